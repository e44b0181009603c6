// Fail-open through the router (lease protocol v2): with the pool's coordinator unreachable (the
// test-only outage hook), a request is still served, by consistent hash over the last replica set,
// and /metrics and the dashboard data say the pool runs open.

import { describe, expect, it } from 'vitest';
import { admin, call, chatBody, complete, poolSnapshot, until } from '../helpers/workers';
import { ADMIN_TOKEN } from '../fixtures/workers/test-env';

const metric = (text: string, name: string, pool: string): number | null => {
  const m = new RegExp(`^${name}\\{pool="${pool}"\\} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : null;
};

describe('fail-open through the router', () => {
  it('serves while the coordinator is out, counts the fallback, and /metrics and the dashboard show the pool open', async () => {
    // A first request so this isolate holds the pool's replica set from a reply.
    const warm = await complete(chatBody({ messages: [{ role: 'user', content: 'warm' }] }), { headers: { 'x-pool': 'batch' } });
    expect(warm.status).toBe(200);
    await warm.text();
    const before = await call('/metrics', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }).then((r) => r.text());
    expect(metric(before, 'prefix_router_pool_open', 'batch')).toBe(0);
    expect(metric(before, 'prefix_router_coordinator_up', 'batch')).toBe(1);

    expect((await admin('/pools/batch/test-fault', { method: 'POST', json: { outageMs: 60_000 } })).status).toBe(200); // ended below, not by the clock
    const res = await complete(chatBody({ messages: [{ role: 'user', content: 'while out' }] }), { headers: { 'x-pool': 'batch' } });
    expect(res.status).toBe(200);
    expect(['batch-a', 'batch-b']).toContain(res.headers.get('x-prefix-router-replica'));
    await res.text();

    const text = await call('/metrics', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }).then((r) => r.text());
    expect(metric(text, 'prefix_router_pool_open', 'batch')).toBe(1);
    expect(metric(text, 'prefix_router_coordinator_fallbacks_total', 'batch')).toBeGreaterThanOrEqual(1);
    expect(metric(text, 'prefix_router_pool_open', 'chat')).toBe(0);
    expect(text).toMatch(/^prefix_router_coordinator_rpcs_total\{pool="batch",method="acquire"\} \d+$/m);

    const data = await call('/dashboard/data', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }).then((r) => r.json<{ open: { pool: string; reason: string }[] }>());
    expect(data.open.map((o) => o.pool)).toContain('batch');

    // Once reachable again (and past the isolate's breaker, coordinatorRetryMs) the isolate
    // reports its fallback to the coordinator: requests until the coordinator has it.
    expect((await admin('/pools/batch/test-fault', { method: 'POST', json: { outageMs: 0 } })).status).toBe(200);
    const snap = await until(
      async () => {
        const again = await complete(chatBody({ messages: [{ role: 'user', content: 'after' }] }), { headers: { 'x-pool': 'batch' } });
        expect(again.status).toBe(200);
        await again.text();
        return poolSnapshot('batch');
      },
      (s) => (s.lease?.fallbacks ?? 0) >= 1,
      { timeoutMs: 20_000, what: 'the isolate to report its fallback once the coordinator is back' },
    );
    expect(snap.lease!.fallbacks).toBeGreaterThanOrEqual(1);
  }, 40_000);
});
