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

  it("a response its replica answered store: false for is marked at release: a later pin is response_not_stored, counted on the replica; other tenants still see nothing", async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), (instance) => {
      const r = instance.acquire(req({ record: { responseId: 'resp_off' } }));
      if (!r.ok) throw new Error('no lease');
      instance.release(r.leaseId, { status: 200, notStored: 'resp_off' });
      expect(instance.acquire(req({ pin: { responseId: 'resp_off' } }))).toMatchObject({ ok: false, reason: 'response_not_stored' });
      expect(instance.acquire(req({ tenant: 'globex', pin: { responseId: 'resp_off' } }))).toMatchObject({ ok: false, reason: 'response_not_found' });
      const snap = instance.snapshot('chat')!;
      expect(snap.replicas.find((x) => x.id === r.replica.id)!.stats.responsesNotStored).toBe(1);
      // Recorded again (a new response with that id, or a retry) it is stored until said otherwise.
      instance.acquire(req({ record: { responseId: 'resp_off' } }));
      expect(replicaOf(instance.acquire(req({ pin: { responseId: 'resp_off' } })))).toBeTruthy();
    });
  });

  it('a table made before the stored column gets it, every old row stored', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), (_i, state) => {
      const sql = state.storage.sql;
      sql.exec('DROP TABLE IF EXISTS response_affinity');
      sql.exec('CREATE TABLE response_affinity (tenant TEXT NOT NULL, id TEXT NOT NULL, replica TEXT NOT NULL, expires INTEGER NOT NULL, PRIMARY KEY (tenant, id))');
      sql.exec("INSERT INTO response_affinity VALUES ('acme', 'resp_old', 'a', 9999999999999)");
      const table = new ResponseAffinity(sql);
      expect(table.find('acme', 'resp_old', 0)).toEqual({ replica: 'a', stored: true });
      table.markNotStored('acme', 'resp_old');
      expect(table.find('acme', 'resp_old', 0)).toEqual({ replica: 'a', stored: false });
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
