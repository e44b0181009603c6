// This isolate's settles on their way to the tenants' meters, batched: a settle waits up to
// SETTLE_WINDOW_MS (or until SETTLE_BATCH_MAX of its tenant are waiting) and goes in one call with
// every other settle of its tenant waiting here (`earlier`), so a busy tenant's meter sees about
// one call per isolate per window, not one per request. A settle that fails is kept and retried
// until it lands, within the waitUntil budget of the request that made it, then with the next
// settle of the same tenant from this isolate. Settles carry a router-drawn id, and the meter
// counts an id once, so a retry of a settle that did land (its answer lost) is harmless.
// I/O: meter RPCs, timers.
//
// The platform cancels waitUntil work 30 s after the response
// (developers.cloudflare.com/workers/platform/limits/#duration): a settle stays in the outbox until
// its call answered, marked in flight only until that call's timeout, so a cancelled call leaves
// nothing stuck. What is lost: the outbox of an isolate that is evicted while the meter is down.

import type { SettleRequest, SettleResult } from './tenant-meter.js';

/** What a settle loop may run for per waitUntil registration (under the platform's 30 s). */
export const SETTLE_BUDGET_MS = 20_000;
/**
 * How long a settle waits for others of its tenant before its call. One Durable Object serves about
 * 1,000 requests/s (developers.cloudflare.com/durable-objects/reference/faq/#how-much-work-can-a-single-durable-object-do):
 * at one call per isolate per window a tenant's meter takes 1,000 / (isolates / 0.25 s) calls, whatever its request rate.
 */
export const SETTLE_WINDOW_MS = 250;
/** A meter call that has not answered by then counts as failed. */
export const SETTLE_CALL_TIMEOUT_MS = 5_000;
/** Settles carried in one call at most; the rest go with the next. */
export const SETTLE_BATCH_MAX = 200;
/** Settles kept per tenant at most while its meter is unreachable; past it the oldest are dropped (counted, logged). */
export const SETTLE_BACKLOG_MAX = 5_000;
/** Settles kept in the isolate at most, all tenants together (~1 KB each: bounded at ~20 MB of the 128 MB). */
export const SETTLE_OUTBOX_MAX = 20_000;

export interface SettleMeter {
  settle(req: SettleRequest): Promise<SettleResult | undefined>;
}

export interface OutboxTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

interface Entry {
  req: SettleRequest & { id: string };
  /** Gets the meter's answer when this settle is the one its call answers for (the newest of the batch). */
  onResult: ((res: SettleResult | undefined) => void) | undefined;
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
  readonly #windowMs: number;
  readonly #maxTotal: number;
  #total = 0;
  #calls = 0;
  readonly counters: OutboxCounters & { calls: number } = { delivered: 0, failedCalls: 0, dropped: 0, calls: 0 };

  constructor(opts: { now?: () => number; timers?: OutboxTimers; budgetMs?: number; callTimeoutMs?: number; windowMs?: number; maxTotal?: number } = {}) {
    this.#now = opts.now ?? Date.now;
    this.#timers = opts.timers ?? { setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>) };
    this.#budgetMs = opts.budgetMs ?? SETTLE_BUDGET_MS;
    this.#callTimeoutMs = opts.callTimeoutMs ?? SETTLE_CALL_TIMEOUT_MS;
    this.#windowMs = opts.windowMs ?? SETTLE_WINDOW_MS;
    this.#maxTotal = opts.maxTotal ?? SETTLE_OUTBOX_MAX;
  }

  /** Settles waiting in this outbox, all tenants. */
  size(): number {
    return this.#total;
  }

  #drop(tenant: string, box: Map<string, Entry>, id: string): void {
    box.delete(id);
    this.#total--;
    if (box.size === 0 && this.#byTenant.get(tenant) === box) this.#byTenant.delete(tenant);
    this.counters.dropped++;
    console.error(JSON.stringify({ type: 'quota_settle_dropped', tenant, id, backlog: box.size }));
  }

  /** Settles of `tenant` not yet acknowledged by its meter. */
  backlog(tenant: string): number {
    return this.#byTenant.get(tenant)?.size ?? 0;
  }

  /**
   * Deliver `req` (with this tenant's backlog) to `meter`; the work is handed to `waitUntil`.
   * `onResult` gets the meter's answer (its allowance) when `req` is the newest settle of its call;
   * the allowance asked by the older ones of a batch is asked once, by the newest.
   */
  deliver(meter: SettleMeter, req: SettleRequest & { id: string }, waitUntil: (p: Promise<unknown>) => void, onResult?: (res: SettleResult | undefined) => void): void {
    let box = this.#byTenant.get(req.tenant);
    if (!box) this.#byTenant.set(req.tenant, (box = new Map()));
    if (!box.has(req.id)) this.#total++;
    box.set(req.id, { req, onResult, sendingUntil: 0, sentBy: 0 });
    while (box.size > SETTLE_BACKLOG_MAX) this.#drop(req.tenant, box, box.keys().next().value!);
    // Past the isolate's bound the oldest backlog goes first (the tenant first in the map has waited
    // longest); a settle in a call now is left alone: it may be landing.
    while (this.#total > this.#maxTotal) {
      const now = this.#now();
      let victim: [string, Map<string, Entry>, string] | undefined;
      for (const [tenant, b] of this.#byTenant) {
        for (const [id, e] of b) {
          if (e.sendingUntil <= now) {
            victim = [tenant, b, id];
            break;
          }
        }
        if (victim) break;
      }
      if (!victim) break;
      this.#drop(...victim);
    }
    waitUntil(this.#loop(meter, req.tenant, req.id));
  }

  /**
   * One per settle, in its own request's waitUntil (a call made from another request's context
   * would be cut with that request): after the window, the first loop to find its settle unsent
   * sends every unsent settle of the tenant; the others find theirs landed or in flight, and wait.
   */
  async #loop(meter: SettleMeter, tenant: string, id: string): Promise<void> {
    const until = this.#now() + this.#budgetMs;
    const unsent = () => [...(this.#byTenant.get(tenant)?.values() ?? [])].filter((e) => e.sendingUntil <= this.#now()).length;
    if (this.#windowMs > 0 && unsent() < SETTLE_BATCH_MAX) await new Promise<void>((r) => this.#timers.setTimeout(r, this.#windowMs));
    for (let attempt = 0; ; attempt++) {
      const box = this.#byTenant.get(tenant);
      const mine = box?.get(id);
      if (!box || !mine) return; // landed with another request's call
      const now = this.#now();
      if (mine.sendingUntil <= now) {
        const stamp = ++this.#calls;
        // Oldest first (Map order), this one included; the newest that asks for an allowance carries the rest.
        const ready = [...box.values()].filter((e) => e === mine || e.sendingUntil <= now);
        let batch = ready.slice(0, SETTLE_BATCH_MAX);
        if (!batch.includes(mine)) batch = [...batch.slice(0, SETTLE_BATCH_MAX - 1), mine];
        for (const e of batch) {
          e.sendingUntil = now + this.#callTimeoutMs;
          e.sentBy = stamp;
        }
        const head = [...batch].reverse().find((e) => e.req.wantAllowance) ?? batch[batch.length - 1]!;
        const earlier = batch.filter((e) => e !== head).map((e) => e.req);
        try {
          this.counters.calls++;
          const res = await this.#withTimeout(meter.settle(earlier.length > 0 ? { ...head.req, earlier } : head.req), this.#callTimeoutMs);
          for (const e of batch) if (box.delete(e.req.id)) this.#total--;
          if (box.size === 0 && this.#byTenant.get(tenant) === box) this.#byTenant.delete(tenant);
          this.counters.delivered += batch.length;
          head.onResult?.(res);
          return;
        } catch (e) {
          for (const x of batch) if (x.sentBy === stamp) x.sendingUntil = 0;
          this.counters.failedCalls++;
          console.error(JSON.stringify({ type: 'quota_settle_failed', tenant, id, carried: batch.length, backlog: box.size, message: e instanceof Error ? e.message : String(e) }));
        }
      }
      // In flight with another loop's call: look again soon (it lands, or its timeout frees it).
      const wait = mine.sendingUntil > now ? Math.min(mine.sendingUntil - now + 1, 100) : Math.min(2_000, 100 * 2 ** attempt);
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
