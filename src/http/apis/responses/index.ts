// OpenAI Responses API (`POST /v1/responses`; retrieve, cancel and delete by id in routes.ts), as
// vLLM serves it. Pure. The router names each new response itself (`request_id`, which vLLM uses
// as the response id), so it knows at the pick which replica will store it; the id carries a tag
// of the pool, so a retrieve by id (which names no model) finds its pool's coordinator at once.

import { z } from 'zod';
import { hashString, hex32, stableStringify } from '../../../core/index.js';
import { responsesReader, storedResponseReader } from './reader.js';
import { ResponsesAnswer } from './continuation.js';
import { promptCacheKeySchema, type BodyFailure } from '../../body.js';
import type { Dialect } from '../dialect.js';
import { fencedBody } from '../fence.js';
import { firstIssue } from '../issues.js';

/** Response ids as vLLM makes them (`resp_` + 32 hex); the router's put the pool's tag first. */
export const RESPONSE_ID = /^resp_[0-9a-f]{32}$/;
/** What the router accepts as a response id in a path or `previous_response_id` (any engine's). */
export const RESPONSE_ID_PARAM = /^[A-Za-z0-9_-]{1,128}$/;

const item = z.object({ type: z.string().max(64).optional(), role: z.string().min(1).max(64).optional() }).passthrough();

export const responsesRequestSchema = z
  .object({
    model: z.string().min(1).max(256),
    input: z.union([z.string(), z.array(item).min(1).max(10_000)]),
    instructions: z.string().nullable().optional(),
    tools: z.array(z.object({ type: z.string().max(64) }).passthrough()).max(1024).nullable().optional(),
    previous_response_id: z.string().regex(RESPONSE_ID_PARAM, 'must be a response id').nullable().optional(),
    stream: z.boolean().nullable().optional(),
    store: z.boolean().nullable().optional(),
    background: z.boolean().nullable().optional(),
    max_output_tokens: z.number().int().min(1).max(10_000_000).nullable().optional(),
    prompt_cache_key: promptCacheKeySchema(),
    user: z.string().max(512).nullable().optional(),
    metadata: z.record(z.string(), z.unknown()).nullable().optional(),
  })
  .passthrough();

/** The 8-hex tag of a pool in the ids of the responses it makes. */
export function poolTag(pool: string): string {
  return hex32(hashString(`pool\u0000${pool}`));
}

/** A new response id for `pool`: `resp_` + the pool's tag + 24 random hex digits. */
export function newResponseId(pool: string, random: Uint8Array = crypto.getRandomValues(new Uint8Array(12))): string {
  let hex = '';
  for (const b of random) hex += b.toString(16).padStart(2, '0');
  return `resp_${poolTag(pool)}${hex}`;
}

/** The pool tag an id made by the router carries, or null for another engine's id. */
export function poolTagOf(id: string): string | null {
  return RESPONSE_ID.test(id) ? id.slice(5, 13) : null;
}

// Separators as in core/keys.ts canonicalPrompt, so the prefix key and blocks see the same kind of text.
const SEP_PART = '\u0001';
const SEP_FIELD = '\u0002';

/**
 * The prompt in the order vLLM builds it from a Responses request: tool schemas, the
 * instructions (its system message), then each input item (a message's role and content; a
 * function call or its output by type). '' for a follow-up (`previous_response_id`): the engine's
 * prompt starts with the stored conversation, which the router never sees, so the new input alone
 * would be a wrong prefix for the key and the index (and the pick is pinned anyway).
 */
export function responsesPromptText(body: Record<string, unknown>): string {
  if (typeof body.previous_response_id === 'string') return '';
  let out = '';
  if (Array.isArray(body.tools) && body.tools.length > 0) out += 'tools' + SEP_FIELD + stableStringify(body.tools) + SEP_PART;
  if (typeof body.instructions === 'string' && body.instructions !== '') out += 'system' + SEP_FIELD + body.instructions + SEP_PART;
  const input = body.input;
  if (typeof input === 'string') out += 'user' + SEP_FIELD + input + SEP_PART;
  else if (Array.isArray(input)) {
    for (const it of input) {
      if (it === null || typeof it !== 'object') continue;
      const o = it as Record<string, unknown>;
      if (typeof o.role === 'string') {
        out += o.role + SEP_FIELD + (typeof o.content === 'string' ? o.content : o.content == null ? '' : stableStringify(o.content));
      } else {
        // function_call, function_call_output, reasoning, ...: the item as the template renders it.
        const { id: _id, status: _status, ...rest } = o;
        out += String(o.type ?? 'item') + SEP_FIELD + stableStringify(rest);
      }
      out += SEP_PART;
    }
  }
  return out;
}

function validateResponses(body: Record<string, unknown>): { ok: true; model: string; stream: boolean } | BodyFailure {
  const res = responsesRequestSchema.safeParse(body);
  if (!res.success) return firstIssue(res.error, body);
  if (body.background === true && body.store === false) {
    return { ok: false, reason: 'invalid_request', message: 'background mode requires store: background responses are polled by id', param: 'background' };
  }
  return { ok: true, model: body.model as string, stream: body.stream === true };
}

/** GET /v1/responses/{id} and its cancel: no body to send, and no usage to count (storedResponseReader). */
export const storedResponseDialect = {
  prepareBody: () => ({ body: '', stripUsageChunk: false }),
  reader: () => storedResponseReader,
};

/** The Responses dialect; `forRequest` binds the response id the router chose for one request. */
export const responsesDialect: Dialect & { forRequest(responseId: string): Dialect } = {
  name: 'responses',
  path: '/v1/responses',
  errors: 'openai',
  validate: validateResponses,
  promptText: responsesPromptText,
  // Usage always comes with the final event: nothing to ask for.
  prepareBody: (body, opts) => ({ body: JSON.stringify(fencedBody(body, opts)), stripUsageChunk: false }),
  reader: () => responsesReader,
  // vLLM's Responses endpoint does not pass the header's rank to the engine (its generation
  // loop, `_generate_with_builtin_tools` in vllm/entrypoints/openai/engine/serving.py, takes none).
  noEnginePin: true,
  // A stream broken after its first token continues through vLLM's partial-message input, on pools that have it (continuation.ts).
  continuation: (body, pool) => new ResponsesAnswer(body, pool.continueResponses),
  forRequest(responseId: string): Dialect {
    return {
      ...this,
      prepareBody: (body, opts) => {
        // The response id is the engine's request id here (affinity): the router's, chosen for it.
        const out = fencedBody(body, opts, false);
        out.request_id = responseId;
        return { body: JSON.stringify(out), stripUsageChunk: false };
      },
    };
  },
};
