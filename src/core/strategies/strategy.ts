// The one interface every routing strategy implements, and helpers they share. Pure.

import type { Ring } from '../ring.js';
import type { PoolTotals } from './load-bound.js';
import type { PickFailure, PickResult, RandomSource, ReplicaView } from '../types.js';

export interface PickContext {
  readonly ring: Ring;
  /** Replicas in the same order as `ring.ids`. */
  readonly replicas: readonly ReplicaView[];
  /** 32-bit hash of the routing key, or null when the request has none. */
  readonly key: number | null;
  /** Replica ids this pick must not return (a retry excludes the replica that failed). */
  readonly exclude?: ReadonlySet<string>;
  readonly random: RandomSource;
  /** Round-robin position from the previous pick; 0 when unknown. */
  readonly cursor?: number;
  /**
   * Σ in-flight and the usable weight sums, kept by the caller (load-bound.ts `RunningTotals`):
   * the bounded strategies then skip their walk over every replica. They must describe exactly
   * `replicas` (same in-flight sum, same health), or the load cap is computed from wrong numbers.
   */
  readonly totals?: PoolTotals;
  /** How much of the request's prompt each replica is believed to hold; only `prefix-aware` reads it. */
  readonly prefixMatch?: PrefixMatch;
  /** The one replica this request must reach (pin.ts); overrides the strategy and its load bound. */
  readonly pin?: string;
}

/** The request's chained prompt blocks matched against a prefix index (see prefix-index.ts). */
export interface PrefixMatch {
  /** Number of blocks of the request. */
  readonly blocks: number;
  /**
   * Per replica index (ring order): leading blocks of the request that replica holds, or −1
   * when the index knows nothing about it (new, restarted, never routed to).
   */
  readonly matched: Int32Array;
  /**
   * Per replica index: 1 when the index recorded no route to it recently (PrefixIndex.staleAll);
   * such replicas do not hold the shared base down. Absent: none is stale.
   */
  readonly stale?: Uint8Array;
  /**
   * Per replica index: routes the index recorded to it among the pool's last ones
   * (PrefixIndex.staleAll's `recent`, a window of PrefixIndex.recentRoutes()). prefix-aware calls
   * a replica under-served when that is below a share of its fair share by weight of what the
   * usable replicas got. Absent: a replica is under-served only when `stale` says starved (2).
   */
  readonly recent?: Int32Array;
  /**
   * Replica index the request's session key was last routed to (PrefixIndex.keyHomeOf), −1 when
   * the index does not know the key (a new session). prefix-aware treats a followed match as a
   * continuation when the key's home holds it. Absent (no session key: a tenant, prefix or body
   * key, shared by many sessions): a match covering most of the request is.
   */
  readonly keyHome?: number;
}

export interface Strategy {
  /** Canonical spec string, e.g. `bounded-hash:1.25`. */
  readonly name: string;
  /** True when the strategy uses the routing key (keyless requests then go to the pool's fallback). */
  readonly keyed: boolean;
  /** True when the pick reads `prefixMatch` (the caller then computes block hashes and keeps an index). */
  readonly usesPrefix?: boolean;
  pick(ctx: PickContext): PickResult;
}

export const NO_HEALTHY: PickFailure = Object.freeze({ ok: false, reason: 'no_healthy_replica' });

/** A replica may take new requests: healthy, not draining, not excluded for this pick. */
export function isUsable(r: ReplicaView, exclude: ReadonlySet<string> | undefined): boolean {
  return r.healthy && !r.draining && (exclude === undefined || !exclude.has(r.id));
}

/**
 * Fewest in-flight per unit of weight among usable replicas; ties broken by `random`
 * (reservoir sampling over the tied set, so each tied replica is equally likely).
 * Returns the index or -1.
 */
export function leastLoadedIndex(replicas: readonly ReplicaView[], exclude: ReadonlySet<string> | undefined, random: RandomSource): number {
  let best = -1;
  let ties = 0;
  for (let i = 0; i < replicas.length; i++) {
    const r = replicas[i]!;
    if (!isUsable(r, exclude)) continue;
    if (best < 0) {
      best = i;
      ties = 1;
      continue;
    }
    const b = replicas[best]!;
    // Compare inFlight/weight without division: a/wa < b/wb ⇔ a·wb < b·wa.
    const lhs = r.inFlight * b.weight;
    const rhs = b.inFlight * r.weight;
    if (lhs < rhs) {
      best = i;
      ties = 1;
    } else if (lhs === rhs) {
      ties++;
      if (random() * ties < 1) best = i;
    }
  }
  return best;
}
