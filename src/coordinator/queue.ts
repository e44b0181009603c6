// Flow control (issue #29): when every replica a request could use is at the pool's per-replica
// bound, its acquire RPC does not fail: it waits here, in the pool's fair queue (core/fair-queue.ts:
// priority bands, weighted fair shares by cost between tenants, FIFO within a tenant), and is
// admitted the moment a slot frees (a release, an expiry, a replica back) to the replica the
// strategy picks then. The one acquire call stays open meanwhile (no extra billed request per
// waiting request); the object keeps serving other calls. A wait past the band's maxQueueMs or a
// full band is refused with Retry-After from the measured drain rate; a Worker whose client went
// away cancels its ticket (cancelQueued): nothing tells the object itself. RPC methods take no
// AbortSignal, and what the platform cancels on a disconnect is the *callee's* execution context of
// a Worker entrypoint ("if the client disconnects, the server's execution context is canceled
// immediately … A client that is itself another Worker is considered to have disconnected when its
// own execution context ends": cloudflare/cloudflare-docs src/content/docs/workers/runtime-apis/rpc/
// lifecycle.mdx); a Durable Object outlives its calls, and the promise this module holds for a
// waiter just stays pending. So the Worker watches its request's abort signal (enable_request_signal,
// WORKERD-NOTES.md) and sends cancelQueued once, only on abandonment; the band's deadline is the
// backstop for a disconnect no signal reports. Soft state: a restart drops the waiters (their calls fail
// and the Workers answer a retriable 503), admitted leases are rebuilt by renewals as any other.
// I/O: timers (one per waiter, its deadline).

import { activeWeightOf, FairQueue, type DrainRate, heldBackByReserve, type RecentShares, isOverShare, overShareBothWays, preemptionVictim, retryAfterMs, type PlaceOutcome, type PreemptionCandidate, type QueueBand, type QueueEntry } from '../core/index.js';
import { flowControlActive, type PoolRuntime } from '../config.js';
import { acquireLease, placeLease, tenantCapped, type LeaseExtra } from './leases.js';
import { configOf, type PoolState } from './state.js';
import { emptyHistogram, observe, type Histogram } from './stats.js';
import type { AcquireRequest, AcquireResult, QueueRefusalReason, QueueSnapshot } from './types.js';

/** A request waiting for a slot: its acquire call's answer, when it comes. */
export interface Waiter {
  readonly req: AcquireRequest & { queue: NonNullable<AcquireRequest['queue']> };
  /** What the acquire settled when it came in (its answer carries it, whenever that is). */
  readonly extra: LeaseExtra;
  resolve(result: AcquireResult): void;
  reject(e: Error): void;
  timer: ReturnType<typeof setTimeout> | undefined;
  /** The share reserve held it back at least once (counted once in QueueBook.reserveHeld). */
  heldByReserve?: boolean;
  /** A preemption was asked for it (flowControl.preempt): one slot taken for it at most. */
  preemptAsked?: boolean;
}

/** Owned by this module: the pool's queue and its counters since this instance started. */
export interface QueueBook {
  fq: FairQueue<Waiter> | null;
  /** The bands `fq` was built with (JSON): rebuilt when the configuration changes them and nobody waits. */
  bandsKey: string;
  /** Slots freed per second (releases and expiries): what Retry-After is computed from. */
  readonly drain: DrainRate;
  admitted: Record<string, number>;
  rejected: Record<string, number>;
  wait: Record<string, Histogram>;
  /** Fair-share weights of the tenants seen lately (the tenants in flight need theirs for the share). */
  readonly weights: Map<string, number>;
  /** Each tenant's share of the recent admissions (the share reserve tells a light tenant's burst from a heavy one). */
  readonly recent: RecentShares;
  /** Requests the share reserve held back (each once, however often it was offered a slot): its price, seen by the tenant that waited. */
  reserveHeld: number;
  /** Preemptions asked of Workers, and those whose Worker gave the slot back (flowControl.preempt). */
  preemptAsked: number;
  preempted: number;
}

const MAX_WEIGHTS = 10_000;
const SNAPSHOT_TENANTS = 20;

/**
 * The acquire RPC: a lease now, or, for a request that may wait (it carries a ticket, the pool has
 * flow control) and finds every usable replica at its bound, a promise of one.
 */
export function acquireOrWait(s: PoolState, pool: PoolRuntime | null, req: AcquireRequest): AcquireResult | Promise<AcquireResult> {
  if (!pool || !req.queue || !flowControlActive(pool)) return acquireNow(s, pool, req);
  const headroom = bandOf(pool, req.queue.band).headroom ?? 0;
  const reserve = pool.flowControl.shareReserve;
  let held = false;
  const mayPick =
    headroom > 0 || reserve > 0
      ? () => {
          if (capacityOf(s, pool) === 0) return true;
          if (freeSlots(s, pool) <= headroom) return false;
          held = reserveHolds(s, pool, req.tenant ?? '', req.queue!.weight);
          return !held;
        }
      : undefined;
  const r = acquireLease(s, pool, req, { beforePick: () => drainQueue(s, pool), ...(mayPick ? { mayPick } : {}) });
  if (r.ok) {
    s.queue.recent.note(req.tenant ?? '', Date.now());
    keepHook(s, pool, req, r.leaseId);
  }
  if (r.ok || r.reason !== 'saturated') return r as AcquireResult;
  return enqueue(s, pool, req as Waiter['req'], r.extra, held);
}

/**
 * The acquire that never waits (the plain acquire RPC). The slots a settle it carries frees still
 * go to those waiting first, when the pool has a queue.
 */
export function acquireNow(s: PoolState, pool: PoolRuntime | null, req: AcquireRequest): AcquireResult {
  const r = pool && flowControlActive(pool) ? acquireLease(s, pool, req, { beforePick: () => drainQueue(s, pool) }) : acquireLease(s, pool, req);
  // No waiting here: a pool at its bound is a refusal, as without flow control.
  return !r.ok && r.reason === 'saturated' ? { ok: false, reason: 'no_healthy_replica', retryAfterMs: configOf(s).retryAfterSeconds * 1000, ...r.extra } : (r as AcquireResult);
}

/** The pool's queue, built (or rebuilt after a configuration change, once empty) from its bands. */
function queueOf(s: PoolState, pool: PoolRuntime): FairQueue<Waiter> {
  const q = s.queue;
  const key = JSON.stringify(pool.flowControl.bands);
  if (!q.fq || (q.bandsKey !== key && q.fq.size === 0)) {
    q.fq = new FairQueue<Waiter>(pool.flowControl.bands as QueueBand[]);
    q.bandsKey = key;
  }
  return q.fq;
}

function enqueue(s: PoolState, pool: PoolRuntime, req: Waiter['req'], extra: LeaseExtra, heldByReserve = false): AcquireResult | Promise<AcquireResult> {
  const fq = queueOf(s, pool);
  const now = Date.now();
  const ticket = req.queue;
  // The Worker checked the band against this configuration; a deploy in between may have renamed it.
  let band = fq.bandIndex(ticket.band);
  if (band < 0) band = Math.max(0, fq.bandIndex(pool.flowControl.defaultBand));
  const tenant = req.tenant ?? '';
  noteWeight(s, tenant, ticket.weight);
  // The same ticket again: the Worker sent its acquire once more (the first failed fast); the first wait is over.
  const old = fq.get(ticket.ticket);
  if (old) finish(s, pool, fq.remove(old.id)!, 'queue_cancelled', now);
  let resolve!: (r: AcquireResult) => void;
  let reject!: (e: Error) => void;
  const answer = new Promise<AcquireResult>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  const waiter: Waiter = { req, extra, resolve, reject, timer: undefined, heldByReserve };
  const res = fq.enqueue({ id: ticket.ticket, tenant, band, cost: ticket.cost, weight: ticket.weight, item: waiter, first: ticket.resume === true }, now);
  if (!res.ok) return refusal(s, pool, fq, req, band, 'queue_full', extra, 0, now);
  if (heldByReserve) s.queue.reserveHeld++;
  for (const shed of res.shed) finish(s, pool, shed, 'queue_full', now);
  // The timer is also what keeps this call's context waiting on something of its own (a pending
  // event), not only on a promise another request resolves.
  waiter.timer = setTimeout(() => {
    const e = fq.remove(ticket.ticket);
    if (e) finish(s, pool, e, 'queue_timeout', Date.now());
  }, fq.bands[band]!.maxQueueMs);
  // The Worker's early-connect request, if any, is cancelled now, not when the wait ends.
  if (req.queued) {
    try {
      void Promise.resolve(req.queued()).catch(() => {});
    } catch {
      // The Worker's request is gone; its ticket goes with its cancel or its deadline.
    }
  }
  // Every slot taken, and this tenant below its share: a slot may be taken back for it.
  if (!heldByReserve) preemptFor(s, pool, ticket.ticket);
  return answer;
}

/** Refuse an entry that was waiting: its call gets the refusal. */
function finish(s: PoolState, pool: PoolRuntime, e: QueueEntry<Waiter>, reason: QueueRefusalReason, now: number): void {
  const w = e.item;
  if (w.timer !== undefined) clearTimeout(w.timer);
  w.resolve(refusal(s, pool, s.queue.fq!, w.req, e.band, reason, w.extra, now - e.enqueuedAt, now));
}

/**
 * A queue refusal: 429 when the tenant holds more than its fair share of the pool (in flight and
 * waiting, this request included), else 503 (the pool is saturated); Retry-After is the time the
 * requests ahead in its band and above take at the measured drain rate.
 */
function refusal(s: PoolState, pool: PoolRuntime, fq: FairQueue<Waiter>, req: AcquireRequest, band: number, reason: QueueRefusalReason, extra: LeaseExtra, queuedMs: number, now: number): AcquireResult {
  const name = fq.bands[band]!.name;
  s.queue.rejected[`${name}|${reason}`] = (s.queue.rejected[`${name}|${reason}`] ?? 0) + 1;
  const tenant = req.tenant ?? '';
  const weight = req.queue?.weight ?? 1;
  const load = (s.leases.tenantInFlight.get(tenant) ?? 0) + fq.queuedOf(tenant) + 1;
  const overShare = tenant !== '' && isOverShare({ load, weight, activeWeight: activeWeight(s, fq, tenant, weight), capacity: capacityOf(s, pool) });
  const retry = retryAfterMs(fq.aheadOf(band), s.queue.drain.perSecond(now), fq.bands[band]!.maxQueueMs);
  return { ok: false, reason, retryAfterMs: retry, overShare, band: name, queuedMs, ...extra };
}

/** The band named `name` (the default band for a name this configuration does not have). */
function bandOf(pool: PoolRuntime, name: string): QueueBand {
  const bands = pool.flowControl.bands;
  return bands.find((b) => b.name === name) ?? bands.find((b) => b.name === pool.flowControl.defaultBand) ?? bands[0]!;
}

/**
 * The pool's `shareReserve` holds this tenant's next request back: only the reserve is free and
 * the tenant already holds its fair share (core heldBackByReserve). The slots stay for tenants
 * below theirs; a tenant alone, or below its share, is never held back.
 */
function reserveHolds(s: PoolState, pool: PoolRuntime, tenant: string, weight: number): boolean {
  const reserve = pool.flowControl.shareReserve;
  if (reserve <= 0 || tenant === '') return false;
  const free = freeSlots(s, pool);
  if (free > reserve) return false;
  return heldBackByReserve({ free, reserve, ...shareOf(s, pool, tenant, weight, (s.leases.tenantInFlight.get(tenant) ?? 0) + 1, Date.now()) });
}

/**
 * What a tenant's fair share is judged by (core isOverShare, overShareBothWays): `load` against its
 * share of the pool's slots among the tenants active (in flight, waiting, or admitted lately: a
 * light tenant between two requests still counts), and its share of the recent admissions.
 */
function shareOf(s: PoolState, pool: PoolRuntime, tenant: string, weight: number, load: number, now: number) {
  const recent = s.queue.recent.read(tenant, now);
  return { load, weight, activeWeight: activeWeight(s, queueOf(s, pool), tenant, weight, recent.tenants), capacity: capacityOf(s, pool), recentShare: recent.share };
}

/** Slots free in the pool's usable replicas (healthy, not drained by an operator) under the bound. */
function freeSlots(s: PoolState, pool: PoolRuntime): number {
  const cap = pool.maxInFlightPerReplica ?? 0;
  let free = 0;
  for (const r of s.replicas) if (r.activeUp && !r.draining && r.inFlight < cap) free += cap - r.inFlight;
  return free;
}

/** Σ weights of the tenants in flight or waiting, and of `tenant` itself. */
function activeWeight(s: PoolState, fq: FairQueue<Waiter>, tenant: string, weight: number, also: Iterable<string> = []): number {
  return activeWeightOf(tenant, weight, fq.tenantWeights(), [s.leases.tenantInFlight.keys(), also], (t) => s.queue.weights.get(t) ?? 1);
}

/** Slots of the pool's usable replicas: healthy, not drained by an operator. */
function capacityOf(s: PoolState, pool: PoolRuntime): number {
  const cap = pool.maxInFlightPerReplica ?? 1;
  let n = 0;
  for (const r of s.replicas) if (r.activeUp && !r.draining) n += cap;
  return n;
}

function noteWeight(s: PoolState, tenant: string, weight: number): void {
  if (!tenant) return;
  const w = s.queue.weights;
  w.delete(tenant);
  w.set(tenant, weight);
  if (w.size > MAX_WEIGHTS) w.delete(w.keys().next().value!);
}

/**
 * Offer freed slots to the waiting requests, in the queue's order, until the pool is full again.
 * Called after everything that frees a slot or adds a replica: a release, a settle, an expiry, the
 * alarm, an admin change, and before an acquire's own pick.
 */
export function drainQueue(s: PoolState, pool: PoolRuntime | null): void {
  const fq = s.queue.fq;
  if (!pool || !fq || fq.size === 0) return;
  const now = Date.now();
  fq.drain((e) => place(s, pool, e, now));
}

function place(s: PoolState, pool: PoolRuntime, e: QueueEntry<Waiter>, now: number): PlaceOutcome {
  const w = e.item;
  // Its band keeps headroom for the bands above and no more is free: nor may any lower band (their
  // headroom is at least as large; bands are offered highest first), so nothing more goes now.
  const headroom = s.queue.fq!.bands[e.band]!.headroom ?? 0;
  if (headroom > 0 && freeSlots(s, pool) <= headroom) return 'full';
  // At its own cap, or holding its fair share while only the share reserve is free: its requests
  // wait behind it (FIFO), others go.
  if (tenantCapped(s, pool, w.req, now)) return 'blocked';
  if (reserveHolds(s, pool, e.tenant, e.weight)) {
    if (!w.heldByReserve) {
      w.heldByReserve = true;
      s.queue.reserveHeld++;
    }
    return 'blocked';
  }
  const pin = w.req.pin ? s.responses.lookup(w.req.tenant ?? '', w.req.pin.responseId, now) : undefined;
  const done = (r: AcquireResult): void => {
    if (w.timer !== undefined) clearTimeout(w.timer);
    w.resolve({ ...r, ...w.extra, queuedMs: now - e.enqueuedAt, band: s.queue.fq!.bands[e.band]!.name });
  };
  if (pin === null) {
    s.leases.pins.not_found++;
    done({ ok: false, reason: 'response_not_found', retryAfterMs: configOf(s).retryAfterSeconds * 1000 });
    return 'dropped';
  }
  const r = placeLease(s, pool, w.req, pin, now, true);
  if (r === 'saturated') return w.req.exclude?.length || pin !== undefined ? 'blocked' : 'full';
  if (!r.ok) {
    done(r);
    return 'dropped';
  }
  const q = s.queue;
  keepHook(s, pool, w.req, r.leaseId);
  const band = q.fq!.bands[e.band]!.name;
  q.admitted[band] = (q.admitted[band] ?? 0) + 1;
  q.recent.note(e.tenant, now);
  observe((q.wait[band] ??= emptyHistogram()), (now - e.enqueuedAt) / 1000);
  done(r);
  return 'placed';
}

/** The Worker's client went away while it waited: out of the queue at once. False: not waiting (admitted, refused, unknown). */
export function cancelQueued(s: PoolState, pool: PoolRuntime | null, ticket: string): boolean {
  const fq = s.queue.fq;
  const e = pool && fq ? fq.remove(ticket) : undefined;
  if (!e || !pool) return false;
  finish(s, pool, e, 'queue_cancelled', Date.now());
  return true;
}

/** A restart in place: the waiters' calls fail as a real restart fails them (the Workers answer 503, retriable). */
export function abandonQueue(s: PoolState): void {
  const fq = s.queue.fq;
  if (!fq) return;
  for (const e of [...fq.entries()]) {
    fq.remove(e.id);
    if (e.item.timer !== undefined) clearTimeout(e.item.timer);
    e.item.reject(new Error('Durable Object reset: the queued request was lost'));
  }
}

/** The queue's part of the pool snapshot; undefined when flow control does not apply. */
export function queueSnapshot(s: PoolState, pool: PoolRuntime, now: number): QueueSnapshot | undefined {
  if (!flowControlActive(pool)) return undefined;
  const fq = queueOf(s, pool);
  const depth: Record<string, number> = {};
  fq.bands.forEach((b, i) => (depth[b.name] = fq.sizeOf(i)));
  const perTenant = new Map<string, { queued: number; since: number }>();
  let oldest = now;
  for (const e of fq.entries()) {
    const t = perTenant.get(e.tenant);
    if (t) (t.queued++, (t.since = Math.min(t.since, e.enqueuedAt)));
    else perTenant.set(e.tenant, { queued: 1, since: e.enqueuedAt });
    oldest = Math.min(oldest, e.enqueuedAt);
  }
  const tenants = [...perTenant]
    .sort((a, b) => b[1].queued - a[1].queued || (a[0] < b[0] ? -1 : 1))
    .slice(0, SNAPSHOT_TENANTS)
    .map(([tenant, t]) => ({ tenant, queued: t.queued, oldestWaitMs: now - t.since }));
  const q = s.queue;
  return {
    depth,
    admitted: { ...q.admitted },
    rejected: { ...q.rejected },
    wait: Object.fromEntries(Object.entries(q.wait).map(([b, h]) => [b, { counts: [...h.counts], sum: h.sum, count: h.count }])),
    drainPerSecond: q.drain.perSecond(now),
    tenants,
    boundPerReplica: pool.maxInFlightPerReplica!,
    oldestWaitMs: now - oldest,
    shareReserve: pool.flowControl.shareReserve,
    reserveHeld: q.reserveHeld,
    preempt: pool.flowControl.preempt,
    preemptAsked: q.preemptAsked,
    preempted: q.preempted,
  };
}

/**
 * A lease just taken by a request whose Worker may be asked to give it back (flowControl.preempt):
 * its callback is kept with the lease. An RPC stub received as a parameter is disposed when the
 * call returns unless duplicated ("When stubs are received in the parameters of an RPC, those stubs
 * are automatically disposed when the call returns. If you wish to keep the stubs longer than
 * that, you must call the dup() method on them": cloudflare/cloudflare-docs
 * src/content/docs/workers/runtime-apis/rpc/lifecycle.mdx); the duplicate is disposed with the lease
 * (leases.ts dropLease).
 */
function keepHook(s: PoolState, pool: PoolRuntime, req: AcquireRequest, leaseId: string): void {
  if (!req.preempt || !req.queue || !pool.flowControl.preempt) return;
  const lease = s.leases.byId.get(leaseId);
  if (!lease) return;
  const hook = req.preempt as AcquireRequest['preempt'] & { dup?: () => NonNullable<AcquireRequest['preempt']> };
  let band = queueOf(s, pool).bandIndex(req.queue.band);
  if (band < 0) band = Math.max(0, queueOf(s, pool).bandIndex(pool.flowControl.defaultBand));
  lease.preempt = { hook: typeof hook.dup === 'function' ? hook.dup() : hook, band, fairWeight: req.queue.weight, asked: false };
}

/** Tries a preemption makes for one waiting request before it gives up (each Worker that answers false: its request committed). */
const PREEMPT_TRIES = 3;
/** A Worker that has not answered a preemption by then is taken to have declined (its isolate is busy or gone). */
const PREEMPT_ANSWER_MS = 1_000;

/**
 * Flow control's preemption (`flowControl.preempt`): the request `ticket` waits with every slot
 * taken, and its tenant is below its fair share (of the slots, or of the recent admissions): the
 * Worker of the youngest request of a tenant over its share both ways, in the same band or a lower
 * one, on a replica this request may use, is asked to give its slot back (core preemptionVictim).
 * It does so only while its request has sent nothing to its client (before its first token); it
 * then aborts that attempt, releases the lease (the release drains the queue: the slot goes to the
 * queue's next request, this one when it is first) and queues again. One slot at most per waiting
 * request; a Worker that answers false (committed meanwhile) makes it try the next, up to
 * PREEMPT_TRIES.
 */
function preemptFor(s: PoolState, pool: PoolRuntime, ticket: string, tries = 0): void {
  if (!pool.flowControl.preempt || tries >= PREEMPT_TRIES) return;
  const fq = s.queue.fq;
  const e = fq?.get(ticket);
  if (!fq || !e || e.item.preemptAsked || e.item.req.pin || freeSlots(s, pool) > 0) return;
  const now = Date.now();
  const tenant = e.tenant;
  if (tenant === '') return;
  const share = (t: string, weight: number, load: number) => overShareBothWays(shareOf(s, pool, t, weight, load, now));
  if (share(tenant, e.weight, (s.leases.tenantInFlight.get(tenant) ?? 0) + 1)) return;
  const exclude = e.item.req.exclude ?? [];
  const over = new Map<string, boolean>();
  const candidates: PreemptionCandidate[] = [];
  for (const lease of s.leases.byId.values()) {
    const p = lease.preempt;
    if (!p || p.asked || lease.tenant === tenant || exclude.includes(lease.replica.id) || !s.replicas.includes(lease.replica)) continue;
    let o = over.get(lease.tenant);
    if (o === undefined) over.set(lease.tenant, (o = share(lease.tenant, p.fairWeight, s.leases.tenantInFlight.get(lease.tenant) ?? 0)));
    candidates.push({ id: lease.id, tenant: lease.tenant, band: p.band, at: lease.startedAt, overShare: o });
  }
  const victim = preemptionVictim(tenant, e.band, candidates);
  if (!victim) return;
  const lease = s.leases.byId.get(victim.id)!;
  const p = lease.preempt!;
  p.asked = true;
  e.item.preemptAsked = true;
  s.queue.preemptAsked++;
  const answered = (yes: boolean) => {
    if (yes) {
      s.queue.preempted++;
      return;
    }
    // Too late for that one (it committed): the next, while this request still waits.
    const still = s.queue.fq?.get(ticket);
    if (still) {
      still.item.preemptAsked = false;
      preemptFor(s, pool, ticket, tries + 1);
    }
  };
  let asked: boolean | Promise<boolean>;
  try {
    asked = p.hook();
  } catch {
    asked = false;
  }
  let timer: ReturnType<typeof setTimeout> | null = null;
  const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), PREEMPT_ANSWER_MS)));
  const stop = () => timer !== null && clearTimeout(timer);
  Promise.race([Promise.resolve(asked), late]).then(
    (yes) => {
      stop();
      answered(yes === true);
    },
    () => {
      stop();
      // The Worker's request ended (its callback went with it): the lease goes with its release or TTL.
      answered(false);
    },
  );
}
