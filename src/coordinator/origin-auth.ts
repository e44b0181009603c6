// Origin credentials: turn a replica's auth reference (`bearer:NAME`, `headers:NAME`, `none`)
// into request headers, reading the named secret from the Worker environment. No other I/O.
// Secret values never appear in an error message.

export type OriginAuthResult = { ok: true; headers: Record<string, string> } | { ok: false; problem: string };

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

export function resolveOriginAuth(env: object, ref: string): OriginAuthResult {
  if (ref === 'none' || ref === '') return { ok: true, headers: {} };
  const colon = ref.indexOf(':');
  const kind = ref.slice(0, colon);
  const name = ref.slice(colon + 1);
  const raw = (env as Record<string, unknown>)[name];
  if (typeof raw !== 'string' || raw.length === 0) return { ok: false, problem: `secret ${name} is not set` };
  if (kind === 'bearer') {
    if (!HEADER_VALUE.test(raw) || /[\r\n]/.test(raw)) return { ok: false, problem: `secret ${name} holds characters not allowed in a header` };
    return { ok: true, headers: { authorization: `Bearer ${raw.trim()}` } };
  }
  if (kind === 'headers') {
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch {
      return { ok: false, problem: `secret ${name} is not a JSON object of headers` };
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return { ok: false, problem: `secret ${name} is not a JSON object of headers` };
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(parsed)) {
      if (!HEADER_NAME.test(k)) return { ok: false, problem: `secret ${name} has an invalid header name` };
      if (typeof v !== 'string' || !HEADER_VALUE.test(v)) return { ok: false, problem: `secret ${name} has an invalid value for header ${k}` };
      headers[k.toLowerCase()] = v;
    }
    return { ok: true, headers };
  }
  return { ok: false, problem: `unknown auth reference kind "${kind}"` };
}

/** Names the auth reference needs from the environment (for validation in the admin API). */
export function authSecretName(ref: string): string | null {
  const colon = ref.indexOf(':');
  return colon < 0 ? null : ref.slice(colon + 1);
}
