// Engine control fields and request bounds. Pure: no I/O, plain data in and out.
// Control fields are request-body extensions of the engines (each profile's `controlFields`) that
// steer the engine itself (its scheduling, its request ids, its KV cache and transfer, code it
// loads) rather than one request's sampling. A tenant must not reach them on a shared replica, so
// the upstream body drops them unless the pool allows a field by name; the router's own
// (cache_salt, request_id) are always overwritten. Bounds: n, best_of and output tokens.

import { ENGINE_PROFILES } from './index.js';

/**
 * Removed from every upstream body unless the pool's `allowEngineFields` names them: every
 * engine's control fields (each profile's `controlFields`, with its sources), whatever the pool's
 * `engine` says, since a pool may mix engines while it migrates. In registry order; where two
 * engines share a field, the first profile's note is kept.
 */
export const ENGINE_CONTROL_FIELDS: Readonly<Record<string, string>> = controlFieldsOf(ENGINE_PROFILES);

function controlFieldsOf(profiles: readonly { readonly controlFields: Readonly<Record<string, string>> }[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of profiles) for (const [name, why] of Object.entries(p.controlFields)) if (!Object.hasOwn(out, name)) out[name] = why;
  return out;
}

/** Fields the router always sets itself (or removes): never allowed to a client. */
export const ROUTER_OWNED_FIELDS = ['cache_salt', 'request_id'] as const;

/** Why `name` cannot be in a pool's allowEngineFields, or null. */
export function engineFieldProblem(name: string): string | null {
  if ((ROUTER_OWNED_FIELDS as readonly string[]).includes(name)) return `"${name}" is always set by the router and cannot be allowed`;
  if (!Object.hasOwn(ENGINE_CONTROL_FIELDS, name)) return `"${name}" is not an engine control field (known: ${Object.keys(ENGINE_CONTROL_FIELDS).join(', ')})`;
  return null;
}

export interface RequestBounds {
  maxN: number;
  maxBestOf: number;
  maxOutputTokens: number;
}

export interface BoundViolation {
  param: string;
  message: string;
}

/**
 * The first bound the body exceeds, in OpenAI's words ("Invalid 'n': integer above maximum
 * value..."), or null. Only numbers are judged here; a value of the wrong type is the engine's to
 * refuse (or the validator's).
 */
export function exceededBound(body: Record<string, unknown>, b: RequestBounds): BoundViolation | null {
  const check = (param: string, max: number): BoundViolation | null => {
    const v = body[param];
    if (typeof v !== 'number' || v <= max) return null;
    return { param, message: `Invalid '${param}': integer above maximum value. Expected a value <= ${max}, but got ${v} instead.` };
  };
  return check('n', b.maxN) ?? check('best_of', b.maxBestOf) ?? check('max_tokens', b.maxOutputTokens) ?? check('max_completion_tokens', b.maxOutputTokens) ?? check('max_output_tokens', b.maxOutputTokens) ?? check('min_tokens', b.maxOutputTokens);
}

/**
 * Sequences the engine runs for this request: `n` choices, or `best_of` candidates when larger
 * (vLLM generates best_of and returns the n best). What the tenant's concurrency cap counts.
 */
export function sequencesOf(body: Record<string, unknown>): number {
  const n = typeof body.n === 'number' && Number.isInteger(body.n) && body.n > 1 ? body.n : 1;
  const best = typeof body.best_of === 'number' && Number.isInteger(body.best_of) && body.best_of > n ? body.best_of : n;
  return best;
}
