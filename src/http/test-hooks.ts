// Test-only fault hooks for the fault suite (test/faults): reachable only when the configuration
// sets `testHooks` (only test configurations do) and with the admin token; otherwise these paths
// do not exist (404 like any unknown path). They inject coordinator faults (an outage window,
// releases dropped on purpose, a restart or a real reset of the object) and show this isolate's held leases, the true in-flight
// count a restarted coordinator must rebuild. I/O: coordinator RPCs.

import { Hono } from 'hono';
import { z } from 'zod';
import { isolateLeases } from '../proxy/forward.js';
import { coordinatorFor, fail, type AppEnv } from './context.js';
import { isAdmin } from './admin-auth.js';
import { parseJsonObject, readLimited } from './body.js';

const faultSchema = z.object({
  outageMs: z.number().int().min(0).max(120_000).optional(),
  dropReleases: z.number().int().min(0).max(10_000).optional(),
  restart: z.boolean().optional(),
  abort: z.boolean().optional(),
});

export function testHookRoutes(): Hono<AppEnv> {
  const hooks = new Hono<AppEnv>();
  hooks.use('/pools/:pool/test-*', async (c, next) => {
    const config = c.get('config');
    if (!config.testHooks) return fail(c, 'not_found', `Unknown path ${c.req.method} ${c.req.path.slice(0, 200)}`);
    if (!(await isAdmin(c))) return fail(c, 'admin_unauthorized', 'Admin token required');
    if (!config.poolByName.has(c.req.param('pool') ?? '')) return fail(c, 'pool_not_found', 'Unknown pool');
    await next();
  });

  hooks.post('/pools/:pool/test-fault', async (c) => {
    const pool = c.req.param('pool');
    const raw = await readLimited(c.req.raw, 4096, c.get('config').bodyTimeoutMs);
    if (!raw.ok) return fail(c, raw.reason, raw.message);
    const parsed = parseJsonObject(raw.bytes);
    if (!parsed.ok) return fail(c, parsed.reason, parsed.message);
    const f = faultSchema.safeParse(parsed.value);
    if (!f.success) return fail(c, 'invalid_request', f.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; '));
    try {
      const res = await coordinatorFor(c.env, pool).testFault(pool, f.data);
      return c.json(res);
    } catch (e) {
      // A restart resets the object under the call: that is the fault, not a failure.
      if (f.data.abort) return c.json({ ok: true, aborted: true });
      throw e;
    }
  });

  hooks.get('/pools/:pool/test-leases', (c) => {
    const pool = c.req.param('pool');
    return c.json({ held: isolateLeases.heldByReplica(pool), agent: isolateLeases.stats().find((s) => s.pool === pool) ?? null, rpcs: isolateLeases.counters.rpcs, counters: isolateLeases.counters });
  });
  return hooks;
}
