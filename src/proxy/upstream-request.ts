// Builds the upstream request from the client's: which headers go to the origin, origin auth, and
// the body (usage asked for on streams). Parses origin-auth secrets. Pure: no I/O. Secret values
// never appear in an error, a message or a thrown exception.

export type OriginAuth =
  | { kind: 'none' }
  | { kind: 'bearer'; token: string }
  | { kind: 'headers'; headers: Record<string, string> };

export type OriginAuthKind = OriginAuth['kind'];

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

/** RFC 9110 §7.6.1 and RFC 2616 §13.5.1; plus any header the `Connection` header names. */
export const HOP_BY_HOP_HEADERS: readonly string[] = [
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
];

/** Header names origin auth may not set: framing, or facts about the body the runtime owns. */
const ORIGIN_AUTH_FORBIDDEN = new Set([...HOP_BY_HOP_HEADERS, 'host', 'content-length', 'content-type', 'content-encoding']);

// RFC 9110 §5.6.2 token.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// RFC 9110 §5.5 field-value: visible ASCII, SP, HTAB and obs-text; never CR, LF, NUL or other CTLs.
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
// A bearer credential: printable ASCII without spaces (a superset of RFC 6750 b64token).
const BEARER = /^[\x21-\x7e]+$/;

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

export type OriginAuthSecretFailure =
  | 'missing_secret'
  | 'invalid_bearer_token'
  | 'invalid_json'
  | 'not_an_object'
  | 'no_headers'
  | 'invalid_header_name'
  | 'forbidden_header_name'
  | 'duplicate_header_name'
  | 'invalid_header_value';

export type OriginAuthSecretResult =
  | { ok: true; auth: OriginAuth }
  | { ok: false; reason: OriginAuthSecretFailure; message: string };

/**
 * Origin auth from the named secret it references. `bearer`: the raw token (surrounding
 * whitespace, such as the newline `echo` leaves, is trimmed). `headers`: a JSON object of header
 * name to value, e.g. Cloudflare Access service-token headers
 * `{"CF-Access-Client-Id": "...", "CF-Access-Client-Secret": "..."}`. Never throws; a failure
 * message names at most a (validated) header name or an entry's position, never a value and never
 * the parser's own message (V8's JSON.parse errors quote the input).
 */
export function parseOriginAuthSecret(raw: string | undefined, kind: OriginAuthKind): OriginAuthSecretResult {
  if (kind === 'none') return { ok: true, auth: { kind: 'none' } };
  if (raw === undefined || raw.trim() === '') {
    return fail('missing_secret', `the ${kind} origin auth secret is missing or empty`);
  }
  if (kind === 'bearer') {
    const token = raw.trim();
    if (!BEARER.test(token)) {
      return fail(
        'invalid_bearer_token',
        "the bearer origin auth secret must be the raw token: printable ASCII with no spaces or line breaks, without a 'Bearer ' prefix",
      );
    }
    return { ok: true, auth: { kind: 'bearer', token } };
  }

  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    return fail('invalid_json', 'the headers origin auth secret is not valid JSON');
  }
  if (!isPlainObject(parsed)) {
    return fail('not_an_object', 'the headers origin auth secret must be a JSON object of header name to value');
  }
  const entries = Object.entries(parsed);
  if (entries.length === 0) return fail('no_headers', 'the headers origin auth secret has no headers');
  const headers: Record<string, string> = {};
  const seen = new Set<string>();
  for (const [i, [name, value]] of entries.entries()) {
    if (!TOKEN.test(name)) {
      return fail('invalid_header_name', `entry ${i + 1} of the headers origin auth secret has an invalid header name`);
    }
    const lower = name.toLowerCase();
    if (ORIGIN_AUTH_FORBIDDEN.has(lower)) {
      return fail('forbidden_header_name', `origin auth may not set the header ${JSON.stringify(name)}`);
    }
    if (seen.has(lower)) {
      return fail('duplicate_header_name', `the header ${JSON.stringify(name)} appears twice in the headers origin auth secret`);
    }
    seen.add(lower);
    const trimmed = typeof value === 'string' ? value.trim() : '';
    if (trimmed === '' || !FIELD_VALUE.test(trimmed)) {
      return fail(
        'invalid_header_value',
        `the value of ${JSON.stringify(name)} in the headers origin auth secret must be a non-empty string without control characters or line breaks`,
      );
    }
    headers[name] = trimmed;
  }
  return { ok: true, auth: { kind: 'headers', headers } };
}

function fail(reason: OriginAuthSecretFailure, message: string): OriginAuthSecretResult {
  return { ok: false, reason, message };
}
