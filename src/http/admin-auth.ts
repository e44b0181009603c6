// Who is an operator: the admin bearer token (compared in constant time), the per-client failure
// budget on it, the dashboard's session cookie, and the refusal of credentials in a query string.
// Shared by the admin API (admin.ts), the dashboard and /metrics (ops.ts) and the test entry's hooks (test/fixtures/router-entry).
// I/O: the guard object (failure budget, revoked sessions).

import type { AppContext } from './context.js';
import { guardStub, overAuthBudget } from './operator-auth-budget.js';
import { readCookie, SESSION_COOKIE, verifySession } from './session.js';
import { secretsEqual } from './tenants.js';

const TOKEN_PARAMS = ['token', 'access_token', 'admin_token', 'api_key', 'key', 'auth'];

/** The admin token from the Authorization header (the admin API takes nothing else). */
export async function isAdmin(c: AppContext): Promise<boolean> {
  const expected = c.env.ADMIN_TOKEN;
  if (typeof expected !== 'string' || expected.length < 16) return false;
  const authz = c.req.header('authorization');
  if (!authz?.startsWith('Bearer ')) return false;
  return secretsEqual(authz.slice(7), expected);
}

/**
 * The admin bearer check with the per-client failure budget (operator-auth-budget.ts): 'ok', 'denied' (a 401),
 * or the retry-after seconds of a client over its budget (a 429, even with the right token). A
 * request without an Authorization header costs nothing and counts nothing.
 */
export async function checkAdmin(c: AppContext): Promise<'ok' | 'denied' | number> {
  const ok = await isAdmin(c);
  if (!ok && c.req.header('authorization') === undefined) return 'denied';
  const over = await overAuthBudget(c, 'admin', !ok);
  if (over !== null) return over;
  return ok ? 'ok' : 'denied';
}

/** Dashboard pages: the admin token as a bearer, or a signed session cookie from the login form that logout has not revoked. */
export async function isDashboardUser(c: AppContext): Promise<boolean | number> {
  if (c.req.header('authorization') !== undefined) {
    const admin = await checkAdmin(c);
    if (admin !== 'denied') return admin === 'ok' ? true : admin;
  }
  const expected = c.env.ADMIN_TOKEN;
  if (typeof expected !== 'string' || expected.length < 16) return false;
  const session = await verifySession(expected, readCookie(c.req.header('cookie'), SESSION_COOKIE), Date.now());
  if (!session) return false;
  try {
    return !(await guardStub(c.env).isSessionRevoked(session.id));
  } catch (e) {
    // Fail closed: a session that cannot be checked against logout is not honoured (the bearer still works).
    console.error(JSON.stringify({ type: 'guard_failed', message: e instanceof Error ? e.message : String(e) }));
    return false;
  }
}

/**
 * Refuse credentials in the query string (they end up in logs and browser history): a parameter
 * named like one, in any case, or the admin token as any parameter's name or value.
 */
export function tokenInQuery(c: AppContext): boolean {
  const admin = c.env.ADMIN_TOKEN;
  for (const [name, value] of new URL(c.req.url).searchParams) {
    if (TOKEN_PARAMS.includes(name.toLowerCase())) return true;
    if (typeof admin === 'string' && admin.length >= 16 && (name.includes(admin) || value.includes(admin))) return true;
  }
  return false;
}
