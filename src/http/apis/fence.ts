// Engine control fields a client must not set on a shared endpoint, removed from every dialect's
// upstream body, and the router's own fields put in instead. Pure.
//
// vLLM reads them from the request body of its OpenAI, Responses and Anthropic endpoints:
// `kv_transfer_params` (disaggregated prefill: which remote KV blocks to load), `priority`
// (scheduling order under --scheduling-policy priority), `request_id` (the engine's id for the
// request, and on /v1/responses the id the response is stored under), `cache_salt` (the prefix
// cache partition: a tenant choosing another's salt would share its cache timing), and
// `data_parallel_rank` (which engine rank serves it); the full list, with SGLang's and
// llama.cpp's, is engines/request-fields.ts. A pool may allow some (`allowEngineFields`), never
// `cache_salt` or `request_id`. The router sets what it needs itself.

import { ENGINE_CONTROL_FIELDS, fenceNested, ROUTER_OWNED_FIELDS } from '../../engines/request-fields.js';
import type { PrepareBodyOptions } from '../../proxy/upstream-request.js';

export const CONTROL_FIELDS: readonly string[] = [...new Set(['kv_transfer_params', 'priority', 'request_id', 'cache_salt', 'data_parallel_rank', ...Object.keys(ENGINE_CONTROL_FIELDS)])];

/** A null-prototype copy of `body` without the control fields (but those `allowed`), key order kept; `body` is not modified. */
export function fenceControlFields(body: Record<string, unknown>, allowed?: readonly string[]): Record<string, unknown> {
  const out = Object.create(null) as Record<string, unknown>;
  for (const key of Object.keys(body)) {
    if (CONTROL_FIELDS.includes(key) && !(allowed?.includes(key) && !(ROUTER_OWNED_FIELDS as readonly string[]).includes(key))) continue;
    out[key] = fenceNested(key, body[key]);
  }
  return out;
}

/** The fenced body with the router's own fields: the tenant's `cache_salt`, and `request_id` unless the dialect sets its own. */
export function fencedBody(body: Record<string, unknown>, opts: PrepareBodyOptions | undefined, setRequestId = true): Record<string, unknown> {
  const out = fenceControlFields(body, opts?.allowEngineFields);
  if (opts?.cacheSalt) out.cache_salt = opts.cacheSalt;
  if (setRequestId && opts?.requestId) out.request_id = opts.requestId;
  return out;
}
