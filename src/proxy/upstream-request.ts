// Builds the upstream request from the client's: which headers go to the origin and origin auth;
// the body is each dialect's (http/apis/<dialect>/, fenced alike by apis/fence.ts) through the
// PreparedBody contract here. Pure: no I/O. Secret values never appear in an error, a message
// or a thrown exception.

import { FIELD_VALUE, HOP_BY_HOP_HEADERS, TOKEN, type OriginAuth } from '../origin/origin-auth.js';
import { MAX_HEADER_KEY_CHARS } from '../core/keys.js';
import { DATA_PARALLEL_RANK_HEADER } from '../engines/vllm.js';

export { FIELD_VALUE, HOP_BY_HOP_HEADERS, parseOriginAuthSecret, type OriginAuth, type OriginAuthKind, type OriginAuthSecretFailure, type OriginAuthSecretResult } from '../origin/origin-auth.js';

/**
 * Client headers forwarded to the origin; everything else is dropped. An allowlist, not a
 * denylist, because the origin is shared by all tenants and authenticates the router, not the
 * client: whatever else a client sends is aimed at the router and an allowlist cannot leak a
 * credential we did not think of (`Authorization`, `Cookie`, `api-key`, `x-api-key`,
 * `OpenAI-Organization`, ...) or the client's address (`CF-Connecting-IP`, `X-Forwarded-For`,
 * `X-Real-IP`, `Forwarded`). Also dropped on purpose: `Host` and `Content-Length` (the runtime sets
 * them for the upstream URL and the body we send), `Content-Encoding` (the body is re-serialized
 * JSON), `Accept-Encoding` (left to the runtime, which decodes before the tap sees the bytes), and
 * every hop-by-hop header (RFC 9110 §7.6.1). `traceparent`/`tracestate` (W3C Trace Context) are
 * kept: vLLM's OpenTelemetry tracing reads them. The client's `x-request-id` is not: vLLM takes
 * that header as the engine's request id, so the router always sends its own (docs/operations.md).
 * A pool may add names (`forwardHeaders`, checked in origin/forward-headers.ts).
 *
 * Headers a client's `Connection` header names are not removed here: the runtime strips
 * `Connection` itself before the Worker runs (workerd, and Cloudflare's edge), so the Worker never
 * sees the list; the allowlist is what keeps hop-by-hop headers from the origin.
 */
export const FORWARDED_REQUEST_HEADERS: readonly string[] = ['accept', 'content-type', 'user-agent', 'traceparent', 'tracestate'];

/**
 * The session header never goes upstream as the client sent it: only as the per-tenant HMAC the
 * caller passes (`sessionTag`, http/cache-salt.ts sessionTagFor), or not at all.
 */
export const SESSION_HEADER = 'x-session-id';

/** Thrown by `buildUpstreamHeaders` for a value the HTTP layer cannot carry; names the header, never the value. */
export class UpstreamHeaderError extends Error {
  override readonly name = 'UpstreamHeaderError';
  constructor(
    readonly header: string,
    readonly source: 'extra' | 'origin_auth',
  ) {
    super(`invalid value for upstream header ${JSON.stringify(header)} (from ${source})`);
  }
}

/**
 * The headers for the upstream request: the client's allowlisted headers (the fixed list, then the
 * pool's `forwardHeaders`), then `x-session-id` as `sessionTag` (the per-tenant HMAC of the
 * client's, never its raw value; absent: none sent), then `extra` (the proxy's own, e.g. its
 * request id), then origin auth, each overriding the one before.
 */
export function buildUpstreamHeaders(client: Headers, originAuth: OriginAuth, extra?: Record<string, string>, forwardHeaders?: readonly string[], sessionTag?: string | null): Headers {
  const out = new Headers();
  for (const name of FORWARDED_REQUEST_HEADERS) {
    const value = client.get(name);
    if (value !== null) out.set(name, value);
  }
  if (forwardHeaders) {
    for (const name of forwardHeaders) {
      const value = client.get(name);
      if (value !== null) out.set(name, value);
    }
  }
  if (typeof sessionTag === 'string' && sessionTag !== '') setHeader(out, SESSION_HEADER, sessionTag, 'extra');
  if (extra) {
    for (const [name, value] of Object.entries(extra)) setHeader(out, name, value, 'extra');
  }
  switch (originAuth.kind) {
    case 'none':
      break;
    case 'bearer':
      setHeader(out, 'authorization', `Bearer ${originAuth.token}`, 'origin_auth');
      break;
    case 'headers':
      for (const [name, value] of Object.entries(originAuth.headers)) setHeader(out, name, value, 'origin_auth');
      break;
  }
  return out;
}

/**
 * The router's own upstream headers: its request id (vLLM's engine request id), the client's
 * request id, and vLLM's `X-data-parallel-rank` when the lease pinned an engine of a
 * data-parallel replica (coordinator/dp-engines.ts). A client's copy of that header never reaches
 * the origin (not in the allowlist, refused in `forwardHeaders`): engine scheduling is the
 * router's, not a tenant's.
 */
export function upstreamExtraHeaders(upstreamRequestId: string, clientRequestId: string, dpRank?: number): Record<string, string> {
  const out: Record<string, string> = { 'x-request-id': upstreamRequestId, 'x-client-request-id': clientRequestId };
  if (dpRank !== undefined && Number.isInteger(dpRank) && dpRank >= 0) out[DATA_PARALLEL_RANK_HEADER] = String(dpRank);
  return out;
}

/** The session header as routing uses it (core/keys.ts): trimmed, at most MAX_HEADER_KEY_CHARS; what sessionTagFor signs. */
export function sessionHeaderValue(v: string): string {
  const t = v.trim();
  return t.length > MAX_HEADER_KEY_CHARS ? t.slice(0, MAX_HEADER_KEY_CHARS) : t;
}

function setHeader(h: Headers, name: string, value: string, source: 'extra' | 'origin_auth'): void {
  const shownName = TOKEN.test(name) ? name : '(invalid name)';
  const lower = name.toLowerCase();
  if (!TOKEN.test(name) || HOP_BY_HOP_HEADERS.includes(lower) || !FIELD_VALUE.test(value)) {
    throw new UpstreamHeaderError(shownName, source);
  }
  try {
    h.set(name, value);
  } catch {
    // The runtime's own message quotes the value (Node's undici does): never let it through.
    throw new UpstreamHeaderError(shownName, source);
  }
}

export interface PrepareBodyOptions {
  /** Ask a streaming origin for usage (`stream_options.include_usage`); default true. */
  requestUsage?: boolean;
  /** The tenant's `cache_salt` (http/cache-salt.ts); null or absent: none is sent. */
  cacheSalt?: string | null;
  /** The router's request id, sent as the body's `request_id` (vLLM's engine id). */
  requestId?: string;
  /** Engine control fields this pool lets clients set (engines/request-fields.ts). */
  allowEngineFields?: readonly string[];
  /** The pool's engine turns usage on for a `stream_options` without `include_usage` (vLLM); default true. */
  streamOptionsIncludeUsage?: boolean;
}

export interface PreparedBody {
  body: string;
  /** The client did not ask for usage: the tap must drop the usage-only chunk. */
  stripUsageChunk: boolean;
}
