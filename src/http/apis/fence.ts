// Engine control fields a client must not set on a shared endpoint, removed from every dialect's
// upstream body. Pure.
//
// vLLM reads them from the request body of its OpenAI, Responses and Anthropic endpoints:
// `kv_transfer_params` (disaggregated prefill: which remote KV blocks to load), `priority`
// (scheduling order under --scheduling-policy priority), `request_id` (the engine's id for the
// request, and on /v1/responses the id the response is stored under), `cache_salt` (the prefix
// cache partition: a tenant choosing another's salt would share its cache timing), and
// `data_parallel_rank` (which engine rank serves it). The router sets what it needs itself.

export const CONTROL_FIELDS: readonly string[] = ['kv_transfer_params', 'priority', 'request_id', 'cache_salt', 'data_parallel_rank'];

/** A null-prototype copy of `body` without the control fields, key order kept; `body` is not modified. */
export function fenceControlFields(body: Record<string, unknown>): Record<string, unknown> {
  const out = Object.create(null) as Record<string, unknown>;
  for (const key of Object.keys(body)) if (!CONTROL_FIELDS.includes(key)) out[key] = body[key];
  return out;
}
