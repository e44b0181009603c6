// The pool's load signal: with `inflight+waiting` the pick counts each replica's vLLM queue (from
// the last scrape) on top of the router's own in-flight, so a replica other clients have queued
// up is avoided; with `inflight` it is not. And the alarm stops once a pool has no replicas left.

import { env } from 'cloudflare:workers';
import { runDurableObjectAlarm, runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import { until } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
const fresh = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`load-${crypto.randomUUID()}`));
interface Internals {
  state: { replicas: { id: string; vllm: { waiting: number | null } }[] };
}

function pickCounts(i: PoolCoordinator, pool: string, n: number): Record<string, number> {
  const counts: Record<string, number> = {};
  for (let k = 0; k < n; k++) {
    const r = i.acquire({ pool, key: null, keyKind: 'none' });
    if (!r.ok) throw new Error(r.reason);
    counts[r.replica.id] = (counts[r.replica.id] ?? 0) + 1;
    i.release(r.leaseId, { status: 200 });
  }
  return counts;
}

describe('load signal', () => {
  it('inflight+waiting steers away from a replica with a vLLM queue', async () => {
    await runInDurableObject<PoolCoordinator, void>(fresh(), (i) => {
      expect(i.snapshot('queued')!.loadSignal).toBe('inflight+waiting');
      (i as unknown as Internals).state.replicas.find((r) => r.id === 'q1')!.vllm.waiting = 12;
      expect(pickCounts(i, 'queued', 40)).toEqual({ q2: 40 });
    });
  });

  it('inflight alone ignores the vLLM queue', async () => {
    await runInDurableObject<PoolCoordinator, void>(fresh(), (i) => {
      expect(i.snapshot('batch')!.loadSignal).toBe('inflight');
      (i as unknown as Internals).state.replicas.find((r) => r.id === 'batch-a')!.vllm.waiting = 12;
      const counts = pickCounts(i, 'batch', 200);
      // Ties broken at random: both replicas get a fair share.
      expect(counts['batch-a']).toBeGreaterThan(50);
      expect(counts['batch-b']).toBeGreaterThan(50);
    });
  });
});

describe('the alarm', () => {
  it('keeps running while the pool has replicas and stops when it has none', async () => {
    const stub = fresh();
    await runInDurableObject<PoolCoordinator, void>(stub, async (i, state) => {
      expect(i.snapshot('admin')!.replicas.length).toBe(2);
      // The first use schedules the alarm asynchronously: wait for it to be set.
      await until(() => state.storage.getAlarm(), (at) => at !== null, { what: 'the first use to set an alarm' });
    });
    // Run it (or, on a loaded machine, the run it started by itself may be under way: then
    // runDurableObjectAlarm finds none); either way a run re-arms it.
    await runDurableObjectAlarm(stub);
    await runInDurableObject<PoolCoordinator, void>(stub, async (i, state) => {
      await until(() => state.storage.getAlarm(), (at) => at !== null, { what: 'the alarm to be re-armed after a run' });
      expect(i.removeReplica('admin', 'm1').ok).toBe(true);
      expect(i.removeReplica('admin', 'm2').ok).toBe(true);
    });
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    await runInDurableObject<PoolCoordinator, void>(stub, async (_i, state) => {
      expect(await state.storage.getAlarm()).toBeNull();
    });
  });
});
