// Builds the upstream request from the client's: which headers go to the origin, origin auth, and
// the body (usage asked for on streams). Pure: no I/O. Secret values
// never appear in an error, a message or a thrown exception.

import { FIELD_VALUE, HOP_BY_HOP_HEADERS, TOKEN, type OriginAuth } from '../coordinator/origin-auth.js';

export { HOP_BY_HOP_HEADERS, parseOriginAuthSecret, type OriginAuth, type OriginAuthKind, type OriginAuthSecretFailure, type OriginAuthSecretResult } from '../coordinator/origin-auth.js';

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
 * kept: vLLM's OpenTelemetry tracing reads them.
 */
export const FORWARDED_REQUEST_HEADERS: readonly string[] = [
  'accept',
  'content-type',
  'user-agent',
  'x-request-id',
  'x-session-id',
  'traceparent',
  'tracestate',
];

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
 * The headers for the upstream request: the client's allowlisted headers (minus any the client's
 * `Connection` header names), then `extra` (the proxy's own, e.g. its request id), then origin auth,
 * each overriding the one before.
 */
export function buildUpstreamHeaders(client: Headers, originAuth: OriginAuth, extra?: Record<string, string>): Headers {
  const connectionNamed = new Set(
    (client.get('connection') ?? '')
      .split(',')
      .map((t) => t.trim().toLowerCase())
      .filter((t) => t !== ''),
  );
  const out = new Headers();
  for (const name of FORWARDED_REQUEST_HEADERS) {
    if (connectionNamed.has(name)) continue;
    const value = client.get(name);
    if (value !== null) out.set(name, value);
  }
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
}

export interface PreparedBody {
  body: string;
  /** The client did not ask for usage: the tap must drop the usage-only chunk. */
  stripUsageChunk: boolean;
}

/**
 * The upstream body: the client's JSON, key order and unknown fields kept, except that a
 * streaming request gets `stream_options.include_usage: true` so the router can read token usage
 * and cached tokens. When the client did not ask for usage itself, `stripUsageChunk` is true and
 * `stream_options.continuous_usage_stats`, if the client set it, is sent as false: vLLM applies it
 * only when `include_usage` is on (`should_include_usage`), so the client would not have seen
 * per-chunk usage, and the tap strips only the usage-only chunk, never fields of other chunks.
 * A `stream_options` that is neither an object nor null is left alone for the origin to reject.
 * `input` is not modified.
 */
export function prepareUpstreamBody(input: Record<string, unknown>, opts: PrepareBodyOptions = {}): PreparedBody {
  const unchanged = (): PreparedBody => ({ body: JSON.stringify(input), stripUsageChunk: false });
  if (input.stream !== true || opts.requestUsage === false) return unchanged();
  const so = input.stream_options;
  if (so !== undefined && so !== null && !isPlainObject(so)) return unchanged();
  if (isPlainObject(so) && so.include_usage === true) return unchanged();

  const streamOptions = copyObject(isPlainObject(so) ? so : {});
  streamOptions.include_usage = true;
  if (streamOptions.continuous_usage_stats) streamOptions.continuous_usage_stats = false;
  const body = copyObject(input);
  body.stream_options = streamOptions; // replaces in place, or appends when absent
  return { body: JSON.stringify(body), stripUsageChunk: true };
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// A null-prototype copy keeps an own `__proto__` key (JSON.parse makes one) as data, in place.
function copyObject(src: Record<string, unknown>): Record<string, unknown> {
  const out = Object.create(null) as Record<string, unknown>;
  for (const key of Object.keys(src)) out[key] = src[key];
  return out;
}
