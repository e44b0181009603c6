// Test-fault hooks of the coordinator (config testHooks; the fault run, test/faults): an outage
// window in which every lease RPC fails, and releases dropped on purpose, then watched until reaped. No I/O.

import type { Lease, TestFaults } from './state.js';

export interface FaultRequest {
  outageMs?: number;
  dropReleases?: number;
  restart?: boolean;
  abort?: boolean;
}

/** Arm the outage window and the releases to drop (restart and abort are the object's to do). */
export function setFaults(f: TestFaults, req: FaultRequest, now: number): void {
  if (req.outageMs !== undefined) f.outageUntil = now + req.outageMs;
  if (req.dropReleases !== undefined) f.dropReleases = req.dropReleases;
}

/** Throws, as an unreachable coordinator would, while the outage window is open. */
export function failIfOutage(f: TestFaults): void {
  if (f.outageUntil > Date.now()) throw new Error('coordinator unavailable (test fault: outage)');
}

/** True when this release is to be dropped (answered as done, the lease left to be reaped). */
export function dropRelease(f: TestFaults, id: string, now: number): boolean {
  if (f.dropReleases <= 0) return false;
  f.dropReleases--;
  f.dropped.push({ id, at: now, reapedAt: null });
  return true;
}

/** Mark when each dropped release's lease was reaped (the fault run checks it happened within one TTL). */
export function noteReaped(f: TestFaults, live: ReadonlyMap<string, Lease>, now: number): void {
  for (const d of f.dropped) if (d.reapedAt === null && !live.has(d.id)) d.reapedAt = now;
}
