// `prefix-aware`: bounded-load consistent hashing that, among the replicas under the load
// bound, prefers the one holding the longest prefix of the request's prompt, and when no
// replica holds enough of it to matter, the least loaded. Pure: the per-replica matches arrive
// in the pick context (`prefixMatch`, from a PrefixIndex).
//
// With n the request's blocks and m_r the leading blocks replica r holds (−1: unknown):
//
//   usable(r)   ⇔ healthy ∧ ¬draining ∧ ¬excluded
//   eligible(r) ⇔ usable(r) ∧ inFlight(r) < cap(r)        (bounded-hash's cap, load-bound.ts:
//                                                          HAProxy slots with factor c, absolute slack)
//   base        = min { m_r : usable(r), m_r ≥ 0 }        (0 when no usable replica is known)
//   gain(r)     = max(0, m_r − base)
//   need        = max(minBlocks, ceil(minShare × (n − base)))      defaults 2 blocks, 0.25
//   best        = max { gain(r) : eligible(r) }
//   ℓ_min       = min { inFlight(r) / w_r : usable(r) }
//   pick        = first eligible r in the key's clockwise ring order with
//                   gain(r) = best                    if best ≥ need   (follow the longest prefix; ties: ring order)
//                   inFlight(r) / w_r ≤ ℓ_min + spread   otherwise     (least loaded; ties: ring order)
//                 and if no eligible r qualifies, the first eligible r in ring order
//   spread      = 0 by default (Infinity: exactly bounded-hash); no `prefixMatch` at all: bounded-hash
//
// No starvation: `base` is the prefix every warm replica already holds (a shared system
// prompt, Mooncake's block 0), so it earns no pull; only what a replica holds beyond it
// counts. Replicas the index knows nothing about are left out of `base`, otherwise one cold
// replica would hold base at 0 and let the first replica that saw the shared prefix pull
// every new session; instead new sessions keep spreading (least loaded first) until every
// replica has seen the shared prefix. The load cap bounds any pull: a replica at its cap is
// skipped and the next longest match (or the least loaded) wins.
//
// Why the threshold: a match shorter than 2 blocks (≈ 128 tokens) saves less prefill than
// it costs in load balance and is often a template coincidence; requiring a quarter of the
// request's own (non-shared) blocks keeps a weak partial overlap (a shared tool schema in
// front of a new conversation) from overriding the load balance,
// while any continuation turn (which typically matches > 50% of its prompt) follows its cache.
//
// Why the least loaded when nothing is worth following (spread 0; it was the ring order, i.e.
// bounded-hash, before): such a pick gains nothing from any cache, and later turns find their
// prefix through the index, not the ring, so load is all that matters. The ring order under the
// cap let a replica run up to ~c × mean + slack while others sat lower, which cost p95 where
// prompts are long or independent. Simulator, 8 replicas (docs/benchmarks.md, "Prefix-aware
// routing (simulator)"): Mooncake at its own rate, p95 7.93 s → 6.02 s (least-load 6.16 s) and
// hit rate 15.3% → 16.4% (one replica with the pool's whole KV: 16.6%); short independent
// prompts ×16, p95 1.10 → 1.01 × least-load's (its seed-to-seed range); multi-turn chat ×16,
// p95 0.22 s → 0.13 s. The ring order still breaks ties among the least loaded, so a session's
// turns with short matches keep meeting on its home replica when loads are even.
//
// Slack defaults to 3 (bounded-hash's stays 0, exactly HAProxy): scripts/stickiness.ts, 200
// sessions / 2,500 requests, ≈ 8 in flight over 8 replicas: slack 3 splits 4.0% of sessions
// (7.0% with the ring-order fallback; HAProxy factor 1.25: 97-99%, 1.5: 91%) and keeps peak
// in-flight max÷mean at 1.08 (1.12). Pure
// stickiness costs request-count spread (1.42 vs 1.22), which session sizes, not the cap, set:
// unbounded `hash` is at 1.46. An absolute slack fades as load grows (cap ≈ U/W·w + 3).

import type { PickResult } from '../types.js';
import { balanceFactorPercent, DEFAULT_BALANCE_FACTOR, pickBoundedHash } from './bounded-hash.js';
import { pickLeastLoad } from './least-load.js';
import { capOf, checkSlack, computeLoadBound } from './load-bound.js';
import { isUsable, leastLoadedIndex, NO_HEALTHY, type PickContext, type Strategy } from './strategy.js';

/** Default absolute slack of `prefix-aware` (see scripts/stickiness.ts and docs/benchmarks.md). */
export const DEFAULT_PREFIX_AWARE_SLACK = 3;
export const DEFAULT_MIN_MATCH_BLOCKS = 2;
export const DEFAULT_MIN_MATCH_SHARE = 0.25;
export const DEFAULT_NO_MATCH_SPREAD = 0;

export interface PrefixAwareOptions {
  /** Multiplier (1.25) or percent (125). Default 1.25. */
  readonly balanceFactor?: number;
  /** Absolute headroom over the mean load, in requests. Default DEFAULT_PREFIX_AWARE_SLACK. */
  readonly slack?: number;
  /** Shortest gain (blocks beyond the shared base) worth following. Default 2. */
  readonly minBlocks?: number;
  /** Shortest gain as a share of the request's blocks beyond the base. Default 0.25. */
  readonly minShare?: number;
  /**
   * When no match is worth following: how far above the least loaded (in-flight per unit of
   * weight) a replica may be and still take the request in ring order. Default
   * DEFAULT_NO_MATCH_SPREAD; Infinity = bounded-hash's ring order under the cap alone.
   */
  readonly spread?: number;
}

interface Params {
  readonly percent: number;
  readonly slack: number;
  readonly minBlocks: number;
  readonly minShare: number;
  readonly spread: number;
}

export function createPrefixAware(options: PrefixAwareOptions = {}): Strategy {
  const percent = balanceFactorPercent(options.balanceFactor ?? DEFAULT_BALANCE_FACTOR);
  const slack = options.slack ?? DEFAULT_PREFIX_AWARE_SLACK;
  checkSlack(slack);
  const minBlocks = options.minBlocks ?? DEFAULT_MIN_MATCH_BLOCKS;
  const minShare = options.minShare ?? DEFAULT_MIN_MATCH_SHARE;
  if (!Number.isInteger(minBlocks) || minBlocks < 1) throw new RangeError(`minBlocks must be an integer ≥ 1, got ${minBlocks}`);
  if (!(minShare >= 0 && minShare <= 1)) throw new RangeError(`minShare must be in [0, 1], got ${minShare}`);
  const spread = options.spread ?? DEFAULT_NO_MATCH_SPREAD;
  if (!(spread >= 0)) throw new RangeError(`spread must be a number ≥ 0 (or Infinity), got ${spread}`);
  const params: Params = { percent, slack, minBlocks, minShare, spread };
  const name = `prefix-aware:${percent === Infinity ? 'inf' : percent / 100}:${slack}`;
  return { name, keyed: true, usesPrefix: true, pick: (ctx) => pickPrefixAware(ctx, params) };
}

// Buffers reused across picks (as bounded-hash does): cumulative weights, and visit stamps
// (seen in this pick ⇔ stamp = this pick's epoch). A pick runs synchronously and never
// re-enters itself, so one set is enough.
let cumScratch = new Int32Array(64);
let seenScratch = new Uint32Array(64);
let seenEpoch = 0;

export function pickPrefixAware(ctx: PickContext, p: Params): PickResult {
  const { ring, replicas, key, exclude, prefixMatch } = ctx;
  if (key === null) return pickLeastLoad(ctx);
  if (prefixMatch === undefined || prefixMatch.blocks === 0) return pickBoundedHash(ctx, p.percent, p.slack);
  const n = replicas.length;
  const pts = ring.points.length;
  if (pts === 0 || n === 0) return NO_HEALTHY;
  if (cumScratch.length < n) cumScratch = new Int32Array(n);
  const bound = computeLoadBound(replicas, p.percent, p.slack, cumScratch);
  if (bound.totalWeight === 0) return NO_HEALTHY;
  const matched = prefixMatch.matched;

  // Pass 1: the shared base over usable replicas, and the longest match among eligible ones
  // (the cap is only evaluated for a replica that would raise the best).
  let base = Infinity;
  let bestMatched = -1;
  let minLoad = Infinity;
  for (let i = 0; i < n; i++) {
    const r = replicas[i]!;
    if (!isUsable(r, exclude)) continue;
    const load = r.inFlight / r.weight;
    if (load < minLoad) minLoad = load;
    const m = matched[i] ?? -1;
    if (m >= 0 && m < base) base = m;
    if (m > bestMatched && r.inFlight < capOf(bound, replicas, i)) bestMatched = m;
  }
  if (base === Infinity) base = 0;
  const best = Math.max(0, bestMatched - base);
  const need = Math.max(p.minBlocks, Math.ceil(p.minShare * (prefixMatch.blocks - base)));
  // Follow the longest prefix only when it is worth it; otherwise take the ring order.
  const follow = best >= need;
  const target = follow ? bestMatched : -Infinity;
  // Nothing worth following: only replicas within `spread` of the least loaded qualify.
  const calm = follow ? Infinity : minLoad + p.spread;

  // Pass 2: the key's clockwise ring order; the first eligible replica reaching the target.
  const start = ring.locate(key);
  const home = ring.owners[start]!;
  if (seenScratch.length < n) {
    seenScratch = new Uint32Array(n);
    seenEpoch = 0;
  }
  if (++seenEpoch === 0xffffffff) {
    seenScratch.fill(0);
    seenEpoch = 1;
  }
  const seen = seenScratch;
  const epoch = seenEpoch;
  let steps = 0;
  let spare = -1;
  let spareSteps = 0;
  const owners = ring.owners;
  for (let j = 0, at = start; j < pts && steps < n; j++, at = at + 1 === pts ? 0 : at + 1) {
    const o = owners[at]!;
    if (seen[o] === epoch) continue;
    seen[o] = epoch;
    const r = replicas[o]!;
    if ((matched[o] ?? -1) >= target && isUsable(r, exclude) && r.inFlight < capOf(bound, replicas, o)) {
      if (r.inFlight / r.weight <= calm) return { ok: true, index: o, replica: r.id, spilled: o !== home, steps };
      if (spare < 0) {
        spare = o;
        spareSteps = steps;
      }
    }
    steps++;
  }
  // The least loaded are all at their cap (weights, exclusions): the first eligible in ring order.
  if (spare >= 0) return { ok: true, index: spare, replica: replicas[spare]!.id, spilled: spare !== home, steps: spareSteps };
  // Every usable replica is at its cap (only when exclusions remove the free ones): least loaded.
  const i = leastLoadedIndex(replicas, exclude, ctx.random);
  if (i < 0) return NO_HEALTHY;
  return { ok: true, index: i, replica: replicas[i]!.id, spilled: i !== home, steps };
}

export const prefixAware: Strategy = createPrefixAware();
