// `prefix-aware`: bounded-load consistent hashing that, among the replicas under the load
// bound, prefers the one holding the longest prefix of the request's prompt, and when no
// replica holds enough of it to matter, the least loaded. Pure: the per-replica matches arrive
// in the pick context (`prefixMatch`, from a PrefixIndex).
//
// With n the request's blocks, m_r the leading blocks replica r holds (−1: unknown) and
// ℓ_r = inFlight(r) / w_r its load per unit of weight:
//
//   usable(r)   ⇔ healthy ∧ ¬draining ∧ ¬excluded
//   eligible(r) ⇔ usable(r) ∧ inFlight(r) < cap(r)        (bounded-hash's cap, load-bound.ts:
//                                                          HAProxy slots with factor c, absolute slack)
//   ℓ_min       = min { ℓ_r : usable(r) }
//   window(r)   ⇔ ℓ_r ≤ ℓ_min + S + ρ × ℓ_min              (S = followSpread 4, ρ = followSpreadShare 0.5)
//   open(r)     ⇔ eligible(r) ∧ window(r)
//   base        = min { m_r : usable(r), m_r ≥ 0, ¬stale(r) }   (over all known usable ones when
//                                                          every one is stale; 0 when none is known)
//   gain(r)     = max(0, m_r − base)
//   need        = max(minBlocks, ceil(minShare × (n − base)))      defaults 2 blocks, 0.25
//   best        = max { gain(r) : open(r) }
//   calmest(r)  ⇔ open(r) ∧ ℓ_r ≤ ℓ_min + spread             (spread 0 by default)
//   fair(r)     = K × w_r / W                                (its share of the K routes the usable
//                                                          replicas got among the pool's last
//                                                          16 × R, W their weight)
//   under(r)    ⇔ fair(r) ≥ 4 ∧ recent_r < u × fair(r)      (u = underShare 0.75; without route
//                                                          counts: no route among the last 16 × R)
//   follow      ⇔ best ≥ need ∧ ¬(some calmest r is under(r) ∧ ¬continuation)
//   continuation⇔ a session key: its last route went to a replica holding the best match
//                 (keyHome); any other key (tenant, prefix, body: shared by many sessions) or
//                 none tracked: m_best ≥ seedBelow × n (0.75)
//   pick        = if follow: the first open r in the key's clockwise ring order with gain(r) = best
//                 else if some calmest r is under(r): among those the fewest recent routes per
//                   weight (ties: ring order)                                   (seeding/filling)
//                 else the first calmest r in ring order                         (least loaded)
//                 else the first open r in ring order, else the least loaded usable r (random ties)
//   no `prefixMatch` at all: bounded-hash; no key: least-load
//
// No-starvation guarantee. Every pick of a request with blocks (one without any is plain
// bounded-hash), whatever the index holds, goes to a usable replica r with
//
//   ℓ_r ≤ ℓ_min + S + ρ × ℓ_min
//
// (every branch above picks inside the window, and the last one picks ℓ_min itself). So while
// a usable replica is idle (ℓ_min = 0), no request goes to a replica holding more than S
// requests per unit of weight, however long a prefix it holds: a prompt switch, a new shared
// prompt or a stale index can pull sessions towards the replicas that saw it first only until
// they are S (+ ρ × ℓ_min) above the least loaded; from there the least loaded take requests,
// see the new prompt, and stop being different. Followed requests still never exceed the cap.
// test/node/core/prefix-starvation.test.ts checks the bound as a property over random prompt
// switches, loads, weights, health and exclusions, and the three scenarios.
//
// Why a window and not only the cap: the cap (≈ c × mean + slack) bounds a replica against the
// mean, so at light load four replicas holding a new prompt could absorb every session while
// four others sat idle (8 replicas, ≈ 8 in flight: 0 of 2,500 requests on 4-5 of them after a
// system-prompt switch). The window bounds it against the least loaded instead. S = 4 keeps
// light-load sessions on their cache (a replica a few requests busier still follows); ρ = 0.5
// lets the window grow with load, where a few requests more are noise (the simulator: see
// docs/benchmarks.md, "Prefix-aware routing (simulator)").
//
// Why under-served replicas take new sessions: at light load every replica is inside the
// window and nothing queues, so the window never binds, and new sessions on a popular tenant's
// system prompt or a shared tool list keep following the few replicas that hold it while the
// rest share what is left (the simulator's multi-tenant and skewed classes at their own rates:
// the emptiest replica got 0.47 and 0.43 of the mean requests; agent: one replica of 8 got
// none). A replica with fewer than three quarters of its fair share of the recent routes
// takes the next pick that follows nothing (no cache is lost) and the next new session on a
// shared prompt (it pays that prompt's prefill once and then holds it for later sessions);
// the most under-served first, so the deficit is shared, not left to ring order. A session's
// later turns are never diverted: the index remembers which replica each session key (a
// session header, the coordinator's `sessionKeyOf`) last went to (PrefixIndex.keyHomeOf, the
// last 2^15 keys), so a new session whose own part is a
// few percent of a long system prompt is told apart from a continuation, which the coverage
// alone (the rule before keys were tracked) could not. The cost: a client that sends a new
// session id with every turn looks like a new session each time, so while a replica is
// under-served such a turn may be seeded there and pay its history's prefill once (bounded by
// the deficit: once the replica has its share, nothing is diverted). u = 0.75, not 0.5, because the share
// is held only while there are new sessions to give: at 0.5 the emptiest replica of the
// skewed class ended at 0.49-0.64 of the mean over four trace seeds, at 0.75 at 0.54-0.71,
// and hit rates moved by less than 1.5 points (docs/benchmarks.md, "Prefix-aware routing
// (simulator)"). Seeding picks are inside the window (ℓ_r ≤ ℓ_min + spread).
//
// Why `base`: it is the prefix every warm replica already holds (a shared system
// prompt, Mooncake's block 0), so it earns no pull; only what a replica holds beyond it
// counts. Replicas the index knows nothing about are left out of `base`, otherwise one cold
// replica would hold base at 0 and let the first replica that saw the shared prefix pull
// every new session. For the same reason replicas with no recorded route among the pool's
// last 4 × R routes are left out (`stale`, PrefixIndex.staleAll): after a system prompt is
// replaced, the replicas that only ever saw the old one would otherwise hold the base at the
// old and new prompts' common blocks forever (they get no traffic, so their entries never
// change), and at light load, inside the window, the replicas that saw the new prompt first
// would keep every session (4 of 8 replicas at 0 requests). Left out, they stop holding the
// base down, new sessions gain nothing on anyone, and go to the least loaded: them.
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

import type { PickResult, ReplicaView } from '../types.js';
import { balanceFactorPercent, DEFAULT_BALANCE_FACTOR, pickBoundedHash } from './bounded-hash.js';
import { pickLeastLoad } from './least-load.js';
import { capOf, checkSlack, computeLoadBound } from './load-bound.js';
import { isUsable, leastLoadedIndex, NO_HEALTHY, type PickContext, type PrefixMatch, type Strategy } from './strategy.js';

/** Default absolute slack of `prefix-aware` (see scripts/stickiness.ts and docs/benchmarks.md). */
export const DEFAULT_PREFIX_AWARE_SLACK = 3;
export const DEFAULT_MIN_MATCH_BLOCKS = 2;
export const DEFAULT_MIN_MATCH_SHARE = 0.25;
export const DEFAULT_NO_MATCH_SPREAD = 0;
/** Load window of a followed prefix, requests per unit of weight above the least loaded (S). */
export const DEFAULT_FOLLOW_SPREAD = 4;
/** Growth of that window with the least loaded replica's own load (ρ). */
export const DEFAULT_FOLLOW_SPREAD_SHARE = 0.5;
/** A followed match covering less than this share of the request is a new session on a shared prompt (seeding). */
export const DEFAULT_SEED_BELOW = 0.75;
/**
 * A fair share below this many routes says nothing yet (a pool's first routes, a replica of
 * small weight among many): no replica is under-served until its fair share reaches it, so a
 * young pool follows prefixes as before. Smaller guards moved the light-load simulator rows
 * only within their seed-to-seed range (docs/benchmarks.md) but, in a pool's first few dozen
 * routes, sent a conversation continued under new session ids off its replica.
 */
export const MIN_FAIR_ROUTES = 4;
/** Under-served: fewer of the pool's recent routes than this share of its fair share by weight. */
export const DEFAULT_UNDER_SHARE = 0.75;

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
  /**
   * No starvation: a pick (followed or not) only goes to a replica whose in-flight per unit of
   * weight is at most ℓ_min + followSpread + followSpreadShare × ℓ_min. Defaults 4 and 0.5;
   * Infinity turns the window off (the cap alone, as before #17).
   */
  readonly followSpread?: number;
  readonly followSpreadShare?: number;
  /**
   * Seeding, when the request has no session key (PrefixMatch.keyHome absent): a match
   * worth following that covers less than this share of the request is a new session on a
   * shared tool list or system prompt, not a continuation, and goes to an under-served replica
   * when one is among the least loaded. Default 0.75; 0: never (without key tracking).
   */
  readonly seedBelow?: number;
  /**
   * A replica is under-served when it got fewer of the pool's recent routes (PrefixMatch.recent)
   * than this share of its fair share by weight; picks that follow nothing and seeded sessions
   * prefer one. Default DEFAULT_UNDER_SHARE; 0: never.
   */
  readonly underShare?: number;
}

interface Params {
  readonly percent: number;
  readonly slack: number;
  readonly minBlocks: number;
  readonly minShare: number;
  readonly spread: number;
  readonly followSpread: number;
  readonly followSpreadShare: number;
  readonly seedBelow: number;
  readonly underShare: number;
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
  const followSpread = options.followSpread ?? DEFAULT_FOLLOW_SPREAD;
  const followSpreadShare = options.followSpreadShare ?? DEFAULT_FOLLOW_SPREAD_SHARE;
  if (!(followSpread >= 0)) throw new RangeError(`followSpread must be a number ≥ 0 (or Infinity), got ${followSpread}`);
  if (!(followSpreadShare >= 0) || !Number.isFinite(followSpreadShare)) throw new RangeError(`followSpreadShare must be a finite number ≥ 0, got ${followSpreadShare}`);
  const seedBelow = options.seedBelow ?? DEFAULT_SEED_BELOW;
  if (!(seedBelow >= 0 && seedBelow <= 1)) throw new RangeError(`seedBelow must be in [0, 1], got ${seedBelow}`);
  const underShare = options.underShare ?? DEFAULT_UNDER_SHARE;
  if (!(underShare >= 0 && underShare <= 1)) throw new RangeError(`underShare must be in [0, 1], got ${underShare}`);
  const params: Params = { percent, slack, minBlocks, minShare, spread, followSpread, followSpreadShare, seedBelow, underShare };
  const fmt = (x: number) => (x === Infinity ? 'inf' : String(x));
  const windowed = followSpread !== DEFAULT_FOLLOW_SPREAD || followSpreadShare !== DEFAULT_FOLLOW_SPREAD_SHARE ? `:${fmt(followSpread)}:${fmt(followSpreadShare)}` : '';
  const name = `prefix-aware:${percent === Infinity ? 'inf' : percent / 100}:${slack}${windowed}`;
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
  const bound = computeLoadBound(replicas, p.percent, p.slack, cumScratch, ctx.totals);
  if (bound.totalWeight === 0) return NO_HEALTHY;
  const matched = prefixMatch.matched;

  // Under-served: fewer of the pool's recent routes than `underShare` of its fair share by
  // weight (or, without counts, starved: no route among the last 16 × R).
  const stale = prefixMatch.stale;
  const recent = prefixMatch.recent;

  // Pass 1: the least loaded and the shared base over usable replicas, and the recent routes
  // and weight of the usable ones (a fair share is of what they got, not of routes to a replica
  // now down, draining or excluded).
  let base = Infinity;
  let staleBase = Infinity;
  let minLoad = Infinity;
  let usableRoutes = 0;
  let usableWeight = 0;
  for (let i = 0; i < n; i++) {
    const r = replicas[i]!;
    if (!isUsable(r, exclude)) continue;
    const load = r.inFlight / r.weight;
    if (load < minLoad) minLoad = load;
    if (recent !== undefined) usableRoutes += recent[i]!;
    usableWeight += r.weight;
    const m = matched[i] ?? -1;
    if (m < 0) continue;
    if (stale !== undefined && stale[i] !== 0) {
      if (m < staleBase) staleBase = m;
    } else if (m < base) base = m;
  }
  if (base === Infinity) base = staleBase === Infinity ? 0 : staleBase;
  const fairPerWeight = usableWeight > 0 ? usableRoutes / usableWeight : 0;
  // The no-starvation window: nothing above it is picked (see the guarantee above).
  const window = minLoad + p.followSpread + p.followSpreadShare * minLoad;
  // Where a pick that follows nothing may go: within `spread` of the least loaded.
  const calmest = Math.min(window, minLoad + p.spread);
  // Pass 2: the longest match among open replicas (the cap is only evaluated for a replica
  // that could matter), and the fewest recent routes per weight among the under-served open
  // ones among the calmest (Infinity: none is open).
  let bestMatched = -1;
  let leastShare = Infinity;
  for (let i = 0; i < n; i++) {
    const m = matched[i] ?? -1;
    const r = replicas[i]!;
    const load = r.inFlight / r.weight;
    if (m <= bestMatched && load > calmest) continue;
    if (!isUsable(r, exclude) || load > window || r.inFlight >= capOf(bound, replicas, i)) continue;
    if (m > bestMatched) bestMatched = m;
    if (load <= calmest && isUnder(prefixMatch, r, i, fairPerWeight, p.underShare)) {
      const share = shareOf(prefixMatch, r, i);
      if (share < leastShare) leastShare = share;
    }
  }
  const underOpen = leastShare !== Infinity;
  const best = Math.max(0, bestMatched - base);
  const need = Math.max(p.minBlocks, Math.ceil(p.minShare * (prefixMatch.blocks - base)));
  // Follow the longest prefix only when it is worth it; otherwise the least loaded.
  let follow = best >= need;
  // Seeding: a followed match that is not a continuation (it covers less than `seedBelow` of
  // the request: a new session on a shared tool list or system prompt) goes to an
  // under-served replica among the calmest instead, if one is open, so that it learns the
  // shared prompt and gets the session's later turns. A pick that follows nothing prefers one
  // too (it loses no cache either way).
  let preferUnder = false;
  if (underOpen) {
    if (!follow) preferUnder = true;
    else if (!isContinuation(prefixMatch, bestMatched, p.seedBelow)) {
      follow = false;
      preferUnder = true;
    }
  }
  const target = follow ? bestMatched : -Infinity;
  const calm = follow ? window : calmest;

  // Pass 3: the key's clockwise ring order; the first open replica reaching the target.
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
    const load = r.inFlight / r.weight;
    if (load <= window && isUsable(r, exclude) && r.inFlight < capOf(bound, replicas, o)) {
      // Preferring the under-served: the first in ring order with the fewest recent routes per
      // weight (pass 2 found that share; one open under-served replica has it).
      if ((matched[o] ?? -1) >= target && load <= calm && (!preferUnder || (shareOf(prefixMatch, r, o) === leastShare && isUnder(prefixMatch, r, o, fairPerWeight, p.underShare))))
        return { ok: true, index: o, replica: r.id, spilled: o !== home, steps };
      if (spare < 0) {
        spare = o;
        spareSteps = steps;
      }
    }
    steps++;
  }
  // The least loaded are all at their cap (weights, exclusions): the first open one in ring order.
  if (spare >= 0) return { ok: true, index: spare, replica: replicas[spare]!.id, spilled: spare !== home, steps: spareSteps };
  // No open replica (every one in the window at its cap): the least loaded, inside the window by definition.
  const i = leastLoadedIndex(replicas, exclude, ctx.random);
  if (i < 0) return NO_HEALTHY;
  return { ok: true, index: i, replica: replicas[i]!.id, spilled: i !== home, steps };
}

/** Recent routes per unit of weight (0 without counts: then only starved replicas are under-served). */
function shareOf(m: PrefixMatch, r: ReplicaView, i: number): number {
  return m.recent !== undefined ? m.recent[i]! / r.weight : 0;
}

/** under(r) of the formula (a plain function, not a closure per pick: the pick allocates nothing of its own). */
function isUnder(m: PrefixMatch, r: ReplicaView, i: number, fairPerWeight: number, underShare: number): boolean {
  if (m.recent === undefined) return m.stale !== undefined && m.stale[i] === 2;
  const fair = fairPerWeight * r.weight;
  return fair >= MIN_FAIR_ROUTES && m.recent[i]! < underShare * fair;
}

/**
 * A followed match is a session's next turn, never diverted by seeding: its session key's last
 * route went to a replica holding the best match, or, without a session key, it covers
 * at least `seedBelow` of the request. A key the index does not know is a new session, however
 * much of a shared system prompt or tool list it matches.
 */
function isContinuation(m: PrefixMatch, bestMatched: number, seedBelow: number): boolean {
  if (m.keyHome === undefined) return bestMatched >= seedBelow * m.blocks;
  return m.keyHome >= 0 && (m.matched[m.keyHome] ?? -1) >= bestMatched;
}

export const prefixAware: Strategy = createPrefixAware();
