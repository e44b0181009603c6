// This isolate's settles on their way to the tenants' meters: a settle that fails is kept and
// retried until it lands, within the waitUntil budget of the request that made it, then with the
// next settle of the same tenant from this isolate, which carries the backlog along (`earlier`,
// one call). Settles carry a router-drawn id, and the meter counts an id once, so a retry of a
// settle that did land (its answer lost) is harmless. I/O: meter RPCs, timers.
//
// The platform cancels waitUntil work 30 s after the response
// (developers.cloudflare.com/workers/platform/limits/#duration): a settle stays in the outbox until
// its call answered, marked in flight only until that call's timeout, so a cancelled call leaves
// nothing stuck. What is lost: the outbox of an isolate that is evicted while the meter is down.

import type { SettleRequest, SettleResult } from './tenant-meter.js';

/** What a settle loop may run for per waitUntil registration (under the platform's 30 s). */
export const SETTLE_BUDGET_MS = 20_000;
/** A meter call that has not answered by then counts as failed. */
export const SETTLE_CALL_TIMEOUT_MS = 5_000;
/** Settles carried in one call at most; the rest go with the next. */
export const SETTLE_BATCH_MAX = 200;
/** Settles kept per tenant at most while its meter is unreachable; past it the oldest are dropped (counted, logged). */
export const SETTLE_BACKLOG_MAX = 5_000;

export interface SettleMeter {
  settle(req: SettleRequest): Promise<SettleResult | undefined>;
}

export interface OutboxTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

interface Entry {
  req: SettleRequest & { id: string };
  /** In a call until then (its timeout), by `sentBy`. */
  sendingUntil: number;
  sentBy: number;
}

export interface OutboxCounters {
  delivered: number;
  failedCalls: number;
  dropped: number;
}

export class SettleOutbox {
  readonly #byTenant = new Map<string, Map<string, Entry>>();
  readonly #now: () => number;
  readonly #timers: OutboxTimers;
  readonly #budgetMs: number;
  readonly #callTimeoutMs: number;
  #calls = 0;
  readonly counters: OutboxCounters = { delivered: 0, failedCalls: 0, dropped: 0 };

  constructor(opts: { now?: () => number; timers?: OutboxTimers; budgetMs?: number; callTimeoutMs?: number } = {}) {
    this.#now = opts.now ?? Date.now;
    this.#timers = opts.timers ?? { setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>) };
    this.#budgetMs = opts.budgetMs ?? SETTLE_BUDGET_MS;
    this.#callTimeoutMs = opts.callTimeoutMs ?? SETTLE_CALL_TIMEOUT_MS;
  }

  /** Settles of `tenant` not yet acknowledged by its meter. */
  backlog(tenant: string): number {
    return this.#byTenant.get(tenant)?.size ?? 0;
  }

  /**
   * Deliver `req` (with this tenant's backlog) to `meter`; the work is handed to `waitUntil`.
   * `onResult` gets the meter's answer to `req` itself (its allowance).
   */
  deliver(meter: SettleMeter, req: SettleRequest & { id: string }, waitUntil: (p: Promise<unknown>) => void, onResult?: (res: SettleResult | undefined) => void): void {
    let box = this.#byTenant.get(req.tenant);
    if (!box) this.#byTenant.set(req.tenant, (box = new Map()));
    box.set(req.id, { req, sendingUntil: 0, sentBy: 0 });
    while (box.size > SETTLE_BACKLOG_MAX) {
      const oldest = box.keys().next().value!;
      box.delete(oldest);
      this.counters.dropped++;
      console.error(JSON.stringify({ type: 'quota_settle_dropped', tenant: req.tenant, id: oldest, backlog: box.size }));
    }
    waitUntil(this.#loop(meter, req.tenant, req.id, onResult));
  }

  async #loop(meter: SettleMeter, tenant: string, id: string, onResult?: (res: SettleResult | undefined) => void): Promise<void> {
    const until = this.#now() + this.#budgetMs;
    for (let attempt = 0; ; attempt++) {
      const box = this.#byTenant.get(tenant);
      const mine = box?.get(id);
      if (!box || !mine) return; // landed with another request's call
      const now = this.#now();
      if (mine.sendingUntil <= now) {
        const stamp = ++this.#calls;
        const batch = [mine, ...[...box.values()].filter((e) => e !== mine && e.sendingUntil <= now).slice(0, SETTLE_BATCH_MAX - 1)];
        for (const e of batch) {
          e.sendingUntil = now + this.#callTimeoutMs;
          e.sentBy = stamp;
        }
        const earlier = batch.slice(1).map((e) => e.req);
        try {
          const res = await this.#withTimeout(meter.settle(earlier.length > 0 ? { ...mine.req, earlier } : mine.req), this.#callTimeoutMs);
          for (const e of batch) box.delete(e.req.id);
          if (box.size === 0) this.#byTenant.delete(tenant);
          this.counters.delivered += batch.length;
          onResult?.(res);
          return;
        } catch (e) {
          for (const x of batch) if (x.sentBy === stamp) x.sendingUntil = 0;
          this.counters.failedCalls++;
          console.error(JSON.stringify({ type: 'quota_settle_failed', tenant, id, carried: batch.length, backlog: box.size, message: e instanceof Error ? e.message : String(e) }));
        }
      }
      const wait = Math.min(2_000, 100 * 2 ** attempt);
      // Past the budget it stays in the outbox: the tenant's next settle from this isolate carries it.
      if (this.#now() + wait + this.#callTimeoutMs >= until) return;
      await new Promise<void>((r) => this.#timers.setTimeout(r, wait));
    }
  }

  #withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
    let timer: unknown;
    return Promise.race([p, new Promise<never>((_, reject) => (timer = this.#timers.setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)))]).finally(() => timer !== undefined && this.#timers.clearTimeout(timer));
  }
}

/** The isolate's outbox. */
export const settleOutbox = new SettleOutbox();
