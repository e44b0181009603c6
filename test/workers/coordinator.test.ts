// PoolCoordinator inside workerd: leases, release idempotency, exclusion, tenant limits, lease
// expiry by the alarm, persistence across a restart, stats, passive and active health.
// Each test gets its own object (`idFromName` of a fresh name) bound to the "chat" pool, so
// in-memory state (leases, health) never leaks between tests; storage is per file.

import { env } from 'cloudflare:workers';
import { runDurableObjectAlarm, runInDurableObject } from 'cloudflare:test';
import { afterAll, describe, expect, it } from 'vitest';
import { PoolCoordinator as PoolCoordinatorClass } from '../../src/index';
// The test entry's class (the workers project's main): the production one plus testFault.
import type { PoolCoordinator } from '../fixtures/router-entry/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/pool-coordinator';
import { loadConfig } from '../../src/config';
import { TTFT_BUCKETS_S } from '../../src/coordinator/stats';
import type { PoolState } from '../../src/coordinator/state';
import { setOriginHealth, until } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;

/** runInDurableObject with the instance typed as our class. */
function inDO<R>(stub: Stub, fn: (instance: PoolCoordinator, state: DurableObjectState) => R | Promise<R>): Promise<R> {
  return runInDurableObject<PoolCoordinator, R>(stub, fn);
}

/** The object's in-memory state (src/coordinator/state.ts), which some tests read or set directly. */
const internals = (i: PoolCoordinator) => (i as unknown as { state: PoolState }).state;

// Every object this file touches, by name: their alarms (health checks, samples) re-arm for as
// long as the object has replicas and would outlive the file. Deleted in afterAll.
const touched = new Set<string>();
// The binding's generated type names src/index.ts's class; the object behind it is the test entry's.
const stubNamed = (name: string): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(name)) as unknown as Stub;
function stubOf(name: string): Stub {
  touched.add(name);
  return stubNamed(name);
}

let objects = 0;
function freshStub(): Stub {
  return stubOf(`chat-test-${++objects}-${crypto.randomUUID()}`);
}

afterAll(async () => {
  for (const name of touched) {
    await runInDurableObject(stubNamed(name), (_i, state: DurableObjectState) => state.storage.deleteAlarm());
  }
});

const req = (over: Partial<AcquireRequest> = {}): AcquireRequest => ({ pool: 'chat', key: 0x1234abcd, keyKind: 'header', ...over });

function leaseOf(r: AcquireResult): { leaseId: string; replica: string } {
  if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
  return { leaseId: r.leaseId, replica: r.replica.id };
}

const chatPool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('chat')!;

describe('PoolCoordinator: leases', () => {
  it('acquire picks a replica and counts it in flight; release gives it back', async () => {
    const stub = stubOf('chat');
    await inDO(stub, (instance) => {
      const res = instance.acquire(req());
      expect(res.ok).toBe(true);
      const { leaseId, replica } = leaseOf(res);
      expect(['a', 'b', 'c']).toContain(replica);
      const snap = instance.snapshot('chat')!;
      expect(snap.leases).toBe(1);
      expect(snap.replicas.find((r) => r.id === replica)!.inFlight).toBe(1);
      expect(snap.replicas.reduce((s, r) => s + r.inFlight, 0)).toBe(1);

      expect(instance.release(leaseId, { status: 200 })).toEqual({ released: true });
      const after = instance.snapshot('chat')!;
      expect(after.leases).toBe(0);
      expect(after.replicas.every((r) => r.inFlight === 0)).toBe(true);
    });
  });

  it('the same key lands on the same replica while loads are low', async () => {
    await inDO(freshStub(), (instance) => {
      const first = leaseOf(instance.acquire(req({ key: 42 })));
      instance.release(first.leaseId, { status: 200 });
      for (let i = 0; i < 5; i++) {
        const l = leaseOf(instance.acquire(req({ key: 42 })));
        expect(l.replica).toBe(first.replica);
        instance.release(l.leaseId, { status: 200 });
      }
    });
  });

  it('release is idempotent: a second release changes nothing and in-flight never goes negative', async () => {
    await inDO(freshStub(), (instance) => {
      const { leaseId, replica } = leaseOf(instance.acquire(req()));
      expect(instance.release(leaseId, { status: 200 })).toEqual({ released: true });
      expect(instance.release(leaseId, { status: 200 })).toEqual({ released: false });
      expect(instance.release('no-such-lease', { status: 200 })).toEqual({ released: false });
      const r = instance.snapshot('chat')!.replicas.find((x) => x.id === replica)!;
      expect(r.inFlight).toBe(0);
      // The second release was not counted in the stats either.
      expect(r.stats.requests).toBe(1);
    });
  });

  it('exclude skips the listed replicas', async () => {
    await inDO(freshStub(), (instance) => {
      for (let key = 1; key <= 20; key++) {
        const l = leaseOf(instance.acquire(req({ key: key * 7919, exclude: ['a', 'b'] })));
        expect(l.replica).toBe('c');
        instance.release(l.leaseId, { status: 200 });
      }
      const none = instance.acquire(req({ exclude: ['a', 'b', 'c'] }));
      expect(none).toEqual({ ok: false, reason: 'no_healthy_replica', retryAfterMs: 2000 });
    });
  });

  it('all replicas draining → no_healthy_replica', async () => {
    await inDO(freshStub(), (instance) => {
      expect(instance.acquire(req()).ok).toBe(true); // binds the object to the pool
      for (const id of ['a', 'b', 'c']) expect(instance.patchReplica('chat', id, { draining: true }).ok).toBe(true);
      expect(instance.acquire(req({ key: 99 }))).toMatchObject({ ok: false, reason: 'no_healthy_replica' });
      expect(instance.acquire(req({ key: null, keyKind: 'none' }))).toMatchObject({ ok: false, reason: 'no_healthy_replica' });
      instance.patchReplica('chat', 'b', { draining: false });
      expect(leaseOf(instance.acquire(req({ key: 99 }))).replica).toBe('b');
    });
  });

  it('with a guess (early connect) it says whether the guessed replica still takes requests there', async () => {
    await inDO(freshStub(), (instance) => {
      const guess = (id: string, url = `https://${id}.origin.test`, auth = 'bearer:ORIGIN_KEY') => ({ id, url, auth });
      const usable = (g: ReturnType<typeof guess>) => {
        const r = instance.acquire(req({ key: 4242, guess: g }));
        if (!r.ok) throw new Error(r.reason);
        instance.release(r.leaseId, { status: 200 });
        return r.guessUsable;
      };
      expect(instance.acquire(req({ key: 4242 }))).not.toHaveProperty('guessUsable'); // no guess, no answer
      expect(usable(guess('a'))).toBe(true);
      expect(usable(guess('a', 'https://moved.origin.test'))).toBe(false);
      expect(usable(guess('a', undefined, 'bearer:OTHER'))).toBe(false);
      expect(usable(guess('zz'))).toBe(false); // not in the pool
      instance.patchReplica('chat', 'b', { draining: true });
      expect(usable(guess('b'))).toBe(false);
      expect(usable(guess('c'))).toBe(true);
    });
  });

  it('an unknown pool is refused', async () => {
    await inDO(freshStub(), (instance) => {
      expect(instance.acquire(req({ pool: 'no-such-pool' }))).toMatchObject({ ok: false, reason: 'unknown_pool' });
    });
  });

  it('a tenant at its in-flight limit gets tenant_limit until one of its leases is released', async () => {
    await inDO(freshStub(), (instance) => {
      const t = { tenant: 't1', tenantMaxInFlight: 2 };
      const l1 = leaseOf(instance.acquire(req({ ...t, key: 1 })));
      leaseOf(instance.acquire(req({ ...t, key: 2 })));
      expect(instance.acquire(req({ ...t, key: 3 }))).toEqual({ ok: false, reason: 'tenant_limit', retryAfterMs: 2000 });
      // Another tenant is not affected.
      expect(instance.acquire(req({ tenant: 't2', tenantMaxInFlight: 2, key: 3 })).ok).toBe(true);
      instance.release(l1.leaseId, { status: 200 });
      expect(instance.acquire(req({ ...t, key: 3 })).ok).toBe(true);
      expect(instance.acquire(req({ ...t, key: 4 }))).toMatchObject({ ok: false, reason: 'tenant_limit' });
    });
  });
});

describe('PoolCoordinator: the alarm expires leases', () => {
  it('a lease past its deadline is freed by the alarm and counted', async () => {
    const stub = freshStub();
    const { leaseId, replica } = await inDO(stub, (instance) => {
      const l = leaseOf(instance.acquire(req({ tenant: 'tx', tenantMaxInFlight: 1 })));
      const lease = internals(instance).leases.byId.get(l.leaseId)!;
      // Lease protocol v2: a short TTL (renewed by the Worker), not maxStreamMs.
      const ttl = loadConfig(env.ROUTER_CONFIG).leaseTtlMs;
      expect(lease.deadline).toBeGreaterThan(Date.now() + ttl - 5_000);
      expect(lease.deadline).toBeLessThanOrEqual(Date.now() + ttl);
      // A Worker that died mid-stream: nobody will release this lease. Move its deadline to the past.
      lease.deadline = Date.now() - 1;
      expect(instance.snapshot('chat')!.expiredLeases).toBe(0);
      return l;
    });
    // The alarm: run now, or (on a loaded machine) the object's own first-use alarm may be the run
    // that reaps it; runDurableObjectAlarm finds none to run while that one is under way.
    await runDurableObjectAlarm(stub);
    await until(() => inDO(stub, (instance) => instance.snapshot('chat')!.expiredLeases), (n) => n > 0, { what: 'the alarm to reap the lease' });
    await inDO(stub, (instance) => {
      const snap = instance.snapshot('chat')!;
      expect(snap.expiredLeases).toBe(1);
      expect(snap.leases).toBe(0);
      expect(snap.replicas.find((r) => r.id === replica)!.inFlight).toBe(0);
      // The tenant's slot came back too, and a late release is a no-op.
      expect(instance.acquire(req({ tenant: 'tx', tenantMaxInFlight: 1 })).ok).toBe(true);
      expect(instance.release(leaseId, { status: 200 })).toEqual({ released: false });
    });
  });

  it('a lease inside its deadline survives the alarm', async () => {
    const stub = freshStub();
    const { replica } = await inDO(stub, (instance) => leaseOf(instance.acquire(req())));
    await runDurableObjectAlarm(stub);
    await inDO(stub, (instance) => {
      const snap = instance.snapshot('chat')!;
      expect(snap.expiredLeases).toBe(0);
      expect(snap.replicas.find((r) => r.id === replica)!.inFlight).toBe(1);
    });
  });
});

describe('PoolCoordinator: replicas survive a restart', () => {
  it('upsert, drain and remove are persisted and reloaded by a new instance', async () => {
    const name = `chat-restart-${crypto.randomUUID()}`;
    const stub = stubOf(name);
    const before = await inDO(stub, (instance) => {
      const up = instance.upsertReplica('chat', { id: 'd', url: 'https://d.origin.test', weight: 3, auth: 'bearer:ORIGIN_KEY' });
      expect(up).toMatchObject({ ok: true, value: { id: 'd', weight: 3, draining: false } });
      expect(instance.patchReplica('chat', 'b', { draining: true, weight: 2 })).toMatchObject({ ok: true, value: { id: 'b', draining: true, weight: 2 } });
      expect(instance.removeReplica('chat', 'c')).toEqual({ ok: true, value: { id: 'c', inFlight: 0 } });
      expect(instance.removeReplica('chat', 'c')).toMatchObject({ ok: false, reason: 'not_found' });
      // A lease is soft state (memory only): the restarted instance must not have it.
      leaseOf(instance.acquire(req()));
      expect(instance.snapshot('chat')!.leases).toBe(1);
      return instance.snapshot('chat')!.replicas.map(({ id, url, weight, auth, draining }) => ({ id, url, weight, auth, draining }));
    });
    expect(before).toEqual([
      { id: 'a', url: 'https://a.origin.test', weight: 1, auth: 'bearer:ORIGIN_KEY', draining: false },
      { id: 'b', url: 'https://b.origin.test', weight: 2, auth: 'bearer:ORIGIN_KEY', draining: true },
      { id: 'd', url: 'https://d.origin.test', weight: 3, auth: 'bearer:ORIGIN_KEY', draining: false },
    ]);

    // A restart: a new instance of the class on the same storage, as the runtime builds one after
    // an eviction or a deploy. (abortAllDurableObjects() here tore down an alarm running its health
    // checks, whose rejection hung the next test file in the pool on a 2-core machine.)
    await inDO(stub, (old, state) => {
      const instance = new PoolCoordinatorClass(state, env);
      expect(old.snapshot('chat')!.leases).toBe(1);
      expect(instance.snapshot('chat')!.leases).toBe(0);
      const after = instance.snapshot('chat')!.replicas.map(({ id, url, weight, auth, draining }) => ({ id, url, weight, auth, draining }));
      expect(after).toEqual(before);
      // And the reloaded state is what routing uses: b is draining, c is gone.
      for (let key = 1; key <= 30; key++) {
        const l = leaseOf(instance.acquire(req({ key: key * 104729 })));
        expect(['a', 'd']).toContain(l.replica);
        instance.release(l.leaseId, { status: 200 });
      }
    });
  });

  it('rejects invalid replicas without changing anything', async () => {
    await inDO(freshStub(), (instance) => {
      for (const bad of [
        { id: 'x', url: 'http://10.0.0.1' },
        { id: 'x', url: 'https://x.origin.test', weight: 0 },
        { id: 'bad id!', url: 'https://x.origin.test' },
        { id: 'x', url: 'https://x.origin.test', auth: 'bearer:lowercase' },
      ]) {
        expect(instance.upsertReplica('chat', bad)).toMatchObject({ ok: false, reason: 'invalid' });
      }
      expect(instance.upsertReplica('other-pool', { id: 'x', url: 'https://x.origin.test' })).toMatchObject({ ok: false, reason: 'unknown_pool' });
      expect(instance.patchReplica('chat', 'a', { weight: 300 })).toMatchObject({ ok: false, reason: 'invalid' });
      expect(instance.snapshot('chat')!.replicas.map((r) => [r.id, r.weight])).toEqual([
        ['a', 1],
        ['b', 1],
        ['c', 1],
      ]);
    });
  });
});

describe('PoolCoordinator: stats', () => {
  it('a release outcome updates the replica stats and the TTFT histogram', async () => {
    await inDO(freshStub(), (instance) => {
      const l1 = leaseOf(instance.acquire(req({ exclude: ['b', 'c'] })));
      expect(l1.replica).toBe('a');
      instance.release(l1.leaseId, { status: 200, ttftMs: 120, durationMs: 900, promptTokens: 1000, cachedTokens: 768, completionTokens: 40 });
      const l2 = leaseOf(instance.acquire(req({ exclude: ['b', 'c'] })));
      instance.release(l2.leaseId, { status: 200, ttftMs: 3000, durationMs: 5000, promptTokens: 200, cachedTokens: null, completionTokens: 10 });
      const l3 = leaseOf(instance.acquire(req({ exclude: ['b', 'c'] })));
      instance.release(l3.leaseId, { status: 0, error: 'client_abort', durationMs: 10 });

      const a = instance.snapshot('chat')!.replicas.find((r) => r.id === 'a')!;
      expect(a.stats).toMatchObject({
        requests: 3,
        byStatus: { '200': 2, '0': 1 },
        errors: 0,
        clientAborts: 1,
        promptTokens: 1200,
        cachedTokens: 768,
        completionTokens: 50,
        usageReports: 2,
        // The second request's engine sent no cached-token figure: unknown, left out of the hit
        // rate (768 / 1000, not 768 / 1200) and counted (issue #26 item 3).
        cacheReportedPromptTokens: 1000,
        requestsWithoutCacheReport: 1,
      });
      expect(a.stats.ttft.count).toBe(2);
      expect(a.stats.ttft.sum).toBeCloseTo(3.12, 6);
      const expected = new Array(TTFT_BUCKETS_S.length + 1).fill(0);
      expected[TTFT_BUCKETS_S.indexOf(0.25)] = 1; // 0.12 s: (0.1, 0.25]
      expected[TTFT_BUCKETS_S.indexOf(5)] = 1; // 3 s: (2.5, 5]
      expect(a.stats.ttft.counts).toEqual(expected);
      // Other replicas are untouched.
      expect(instance.snapshot('chat')!.replicas.filter((r) => r.id !== 'a').every((r) => r.stats.requests === 0)).toBe(true);
    });
  });
});

describe('PoolCoordinator: passive health', () => {
  it('maxFails failures within the window take a replica out for failTimeoutMs', async () => {
    const pool = chatPool();
    expect(pool.maxFails).toBe(3);
    await inDO(freshStub(), (instance) => {
      const onA = () => leaseOf(instance.acquire(req({ exclude: ['b', 'c'] })));
      const healthyA = () => instance.snapshot('chat')!.replicas.find((r) => r.id === 'a')!;
      instance.release(onA().leaseId, { status: 0, error: 'connect' });
      instance.release(onA().leaseId, { status: 503, error: 'upstream_5xx' });
      // A success and a client abort do not count as failures.
      instance.release(onA().leaseId, { status: 200 });
      instance.release(onA().leaseId, { status: 0, error: 'client_abort' });
      expect(healthyA().healthy).toBe(true);
      expect(healthyA().passiveDownUntil).toBe(0);

      const before = Date.now();
      instance.release(onA().leaseId, { status: 503 });
      const a = healthyA();
      expect(a.healthy).toBe(false);
      expect(a.activeUp).toBe(true); // passive, not active
      expect(a.passiveDownUntil).toBeGreaterThanOrEqual(before + pool.failTimeoutMs);
      expect(a.stats.errors).toBe(3);
      // Out of rotation: anything else avoids it.
      for (let key = 1; key <= 20; key++) {
        const l = leaseOf(instance.acquire(req({ key: key * 31337 })));
        expect(l.replica).not.toBe('a');
        instance.release(l.leaseId, { status: 200 });
      }
      // Passive exclusion is soft: as the only replica left (b and c excluded by a retry) it is
      // still tried rather than failing the request; not once its active check is down too.
      const last = leaseOf(instance.acquire(req({ exclude: ['b', 'c'] })));
      expect(last.replica).toBe('a');
      instance.release(last.leaseId, { status: 200 });
      // Health poked directly: tell the kept pick state (pick-state.ts), as a health check does.
      const state = internals(instance);
      state.replicas.find((r) => r.id === 'a')!.activeUp = false;
      state.pickState.invalidate();
      expect(instance.acquire(req({ exclude: ['b', 'c'] }))).toMatchObject({ ok: false, reason: 'no_healthy_replica' });
    });
  });
});

describe('PoolCoordinator: active health checks from the alarm', () => {
  it('a replica whose /health fails `fall` times goes down, and comes back after `rise` successes', async () => {
    const pool = chatPool();
    expect([pool.fall, pool.rise]).toEqual([2, 2]);
    const host = `flaky-coord-${crypto.randomUUID().slice(0, 8)}.origin.test`;
    await setOriginHealth(host, 200);
    const stub = freshStub();
    await inDO(stub, (instance) => {
      expect(instance.upsertReplica('chat', { id: 'f', url: `https://${host}`, auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
      // Keep the self-firing alarm from running a round of its own: rounds happen only below.
      internals(instance).alarm.nextHealthAt = Date.now() + 3_600_000;
    });
    const lastCheckOfF = () => inDO(stub, (instance) => instance.snapshot('chat')!.replicas.find((r) => r.id === 'f')!.lastCheckAt);
    /**
     * Make the next alarm run a health round, run it, and return f's state. The alarm also fires by
     * itself (samples), and on a loaded machine may be running just then (runDurableObjectAlarm
     * then finds none to run): whichever alarm runs the round, wait for f's check to land.
     */
    const round = async () => {
      const before = await lastCheckOfF();
      await inDO(stub, (instance) => {
        internals(instance).alarm.nextHealthAt = 0;
      });
      await inDO(stub, (_i, state) => state.storage.setAlarm(Date.now()));
      await runDurableObjectAlarm(stub);
      await until(lastCheckOfF, (at) => at > before, { what: 'a health round to check f' });
      return inDO(stub, (instance) => {
        const f = instance.snapshot('chat')!.replicas.find((r) => r.id === 'f')!;
        const onlyF = instance.acquire(req({ exclude: ['a', 'b', 'c'] }));
        if (onlyF.ok) instance.release(onlyF.leaseId, { status: 200 });
        return { healthy: f.healthy, activeUp: f.activeUp, lastCheckError: f.lastCheckError, lastCheckAt: f.lastCheckAt, routable: onlyF.ok };
      });
    };

    expect(await round()).toMatchObject({ healthy: true, routable: true, lastCheckError: null });
    await setOriginHealth(host, 503);
    expect(await round()).toMatchObject({ healthy: true, routable: true, lastCheckError: 'status 503' }); // 1 < fall
    const down = await round();
    expect(down).toMatchObject({ healthy: false, activeUp: false, routable: false, lastCheckError: 'status 503' });
    expect(down.lastCheckAt).toBeGreaterThan(0);

    await setOriginHealth(host, 200);
    expect(await round()).toMatchObject({ healthy: false, routable: false, lastCheckError: null }); // 1 < rise
    expect(await round()).toMatchObject({ healthy: true, activeUp: true, routable: true });

    // The probe carried the origin's credentials.
    const probes = await (await fetch(`https://control.origin.test/requests?host=${host}`)).json<{ requests: { path: string; headers: Record<string, string> }[] }>();
    const healthProbes = probes.requests.filter((p) => p.path === '/health');
    expect(healthProbes.length).toBeGreaterThanOrEqual(5);
    for (const p of healthProbes) {
      expect(p.headers.authorization).toBe(`Bearer ${(env as unknown as { ORIGIN_KEY: string }).ORIGIN_KEY}`);
    }
  });

  it('checkHealth can also be run directly: a replica answering 503 goes down after fall rounds', async () => {
    const stub = freshStub();
    await inDO(stub, async (instance) => {
      internals(instance).alarm.nextHealthAt = Date.now() + 3_600_000;
      // 503 on /health from the fail503 host.
      expect(instance.upsertReplica('chat', { id: 'g', url: 'https://fail503-coord.origin.test', auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
      const pool = chatPool();
      await instance.checkHealth(pool);
      expect(instance.snapshot('chat')!.replicas.find((r) => r.id === 'g')!.healthy).toBe(true);
      await instance.checkHealth(pool);
      const g = instance.snapshot('chat')!.replicas.find((r) => r.id === 'g')!;
      expect(g).toMatchObject({ healthy: false, lastCheckError: 'status 503' });
      // The healthy ones stayed up.
      expect(instance.snapshot('chat')!.replicas.filter((r) => r.id !== 'g').every((r) => r.healthy)).toBe(true);
    });
  });
});

describe('PoolCoordinator: lease protocol v2 (renewals, batched releases, restart recovery)', () => {
  const v2 = (over: Partial<AcquireRequest> = {}): AcquireRequest => req({ viewVersion: '', ...over });
  const renewalOf = (r: AcquireResult, tenant = '') => {
    if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
    return { id: r.leaseId, replica: r.replica.id, tenant, deadline: r.deadline, startedAt: Date.now(), spilled: r.spilled };
  };

  it('a renewal pushes the deadline one TTL out; a lease whose renewals stop is reaped within one TTL', async () => {
    const stub = freshStub();
    const ttl = loadConfig(env.ROUTER_CONFIG).leaseTtlMs;
    const a = await stub.acquire(v2({ key: 1 }));
    const b = await stub.acquire(v2({ key: 2 }));
    // Both leases' deadlines go back in time (as if TTL had nearly passed); only `a` is renewed.
    await inDO(stub, (i) => {
      for (const l of internals(i).leases.byId.values()) l.deadline = Date.now() + 50;
    });
    const res = await stub.settle('chat', { releases: [], renew: [renewalOf(a)] });
    expect(res).toMatchObject({ renewed: 1, restored: 0, gone: [] });
    expect(res.deadline).toBeGreaterThan(Date.now() + ttl - 5_000);
    await new Promise((r) => setTimeout(r, 60));
    await inDO(stub, (_i, state) => state.storage.setAlarm(Date.now()));
    await runDurableObjectAlarm(stub);
    const snap = (await stub.snapshot('chat'))!;
    expect(snap.leases).toBe(1);
    expect(snap.expiredLeases).toBe(1);
    expect(renewalOf(a).id).not.toBe(renewalOf(b).id);
    expect(await inDO(stub, (i) => [...internals(i).leases.byId.keys()])).toEqual([renewalOf(a).id]);
  });

  it('releases riding on an acquire are applied before its pick: a tenant at its cap gets the slot it just freed', async () => {
    const stub = freshStub();
    const first = await stub.acquire(v2({ tenant: 'cap1', tenantMaxInFlight: 1 }));
    expect(first.ok).toBe(true);
    expect((await stub.acquire(v2({ tenant: 'cap1', tenantMaxInFlight: 1 }))).ok).toBe(false);
    const second = await stub.acquire(v2({ tenant: 'cap1', tenantMaxInFlight: 1, settle: { releases: [{ id: renewalOf(first).id, outcome: { status: 200 }, tenant: 'cap1' }] } }));
    expect(second.ok).toBe(true);
    if (second.ok) expect(second.settled).toMatchObject({ released: 1 });
    const snap = (await stub.snapshot('chat'))!;
    expect(snap.leases).toBe(1);
    expect(snap.replicas.reduce((s, r) => s + r.stats.requests, 0)).toBe(1);
    // One acquire carried the release: three acquires, no release call.
    expect(snap.lease!.rpcs).toMatchObject({ acquire: 3 });
    expect(snap.lease!.rpcs.release).toBeUndefined();
  });

  it('a renewal that crossed its own release does not bring the lease back (tombstone)', async () => {
    const stub = freshStub();
    const a = await stub.acquire(v2());
    await stub.settle('chat', { releases: [{ id: renewalOf(a).id, outcome: { status: 200 } }] });
    const res = await stub.settle('chat', { releases: [], renew: [renewalOf(a)] });
    expect(res).toMatchObject({ renewed: 0, restored: 0, gone: [renewalOf(a).id] });
    expect((await stub.snapshot('chat'))!.leases).toBe(0);
  });

  it('the first v2 acquire gets the replica set for failing open, and not again while it holds that version', async () => {
    const stub = freshStub();
    const first = await stub.acquire(v2());
    expect(first.ok && first.view?.replicas.map((r) => r.id)).toEqual(['a', 'b', 'c']);
    const version = first.ok ? first.view!.version : '';
    const again = await stub.acquire(v2({ viewVersion: version }));
    expect(again.ok && again.view).toBeUndefined();
    expect(again.ok && again.epoch).toBe(first.ok && first.epoch);
  });

  it('after a restart, renewals rebuild in-flight per replica and per tenant, and the tenant cap holds meanwhile', async () => {
    const name = `chat-restart-${crypto.randomUUID()}`;
    const stub = stubOf(name);
    const cap = { tenant: 'capped', tenantMaxInFlight: 3 };
    const held = [];
    for (let k = 0; k < 3; k++) held.push(await stub.acquire(v2({ ...cap, key: 100 + k })));
    const other = await stub.acquire(v2({ key: 999, tenant: 'other' }));
    const before = (await stub.snapshot('chat'))!;
    const epoch = before.lease!.epoch;
    const perReplica = Object.fromEntries(before.replicas.map((r) => [r.id, r.inFlight]));
    expect(Object.values(perReplica).reduce((s, n) => s + n, 0)).toBe(4);

    // Restart: the object is reset by the runtime; its memory (leases, counts) is gone.
    expect(await stub.testFault('chat', { abort: true })).toEqual({ ok: true });
    // The reset comes just after the answer, on the object's own timer: wait until a fresh stub
    // reaches the new instance (a call that lands on the old one sees the old epoch, or fails).
    const after = await until(
      () => stubNamed(name).snapshot('chat').then((s) => s!, () => null),
      (s) => s !== null && s.lease!.epoch !== epoch,
      { what: `the object ${name} to come back with a new epoch after its reset` },
    ).then((s) => s!);
    const fresh = stubNamed(name);
    expect(after.lease!.epoch).not.toBe(epoch);
    expect(after.leases).toBe(0);
    expect(after.lease!.recoveryUntil).toBeGreaterThan(Date.now());
    // Before any renewal: the tenant still counts its 3 (persisted floor), so a 4th is refused.
    expect(await fresh.acquire(v2({ ...cap, key: 200 }))).toMatchObject({ ok: false, reason: 'tenant_limit' });

    // One isolate's renewal brings everything back.
    const res = await fresh.settle('chat', { releases: [], renew: [...held.map((h) => renewalOf(h, 'capped')), renewalOf(other, 'other')] });
    expect(res).toMatchObject({ restored: 4, renewed: 0, gone: [] });
    const rebuilt = (await fresh.snapshot('chat'))!;
    expect(Object.fromEntries(rebuilt.replicas.map((r) => [r.id, r.inFlight]))).toEqual(perReplica);
    expect(rebuilt.lease!.restoredLeases).toBe(4);
    expect(await fresh.acquire(v2({ ...cap, key: 201 }))).toMatchObject({ ok: false, reason: 'tenant_limit' });
    // Releasing one of the rebuilt leases frees a slot for the tenant.
    await fresh.settle('chat', { releases: [{ id: renewalOf(held[0]!).id, outcome: { status: 200 }, tenant: 'capped' }] });
    expect((await fresh.acquire(v2({ ...cap, key: 202 }))).ok).toBe(true);
  });

  it('the in-place restart hook (the fault run\'s) drops memory like a reset: new epoch, no leases, renewals restore them', async () => {
    const stub = freshStub();
    const a = await stub.acquire(v2({ tenant: 'ip', tenantMaxInFlight: 1 }));
    const epoch = (await stub.snapshot('chat'))!.lease!.epoch;
    expect(await stub.testFault('chat', { restart: true })).toEqual({ ok: true });
    const after = (await stub.snapshot('chat'))!;
    expect(after.lease!.epoch).not.toBe(epoch);
    expect(after.leases).toBe(0);
    expect(after.replicas.every((r) => r.inFlight === 0)).toBe(true);
    expect(await stub.acquire(v2({ tenant: 'ip', tenantMaxInFlight: 1 }))).toMatchObject({ ok: false, reason: 'tenant_limit' });
    expect(await stub.settle('chat', { releases: [], renew: [renewalOf(a, 'ip')] })).toMatchObject({ restored: 1 });
    expect((await stub.snapshot('chat'))!.replicas.find((r) => r.id === renewalOf(a).replica)!.inFlight).toBe(1);
  });

  it('fallback reports are running totals per isolate: one delivered twice counts once', async () => {
    const stub = freshStub();
    await stub.settle('chat', { releases: [], fallbacks: { isolate: 'iso-a', total: 3 } });
    await stub.settle('chat', { releases: [], fallbacks: { isolate: 'iso-a', total: 3 } });
    await stub.settle('chat', { releases: [], fallbacks: { isolate: 'iso-b', total: 2 } });
    await stub.settle('chat', { releases: [], fallbacks: { isolate: 'iso-a', total: 5 } });
    const lease = (await stub.snapshot('chat'))!.lease!;
    expect(lease.fallbacks).toBe(7);
    expect(lease.lastFallbackAt).toBeGreaterThan(0);
  });

  it('a test outage (the fault coordinator of the test entry) makes every lease RPC fail until it ends', async () => {
    const stub = freshStub();
    // Long enough that the calls below never outlive it however slow the machine; then it is
    // shortened to end on its own, and the first acquire after its end succeeds.
    expect(await stub.testFault('chat', { outageMs: 60_000 })).toEqual({ ok: true });
    const failure = async (p: () => Promise<unknown>) => {
      try {
        await p();
        return 'ok';
      } catch (e) {
        return (e as Error).message;
      }
    };
    expect(await failure(() => stub.acquire(v2()))).toMatch(/unavailable/);
    expect(await failure(() => stub.settle('chat', { releases: [] }))).toMatch(/unavailable/);
    expect(await stub.testFault('chat', { outageMs: 50 })).toEqual({ ok: true });
    const after = await until(
      () => failure(() => stub.acquire(v2()).then((r) => expect(r.ok).toBe(true))),
      (m) => !/unavailable/.test(m),
      { what: 'the 50 ms outage to end' },
    );
    expect(after).toBe('ok');
  });
});

describe('PoolCoordinator: health-check pacing', () => {
  it('runLimited keeps at most `limit` tasks in progress and runs them all', async () => {
    const { runLimited } = await import('../../src/coordinator/origin-fetch');
    let running = 0;
    let peak = 0;
    const done: number[] = [];
    const tasks = Array.from({ length: 10 }, (_, i) => async () => {
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 5));
      running--;
      done.push(i);
      if (i === 3) throw new Error('one task fails; the rest still run');
    });
    await runLimited(tasks, 3);
    expect(peak).toBe(3);
    expect(done.sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  });

  it('readCapped stops at the cap and cancels the rest of the body', async () => {
    const { readCapped } = await import('../../src/coordinator/origin-fetch');
    let cancelled = false;
    let pulls = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        pulls++;
        c.enqueue(new TextEncoder().encode('x'.repeat(1000)));
      },
      cancel() {
        cancelled = true;
      },
    });
    const text = await readCapped(new Response(body), 2500);
    expect(text.length).toBe(2500);
    expect(cancelled).toBe(true);
    expect(pulls).toBeLessThan(10);
  });

  it('a health round over many replicas is spread over ticks of at most healthConcurrency probes', async () => {
    const stub = freshStub();
    const pool = chatPool();
    expect(pool.healthConcurrency).toBe(4);
    await inDO(stub, (instance) => {
      for (let i = 0; i < 7; i++) expect(instance.upsertReplica('chat', { id: `h${i}`, url: `https://h${i}.origin.test`, auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
    });
    const checkedNow = () => inDO(stub, (i) => i.snapshot('chat')!.replicas.filter((r) => r.lastCheckAt > 0).map((r) => r.id));
    /**
     * The probes of a tick finish after the alarm handler was started (it may also fire by itself):
     * wait for them. The tick's slice is taken at once when it starts, so the cursor says how many
     * replicas it took, whether or not a surplus probe would have landed yet.
     */
    const checked = async (atLeast: number) => {
      await until(checkedNow, (ids) => ids.length >= atLeast, { what: `${atLeast} replicas health-checked` });
      expect(await inDO(stub, (i) => internals(i).alarm.cursors.health)).toBe(atLeast);
      return checkedNow();
    };
    const tick = async () => {
      await inDO(stub, (i) => {
        const x = internals(i).alarm;
        x.nextHealthAt = 0;
        x.nextScrapeAt = Date.now() + 3_600_000;
      });
      await inDO(stub, (_i, state) => state.storage.setAlarm(Date.now()));
      await runDurableObjectAlarm(stub);
    };
    // Forget the round the object ran when it loaded: count only the ticks below.
    await inDO(stub, (i) => {
      for (const r of internals(i).replicas) r.lastCheckAt = 0;
      internals(i).alarm.cursors.health = 0;
    });
    await tick();
    // 10 replicas, 4 at a time: 3 ticks of 4, 4 and 2.
    expect(await checked(4)).toHaveLength(4);
    await tick();
    expect(await checked(8)).toHaveLength(8);
    await tick();
    expect(await checked(10)).toHaveLength(10);
    const next = await inDO(stub, (i) => internals(i).alarm.nextHealthAt);
    // The round is complete: the next starts one interval after this one began.
    expect(next).toBeGreaterThan(Date.now() + pool.healthIntervalMs - 60_000);
  });
});

describe('PoolCoordinator: the alarm survives a failed setAlarm', () => {
  it('a setAlarm that throws is retried: the next alarm is still armed', async () => {
    const stub = freshStub();
    await inDO(stub, (i) => void i.snapshot('chat'));
    const armed = await inDO(stub, async (instance, state) => {
      const storage = state.storage as unknown as { setAlarm: (t: number) => Promise<void> };
      const original = storage.setAlarm.bind(storage);
      let failures = 0;
      try {
        storage.setAlarm = async (t: number) => {
          if (failures++ === 0) throw new Error('storage overloaded (test)');
          return original(t);
        };
      } catch {
        return 'not patchable';
      }
      await state.storage.deleteAlarm();
      await instance.alarm();
      storage.setAlarm = original;
      return { failures, alarm: await state.storage.getAlarm() };
    });
    if (armed === 'not patchable') return;
    expect(armed.failures).toBeGreaterThanOrEqual(2);
    expect(armed.alarm).not.toBeNull();
  });
});
