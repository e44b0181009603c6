// Dashboard sessions: after one login with the admin token, the browser keeps an HttpOnly
// cookie holding an expiring HMAC-signed value with a random session id, never the token itself.
// Logout revokes the id server-side (the RouterGuard object), so a copied cookie dies with it.
// Web Crypto only here; the revocation check is the caller's (ops.ts, admin.ts).

const enc = new TextEncoder();
export const SESSION_COOKIE = 'prefix_router_session';
export const SESSION_TTL_MS = 12 * 3600_000;

async function hmacHex(secret: string, message: string): Promise<string> {
  const key = await crypto.subtle.importKey('raw', enc.encode(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const sig = await crypto.subtle.sign('HMAC', key, enc.encode(message));
  return [...new Uint8Array(sig)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** `s2.<expires ms>.<session id>.<hmac>`, valid until `expires`; rotating ADMIN_TOKEN invalidates every session. */
export async function createSession(adminToken: string, now: number): Promise<string> {
  const expires = now + SESSION_TTL_MS;
  const id = [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, '0')).join('');
  return `s2.${expires}.${id}.${await hmacHex(adminToken, `dashboard-session:${expires}:${id}`)}`;
}

export interface Session {
  id: string;
  expires: number;
}

/** The session a cookie value carries when its signature and expiry are good (revocation not checked), or null. */
export async function verifySession(adminToken: string, value: string | undefined, now: number): Promise<Session | null> {
  if (!value) return null;
  const m = /^s2\.(\d{13})\.([0-9a-f]{32})\.([0-9a-f]{64})$/.exec(value);
  if (!m) return null;
  const expires = Number(m[1]);
  if (!(expires > now) || expires > now + SESSION_TTL_MS) return null;
  const expected = await hmacHex(adminToken, `dashboard-session:${expires}:${m[2]}`);
  return crypto.subtle.timingSafeEqual(enc.encode(expected), enc.encode(m[3]!)) ? { id: m[2]!, expires } : null;
}

export function readCookie(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}
