// Origin credentials: parse the secret a replica's auth reference names (`bearer:NAME` for vLLM's
// --api-key, `headers:NAME` for a JSON object of fixed headers such as Cloudflare Access service
// tokens) into request headers. Below both of its users: the coordinator (health checks, metrics
// scrapes) and the proxy (every upstream request) import it; it imports neither. Reads only the environment object handed in; no other I/O.
// Secret values never appear in an error, a message or a thrown exception.

export type OriginAuth =
  | { kind: 'none' }
  | { kind: 'bearer'; token: string }
  | { kind: 'headers'; headers: Record<string, string> };

export type OriginAuthKind = OriginAuth['kind'];

// RFC 9110 §5.6.2 token.
export const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// RFC 9110 §5.5 field-value: visible ASCII, SP, HTAB and obs-text; never CR, LF, NUL or other CTLs.
export const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
// A bearer credential: printable ASCII without spaces (a superset of RFC 6750 b64token).
const BEARER = /^[\x21-\x7e]+$/;

/** RFC 9110 §7.6.1 and RFC 2616 §13.5.1 hop-by-hop headers (plus any the `Connection` header names). */
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

/** Header names origin auth may not set: hop-by-hop framing, or facts about the body the runtime owns. */
const ORIGIN_AUTH_FORBIDDEN = new Set([...HOP_BY_HOP_HEADERS, 'host', 'content-length', 'content-type', 'content-encoding']);

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
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

export type OriginAuthResult = { ok: true; auth: OriginAuth; headers: Record<string, string> } | { ok: false; problem: string };

/** The request headers an origin auth adds. */
export function originAuthHeaders(auth: OriginAuth): Record<string, string> {
  if (auth.kind === 'bearer') return { authorization: `Bearer ${auth.token}` };
  if (auth.kind === 'headers') return { ...auth.headers };
  return {};
}

/** Resolve a replica's auth reference against the environment's secrets. */
export function resolveOriginAuth(env: object, ref: string): OriginAuthResult {
  if (ref === 'none' || ref === '') return { ok: true, auth: { kind: 'none' }, headers: {} };
  const colon = ref.indexOf(':');
  const kind = ref.slice(0, colon);
  const name = ref.slice(colon + 1);
  if (kind !== 'bearer' && kind !== 'headers') return { ok: false, problem: `unknown auth reference kind "${kind}"` };
  const raw = (env as Record<string, unknown>)[name];
  const parsed = parseOriginAuthSecret(typeof raw === 'string' ? raw : undefined, kind);
  if (!parsed.ok) return { ok: false, problem: `secret ${name} is unusable: ${parsed.message}` };
  return { ok: true, auth: parsed.auth, headers: originAuthHeaders(parsed.auth) };
}

/** The secret an auth reference needs from the environment (for validation in the admin API). */
export function authSecretName(ref: string): string | null {
  const colon = ref.indexOf(':');
  return colon < 0 ? null : ref.slice(colon + 1);
}
