// When the coordinator's alarm fires: arming it for a lease deadline, scheduling the next round
// after one, and spreading health and scrape rounds over ticks. I/O: the DO's alarm (get/set/delete).

import type { PoolRuntime } from '../config.js';
import { boundPool, type PoolState, type ReplicaLive } from './state.js';

/** Health and scrape ticks are at least this far apart (a round is spread over its interval). */
const HEALTH_TICK_MIN_MS = 250;

/**
 * The alarm runs while the pool has replicas (health) or leases (expiry; `leaseWakeAt`, from
 * leases.ts), and stops otherwise. setAlarm is awaited; a failure is retried, and if it keeps
 * failing the next RPC that needs the alarm arms it again.
 */
export async function scheduleNext(s: PoolState, now: number, leaseWakeAt: number): Promise<void> {
  const a = s.alarm;
  let next = Infinity;
  if (boundPool(s) && s.replicas.length > 0) next = Math.max(now + 50, Math.min(a.nextHealthAt, a.nextScrapeAt, a.nextSampleAt));
  next = Math.min(next, leaseWakeAt);
  a.pending = next === Infinity ? null : next;
  for (let attempt = 0; ; attempt++) {
    try {
      if (next !== Infinity) await s.storage.setAlarm(next);
      else await s.storage.deleteAlarm();
      return;
    } catch (e) {
      console.error(JSON.stringify({ type: 'set_alarm_failed', pool: s.poolName, attempt, message: (e as Error).message }));
      if (attempt >= 2) {
        a.pending = null;
        return;
      }
      await new Promise((r) => setTimeout(r, 100 * 4 ** attempt));
    }
  }
}

/** Make sure the alarm fires by `at` (a lease deadline, a new replica's first check); never later than one already armed. */
export function ensureAlarm(s: PoolState, at: number): void {
  const a = s.alarm;
  if (a.pending !== null && a.pending <= at) return;
  a.pending = at;
  const arm = async () => {
    const current = await s.storage.getAlarm();
    if (current === null || current > at) await s.storage.setAlarm(at);
  };
  arm().catch((e) => {
    // Not armed: forget it so the next call tries again; one more try now.
    console.error(JSON.stringify({ type: 'set_alarm_failed', pool: s.poolName, message: (e as Error).message }));
    if (a.pending === at) a.pending = null;
    setTimeout(() => ensureAlarm(s, at), 200);
  });
}

/**
 * The replicas this tick of a round takes, and when the next tick is: a round of N replicas is
 * split into ceil(N / concurrency) ticks (no more than one per HEALTH_TICK_MIN_MS of the
 * interval), spaced evenly; the next round starts one interval after this one started.
 */
export function nextSlice(s: PoolState, kind: 'health' | 'scrape', pool: PoolRuntime, intervalMs: number, now: number): ReplicaLive[] {
  const a = s.alarm;
  const n = s.replicas.length;
  if (a.cursors[kind] === 0 || a.cursors[kind] >= n) {
    a.cursors[kind] = 0;
    a.roundStart[kind] = now;
  }
  const ticks = Math.max(1, Math.min(Math.ceil(n / pool.healthConcurrency), Math.floor(intervalMs / HEALTH_TICK_MIN_MS)));
  const perTick = Math.ceil(n / ticks);
  const slice = s.replicas.slice(a.cursors[kind], a.cursors[kind] + perTick);
  a.cursors[kind] += slice.length;
  const next = a.cursors[kind] >= n ? a.roundStart[kind] + intervalMs : now + intervalMs / ticks;
  const at = Math.max(next, now + 50);
  if (kind === 'health') a.nextHealthAt = at;
  else a.nextScrapeAt = at;
  return slice;
}
