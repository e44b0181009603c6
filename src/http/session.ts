// Dashboard sessions: after one login with the admin token, the browser keeps an HttpOnly
// cookie holding an expiring HMAC-signed value, never the token itself. Web Crypto only.

const enc = new TextEncoder();
export const SESSION_COOKIE = 'prefix_router_session';
export const SESSION_TTL_MS = 12 * 3600_000;

async function hmacHex(secret: string, message: string): Promise<string> {
  const key = await crypto.subtle.importKey('raw', enc.encode(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const sig = await crypto.subtle.sign('HMAC', key, enc.encode(message));
  return [...new Uint8Array(sig)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** `s1.<expires ms>.<hmac>`, valid until `expires`; rotating ADMIN_TOKEN invalidates every session. */
export async function createSession(adminToken: string, now: number): Promise<string> {
  const expires = now + SESSION_TTL_MS;
  return `s1.${expires}.${await hmacHex(adminToken, `dashboard-session:${expires}`)}`;
}

export async function verifySession(adminToken: string, value: string | undefined, now: number): Promise<boolean> {
  if (!value) return false;
  const m = /^s1\.(\d{13})\.([0-9a-f]{64})$/.exec(value);
  if (!m) return false;
  const expires = Number(m[1]);
  if (!(expires > now) || expires > now + SESSION_TTL_MS) return false;
  const expected = await hmacHex(adminToken, `dashboard-session:${expires}`);
  return crypto.subtle.timingSafeEqual(enc.encode(expected), enc.encode(m[2]!));
}

export function readCookie(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}
