// Cross-region failover (src/http/regions.ts) inside workerd: one model served by pools in two
// regions (geo-eu: weur, geo-us: enam). A request goes to the nearest region by its `cf`
// (continent, then coordinates; the test pool's fetch takes `cf` in RequestInit) and spills to
// the other when the nearest has no healthy replica, is saturated, or its coordinator fails.

import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import { orderByRegion } from '../../src/http/regions';
import { loadConfig } from '../../src/config';
import { admin, call, KEYS, until, poolSnapshot } from '../helpers/workers';
import { ADMIN_TOKEN } from '../fixtures/workers/test-env';

const EU = { continent: 'EU', latitude: '48.86', longitude: '2.35', country: 'FR' }; // Paris
const US = { continent: 'NA', latitude: '40.71', longitude: '-74.01', country: 'US' }; // New York

async function geoRequest(cf: Record<string, string> | undefined, content = 'hi'): Promise<{ status: number; replica: string | null; text: string }> {
  const init = {
    method: 'POST',
    headers: { authorization: `Bearer ${KEYS.acme}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'geo-model', messages: [{ role: 'user', content }] }),
    ...(cf ? { cf } : {}),
  } as RequestInit;
  const res = await call('/v1/chat/completions', init);
  const text = await res.text();
  return { status: res.status, replica: res.headers.get('x-prefix-router-replica'), text };
}

const stub = (pool: string) => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(pool)) as unknown as DurableObjectStub<PoolCoordinator>;

describe('cross-region failover', () => {
  it('orders regions by continent, then distance; pools without a region last', () => {
    const config = loadConfig(env.ROUTER_CONFIG);
    const eu = config.poolByName.get('geo-eu')!;
    const us = config.poolByName.get('geo-us')!;
    const chat = config.poolByName.get('chat')!;
    expect(orderByRegion([us, eu], EU).map((p) => p.name)).toEqual(['geo-eu', 'geo-us']);
    expect(orderByRegion([eu, us], US).map((p) => p.name)).toEqual(['geo-us', 'geo-eu']);
    // Coordinates alone: Lisbon is nearer Frankfurt than Ashburn; Bogotá nearer Ashburn.
    expect(orderByRegion([us, eu], { latitude: 38.72, longitude: -9.14 }).map((p) => p.name)).toEqual(['geo-eu', 'geo-us']);
    expect(orderByRegion([eu, us], { latitude: 4.71, longitude: -74.07 }).map((p) => p.name)).toEqual(['geo-us', 'geo-eu']);
    // A continent without a region of its own (Asia): by distance (Singapore → Frankfurt is nearer than Ashburn).
    expect(orderByRegion([us, eu], { continent: 'AS', latitude: 1.29, longitude: 103.85 }).map((p) => p.name)).toEqual(['geo-eu', 'geo-us']);
    expect(orderByRegion([chat, us, eu], undefined).map((p) => p.name)).toEqual(['geo-us', 'geo-eu', 'chat']);
  });

  it('a request goes to the nearest region by request.cf', async () => {
    const fromEu = await geoRequest(EU);
    expect(fromEu.status).toBe(200);
    expect(fromEu.replica).toMatch(/^eu-/);
    const fromUs = await geoRequest(US);
    expect(fromUs.status).toBe(200);
    expect(fromUs.replica).toMatch(/^us-/);
  });

  it('spills to the next region when the nearest has no healthy replica (both drained), and comes back', async () => {
    for (const id of ['eu-1', 'eu-2']) expect((await admin(`/pools/geo-eu/replicas/${id}`, { method: 'PATCH', json: { draining: true } })).status).toBe(200);
    try {
      for (let i = 0; i < 4; i++) {
        const r = await geoRequest(EU, `drained ${i}`);
        expect(r.status).toBe(200);
        expect(r.replica).toMatch(/^us-/);
      }
    } finally {
      for (const id of ['eu-1', 'eu-2']) await admin(`/pools/geo-eu/replicas/${id}`, { method: 'PATCH', json: { draining: false } });
    }
    expect((await geoRequest(EU)).replica).toMatch(/^eu-/);
  });

  it('spills when the nearest pool is saturated (maxInFlightPerReplica on every replica)', async () => {
    await until(() => poolSnapshot('geo-eu'), (s) => s.leases === 0);
    const held: string[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await stub('geo-eu').acquire({ pool: 'geo-eu', key: null, keyKind: 'none' });
      if (r.ok) held.push(r.leaseId);
    }
    expect(held).toHaveLength(4);
    expect((await stub('geo-eu').acquire({ pool: 'geo-eu', key: null, keyKind: 'none' })).ok).toBe(false);
    try {
      const r = await geoRequest(EU, 'saturated');
      expect(r.status).toBe(200);
      expect(r.replica).toMatch(/^us-/);
    } finally {
      for (const id of held) await stub('geo-eu').release(id, { status: 200 });
    }
  });

  it('spills when the nearest region\'s coordinator is unreachable, without failing open there', async () => {
    expect((await call('/admin/pools/geo-eu/test-fault', { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify({ outageMs: 60_000 }) })).status).toBe(200);
    const served: (string | null)[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await geoRequest(EU, `outage ${i}`);
      expect(r.status).toBe(200);
      served.push(r.replica);
    }
    expect(served.every((s) => s?.startsWith('us-'))).toBe(true);
    // The outage ends (ended here, not by the clock, so no request above can outlive it); after
    // the isolate's breaker (coordinatorRetryMs from the last failure, above) EU is served from EU again.
    expect((await call('/admin/pools/geo-eu/test-fault', { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify({ outageMs: 0 }) })).status).toBe(200);
    await new Promise((r) => setTimeout(r, loadConfig(env.ROUTER_CONFIG).coordinatorRetryMs + 100));
    expect((await geoRequest(EU, 'after')).replica).toMatch(/^eu-/);
    await until(() => poolSnapshot('geo-eu'), (s) => s.leases === 0);
  }, 30_000);
});
