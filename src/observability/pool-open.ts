// Whether a pool runs open (lease protocol v2 fail-open): its coordinator did not answer this
// isolate's snapshot call, this isolate's breaker for it is open, or Workers reported requests
// routed without it within the last OPEN_RECENT_MS. Pure: the caller gathers the inputs.

import type { PoolSnapshot } from '../coordinator/types.js';

/** A fallback reported this recently still shows the pool as running open. */
export const OPEN_RECENT_MS = 60_000;

export interface PoolOpenState {
  pool: string;
  open: boolean;
  reason: 'coordinator_unreachable' | 'isolate_breaker' | 'recent_fallbacks' | null;
  coordinatorUp: boolean;
  /** Requests routed open: reported to the coordinator, plus this isolate's not yet reported. */
  fallbacks: number;
}

export interface IsolateLeaseStats {
  pool: string;
  fallbacksUnreported: number;
  open: boolean;
}

export function poolOpenStates(pools: readonly string[], snapshots: readonly PoolSnapshot[], isolate: readonly IsolateLeaseStats[], now: number): PoolOpenState[] {
  return pools.map((pool) => {
    const snap = snapshots.find((s) => s.pool === pool);
    const mine = isolate.find((s) => s.pool === pool);
    const fallbacks = (snap?.lease?.fallbacks ?? 0) + (mine?.fallbacksUnreported ?? 0);
    const recent = snap?.lease !== undefined && snap.lease.lastFallbackAt > 0 && now - snap.lease.lastFallbackAt < OPEN_RECENT_MS;
    const reason = !snap ? 'coordinator_unreachable' : mine?.open ? 'isolate_breaker' : recent || (mine?.fallbacksUnreported ?? 0) > 0 ? 'recent_fallbacks' : null;
    return { pool, open: reason !== null, reason, coordinatorUp: snap !== undefined, fallbacks };
  });
}
