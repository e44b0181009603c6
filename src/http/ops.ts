// Operator endpoints: Prometheus `/metrics` (metrics token or admin token) and the `/dashboard`
// (admin token, once, then an HttpOnly cookie). I/O: snapshot RPCs to every pool's coordinator.

import { Hono } from 'hono';
import type { PoolSnapshot } from '../coordinator/types.js';
import { histogramQuantile } from '../coordinator/stats.js';
import { dashboardPage, LOGIN_PAGE } from '../observability/dashboard.js';
import { renderMetrics } from '../observability/prometheus.js';
import { poolOpenStates, type PoolOpenState } from '../observability/pool-open.js';
import { isolateLeases } from '../proxy/forward.js';
import { renderTenantMetrics } from '../observability/tenant-metrics.js';
import { tenantView } from '../observability/tenant-view.js';
import { registryStub } from '../quota/tenant-meter.js';
import type { TenantTotals } from '../quota/usage.js';
import { coordinatorFor, fail, type AppContext, type AppEnv } from './context.js';
import { checkAdmin, isDashboardUser, tokenInQuery } from './admin-auth.js';
import { readLimited } from './body.js';
import { guardStub, overAuthBudget } from './operator-auth-budget.js';
import { createSession, readCookie, SESSION_COOKIE, SESSION_TTL_MS, verifySession } from './session.js';
import { secretsEqual } from './tenants.js';

/**
 * Every dashboard page and answer: no framing (clickjacking), scripts only with this response's
 * nonce, no other origin reachable, no sniffing, no referrer, no caching. Inline styles stay
 * allowed: the charts colour their legends through style attributes.
 */
function dashboardHeaders(nonce?: string): Record<string, string> {
  return {
    'content-security-policy': `default-src 'none'; script-src ${nonce ? `'nonce-${nonce}'` : "'none'"}; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'`,
    'x-frame-options': 'DENY',
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'cache-control': 'no-store',
  };
}

function rateLimited(c: AppContext, retryAfterSeconds: number): Response {
  return fail(c, 'auth_rate_limited', 'Too many failed credentials from this client; retry later', { retryAfterSeconds });
}

/** Every pool's snapshot; a pool whose coordinator fails is logged and left out, not a 500. */
async function allSnapshots(c: AppContext): Promise<PoolSnapshot[]> {
  const pools = c.get('config').pools;
  const settled = await Promise.allSettled(pools.map((p) => coordinatorFor(c.env, p.name).snapshot(p.name)));
  const out: PoolSnapshot[] = [];
  settled.forEach((s, i) => {
    if (s.status === 'fulfilled' && s.value) out.push(s.value);
    else if (s.status === 'rejected') console.error(JSON.stringify({ type: 'snapshot_failed', pool: pools[i]!.name, message: s.reason instanceof Error ? s.reason.message : String(s.reason) }));
  });
  return out;
}

/** Per configured pool: running open or not (lease protocol v2), from the snapshots that came back. */
function openStates(c: AppContext, snapshots: readonly PoolSnapshot[]): PoolOpenState[] {
  return poolOpenStates(c.get('config').pools.map((p) => p.name), snapshots, isolateLeases.stats(), Date.now());
}

/** Every tenant's usage totals from the UsageRegistry; on failure logged and empty, not a 500. */
async function tenantTotals(c: AppContext): Promise<TenantTotals[]> {
  try {
    return await registryStub(c.env).totals();
  } catch (e) {
    console.error(JSON.stringify({ type: 'usage_totals_failed', message: e instanceof Error ? e.message : String(e) }));
    return [];
  }
}

export function opsRoutes(): Hono<AppEnv> {
  const ops = new Hono<AppEnv>();

  ops.get('/metrics', async (c) => {
    if (tokenInQuery(c)) return fail(c, 'token_in_query', 'Credentials are not accepted in the query string; use the Authorization header');
    const authz = c.req.header('authorization');
    const bearer = authz?.startsWith('Bearer ') ? authz.slice(7) : '';
    const metricsToken = c.env.METRICS_TOKEN;
    const metricsOk = typeof metricsToken === 'string' && metricsToken.length >= 16 && (await secretsEqual(bearer, metricsToken));
    const admin = metricsOk ? 'ok' : await checkAdmin(c);
    if (typeof admin === 'number') return rateLimited(c, admin);
    if (admin !== 'ok') return fail(c, 'admin_unauthorized', 'Metrics token or admin token required');
    const [snapshots, totals] = await Promise.all([allSnapshots(c), tenantTotals(c)]);
    const tenantText = renderTenantMetrics(totals, Date.now());
    return new Response(renderMetrics(snapshots, openStates(c, snapshots)) + (tenantText.trim() ? tenantText : ''), { headers: { 'content-type': 'text/plain; version=0.0.4; charset=utf-8', 'cache-control': 'no-store' } });
  });

  ops.get('/dashboard', async (c) => {
    if (tokenInQuery(c)) return fail(c, 'token_in_query', 'Credentials are not accepted in the query string');
    const user = await isDashboardUser(c);
    if (typeof user === 'number') return rateLimited(c, user);
    if (!user) return c.html(LOGIN_PAGE, 200, dashboardHeaders());
    const nonce = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
    return c.html(dashboardPage(5000, nonce), 200, dashboardHeaders(nonce));
  });

  ops.post('/dashboard/login', async (c) => {
    const raw = await readLimited(c.req.raw, 4096, c.get('config').bodyTimeoutMs);
    if (!raw.ok) return fail(c, raw.reason, raw.message);
    const form = new URLSearchParams(new TextDecoder().decode(raw.bytes));
    const token = form.get('token') ?? '';
    const expected = c.env.ADMIN_TOKEN;
    const right = typeof expected === 'string' && expected.length >= 16 && (await secretsEqual(token, expected));
    const over = await overAuthBudget(c, 'login', !right);
    if (over !== null) return c.html(LOGIN_PAGE.replace('<!--ERROR-->', '<p class="err">Too many attempts; wait and retry.</p>'), 429, { ...dashboardHeaders(), 'retry-after': String(over) });
    if (!right) return c.html(LOGIN_PAGE.replace('<!--ERROR-->', '<p class="err">Wrong token.</p>'), 401, dashboardHeaders());
    const secure = new URL(c.req.url).protocol === 'https:' ? '; Secure' : '';
    const session = await createSession(expected!, Date.now());
    return new Response(null, {
      status: 303,
      headers: { ...dashboardHeaders(), location: '/dashboard', 'set-cookie': `${SESSION_COOKIE}=${session}; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age=${SESSION_TTL_MS / 1000}${secure}` },
    });
  });

  // Logout revokes the session server-side (RouterGuard), not only the browser's copy of it.
  ops.post('/dashboard/logout', async (c) => {
    const expected = c.env.ADMIN_TOKEN;
    const session = typeof expected === 'string' && expected.length >= 16 ? await verifySession(expected, readCookie(c.req.header('cookie'), SESSION_COOKIE), Date.now()) : null;
    if (session) {
      try {
        await guardStub(c.env).revokeSession(session.id, session.expires);
      } catch (e) {
        console.error(JSON.stringify({ type: 'guard_failed', message: e instanceof Error ? e.message : String(e) }));
        return fail(c, 'no_healthy_replica', 'Logout could not be recorded; retry', { retryAfterSeconds: 1 });
      }
    }
    return new Response(null, { status: 303, headers: { ...dashboardHeaders(), location: '/dashboard', 'set-cookie': `${SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age=0` } });
  });

  ops.get('/dashboard/data', async (c) => {
    if (tokenInQuery(c)) return fail(c, 'token_in_query', 'Credentials are not accepted in the query string');
    const user = await isDashboardUser(c);
    if (typeof user === 'number') return rateLimited(c, user);
    if (!user) return fail(c, 'admin_unauthorized', 'Admin token required');
    const [snapshots, totals] = await Promise.all([allSnapshots(c), tenantTotals(c)]);
    const pools = snapshots.map((p) => ({
      ...p,
      replicas: p.replicas.map((r) => ({ ...r, url: undefined, auth: undefined, ttft: { p50: histogramQuantile(r.stats.ttft, 0.5), p95: histogramQuantile(r.stats.ttft, 0.95) } })),
    }));
    const now = Date.now();
    return c.json({ at: now, pools, open: openStates(c, snapshots).filter((o) => o.open), tenants: tenantView(totals, now) }, 200, dashboardHeaders());
  });

  return ops;
}
