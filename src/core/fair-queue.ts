// The queue of requests waiting for a slot when every replica is at its bound (issue #29): strict
// priority between bands, weighted fair shares by cost between tenants within a band, FIFO within a
// tenant, bounded length and wait per band. Pure: no I/O, no clock (every call takes `now`), no
// timers; the pool coordinator and the simulator drive it. The drain rate and Retry-After helpers
// for the refusals live here too, so both hosts answer alike.
//
// Fairness: VTC-style virtual counters (Sheng et al., "Fairness in Serving Large Language Models",
// OSDI '24; AIBrix's VTC router). Each tenant's counter is the service it was admitted, in cost
// units divided by its weight; among a band's waiting tenants the one with the lowest counter goes
// next, so over any backlogged period tenants are admitted cost in proportion to their weights
// (within one request's cost). A tenant that starts waiting is lifted to the lowest counter of the
// tenants already waiting: credit is not banked while idle (a returning tenant cannot starve the
// others with a burst), and it is not behind either. When nobody waits the counters are forgotten:
// in an idle pool nobody was held back. Work-conserving: the host offers a free slot to the next
// entry whenever one frees, whoever waits; a tenant alone gets every slot.

/** One priority band; `bands[0]` is admitted first, the last is shed first. */
export interface QueueBand {
  readonly name: string;
  /** Longest a request of this band waits for a slot, then it is refused (queue_timeout). */
  readonly maxQueueMs: number;
  /** Most requests of this band waiting at once; past it an arrival is refused (queue_full). */
  readonly maxQueueLength: number;
  /**
   * Slots of the pool kept free for the bands above: a request of this band is admitted only while
   * more than this many are free (default 0: work-conserving). Strict priority alone cannot help a
   * higher band's request that arrives when every slot is taken; headroom can, at the price of
   * slots the lower band leaves idle. Non-decreasing down the bands (the host's rule).
   */
  readonly headroom?: number;
}

/** The default bands: the lowest waits least, so under a long overload it is shed first. */
export const DEFAULT_QUEUE_BANDS: readonly QueueBand[] = [
  { name: 'high', maxQueueMs: 30_000, maxQueueLength: 1_000 },
  { name: 'normal', maxQueueMs: 30_000, maxQueueLength: 1_000 },
  { name: 'low', maxQueueMs: 10_000, maxQueueLength: 500 },
];

/** What a request costs its tenant's fair share: `tokens` (estimated prompt + output budget) or `requests` (1 each). */
export type FairnessUnit = 'tokens' | 'requests';

/** Why a waiting or arriving request is refused. */
export type QueueRefusal = 'queue_full' | 'queue_timeout';

export interface QueueEntry<T> {
  /** Unique among the queue's entries (the caller's ticket). */
  readonly id: string;
  readonly tenant: string;
  /** Index into the queue's bands. */
  readonly band: number;
  /** In the pool's fairness unit, at least a tiny positive amount. */
  readonly cost: number;
  /** The tenant's fair-share weight, ≥ 1. */
  readonly weight: number;
  readonly enqueuedAt: number;
  /** enqueuedAt + the band's maxQueueMs. */
  readonly deadline: number;
  readonly item: T;
}

export type EnqueueResult<T> =
  /** Queued; `shed` are entries pushed out to make room (another tenant's newest, over its share). */
  | { ok: true; entry: QueueEntry<T>; shed: QueueEntry<T>[] }
  | { ok: false; reason: 'queue_full' };

/** What the host did with an entry the queue offered it (drain). */
export type PlaceOutcome =
  /** Admitted to a replica: charged to its tenant's counter and removed. */
  | 'placed'
  /** Answered otherwise (its replica is gone, its pool no longer serves it): removed, not charged. */
  | 'dropped'
  /** This entry cannot go now (its pin or exclusions), others may: skip its tenant in this band. */
  | 'blocked'
  /** Nothing can go now: stop. */
  | 'full';

/** One tenant's waiting requests in one band, oldest first. */
interface Lane<T> {
  readonly tenant: string;
  readonly entries: QueueEntry<T>[];
}

/** A positive finite cost (a NaN or a negative estimate must not make a tenant free). */
function cleanCost(cost: number): number {
  return Number.isFinite(cost) && cost > 0 ? cost : 1e-6;
}

function cleanWeight(weight: number): number {
  return Number.isFinite(weight) && weight >= 1 ? weight : 1;
}

export class FairQueue<T> {
  readonly bands: readonly QueueBand[];
  /** Per band: tenant → lane (only tenants with entries). */
  readonly #bands: Map<string, Lane<T>>[];
  readonly #counts: number[];
  readonly #byId = new Map<string, QueueEntry<T>>();
  /** Per tenant: entries waiting in any band. */
  readonly #queued = new Map<string, number>();
  /** VTC counters: service admitted, in cost / weight (only meaningful while someone waits). */
  readonly #counters = new Map<string, number>();

  constructor(bands: readonly QueueBand[]) {
    if (bands.length === 0) throw new Error('a fair queue needs at least one band');
    this.bands = bands;
    this.#bands = bands.map(() => new Map());
    this.#counts = bands.map(() => 0);
  }

  /** Entries waiting in all bands. */
  get size(): number {
    return this.#byId.size;
  }

  /** Entries waiting in band `band`. */
  sizeOf(band: number): number {
    return this.#counts[band] ?? 0;
  }

  /** The index of the band named `name`, or -1. */
  bandIndex(name: string): number {
    return this.bands.findIndex((b) => b.name === name);
  }

  /** Entries `tenant` has waiting in all bands. */
  queuedOf(tenant: string): number {
    return this.#queued.get(tenant) ?? 0;
  }

  /** Waiting tenants and the weight each came with (its latest entry's). */
  tenantWeights(): Map<string, number> {
    const out = new Map<string, number>();
    for (const lanes of this.#bands) for (const lane of lanes.values()) out.set(lane.tenant, lane.entries[lane.entries.length - 1]!.weight);
    return out;
  }

  get(id: string): QueueEntry<T> | undefined {
    return this.#byId.get(id);
  }

  /** Every waiting entry, band by band, oldest first within a tenant (for snapshots and restarts). */
  *entries(): IterableIterator<QueueEntry<T>> {
    for (const lanes of this.#bands) for (const lane of lanes.values()) yield* lane.entries;
  }

  /** A tenant's counter (tests, snapshots): service admitted per unit weight since the queue was last empty. */
  counterOf(tenant: string): number {
    return this.#counters.get(tenant) ?? 0;
  }

  /**
   * Queue a request. A full band takes it only by shedding the newest entry of the tenant with the
   * most entries waiting there, when that is another tenant with at least two more than this one:
   * a burst fills the band with its own requests, not in front of everyone else's. `first`: the
   * entry goes ahead of its tenant's others (a stream flow control paused, resuming: admitted
   * once already, it is its tenant's oldest request), still behind other tenants by their counters.
   */
  enqueue(input: { id: string; tenant: string; band: number; cost: number; weight: number; item: T; first?: boolean }, now: number): EnqueueResult<T> {
    const band = this.bands[input.band];
    if (!band) throw new Error(`no band ${input.band}`);
    if (this.#byId.has(input.id)) throw new Error(`entry ${input.id} is already queued`);
    const lanes = this.#bands[input.band]!;
    const shed: QueueEntry<T>[] = [];
    if (this.#counts[input.band]! >= band.maxQueueLength) {
      const mine = lanes.get(input.tenant)?.entries.length ?? 0;
      let heaviest: Lane<T> | null = null;
      for (const lane of lanes.values()) if (!heaviest || lane.entries.length > heaviest.entries.length) heaviest = lane;
      if (!heaviest || heaviest.tenant === input.tenant || heaviest.entries.length < mine + 2) return { ok: false, reason: 'queue_full' };
      shed.push(this.remove(heaviest.entries[heaviest.entries.length - 1]!.id)!);
    }
    if (!this.#queued.has(input.tenant)) this.#lift(input.tenant);
    const entry: QueueEntry<T> = { id: input.id, tenant: input.tenant, band: input.band, cost: cleanCost(input.cost), weight: cleanWeight(input.weight), enqueuedAt: now, deadline: now + band.maxQueueMs, item: input.item };
    let lane = lanes.get(entry.tenant);
    if (!lane) lanes.set(entry.tenant, (lane = { tenant: entry.tenant, entries: [] }));
    if (input.first === true) lane.entries.unshift(entry);
    else lane.entries.push(entry);
    this.#counts[entry.band]!++;
    this.#queued.set(entry.tenant, (this.#queued.get(entry.tenant) ?? 0) + 1);
    this.#byId.set(entry.id, entry);
    return { ok: true, entry, shed };
  }

  /** The entry that goes next: the highest non-empty band, its tenant with the lowest counter (then the shorter backlog, then the oldest head), that tenant's oldest. */
  peek(): QueueEntry<T> | null {
    for (const lanes of this.#bands) {
      const lane = this.#pickLane(lanes, null);
      if (lane) return lane.entries[0]!;
    }
    return null;
  }

  /** Admit `id` (it got a slot): removed, and its cost charged to its tenant. */
  admit(id: string): QueueEntry<T> | undefined {
    const e = this.#byId.get(id);
    if (!e) return undefined;
    // Charged before removal: the queue may empty and forget the counters, which is then right.
    this.#counters.set(e.tenant, this.counterOf(e.tenant) + e.cost / e.weight);
    return this.remove(id);
  }

  /** Take `id` out without charging it (cancelled, timed out, shed). */
  remove(id: string): QueueEntry<T> | undefined {
    const e = this.#byId.get(id);
    if (!e) return undefined;
    this.#byId.delete(id);
    const lanes = this.#bands[e.band]!;
    const lane = lanes.get(e.tenant)!;
    const i = lane.entries.indexOf(e);
    lane.entries.splice(i, 1);
    if (lane.entries.length === 0) lanes.delete(e.tenant);
    this.#counts[e.band]!--;
    const q = this.#queued.get(e.tenant)! - 1;
    if (q > 0) this.#queued.set(e.tenant, q);
    else this.#queued.delete(e.tenant);
    if (this.#byId.size === 0) this.#counters.clear();
    return e;
  }

  /**
   * Offer waiting entries to `place` in admission order until it answers `full` or nothing more can
   * go. A `blocked` entry holds back only its own tenant in its band (FIFO within a tenant): others
   * are offered instead, at most `maxBlocked` of them per call. Returns the entries placed.
   */
  drain(place: (entry: QueueEntry<T>) => PlaceOutcome, maxBlocked = 16): QueueEntry<T>[] {
    const placed: QueueEntry<T>[] = [];
    const blocked = this.bands.map(() => new Set<string>());
    let misses = 0;
    for (;;) {
      let offered: QueueEntry<T> | null = null;
      for (let b = 0; b < this.#bands.length && !offered; b++) {
        const lane = this.#pickLane(this.#bands[b]!, blocked[b]!);
        if (lane) offered = lane.entries[0]!;
      }
      if (!offered) return placed;
      const outcome = place(offered);
      if (outcome === 'full') return placed;
      if (outcome === 'placed') placed.push(this.admit(offered.id)!);
      else if (outcome === 'dropped') this.remove(offered.id);
      else {
        blocked[offered.band]!.add(offered.tenant);
        if (++misses >= maxBlocked) return placed;
      }
    }
  }

  /** Remove and return the entries whose deadline has come (oldest first per tenant). */
  expire(now: number): QueueEntry<T>[] {
    const out: QueueEntry<T>[] = [];
    for (const lanes of this.#bands) for (const lane of lanes.values()) for (const e of lane.entries) if (e.deadline <= now) out.push(e);
    for (const e of out) this.remove(e.id);
    return out;
  }

  /** The earliest deadline of a waiting entry (Infinity when none): when to call expire. */
  nextDeadline(): number {
    let next = Infinity;
    for (const lanes of this.#bands) for (const lane of lanes.values()) next = Math.min(next, lane.entries[0]!.deadline);
    return next;
  }

  /** Entries that go before a new arrival of band `band` (every entry of its band and above): for Retry-After. */
  aheadOf(band: number): number {
    let n = 0;
    for (let b = 0; b <= band && b < this.#counts.length; b++) n += this.#counts[b]!;
    return n;
  }

  #pickLane(lanes: Map<string, Lane<T>>, skip: Set<string> | null): Lane<T> | null {
    let best: Lane<T> | null = null;
    let bestCounter = Infinity;
    for (const lane of lanes.values()) {
      if (skip?.has(lane.tenant)) continue;
      const c = this.counterOf(lane.tenant);
      if (c < bestCounter || (c === bestCounter && best !== null && tieBefore(lane, best))) {
        best = lane;
        bestCounter = c;
      }
    }
    return best;
  }

  /** A tenant that starts waiting: its counter is raised to the lowest of those already waiting. */
  #lift(tenant: string): void {
    let floor = Infinity;
    for (const t of this.#queued.keys()) floor = Math.min(floor, this.counterOf(t));
    if (floor === Infinity) return;
    this.#counters.set(tenant, Math.max(this.counterOf(tenant), floor));
  }
}

/**
 * Between two lanes of equal counters: the shorter backlog first, then the older head. Equal
 * counters are mostly a tenant that just started waiting, lifted to a burst's counter (#lift): it
 * goes at the next slot rather than one slot later behind the burst's oldest (bench:fairness).
 */
function tieBefore<T>(a: Lane<T>, b: Lane<T>): boolean {
  if (a.entries.length !== b.entries.length) return a.entries.length < b.entries.length;
  return a.entries[0]!.enqueuedAt < b.entries[0]!.enqueuedAt;
}

/** A request's cost in the pool's fairness unit: estimated prompt tokens + its output budget, or 1. */
export function requestCost(unit: FairnessUnit, promptTokens: number, maxOutputTokens: number): number {
  if (unit === 'requests') return 1;
  const t = (Number.isFinite(promptTokens) ? Math.max(0, promptTokens) : 0) + (Number.isFinite(maxOutputTokens) ? Math.max(0, maxOutputTokens) : 0);
  return Math.max(1, t);
}

/**
 * Whether a tenant holds more than its fair share of the pool: its requests in flight and waiting
 * (this one included) above capacity × weight / Σ weights of the tenants in flight or waiting
 * (its own included). Refusals of a tenant over its share are its own doing (429); the others
 * are the pool's (503).
 */
export function isOverShare(args: { load: number; weight: number; activeWeight: number; capacity: number }): boolean {
  const weight = cleanWeight(args.weight);
  const total = Math.max(weight, args.activeWeight);
  return args.load > (Math.max(1, args.capacity) * weight) / total;
}

/**
 * Whether the pool's share reserve holds a request back: a pool may keep `reserve` of its free
 * slots for tenants below their fair share, so that a light tenant's request starts at once
 * instead of waiting for the next slot a burst frees (issue #29, bench:fairness). A request is held
 * back while no more than `reserve` slots are free and its tenant, with this request, would hold
 * more than its share of the pool (`load` = its requests in flight + 1; the share as in
 * isOverShare, among the tenants in flight or waiting, or admitted lately: a light tenant between two
 * requests still counts) and, when `recentShare` is given, its share of the pool's recent
 * admissions (RecentShares) is above its weight's share too. A tenant alone is
 * never held back (its share is the pool), and the reserve never takes the whole pool (at most
 * capacity − 1).
 */
export function heldBackByReserve(args: { free: number; reserve: number; load: number; weight: number; activeWeight: number; capacity: number; recentShare?: number | undefined }): boolean {
  const keep = Math.min(Math.max(0, Math.floor(args.reserve)), Math.max(0, args.capacity - 1));
  if (keep === 0 || args.free > keep) return false;
  return overShareBothWays(args);
}

/**
 * A tenant over its fair share both ways: of the slots (`load` against its share of `capacity`, as
 * isOverShare) and of the recent admissions. A tenant over its share of the slots right now but
 * admitted less than its share lately is a light tenant whose requests arrived close together (its
 * average below its share): not over. What the share reserve holds back (heldBackByReserve) and
 * what preemption takes a slot from (preemptionVictim); `recentShare` undefined: the slots alone.
 */
export function overShareBothWays(args: { load: number; weight: number; activeWeight: number; capacity: number; recentShare?: number | undefined }): boolean {
  if (!isOverShare({ load: args.load, weight: args.weight, activeWeight: args.activeWeight, capacity: args.capacity })) return false;
  if (args.recentShare !== undefined && args.recentShare <= args.weight / Math.max(args.weight, args.activeWeight)) return false;
  return true;
}

/** A request gives its slot back at most this many times; past it, it keeps the slot it has (proxy/preemption.ts). */
export const MAX_PREEMPTIONS = 2;

/** A request in flight that preemption could take a slot from (its Worker said it may be asked). */
export interface PreemptionCandidate {
  readonly id: string;
  readonly tenant: string;
  /** Its band's index (0 the highest). */
  readonly band: number;
  /** When it was admitted (ms). */
  readonly at: number;
  /** Its tenant is over its fair share both ways (overShareBothWays, with this request counted). */
  readonly overShare: boolean;
}

/**
 * The request preemption takes a slot from for a waiting request of `waiter` (a tenant below its
 * share) in band `band`: one of another tenant's, over its share, in the same band or a lower
 * one, and of those the youngest (the least work lost: it is likely still in prefill, and the
 * Worker gives it up only while nothing went to its client). Null: none may be preempted.
 */
export function preemptionVictim(waiter: string, band: number, candidates: Iterable<PreemptionCandidate>): PreemptionCandidate | null {
  let best: PreemptionCandidate | null = null;
  for (const c of candidates) {
    if (c.tenant === waiter || c.band < band || !c.overShare) continue;
    if (best === null || c.at > best.at) best = c;
  }
  return best;
}

/**
 * Σ weights of the tenants active in a pool, each counted once: `tenant` itself with `weight`, the
 * tenants waiting with the weights their entries carry (FairQueue.tenantWeights), and the tenants
 * in `others` (in flight, admitted lately) by `weightOf`. The denominator of a fair share
 * (isOverShare, heldBackByReserve).
 */
export function activeWeightOf(tenant: string, weight: number, waiting: Iterable<readonly [string, number]>, others: readonly Iterable<string>[], weightOf: (tenant: string) => number): number {
  const seen = new Set<string>([tenant]);
  let total = weight;
  for (const [t, w] of waiting) {
    if (seen.has(t)) continue;
    seen.add(t);
    total += w;
  }
  for (const group of others) {
    for (const t of group) {
      if (seen.has(t)) continue;
      seen.add(t);
      total += weightOf(t);
    }
  }
  return total;
}

/**
 * Each tenant's share of the requests admitted to a pool lately: admissions decayed exponentially
 * with time constant `tauMs` (default 5 s), so a tenant's figure is its recent rate and the
 * shares follow a change of traffic within a few seconds. Bounded: tenants whose figure decayed
 * below 1/100 of a request are dropped, and at most `maxTenants` are kept (the least recent go
 * first). Pure: the caller passes the clock.
 */
export class RecentShares {
  readonly #byTenant = new Map<string, { value: number; at: number }>();

  constructor(
    readonly tauMs = 5_000,
    readonly maxTenants = 10_000,
  ) {}

  /** One request of `tenant` admitted at `now` (ms). */
  note(tenant: string, now: number): void {
    const e = this.#byTenant.get(tenant);
    const value = (e ? this.#decayed(e, now) : 0) + 1;
    // Re-inserted: the map's order is least recent first, which the bound evicts.
    this.#byTenant.delete(tenant);
    this.#byTenant.set(tenant, { value, at: now });
    if (this.#byTenant.size > this.maxTenants) this.#byTenant.delete(this.#byTenant.keys().next().value!);
  }

  /**
   * At `now`, in one pass: `tenant`'s share (0..1) of everyone's recent admissions (undefined when
   * nothing was admitted lately), and the tenants admitted lately (whose decayed figure is still at
   * least 1/100 of a request; the others are dropped).
   */
  read(tenant: string, now: number): { share: number | undefined; tenants: string[] } {
    let total = 0;
    let own = 0;
    const tenants: string[] = [];
    for (const [t, e] of this.#byTenant) {
      const v = this.#decayed(e, now);
      if (v < 0.01) {
        this.#byTenant.delete(t);
        continue;
      }
      total += v;
      tenants.push(t);
      if (t === tenant) own = v;
    }
    return { share: total > 0 ? own / total : undefined, tenants };
  }

  #decayed(e: { value: number; at: number }, now: number): number {
    return e.value * Math.exp(-Math.max(0, now - e.at) / this.tauMs);
  }
}

/**
 * Slots freed per second over a sliding window, in one-second buckets: the queue's drain rate,
 * which Retry-After is computed from. Pure: the caller passes the clock.
 */
export class DrainRate {
  readonly #buckets: Float64Array;
  #second = -1;

  constructor(readonly windowSeconds = 10) {
    this.#buckets = new Float64Array(windowSeconds);
  }

  /** `n` slots freed at `now` (ms). */
  note(now: number, n = 1): void {
    this.#advance(now);
    this.#buckets[this.#second % this.windowSeconds]! += n;
  }

  /** Slots freed per second over the window ending at `now` (0 when none). */
  perSecond(now: number): number {
    this.#advance(now);
    let sum = 0;
    for (const v of this.#buckets) sum += v;
    return sum / this.windowSeconds;
  }

  #advance(now: number): void {
    const sec = Math.floor(now / 1000);
    if (this.#second < 0) this.#second = sec;
    if (sec <= this.#second) return;
    // Clear the buckets of the seconds that passed with nothing noted (at most the whole window).
    for (let s = this.#second + 1; s <= sec && s <= this.#second + this.windowSeconds; s++) this.#buckets[s % this.windowSeconds] = 0;
    this.#second = sec;
  }
}

/** Longest Retry-After the router suggests: past it a client should rather hear how long again. */
export const MAX_RETRY_AFTER_MS = 60_000;

/**
 * When to come back: the time the queue ahead takes to drain at the measured rate (`ahead + 1`
 * slots at `perSecond`), at least 1 s, at most MAX_RETRY_AFTER_MS; `fallbackMs` when nothing
 * drained in the window (no measurement).
 */
export function retryAfterMs(ahead: number, perSecond: number, fallbackMs: number): number {
  const ms = perSecond > 0 ? ((Math.max(0, ahead) + 1) / perSecond) * 1000 : fallbackMs;
  return Math.min(MAX_RETRY_AFTER_MS, Math.max(1000, Math.ceil(ms)));
}
