// The bounded-load eligibility shared by `bounded-hash` and `prefix-aware`: HAProxy's
// `hash-balance-factor` slots (src/lb_chash.c `chash_server_is_eligible`) plus an optional
// absolute slack. Pure: computed from the replica views of one pick.
//
// With factor c written as an integer percent P, over the usable replicas (healthy, not
// draining) with total weight W and Σ in-flight U across the pool:
//
//   totalSlots  = ceil((U + 1) × P / 100)           = floor(((U + 1) × P + 99) / 100)
//   slots(r)    = w_r × floor(totalSlots / W)
//               + floor((cum_r + w_r) × R / W) − floor(cum_r × R / W),   R = totalSlots mod W
//   slots(r)    = max(slots(r), 1)
//   cap(r)      = max(slots(r), ceil(U × w_r / W + slack))              (slack = 0: exactly HAProxy)
//   eligible(r) ⇔ inFlight(r) < cap(r)
//
// cum_r is the weight of the usable replicas before r, so R is spread by weight with no
// rounding drift. P = Infinity means unbounded: every usable replica is eligible.

import type { ReplicaView } from '../types.js';

/** Weight sums of the usable replicas: cum[i] is the usable weight before replica i, totalWeight W. */
export interface WeightSums {
  readonly cum: Int32Array;
  readonly totalWeight: number;
}

/**
 * What a caller keeps so a pick need not walk every replica (PickContext.totals): Σ in-flight
 * over the pool (U), kept running as leases come and go, and the weight sums, recomputed only
 * when the ring or a replica's health, draining or weight changes (`weightSums`).
 */
export interface PoolTotals {
  readonly used: number;
  readonly weights: WeightSums;
}

/** One pass over the replicas: the usable weight before each (cum) and in all (W). */
export function weightSums(replicas: readonly ReplicaView[], cumOut?: Int32Array): WeightSums {
  const n = replicas.length;
  const cum = cumOut !== undefined && cumOut.length >= n ? cumOut : new Int32Array(n);
  let total = 0;
  for (let i = 0; i < n; i++) {
    const r = replicas[i]!;
    cum[i] = total;
    if (r.healthy && !r.draining) total += r.weight;
  }
  return { cum, totalWeight: total };
}

/**
 * A PoolTotals a caller can keep: `used` moves with `add`, the weight sums are cached per
 * `version` (bump it whenever membership, health, draining or a weight changes).
 */
export class RunningTotals implements PoolTotals {
  used = 0;
  weights: WeightSums = { cum: new Int32Array(0), totalWeight: 0 };
  private version = NaN;

  add(delta: number): void {
    this.used += delta;
  }

  /** Recompute the weight sums if `version` differs from the last one seen; returns this. */
  refresh(replicas: readonly ReplicaView[], version: number): this {
    if (version !== this.version) {
      this.weights = weightSums(replicas);
      this.version = version;
    }
    return this;
  }
}

export interface LoadBound {
  /** Σ in-flight over every replica of the pool (U). */
  readonly used: number;
  /** Σ weight of the usable replicas (W); 0 means nothing can take traffic. */
  readonly totalWeight: number;
  /** cum[i]: weight of the usable replicas before replica i. */
  readonly cum: Int32Array;
  readonly percent: number;
  readonly slack: number;
  readonly perWeight: number;
  readonly remainder: number;
}

/**
 * One pass over the replicas: pool load, usable weight, and each replica's cumulative usable
 * weight. `cumOut`, when at least as long as `replicas`, receives the cumulative weights instead
 * of a new array, so a hot caller can reuse one buffer (the bound is then valid until its next use).
 */
export function computeLoadBound(replicas: readonly ReplicaView[], percent: number, slack = 0, cumOut?: Int32Array, totals?: PoolTotals): LoadBound {
  if (totals !== undefined) return boundFromTotals(totals, percent, slack);
  const n = replicas.length;
  const cum = cumOut !== undefined && cumOut.length >= n ? cumOut : new Int32Array(n);
  let used = 0;
  let totalWeight = 0;
  for (let i = 0; i < n; i++) {
    const r = replicas[i]!;
    used += r.inFlight;
    cum[i] = totalWeight;
    if (r.healthy && !r.draining) totalWeight += r.weight;
  }
  const totalSlots = percent === Infinity || totalWeight === 0 ? 0 : Math.floor(((used + 1) * percent + 99) / 100);
  const perWeight = totalWeight === 0 ? 0 : Math.floor(totalSlots / totalWeight);
  const remainder = totalWeight === 0 ? 0 : totalSlots % totalWeight;
  return { used, totalWeight, cum, percent, slack, perWeight, remainder };
}

/** The same bound in O(1) from totals the caller keeps (no walk over the replicas). */
export function boundFromTotals(t: PoolTotals, percent: number, slack = 0): LoadBound {
  const used = t.used;
  const totalWeight = t.weights.totalWeight;
  const totalSlots = percent === Infinity || totalWeight === 0 ? 0 : Math.floor(((used + 1) * percent + 99) / 100);
  const perWeight = totalWeight === 0 ? 0 : Math.floor(totalSlots / totalWeight);
  const remainder = totalWeight === 0 ? 0 : totalSlots % totalWeight;
  return { used, totalWeight, cum: t.weights.cum, percent, slack, perWeight, remainder };
}

/** cap(r): the in-flight count replica `i` must stay below to be eligible (Infinity when unbounded). */
export function capOf(b: LoadBound, replicas: readonly ReplicaView[], i: number): number {
  if (b.percent === Infinity) return Infinity;
  const w = replicas[i]!.weight;
  const c = b.cum[i]!;
  const W = b.totalWeight;
  let slots = w * b.perWeight + Math.floor(((c + w) * b.remainder) / W) - Math.floor((c * b.remainder) / W);
  if (slots === 0) slots = 1;
  if (b.slack > 0) slots = Math.max(slots, Math.ceil((b.used * w) / W + b.slack));
  return slots;
}

/** Under its load cap (the caller checks usability: health, draining, exclusion). */
export function isUnderBound(b: LoadBound, replicas: readonly ReplicaView[], i: number): boolean {
  return replicas[i]!.inFlight < capOf(b, replicas, i);
}

export function checkSlack(slack: number): void {
  if (!(slack >= 0) || !Number.isFinite(slack)) throw new RangeError(`slack must be a finite number ≥ 0, got ${slack}`);
}
