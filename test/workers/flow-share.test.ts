// Flow control's share reserve (issue #29, core heldBackByReserve): pool `flow-share` (test-env.ts)
// has three replicas of one slot and keeps one slot for tenants below their fair share. A tenant
// holding its share (of the slots, and of the recent admissions) waits while only that slot is
// free; a tenant below its share takes it at once;
// the waiter goes as soon as it no longer holds more than its share (the other tenant left).

import { env } from 'cloudflare:workers';
import { expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import { poolSnapshot, until } from '../helpers/workers';

const POOL = 'flow-share';
const stub = () => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(POOL)) as unknown as DurableObjectStub<PoolCoordinator>;
const req = (ticket: string, tenant: string): AcquireRequest => ({ pool: POOL, key: null, keyKind: 'none', tenant, queue: { ticket, band: 'normal', cost: 10, weight: 1 } });
const acquire = (ticket: string, tenant: string) => stub().acquireQueued(req(ticket, tenant)) as Promise<AcquireResult>;
const leaseOf = (r: AcquireResult): string => {
  if (!r.ok) throw new Error(`expected a lease, got ${r.reason}`);
  return r.leaseId;
};

it('a tenant at its share waits while only the reserve is free; a tenant below its share takes it; the waiter goes when the share grows', async () => {
  await until(() => poolSnapshot(POOL), (s) => s.leases === 0, { what: 'pool flow-share idle' });
  // heavy has been sending: most of the pool's recent admissions are its (a light tenant's burst,
  // below its share of those, is not held back: core heldBackByReserve's recentShare).
  for (let i = 0; i < 4; i++) await stub().release(leaseOf(await acquire(`a-warm-${i}`, 'heavy')), { status: 200, durationMs: 1 });
  const a1 = leaseOf(await acquire('a-1', 'heavy'));
  const b1 = leaseOf(await acquire('b-1', 'light'));
  // heavy holds 1 of 3 with light active (its share is 1.5): a second would be over it, and the one free slot is the reserve.
  let a2Answer: AcquireResult | null = null;
  const a2 = acquire('a-2', 'heavy').then((r) => (a2Answer = r));
  const held = await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 1, { what: "heavy's second request waiting for the reserve" });
  expect(a2Answer).toBeNull();
  // The reserve's price, counted (prefix_router_queue_reserve_held_total): one request held back.
  expect(held.queue!.shareReserve).toBe(1);
  const heldBefore = held.queue!.reserveHeld;
  expect(heldBefore).toBeGreaterThanOrEqual(1);
  // A third tenant, below its share, takes the kept slot at once (no queue).
  const c1Result = await acquire('c-1', 'third');
  expect(c1Result.ok).toBe(true);
  expect(c1Result.queuedMs).toBeUndefined();
  const c1 = leaseOf(c1Result);
  // The third leaves: one slot free again, but heavy still holds its share (light is in flight): still waiting.
  await stub().release(c1, { status: 200, durationMs: 1 });
  const snap = await poolSnapshot(POOL);
  expect(snap.queue?.depth.normal, 'heavy still waits while light is active and only the reserve is free').toBe(1);
  expect(a2Answer).toBeNull();
  // Held back again when the freed slot was offered to it: still one request, counted once.
  expect(snap.queue!.reserveHeld).toBe(heldBefore);
  // light leaves: heavy is alone, the pool is its share, and its waiting request is admitted.
  await stub().release(b1, { status: 200, durationMs: 1 });
  const admitted = await a2;
  expect(admitted.ok).toBe(true);
  expect(admitted.queuedMs).toBeGreaterThanOrEqual(0);
  await stub().release(a1, { status: 200, durationMs: 1 });
  await stub().release(leaseOf(admitted), { status: 200, durationMs: 1 });
  await until(() => poolSnapshot(POOL), (s) => s.leases === 0, { what: 'pool flow-share idle after the test' });
});
