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

/**
 * Keys removed from inside a field that is itself allowed through. `chat_template_kwargs` is passed
 * to the chat template's renderer as keyword arguments (vLLM's ChatCompletionRequest, its
 * embeddings and tokenize chat requests and, in later versions, ResponsesRequest; SGLang and
 * llama.cpp read the same field), and a `chat_template` among them replaces the server's template
 * with the client's Jinja: the route of vLLM advisory GHSA-6fvq-23cw-5628 (a template that renders
 * for minutes on a replica every tenant shares), the same as a top-level `chat_template`. The
 * other kwargs (`enable_thinking` and the like) are the template's own switches and pass.
 */
export const NESTED_CONTROL_FIELDS: Readonly<Record<string, readonly string[]>> = {
  chat_template_kwargs: ['chat_template'],
};

/**
 * `value` of the body field `key` as it may go upstream: for a container of nested control keys,
 * a null-prototype copy without them (key order kept); anything else unchanged.
 */
export function fenceNested(key: string, value: unknown): unknown {
  const nested = Object.hasOwn(NESTED_CONTROL_FIELDS, key) ? NESTED_CONTROL_FIELDS[key]! : null;
  if (nested === null || typeof value !== 'object' || value === null || Array.isArray(value)) return value;
  const out = Object.create(null) as Record<string, unknown>;
  for (const k of Object.keys(value)) if (!nested.includes(k)) out[k] = (value as Record<string, unknown>)[k];
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

/** The body fields a pool bounds (and the tenant's sequence cap and token charge count). */
export const BOUNDED_FIELDS = ['n', 'best_of', 'max_tokens', 'max_completion_tokens', 'max_output_tokens', 'min_tokens'] as const;

function jsonTypeName(v: unknown): string {
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'object') return 'an object';
  return `a ${typeof v}`;
}

/**
 * The first bounded field the body gets wrong, in OpenAI's words, or null: a value that is not a
 * JSON number ("Invalid type for 'n': expected an integer, but got a string instead.", as
 * OpenAI's API answers), then one above its bound ("Invalid 'n': integer above maximum value...").
 * The type check is what makes the bounds hold: vLLM's request models parse in pydantic's lax
 * mode, which turns `"9"` into 9 and `true` into 1 (OpenAIBaseModel in
 * vllm/entrypoints/openai/engine/protocol.py, which every request model extends), so a string would pass a check of numbers and still run as one. null (the
 * field's default) passes.
 */
export function exceededBound(body: Record<string, unknown>, b: RequestBounds): BoundViolation | null {
  const max: Record<(typeof BOUNDED_FIELDS)[number], number> = {
    n: b.maxN,
    best_of: b.maxBestOf,
    max_tokens: b.maxOutputTokens,
    max_completion_tokens: b.maxOutputTokens,
    max_output_tokens: b.maxOutputTokens,
    min_tokens: b.maxOutputTokens,
  };
  for (const param of BOUNDED_FIELDS) {
    const v = body[param];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'number') return { param, message: `Invalid type for '${param}': expected an integer, but got ${jsonTypeName(v)} instead.` };
  }
  for (const param of BOUNDED_FIELDS) {
    const v = body[param];
    if (typeof v === 'number' && v > max[param]) return { param, message: `Invalid '${param}': integer above maximum value. Expected a value <= ${max[param]}, but got ${v} instead.` };
  }
  return null;
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
