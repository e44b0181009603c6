// The coordinator's kept pick inputs (src/coordinator/pick-state.ts): random sequences of
// acquire, release, settle (releases, renewals, restores after a restart), lease expiry, active
// health, passive failures and their timeout, engine-queue scrapes, drain, weight, add, remove
// and replace, on a pool with every input the views depend on (bounded-hash, inflight+waiting,
// a per-replica cap). After each step the kept views and totals must equal a fresh
// recomputation from the replicas, and picks with the kept totals must equal picks without.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
// The test entry's class (the workers project's main): the production one plus testFault.
import type { PoolCoordinator } from '../fixtures/router-entry/index';
import type { AcquireResult, LeaseRelease, LeaseRenewal } from '../../src/coordinator/pool-coordinator';
import { loadConfig } from '../../src/config';
import { createStrategy, pickReplica, seededRandom, weightSums, type PoolTotals } from '../../src/core';
import { poolConfig, type PoolState } from '../../src/coordinator/state';
import { views } from '../../src/coordinator/replicas';
import { expireLeases } from '../../src/coordinator/leases';
import { ROUTER_CONFIG } from '../fixtures/workers/test-env';
import { withOriginFetch } from '../helpers/workers';

const HOUR = 3_600_000;
const POOL = 'kept-totals';
const FAIL_TIMEOUT_MS = 100;
const auth = 'bearer:ORIGIN_KEY';
const replica = (id: string, weight = 1) => ({ id, url: `https://${id}.origin.test`, auth, weight });

/** The test configuration plus one pool whose views depend on everything they can depend on. */
const CONFIG = {
  ...ROUTER_CONFIG,
  pools: [
    ...ROUTER_CONFIG.pools,
    {
      name: POOL,
      models: ['kept-totals-model'],
      strategy: 'bounded-hash:1.25',
      fallback: 'least-load',
      loadSignal: 'inflight+waiting',
      maxInFlightPerReplica: 4,
      healthIntervalMs: HOUR,
      scrapeIntervalMs: HOUR,
      fall: 1,
      rise: 1,
      maxFails: 2,
      failWindowMs: HOUR,
      failTimeoutMs: FAIL_TIMEOUT_MS,
      replicas: [replica('k1', 1), replica('k2', 2), replica('k3', 1), replica('k4', 3), replica('k5', 1)],
    },
  ],
};

interface Internals {
  state: PoolState;
}

const STRATEGIES = ['bounded-hash:1.25', 'bounded-hash:1.5:2', 'prefix-aware:1.25:3', 'least-load'].map(createStrategy);
const FALLBACK = createStrategy('least-load');

/** How many checks saw each state the views depend on (the sequences must reach them all). */
const seen = { loaded: 0, passiveFallback: 0, atCap: 0, passive: 0, down: 0, queued: 0, restored: 0, expired: 0, removedWithLeases: 0, readdedWithLeases: 0 };

/** Kept views and totals against a fresh recomputation, and picks with and without the totals. */
function check(s: Internals, step: string, rnd: () => number): void {
  const pool = poolConfig(s.state, POOL)!;
  const now = Date.now();
  const kept = s.state.pickState.current(s.state.replicas as never, pool, now);
  const totals: PoolTotals = s.state.pickState.totals;
  const fresh = views(s.state, now, pool, false);
  expect(kept, step).toEqual(fresh);
  const live = s.state.replicas as unknown as { draining: boolean; inFlight: number; activeUp: boolean; passiveDownUntil: number; vllm: { waiting: number | null } }[];
  if (live.some((r) => r.inFlight >= 2)) seen.loaded++;
  if (live.some((r) => !r.draining && r.inFlight >= pool.maxInFlightPerReplica!)) seen.atCap++;
  if (live.some((r) => r.activeUp && r.passiveDownUntil > now)) seen.passive++;
  if (live.some((r) => !r.activeUp)) seen.down++;
  if (live.some((r) => (r.vllm.waiting ?? 0) > 0 && r.inFlight > 0)) seen.queued++;
  expect(kept.map((v) => v.id), step).toEqual([...s.state.ring.ids]);
  expect(totals.used, step).toBe(fresh.reduce((a, v) => a + v.inFlight, 0));
  const sums = weightSums(fresh);
  expect(totals.weights.totalWeight, step).toBe(sums.totalWeight);
  expect([...totals.weights.cum.subarray(0, fresh.length)], step).toEqual([...sums.cum]);
  for (let k = 0; k < 8; k++) {
    const key = k === 0 ? null : Math.floor(rnd() * 2 ** 32);
    const seed = Math.floor(rnd() * 2 ** 31);
    const matched = Int32Array.from(fresh, () => Math.floor(rnd() * 5) - 1);
    const exclude = rnd() < 0.2 && fresh.length > 0 ? new Set([fresh[Math.floor(rnd() * fresh.length)]!.id]) : undefined;
    for (const strategy of STRATEGIES) {
      const base = { ring: s.state.ring, key, exclude, cursor: 0, prefixMatch: { blocks: 4, matched } };
      const withTotals = pickReplica(strategy, FALLBACK, { ...base, replicas: kept, totals, random: seededRandom(seed) });
      const without = pickReplica(strategy, FALLBACK, { ...base, replicas: fresh, random: seededRandom(seed) });
      expect(withTotals, `${step}: ${strategy.name}`).toEqual(without);
    }
  }
}

/** Run `fn` with the object's fetch answered per host (health checks, metrics scrapes). */
/** The isolate's fetch answered by replica (the host's first label) and path. */
const withFetch = (answer: (host: string, path: string) => Response, fn: () => Promise<void>): Promise<void> => withOriginFetch((u) => answer(u.hostname.split('.')[0]!, u.pathname), fn, 2);

const metrics = (waiting: number, running: number) =>
  ['# TYPE vllm:num_requests_waiting gauge', `vllm:num_requests_waiting{model_name="kept-totals-model"} ${waiting}`, '# TYPE vllm:num_requests_running gauge', `vllm:num_requests_running{model_name="kept-totals-model"} ${running}`].join('\n') + '\n';

async function runSequence(seed: number, steps: number): Promise<void> {
  // The binding's generated type names src/index.ts's class; the object behind it is the test entry's.
  const stub = env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`kept-totals-${seed}-${crypto.randomUUID()}`)) as unknown as DurableObjectStub<PoolCoordinator>;
  await runInDurableObject<PoolCoordinator, void>(stub, async (instance, state) => {
    const s = instance as unknown as Internals;
    // This object reads the configuration above (bound before its first call picks its pool).
    s.state.env = { ...s.state.env, ROUTER_CONFIG: CONFIG as unknown as Env['ROUTER_CONFIG'] };
    const rnd = seededRandom(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
    const held: { id: string; replica: string; tenant: string }[] = [];
    const ids = () => s.state.replicas.map((r) => r.id);
    let added = 0;
    const removed: string[] = [];
    try {
      expect(instance.snapshot(POOL)).not.toBeNull();
      check(s, 'start', rnd);
      for (let n = 0; n < steps; n++) {
        const x = rnd();
        let step: string;
        if (x < 0.3) {
          const tenant = pick(['', 'acme', 'basic']);
          const key = rnd() < 0.15 ? null : Math.floor(rnd() * 16);
          const exclude = rnd() < 0.1 ? [pick(ids())] : undefined;
          // The pick acquire makes, made here without kept totals over fresh views, with the
          // same random source (passive exclusions ignored when they leave nothing, as acquire does).
          const seed = Math.floor(rnd() * 2 ** 31);
          const pool = poolConfig(s.state, POOL)!;
          const now = Date.now();
          const random = seededRandom(seed);
          const ctx = { ring: s.state.ring, key, exclude: exclude ? new Set(exclude) : undefined, random, cursor: s.state.leases.cursor };
          let expected = pickReplica(pool.strategyImpl, pool.fallbackImpl, { ...ctx, replicas: views(s.state, now, pool, false) });
          if (!expected.ok && (s.state.replicas as unknown as { activeUp: boolean; passiveDownUntil: number }[]).some((r) => r.activeUp && r.passiveDownUntil > now)) {
            expected = pickReplica(pool.strategyImpl, pool.fallbackImpl, { ...ctx, replicas: views(s.state, now, pool, true) });
            seen.passiveFallback++;
          }
          const realRandom = Math.random;
          Math.random = seededRandom(seed);
          let res: AcquireResult;
          try {
            res = instance.acquire({ pool: POOL, key, keyKind: 'header', tenant, ...(exclude ? { exclude } : {}) });
          } finally {
            Math.random = realRandom;
          }
          expect(res.ok ? { ok: true, replica: res.replica.id, spilled: res.spilled, steps: res.steps } : { ok: false, reason: res.reason }, `acquire at step ${n}`).toEqual(
            expected.ok ? { ok: true, replica: expected.replica, spilled: expected.spilled, steps: expected.steps } : { ok: false, reason: expected.reason },
          );
          if (res.ok) held.push({ id: res.leaseId, replica: res.replica.id, tenant });
          step = `acquire → ${res.ok ? res.replica.id : res.reason}`;
        } else if (x < 0.5) {
          if (held.length === 0) continue;
          const l = held.splice(Math.floor(rnd() * held.length), 1)[0]!;
          // A failure (5xx) counts towards the replica's passive exclusion (maxFails 2).
          const failed = rnd() < 0.35;
          instance.release(l.id, failed ? { status: 503, error: 'upstream_5xx' } : { status: 200, ttftMs: 20, promptTokens: 10, cachedTokens: 5 });
          step = `release ${l.replica}${failed ? ' (503)' : ''}`;
        } else if (x < 0.58) {
          // Lease protocol v2: some releases, every lease still held renewed (restored if unknown, as after a restart).
          const releases: LeaseRelease[] = [];
          while (held.length > 0 && rnd() < 0.4) {
            const l = held.splice(Math.floor(rnd() * held.length), 1)[0]!;
            releases.push({ id: l.id, outcome: { status: 200 }, tenant: l.tenant });
          }
          const renew: LeaseRenewal[] = held.map((l) => ({ id: l.id, replica: l.replica, tenant: l.tenant, spilled: false, startedAt: Date.now(), deadline: Date.now() }));
          const r = instance.settle(POOL, { releases, renew });
          step = `settle: ${r.released} released, ${r.renewed} renewed, ${r.restored} restored, ${r.gone.length} gone`;
          // A lease the coordinator no longer knows and cannot restore (its replica removed) is over.
          for (const g of r.gone) held.splice(held.findIndex((l) => l.id === g), 1);
          seen.restored += r.restored;
        } else if (x < 0.64) {
          // One lease's renewals stopped: its deadline passes and the alarm's sweep reaps it.
          const live = [...s.state.leases.byId.values()];
          if (live.length === 0) continue;
          pick(live).deadline = Date.now() - 1;
          expireLeases(s.state, Date.now());
          seen.expired++;
          step = 'expire one lease';
        } else if (x < 0.71) {
          const down = new Set(ids().filter(() => rnd() < 0.3));
          await withFetch((host) => new Response('', { status: down.has(host) ? 503 : 200 }), () => instance.checkHealth(poolConfig(s.state, POOL)!));
          step = `health: down ${[...down].join(',') || 'none'}`;
        } else if (x < 0.78) {
          const waiting = new Map(ids().map((id) => [id, rnd() < 0.5 ? 0 : Math.floor(rnd() * 6)]));
          await withFetch((host, path) => (path === '/metrics' ? new Response(metrics(waiting.get(host) ?? 0, 1)) : new Response('')), () => instance.scrapeMetrics(poolConfig(s.state, POOL)!));
          step = `scrape: waiting ${[...waiting.values()].join(',')}`;
        } else if (x < 0.83) {
          const id = pick(ids());
          const draining = rnd() < 0.5;
          instance.patchReplica(POOL, id, { draining });
          step = `drain ${id} ${draining}`;
        } else if (x < 0.88) {
          const id = pick(ids());
          const weight = 1 + Math.floor(rnd() * 4);
          instance.patchReplica(POOL, id, { weight });
          step = `weight ${id} ${weight}`;
        } else if (x < 0.91) {
          // Half the time an id removed earlier comes back: a new replica object, while the old
          // one's leases (still held) end without touching its counts.
          const back = removed.length > 0 && rnd() < 0.5 ? removed.splice(Math.floor(rnd() * removed.length), 1)[0]! : null;
          const id = back ?? `kn${++added}`;
          instance.upsertReplica(POOL, replica(id, 1 + Math.floor(rnd() * 3)));
          if (back !== null && held.some((l) => l.replica === id)) seen.readdedWithLeases++;
          step = `${back !== null ? 're-add' : 'add'} ${id}`;
        } else if (x < 0.94) {
          if (s.state.replicas.length <= 2) continue;
          // Mostly one holding leases; half the time it comes straight back under the same id.
          const loaded = s.state.replicas.filter((r) => r.inFlight > 0).map((r) => r.id);
          const id = loaded.length > 0 && rnd() < 0.7 ? pick(loaded) : pick(ids());
          const res = instance.removeReplica(POOL, id);
          if (res.ok && res.value.inFlight > 0) seen.removedWithLeases++;
          if (rnd() < 0.5) {
            instance.upsertReplica(POOL, replica(id, 1 + Math.floor(rnd() * 3)));
            if (res.ok && res.value.inFlight > 0) seen.readdedWithLeases++;
            step = `remove ${id} and add it back`;
          } else {
            removed.push(id);
            step = `remove ${id}`;
          }
        } else if (x < 0.96) {
          // Replaced in place (PUT of an existing id): keeps its in-flight count.
          const id = pick(ids());
          instance.upsertReplica(POOL, { ...replica(id, 1 + Math.floor(rnd() * 3)), draining: rnd() < 0.3 });
          step = `replace ${id}`;
        } else if (x < 0.97) {
          // Every replica fails real traffic twice (maxFails): all passively excluded at once, so
          // acquire falls back to the replicas whose active checks pass.
          for (const id of ids()) {
            for (let f = 0; f < 2; f++) {
              const res = instance.acquire({ pool: POOL, key: null, keyKind: 'none', exclude: ids().filter((o) => o !== id) });
              if (res.ok) instance.release(res.leaseId, { status: 502, error: 'upstream_5xx' });
            }
          }
          step = 'every replica fails twice';
        } else if (x < 0.985) {
          // Passive exclusions end with time alone.
          await new Promise((r) => setTimeout(r, FAIL_TIMEOUT_MS + 5));
          step = 'wait past the fail timeout';
        } else {
          await instance.testFault(POOL, { restart: true });
          step = 'restart';
        }
        check(s, `step ${n} (seed ${seed}): ${step}`, rnd);
      }
    } finally {
      await state.storage.deleteAlarm();
    }
  });
}

describe('coordinator: kept pick totals (pick-state.ts)', () => {
  it('the pool configuration for this test parses', () => {
    const pool = loadConfig(CONFIG).poolByName.get(POOL)!;
    expect(pool).toMatchObject({ loadSignal: 'inflight+waiting', maxInFlightPerReplica: 4, failTimeoutMs: FAIL_TIMEOUT_MS });
  });

  for (const seed of [1, 2, 3, 4]) {
    it(`kept views and totals equal a fresh recomputation after every step (seed ${seed})`, async () => {
      await runSequence(seed, 250);
    });
  }

  it('the sequences reached every state the views depend on', () => {
    for (const [state, checks] of Object.entries(seen)) expect(checks, state).toBeGreaterThan(0);
  });
});
