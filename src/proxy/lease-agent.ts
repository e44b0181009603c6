// Lease protocol v2, the Worker's half: one LeaseAgent per isolate keeps, per pool, the leases
// this isolate holds, the releases not yet delivered, the coordinator's last replica set (for
// failing open) and a breaker for an unreachable coordinator. Releases ride on the next acquire
// or go out together within `releaseFlushMs`; every `renewIntervalMs` one batched renewal of all
// live leases rides on an acquire or goes out on its own; a failed delivery is retried until the
// lease's TTL has passed (the coordinator has reaped it by then). I/O: coordinator RPCs through
// the LeaseClient each request hands in (a stub belongs to its request), timers.
//
// Billed Durable Object requests (every stub method call is one): an acquire per attempt, plus a
// `settle` only when no acquire came along in time: at steady load about one per client request
// (docs/scaling.md, measured in the fault run as `rpcs per request`).
//
// Background work runs in requests' `waitUntil`, which the platform cancels 30 s after the
// response ("Use event.waitUntil() to delay cancellation for another 30 seconds or until the
// promise passed to waitUntil() completes": developers.cloudflare.com/workers/platform/limits/#duration;
// Miniflare never cancels). A cancelled promise never resumes, so nothing here trusts a flag
// alone: every loop stops within LOOP_BUDGET_MS of its registration and owns its work through a
// token with a deadline that a later request's loop takes over once past; an in-flight batch and
// a renewal in progress are marked until their call's timeout, not until their call returns.

import type { AcquireRequest, AcquireResult, LeaseRelease, LeaseRenewal, SettleResult, PoolView } from '../coordinator/types.js';
import type { ReleaseOutcome } from '../coordinator/stats.js';
import { globalTimers, LOOP_BUDGET_MS, PoolLeases, QUEUED_QUIET_MS, type AcquireOutcome, type AcquireWait, type AgentTimers, type HeldLease, type LeaseAgentCounters, type LeaseClient, type LeaseTimings, type Owner, type Taken } from './lease-agent-state.js';

export { LOOP_BUDGET_MS, QUEUED_QUIET_MS, type AcquireOutcome, type AcquireWait, type AgentTimers, type HeldLease, type LeaseAgentCounters, type LeaseClient, type LeaseTimings } from './lease-agent-state.js';

export class LeaseAgent {
  readonly #pools = new Map<string, PoolLeases>();
  readonly #now: () => number;
  /** This isolate, for the coordinator's per-isolate fallback totals (drawn on first use: no random values at global scope). */
  #isolateId: string | null = null;
  get #isolate(): string {
    return (this.#isolateId ??= crypto.randomUUID());
  }
  readonly counters: LeaseAgentCounters = { rpcs: {}, releasesRetried: 0, releasesAbandoned: 0, lateAcquires: 0, loopsTakenOver: 0, leasesOrphaned: 0 };
  readonly #timers: AgentTimers;
  #tokens = 0;

  constructor(now: () => number = Date.now, timers: AgentTimers = globalTimers) {
    this.#now = now;
    this.#timers = timers;
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((r) => this.#timers.setTimeout(r, ms));
  }

  #withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
    let timer: unknown;
    return Promise.race([p, new Promise<never>((_, reject) => (timer = this.#timers.setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)))]).finally(() => timer !== undefined && this.#timers.clearTimeout(timer));
  }

  /** A new owner for a loop or call, trusted until `now + ms`. */
  #own(ms: number): Owner {
    return { token: ++this.#tokens, until: this.#now() + ms };
  }

  /** Whether `o` still stands: a loop or call past its deadline was cancelled (or is about to stop). */
  #live(o: Owner | null): boolean {
    return o !== null && o.until > this.#now();
  }

  #state(pool: string): PoolLeases {
    let s = this.#pools.get(pool);
    if (!s) this.#pools.set(pool, (s = new PoolLeases()));
    return s;
  }

  #count(method: string): void {
    this.counters.rpcs[method] = (this.counters.rpcs[method] ?? 0) + 1;
  }

  /** The coordinator's last replica set for `pool` as this isolate knows it (null: never heard). */
  view(pool: string): PoolView | null {
    return this.#pools.get(pool)?.view ?? null;
  }

  /** An acquire of `pool` is waiting in the coordinator's queue (its `queued` callback came): the pool is at its bound. */
  noteQueued(pool: string): void {
    this.#state(pool).queuedAt = this.#now();
  }

  /** An acquire of `pool` waited in the coordinator's queue lately (flow control): the pool is at its bound. */
  recentlyQueued(pool: string): boolean {
    return this.#now() - (this.#pools.get(pool)?.queuedAt ?? -Infinity) < QUEUED_QUIET_MS;
  }

  /** Whether this isolate currently routes `pool` open (its coordinator failed within coordinatorRetryMs). */
  isOpen(pool: string): boolean {
    return (this.#pools.get(pool)?.openUntil ?? 0) > this.#now();
  }

  /** Per pool: leases held, releases waiting, fallbacks not yet reported, open or not. */
  stats(): { pool: string; held: number; pending: number; fallbacksUnreported: number; open: boolean }[] {
    const now = this.#now();
    return [...this.#pools].map(([pool, s]) => ({ pool, held: s.held.size, pending: s.pending.size, fallbacksUnreported: s.fallbacksTotal - s.fallbacksAcked, open: s.openUntil > now }));
  }

  /** Held leases of `pool` on each replica (tests, the fault run's true count). */
  heldByReplica(pool: string): Record<string, number> {
    const out: Record<string, number> = {};
    for (const l of this.#pools.get(pool)?.held.values() ?? []) out[l.replica] = (out[l.replica] ?? 0) + 1;
    return out;
  }

  /** A request this isolate served without the coordinator; reported on the next call that gets through. */
  noteFallback(pool: string, client?: LeaseClient, t?: LeaseTimings, waitUntil?: (p: Promise<unknown>) => void): void {
    const st = this.#state(pool);
    st.fallbacksTotal++;
    // Reported on the next call that gets through; if none comes (every request since ran open),
    // one report goes out after the breaker's wait, retried for a while (one per isolate and pool).
    // A request routed open is also the one that takes over releases a cancelled loop left behind.
    if (client?.settle && t && waitUntil) {
      if (!this.#live(st.reporting)) {
        if (st.reporting) this.counters.loopsTakenOver++;
        const owner = (st.reporting = this.#own(LOOP_BUDGET_MS));
        waitUntil(
          this.#reportLoop(client, pool, t, owner).finally(() => {
            if (st.reporting === owner) st.reporting = null;
          }),
        );
      }
      this.#resumeFlush(client, pool, t, waitUntil);
    }
  }

  async #reportLoop(client: LeaseClient, pool: string, t: LeaseTimings, owner: Owner): Promise<void> {
    const st = this.#state(pool);
    for (let attempt = 0; ; attempt++) {
      const wait = Math.max(t.coordinatorRetryMs, 100) + backoff(attempt);
      // Within the budget, a settle's timeout included; what is left goes with the next call.
      if (this.#now() + wait + settleTimeoutMs(t) >= owner.until) return;
      await this.#sleep(wait);
      if (st.reporting !== owner) return;
      if (st.fallbacksTotal <= st.fallbacksAcked) return;
      if (this.#now() < st.openUntil) continue;
      await this.#settleNow(client, pool, t, false);
    }
  }

  /** Releases left by a flush loop that stopped (its budget) or was cancelled: this request's waitUntil carries them now. */
  #resumeFlush(client: LeaseClient, pool: string, t: LeaseTimings, waitUntil: (p: Promise<unknown>) => void): void {
    const st = this.#state(pool);
    if (!this.#live(st.flushing) && this.#sendable(st)) this.#scheduleFlush(client, pool, t, t.releaseFlushMs, waitUntil);
  }

  /** Releases waiting that no call is carrying now. */
  #sendable(st: PoolLeases): boolean {
    const now = this.#now();
    for (const p of st.pending.values()) if (p.sendingUntil <= now) return true;
    return false;
  }

  /**
   * Acquire, with this isolate's pending releases (and a due renewal) riding along. Resolves
   * `unreachable` when the call fails, misses `acquireTimeoutMs`, or the breaker is open; the
   * caller then fails open or tries another region. A reply that comes after the deadline still
   * settles what it carried, and a lease it granted is released at once.
   */
  async acquire(client: LeaseClient, req: AcquireRequest, t: LeaseTimings, waitUntil: (p: Promise<unknown>) => void, wait?: AcquireWait): Promise<AcquireOutcome> {
    const st = this.#state(req.pool);
    const now = this.#now();
    // A queue-eligible call may stay open for its band's wait: only past that and the usual
    // timeout is the coordinator taken to be unreachable.
    const queued = req.queue !== undefined && wait !== undefined;
    const timeoutMs = t.acquireTimeoutMs + (queued ? wait.maxQueueMs : 0);
    if (now < st.openUntil) {
      if (client.settle) this.#resumeFlush(client, req.pool, t, waitUntil);
      return { kind: 'unreachable', why: 'breaker', message: 'coordinator failed recently' };
    }
    const taken = client.settle ? this.#take(st, now, t, false) : null;
    const send = (): Promise<AcquireResult> => {
      this.#count('acquire');
      try {
        return client.acquire({ ...req, ...(taken ? { settle: taken.batch } : {}), viewVersion: st.view?.version ?? '' });
      } catch (e) {
        return Promise.reject(e);
      }
    };
    // A call that fails fast (the object was reset under it: a deploy, a restart) is sent once more
    // before giving up; a slow one is not.
    const call: Promise<AcquireResult> = send().catch((e: unknown) => {
      if (this.#now() - now >= t.acquireTimeoutMs / 2) throw e;
      return send();
    });
    let timer: unknown;
    const deadline = new Promise<'timeout'>((resolve) => (timer = this.#timers.setTimeout(() => resolve('timeout'), timeoutMs)));
    // The client went away while the acquire waited in the queue: leave it at once (cancelQueued).
    let onAbort: (() => void) | undefined;
    const aborted = queued && wait.signal ? new Promise<'aborted'>((resolve) => {
      if (wait.signal!.aborted) resolve('aborted');
      onAbort = () => resolve('aborted');
      wait.signal!.addEventListener('abort', onAbort, { once: true });
    }) : null;
    const stop = () => {
      if (timer !== undefined) this.#timers.clearTimeout(timer);
      if (onAbort) wait!.signal!.removeEventListener('abort', onAbort);
    };
    // The call may still land after we stopped waiting: what it settled is settled (releases are
    // idempotent, so sending them again is harmless), and a lease it took for nobody goes back at once.
    const releaseLate = () =>
      waitUntil(
        call.then(
          (late) => {
            if (late.ok) {
              this.counters.lateAcquires++;
              this.release(client, req.pool, late.leaseId, req.tenant ?? '', { status: 0, error: 'connect', durationMs: 0 }, t, waitUntil);
            }
          },
          () => {},
        ),
      );
    let out: AcquireResult | 'timeout' | 'aborted';
    try {
      out = await Promise.race(aborted ? [call, deadline, aborted] : [call, deadline]);
    } catch (e) {
      stop();
      const message = e instanceof Error ? e.message : String(e);
      // Failed after waiting longer than an acquire takes: it was queued (a restart drops the queue).
      if (queued && this.#now() - now >= t.acquireTimeoutMs) {
        this.#failed(st, taken, t, false);
        if (taken) this.#scheduleFlush(client, req.pool, t, 0, waitUntil);
        return { kind: 'lost', message };
      }
      this.#failed(st, taken, t);
      if (taken) this.#scheduleFlush(client, req.pool, t, 0, waitUntil);
      return { kind: 'unreachable', why: 'error', message };
    }
    stop();
    if (out === 'aborted') {
      // Releases it carried may or may not have landed: sent again (idempotent), without opening the breaker.
      this.#failed(st, taken, t, false);
      if (taken) this.#scheduleFlush(client, req.pool, t, 0, waitUntil);
      if (client.cancelQueued) {
        this.#count('cancelQueued');
        waitUntil(client.cancelQueued(req.pool, req.queue!.ticket).catch((e: unknown) => logError('cancel_queued_failed', e)));
      }
      releaseLate();
      return { kind: 'cancelled' };
    }
    if (out === 'timeout') {
      this.#failed(st, taken, t, !queued);
      if (taken) this.#scheduleFlush(client, req.pool, t, 0, waitUntil);
      releaseLate();
      if (queued) return { kind: 'lost', message: `no answer within ${timeoutMs} ms (queued)` };
      return { kind: 'unreachable', why: 'timeout', message: `no answer within ${t.acquireTimeoutMs} ms` };
    }
    if (out.queuedMs !== undefined || (!out.ok && (out.reason === 'queue_full' || out.reason === 'queue_timeout'))) st.queuedAt = this.#now();
    this.#answered(st, taken, out, out.settled, t, client, req.pool, waitUntil);
    if (client.settle) this.#resumeFlush(client, req.pool, t, waitUntil);
    return { kind: 'reply', result: out };
  }

  /**
   * Hold a granted lease: renewed with all of this isolate's leases of the pool until released.
   * The returned promise is the renew loop (for waitUntil); it ends when the lease is released,
   * which its request does in a `finally`: the loop lives as long as its request's response, so
   * the 30 s after it do not apply; a loop cancelled anyway stops marking its lease `seenAt`, and
   * the lease is no longer renewed by the others' loops (the coordinator reaps it).
   */
  hold(client: LeaseClient, pool: string, lease: HeldLease, t: LeaseTimings): Promise<void> {
    const st = this.#state(pool);
    if (st.held.size === 0) st.nextRenewAt = this.#now() + t.renewIntervalMs;
    st.held.set(lease.id, { ...lease, seenAt: this.#now() });
    return this.#renewLoop(client, pool, lease.id, t);
  }

  /**
   * A finished lease. With a batching coordinator it waits for the next acquire or goes out
   * within releaseFlushMs; otherwise it is sent alone. Either way a failed delivery is retried.
   */
  release(client: LeaseClient, pool: string, leaseId: string, tenant: string, outcome: ReleaseOutcome, t: LeaseTimings, waitUntil: (p: Promise<unknown>) => void): void {
    const st = this.#state(pool);
    st.held.delete(leaseId);
    st.wakers.get(leaseId)?.();
    const until = this.#now() + t.leaseTtlMs;
    if (!client.settle) {
      waitUntil(this.#releaseAlone(client, leaseId, outcome, until));
      return;
    }
    st.pending.set(leaseId, { rel: { id: leaseId, outcome, ...(tenant ? { tenant } : {}) }, until, sendingUntil: 0, sentBy: 0 });
    this.#scheduleFlush(client, pool, t, this.#flushMs(pool, t), waitUntil);
  }

  /**
   * How long a release waits for an acquire to carry it: releaseFlushMs, but nothing while the
   * pool's acquires queue (flow control): there every freed slot has a request waiting for it at
   * the coordinator, and the delay would be added to that request's wait (a settle per round trip
   * instead of per releaseFlushMs, only while the pool is at its bound).
   */
  #flushMs(pool: string, t: LeaseTimings): number {
    return this.recentlyQueued(pool) ? 0 : t.releaseFlushMs;
  }

  /**
   * One flush loop per pool at a time, in the context of the request that started it: while the
   * coordinator is down, every failing request would otherwise add its own retrying loop. The
   * loop owns the pool's flushing until its budget ends; past that, the next request takes over.
   */
  #scheduleFlush(client: LeaseClient, pool: string, t: LeaseTimings, delayMs: number, waitUntil: (p: Promise<unknown>) => void): void {
    const st = this.#state(pool);
    if (this.#live(st.flushing)) return;
    if (st.flushing) this.counters.loopsTakenOver++;
    const owner = (st.flushing = this.#own(LOOP_BUDGET_MS));
    waitUntil(
      this.#flushLoop(client, pool, t, delayMs, owner)
        .catch((e: unknown) => logError('flush_failed', e))
        .finally(() => {
          if (st.flushing === owner) st.flushing = null;
        }),
    );
  }

  async #releaseAlone(client: LeaseClient, leaseId: string, outcome: ReleaseOutcome, until0: number): Promise<void> {
    const until = Math.min(until0, this.#now() + LOOP_BUDGET_MS);
    for (let attempt = 0; ; attempt++) {
      try {
        this.#count('release');
        await client.release(leaseId, outcome);
        return;
      } catch (e) {
        if (this.#now() + backoff(attempt) >= until) {
          this.counters.releasesAbandoned++;
          logError('release_failed', e);
          return;
        }
        this.counters.releasesRetried++;
        await this.#sleep(backoff(attempt));
      }
    }
  }

  /**
   * Deliver what is pending for `pool` (after `delayMs`, so that an acquire may take it first), and
   * retry with backoff while anything is left that the coordinator has not reaped yet, within
   * the loop's budget (what is left then goes with the next request's acquire or loop).
   */
  async #flushLoop(client: LeaseClient, pool: string, t: LeaseTimings, delayMs: number, owner: Owner): Promise<void> {
    const st = this.#state(pool);
    const stop = (): void => {
      // Cleared in the same turn as the last check, so a release after it starts a new loop.
      if (st.flushing === owner) st.flushing = null;
    };
    if (delayMs > 0) await this.#sleep(delayMs);
    for (let attempt = 0; ; ) {
      if (st.flushing !== owner) return;
      const now = this.#now();
      this.#dropExpired(st, now);
      if (!this.#sendable(st)) return stop();
      if (now + settleTimeoutMs(t) >= owner.until) return stop();
      let wait: number;
      if (await this.#settleNow(client, pool, t, false)) {
        // Releases that came in meanwhile: give an acquire the usual chance to take them first.
        attempt = 0;
        wait = this.#flushMs(pool, t);
      } else {
        this.counters.releasesRetried++;
        wait = backoff(attempt++);
      }
      if (this.#now() + wait >= owner.until) return stop();
      await this.#sleep(wait);
    }
  }

  /** One settle call now: pending releases, a due renewal (or a forced one), unreported fallbacks. */
  async #settleNow(client: LeaseClient, pool: string, t: LeaseTimings, forceRenew: boolean): Promise<boolean> {
    const st = this.#state(pool);
    const taken = this.#take(st, this.#now(), t, forceRenew);
    if (!taken || !client.settle) return true;
    this.#count('settle');
    try {
      const res = await this.#withTimeout(client.settle(pool, taken.batch), settleTimeoutMs(t));
      this.#answered(st, taken, null, res, t, client, pool, () => {});
      // A renewal that brought leases back after a restart, or found them gone, is worth a line.
      if (res.restored > 0 || res.gone.length > 0) console.log(JSON.stringify({ type: 'lease_renewal', pool, renewed: res.renewed, restored: res.restored, gone: res.gone.length }));
      return true;
    } catch (e) {
      this.#failed(st, taken, t);
      logError('settle_failed', e);
      return false;
    }
  }

  async #renewLoop(client: LeaseClient, pool: string, id: string, t: LeaseTimings): Promise<void> {
    const st = this.#state(pool);
    const timers = this.#timers;
    while (st.held.has(id)) {
      // Every holder wakes at the pool's renew time (a little spread); the first one sends it.
      // At most every half interval, so that `seenAt` stays fresh while a renewal is failing.
      const wait = Math.min(t.renewIntervalMs / 2, Math.max(10, st.nextRenewAt - this.#now())) + Math.floor(Math.random() * 20);
      await new Promise<void>((resolve) => {
        const timer = timers.setTimeout(done, wait);
        function done() {
          if (timer !== undefined) timers.clearTimeout(timer);
          st.wakers.delete(id);
          resolve();
        }
        st.wakers.set(id, done);
      });
      const lease = st.held.get(id);
      if (!lease) return;
      lease.seenAt = this.#now();
      const now = this.#now();
      if (now >= st.nextRenewAt && !this.#live(st.renewing)) await this.#settleNow(client, pool, t, true);
      // Releases a flush loop left when its budget ran out: a live stream's loop carries them.
      else if (!this.#live(st.flushing) && this.#sendable(st)) await this.#settleNow(client, pool, t, false);
    }
  }

  #take(st: PoolLeases, now: number, t: LeaseTimings, forceRenew: boolean): Taken | null {
    this.#dropExpired(st, now);
    const stamp = ++this.#tokens;
    // Marked for as long as the call may take (an acquire's or a settle's timeout): a call
    // cancelled with its request never clears the mark, its expiry does.
    const inCallUntil = now + Math.max(t.acquireTimeoutMs, settleTimeoutMs(t));
    const releases: LeaseRelease[] = [];
    const releaseIds: string[] = [];
    for (const [id, p] of st.pending) {
      if (p.sendingUntil > now) continue;
      p.sendingUntil = inCallUntil;
      p.sentBy = stamp;
      releases.push(p.rel);
      releaseIds.push(id);
    }
    // A lease whose own renew loop has not run for a TTL belongs to a request the platform
    // cancelled (its release never came): renewing it would keep it counted forever.
    for (const [id, l] of st.held) {
      if (now - (l.seenAt ?? now) > t.leaseTtlMs) {
        st.held.delete(id);
        this.counters.leasesOrphaned++;
      }
    }
    const renewDue = st.held.size > 0 && !this.#live(st.renewing) && (forceRenew || now >= st.nextRenewAt);
    let renew: LeaseRenewal[] | undefined;
    if (renewDue) {
      st.renewing = { token: stamp, until: inCallUntil };
      renew = [...st.held.values()].map((l) => ({ id: l.id, replica: l.replica, tenant: l.tenant, deadline: l.deadline, startedAt: l.startedAt, spilled: l.spilled }));
    }
    const fallbacks = st.fallbacksTotal > st.fallbacksAcked ? st.fallbacksTotal : null;
    if (releases.length === 0 && !renew && fallbacks === null) return null;
    return { stamp, batch: { releases, ...(renew ? { renew } : {}), ...(fallbacks !== null ? { fallbacks: { isolate: this.#isolate, total: fallbacks } } : {}) }, releaseIds, renewed: renew !== undefined, fallbacks };
  }

  #answered(st: PoolLeases, taken: Taken | null, acq: AcquireResult | null, settled: SettleResult | undefined, t: LeaseTimings, client: LeaseClient, pool: string, waitUntil: (p: Promise<unknown>) => void): void {
    const now = this.#now();
    st.openUntil = 0;
    if (taken) {
      for (const id of taken.releaseIds) st.pending.delete(id);
      if (taken.fallbacks !== null) st.fallbacksAcked = Math.max(st.fallbacksAcked, taken.fallbacks);
      if (taken.renewed) {
        if (st.renewing?.token === taken.stamp) st.renewing = null;
        st.nextRenewAt = now + t.renewIntervalMs;
        if (settled) {
          for (const id of settled.gone) st.held.delete(id);
          for (const l of st.held.values()) l.deadline = Math.max(l.deadline, settled.deadline);
        }
      }
    }
    const epoch = settled?.epoch ?? acq?.epoch;
    if (acq?.view) st.view = acq.view;
    if (epoch !== undefined) {
      const restarted = st.epoch !== null && st.epoch !== epoch;
      st.epoch = epoch;
      // A new coordinator instance knows none of our leases: renew them now, not at the next interval.
      if (restarted && st.held.size > 0 && !(taken?.renewed ?? false)) {
        st.nextRenewAt = 0;
        if (acq) waitUntil(this.#settleNow(client, pool, t, true));
      }
    }
  }

  /** A call that failed: what it carried is sendable again; `trip`: the breaker opens (the coordinator is taken to be unreachable). */
  #failed(st: PoolLeases, taken: Taken | null, t: LeaseTimings, trip = true): void {
    const now = this.#now();
    if (trip) {
      st.openUntil = now + t.coordinatorRetryMs;
      st.lastFailureAt = now;
    }
    if (!taken) return;
    for (const id of taken.releaseIds) {
      const p = st.pending.get(id);
      if (p && p.sentBy === taken.stamp) p.sendingUntil = 0;
    }
    if (taken.renewed) {
      if (st.renewing?.token === taken.stamp) st.renewing = null;
      // Try again soon: the leases' TTL is running, and a restarted coordinator waits for them.
      st.nextRenewAt = now + Math.min(200, t.renewIntervalMs / 4);
    }
  }

  #dropExpired(st: PoolLeases, now: number): void {
    for (const [id, p] of st.pending) {
      if (p.sendingUntil <= now && p.until <= now) {
        st.pending.delete(id);
        this.counters.releasesAbandoned++;
      }
    }
  }
}

/** A settle that has not answered by then counts as failed: 4 × acquireTimeoutMs (at least 1 s), at most half a renew interval. */
function settleTimeoutMs(t: LeaseTimings): number {
  return Math.min(Math.max(1_000, 4 * t.acquireTimeoutMs), t.renewIntervalMs / 2);
}

/** 100 ms, 200 ms, 400 ms … capped at 2 s. */
function backoff(attempt: number): number {
  return Math.min(2_000, 100 * 2 ** attempt);
}

function logError(type: string, e: unknown): void {
  console.error(JSON.stringify({ type, message: e instanceof Error ? e.message : String(e) }));
}
