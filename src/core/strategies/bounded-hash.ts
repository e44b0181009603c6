// `bounded-hash`: consistent hashing with bounded loads, HAProxy `hash-balance-factor`
// semantics (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads",
// SODA 2018; HAProxy src/lb_chash.c `chash_server_is_eligible`). Pure.
//
// The cap is computed in load-bound.ts (shared with `prefix-aware`). With factor c written
// as an integer percent P (c = 1.25 → P = 125), over the usable
// replicas (healthy, not draining) with total weight W and Σ in-flight U across the pool:
//
//   totalSlots     = ceil((U + 1) × P / 100)           = floor(((U + 1) × P + 99) / 100)
//   slots(r)       = w_r × floor(totalSlots / W)
//                  + floor((cum_r + w_r) × R / W) − floor(cum_r × R / W),   R = totalSlots mod W
//   slots(r)       = max(slots(r), 1)
//   eligible(r)    ⇔ inFlight(r) < max(slots(r), ceil(U × w_r / W + slack))   (slack = 0: exactly HAProxy)
//
// cum_r is the weight of the usable replicas before r, so the remainder R is spread by
// weight with no rounding drift. Start at the key's point, walk clockwise, take the first
// usable eligible replica; wrap at most once. The optional absolute `slack` keeps a session
// on its home replica while the fleet is nearly idle, where the purely multiplicative cap
// (ceil(1.25 × 3) = 4 slots over 8 replicas) would split it.

import type { PickResult } from '../types.js';
import { pickLeastLoad } from './least-load.js';
import { checkSlack, computeLoadBound, isUnderBound } from './load-bound.js';
import { isUsable, leastLoadedIndex, NO_HEALTHY, type PickContext, type Strategy } from './strategy.js';

export const DEFAULT_BALANCE_FACTOR = 1.25;

/**
 * Accepts a multiplier (1.25) or HAProxy's percent form (125) and returns the integer
 * percent; `Infinity` (or 0, HAProxy's "off") means unbounded and returns Infinity.
 *
 * A factor ≤ 1.0 (≤ 100 percent) is refused, as HAProxy refuses `hash-balance-factor` values
 * in 1-100 ("a percentage greater than 100", doc/configuration.txt): at 1.0 the cap is the mean
 * itself, so almost every pick spills off its key's home and the hashing buys nothing.
 */
export function balanceFactorPercent(factor: number): number {
  if (factor === 0 || factor === Infinity) return Infinity;
  if (!Number.isFinite(factor) || factor <= 1) {
    throw new RangeError(`balance factor must be > 1 (or > 100 in percent, as HAProxy's hash-balance-factor), or 0/inf for unbounded; got ${factor}`);
  }
  let percent: number;
  if (factor <= 10) percent = Math.round(factor * 100);
  else if (factor > 100) percent = Math.round(factor);
  else if (factor === 100) throw new RangeError('balance factor 100 (percent) is 1.0: the cap would be the mean itself; write a factor > 1 (e.g. 1.25 or 125)');
  else throw new RangeError(`balance factor ${factor} is ambiguous: write a multiplier in (1, 10] or a percent > 100`);
  if (percent <= 100) throw new RangeError(`balance factor ${factor} rounds to ${percent} percent; it must be > 100 (a multiplier > 1.0)`);
  return percent;
}

export interface BoundedHashOptions {
  /** Multiplier (1.25) or percent (125). Default 1.25. */
  readonly balanceFactor?: number;
  /** Absolute headroom over the mean load, in requests. Default 0 (pure HAProxy). */
  readonly slack?: number;
}

export function createBoundedHash(options: BoundedHashOptions = {}): Strategy {
  const factor = options.balanceFactor ?? DEFAULT_BALANCE_FACTOR;
  const percent = balanceFactorPercent(factor);
  const slack = options.slack ?? 0;
  checkSlack(slack);
  const name = `bounded-hash:${percent === Infinity ? 'inf' : percent / 100}${slack > 0 ? `:${slack}` : ''}`;
  return { name, keyed: true, pick: (ctx) => pickBoundedHash(ctx, percent, slack) };
}

// Buffers reused across picks so the hot path allocates nothing but its result: a fresh
// Int32Array and Uint8Array per pick cost more than the rest of the pick at 64 replicas
// (scripts/bench-core.ts). `seen` holds a visit stamp per replica: seen in this pick ⇔ stamp
// equals this pick's epoch, so it never needs clearing. A pick runs synchronously to the end
// and never re-enters itself, so one set of buffers is enough.
let cumScratch = new Int32Array(64);
let seenScratch = new Uint32Array(64);
let seenEpoch = 0;

export function pickBoundedHash(ctx: PickContext, percent: number, slack = 0): PickResult {
  const { ring, replicas, key, exclude } = ctx;
  if (key === null) return pickLeastLoad(ctx);
  const n = replicas.length;
  const pts = ring.points.length;
  if (pts === 0 || n === 0) return NO_HEALTHY;
  if (cumScratch.length < n) {
    cumScratch = new Int32Array(n);
    seenScratch = new Uint32Array(n);
    seenEpoch = 0;
  }
  const bound = computeLoadBound(replicas, percent, slack, cumScratch, ctx.totals);
  if (bound.totalWeight === 0) return NO_HEALTHY;
  if (++seenEpoch === 0xffffffff) {
    seenScratch.fill(0);
    seenEpoch = 1;
  }
  const seen = seenScratch;
  const epoch = seenEpoch;

  const owners = ring.owners;
  const start = ring.locate(key);
  const home = owners[start]!;
  let steps = 0;
  for (let j = 0, at = start; j < pts && steps < n; j++, at = at + 1 === pts ? 0 : at + 1) {
    const o = owners[at]!;
    if (seen[o] === epoch) continue;
    seen[o] = epoch;
    const r = replicas[o]!;
    if (isUsable(r, exclude) && isUnderBound(bound, replicas, o)) return { ok: true, index: o, replica: r.id, spilled: o !== home, steps };
    steps++;
  }
  // Every usable replica is at its cap. Only possible when exclusions remove the replicas
  // with free slots (the slots sum to more than U otherwise): take the least loaded.
  const i = leastLoadedIndex(replicas, exclude, ctx.random);
  if (i < 0) return NO_HEALTHY;
  return { ok: true, index: i, replica: replicas[i]!.id, spilled: i !== home, steps };
}

export const boundedHash: Strategy = createBoundedHash();
