// Which client headers a pool may forward to its origins beyond the fixed list: the names an
// operator can add (`forwardHeaders`) and those it never can. Pure: config-time checks only. In origin/ (what
// reaches an origin) so that config.ts and the proxy both import it without importing each other.

/** Never forwardable, whatever a pool says: credentials, the client's address, framing, the router's own, engine scheduling, the raw session id. */
const NEVER_EXACT = new Set([
  'authorization',
  'proxy-authorization',
  'cookie',
  'set-cookie',
  'cookie2',
  'x-api-key',
  'api-key',
  'forwarded',
  'x-real-ip',
  'true-client-ip',
  'host',
  'content-length',
  'content-type',
  'content-encoding',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'upgrade',
  'x-request-id',
  'x-client-request-id',
  'x-pool',
  // vLLM's and SGLang's data-parallel engine pin: set by the router only (an engine-control input,
  // dp-engines.ts; SGLang's serving_base.py extract_routed_dp_rank_from_header reads it too).
  'x-data-parallel-rank',
  // SGLang's routing key for its data-parallel and gateway scheduling (serving_base.py
  // extract_routing_key): engine scheduling, not a tenant's choice.
  'x-smg-routing-key',
  // vLLM's scheduling priority header (Completions, Chat Completions, Responses): it overrides the
  // body's `priority`, which the router fences; a tenant may not reorder everyone's queue.
  'x-vllm-priority',
  // The session header goes upstream only as the router's per-tenant HMAC of it (upstream-request.ts).
  'x-session-id',
]);
/** Prefixes never forwardable: Cloudflare's (`cf-connecting-ip`, Access's `cf-access-client-secret`), proxies', the router's. */
const NEVER_PREFIX = ['cf-', 'x-forwarded-', 'x-prefix-router-', 'proxy-', 'sec-'];

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** Why a pool may not forward the header `name`, or null. */
export function forwardHeaderProblem(name: string): string | null {
  if (!TOKEN.test(name) || name.length > 64) return `"${name.slice(0, 64)}" is not a valid header name`;
  const lower = name.toLowerCase();
  if (NEVER_EXACT.has(lower) || NEVER_PREFIX.some((p) => lower.startsWith(p))) return `"${name}" may never be forwarded to an origin (credentials, client address, framing, engine scheduling or the router's own)`;
  return null;
}
