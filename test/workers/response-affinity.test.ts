// The coordinator's response-id affinity (coordinator/response-affinity.ts) inside workerd: an id
// recorded with the pick pins later requests to that replica past the load bound, per tenant; an
// id the engine named itself is recorded at release; the table survives a restart, expires by
// TTL and is bounded; a removed replica is a "gone", a down one "unavailable", never another pick.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { afterAll, describe, expect, it } from 'vitest';
import { PoolCoordinator as PoolCoordinatorClass } from '../../src/index';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/pool-coordinator';
import { ResponseAffinity } from '../../src/coordinator/response-affinity';

type Stub = DurableObjectStub<PoolCoordinator>;
const touched: Stub[] = [];
function freshStub(): Stub {
  const s = env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`chat-affinity-${crypto.randomUUID()}`)) as Stub;
  touched.push(s);
  return s;
}
afterAll(async () => {
  for (const s of touched) await runInDurableObject(s, (_i, state: DurableObjectState) => state.storage.deleteAlarm());
});

const req = (over: Partial<AcquireRequest> = {}): AcquireRequest => ({ pool: 'chat', key: null, keyKind: 'none', tenant: 'acme', ...over });
const replicaOf = (r: AcquireResult): string => {
  if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
  return r.replica.id;
};

describe('response affinity in the coordinator', () => {
  it('pins to the recording replica even when it is by far the busiest; other tenants do not see the id', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), (instance) => {
      const first = instance.acquire(req({ record: { responseId: 'resp_one' } }));
      const home = replicaOf(first);
      // Pile leases on the home replica: a keyless pick would go elsewhere, the pin does not.
      const held: string[] = [];
      for (let i = 0; i < 20; i++) {
        const r = instance.acquire(req({ pin: { responseId: 'resp_one' } }));
        expect(replicaOf(r)).toBe(home);
        if (r.ok) held.push(r.leaseId);
      }
      expect(replicaOf(instance.acquire(req()))).not.toBe(home);
      expect(instance.acquire(req({ tenant: 'globex', pin: { responseId: 'resp_one' } }))).toMatchObject({ ok: false, reason: 'response_not_found' });
      expect(instance.acquire(req({ pin: { responseId: 'resp_never' } }))).toMatchObject({ ok: false, reason: 'response_not_found' });
      for (const l of held) instance.release(l, { status: 200 });
      expect(instance.snapshot('chat')!.responseAffinity).toEqual({ entries: 1, pins: { hit: 20, not_found: 2, gone: 0, unavailable: 0 } });
    });
  });

  it('an id the engine named itself is recorded at release, on the leased replica', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), (instance) => {
      const r = instance.acquire(req());
      if (!r.ok) throw new Error('no lease');
      instance.release(r.leaseId, { status: 200, responseId: 'resp_engine_named' });
      expect(replicaOf(instance.acquire(req({ pin: { responseId: 'resp_engine_named' } })))).toBe(r.replica.id);
    });
  });

  it('a removed replica is gone, a down one unavailable; neither is replaced by another', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), (instance) => {
      const a = replicaOf(instance.acquire(req({ record: { responseId: 'resp_a' } })));
      // Health poked directly, so the kept pick state (pick-state.ts) is told as a health check would.
      const internals = (instance as unknown as { state: { replicas: Array<{ id: string; activeUp: boolean }>; pickState: { invalidate(): void } } }).state;
      internals.replicas.find((r) => r.id === a)!.activeUp = false;
      internals.pickState.invalidate();
      expect(instance.acquire(req({ pin: { responseId: 'resp_a' } }))).toMatchObject({ ok: false, reason: 'pinned_replica_unavailable' });
      internals.replicas.find((r) => r.id === a)!.activeUp = true;
      internals.pickState.invalidate();
      expect(instance.removeReplica('chat', a)).toMatchObject({ ok: true });
      expect(instance.acquire(req({ pin: { responseId: 'resp_a' } }))).toMatchObject({ ok: false, reason: 'pinned_replica_gone' });
    });
  });

  it('survives a restart of the coordinator (a new instance on the same storage)', async () => {
    const stub = freshStub();
    const home = await runInDurableObject<PoolCoordinator, string>(stub, (instance) => replicaOf(instance.acquire(req({ record: { responseId: 'resp_durable' } }))));
    await runInDurableObject<PoolCoordinator, void>(stub, (_old, state) => {
      const instance = new PoolCoordinatorClass(state, env);
      expect(replicaOf(instance.acquire(req({ pin: { responseId: 'resp_durable' } })))).toBe(home);
    });
  });

  it('expires by TTL and keeps at most maxEntries, the oldest forgotten first', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), (_i, state) => {
      const table = new ResponseAffinity(state.storage.sql);
      const t0 = 1_000_000;
      table.record('acme', 'old', 'a', t0, 1000, 100);
      expect(table.lookup('acme', 'old', t0 + 999)).toBe('a');
      expect(table.lookup('acme', 'old', t0 + 1000)).toBeNull();
      for (let i = 0; i < 150; i++) table.record('acme', `id${i}`, 'b', t0 + 2000 + i, 60_000, 100);
      expect(table.size).toBe(100);
      expect(table.lookup('acme', 'id0', t0 + 3000)).toBeNull();
      expect(table.lookup('acme', 'id149', t0 + 3000)).toBe('b');
      // A retry moves an id to the replica that finally served it.
      table.record('acme', 'id149', 'c', t0 + 3000, 60_000, 100);
      expect(table.lookup('acme', 'id149', t0 + 3001)).toBe('c');
      expect(table.size).toBe(100);
    });
  });
});
