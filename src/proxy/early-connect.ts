// Early connect: while the acquire RPC is on its way, send the upstream request to the replica
// this isolate's last lease for the same routing key went to. The coordinator's pick stays the
// only decision (exact and serialized, DESIGN.md): when it names another replica, or refuses, the
// early request is aborted before a byte of it reaches the client. What it buys: the coordinator
// round trip overlaps the origin's connect and prefill instead of adding to TTFT. What it costs:
// a request the guessed replica starts and then sees cancelled, counted per replica as
// `prefix_router_early_connects_total{result="miss"}`. Pure bookkeeping; no I/O.

import type { RoutingKey } from '../core/index.js';

export interface LeasedReplica {
  id: string;
  url: string;
  auth: string;
  /** The data-parallel engine the lease pinned (sent as vLLM's X-data-parallel-rank). */
  dpRank?: number;
}

export interface LeaseMemoryOptions {
  /** Keys remembered per isolate; the least recently used is forgotten first. */
  maxEntries?: number;
  /** A remembered pick older than this is not used (replicas drain, keys move). */
  ttlMs?: number;
  /** After a tenant-limit refusal, no early connects for that tenant for this long. */
  tenantCooldownMs?: number;
}

interface Remembered {
  replica: LeasedReplica;
  at: number;
}

export const LEASE_MEMORY_DEFAULTS = { maxEntries: 10_000, ttlMs: 60_000, tenantCooldownMs: 5_000 } as const;

/**
 * Per-isolate memory of the replica each keyed request was last leased on. Only keyed requests are
 * guessed: without a key the pick is least-load, which only the coordinator knows. Bounds on what
 * a guess can send where the coordinator would not have:
 * - a tenant with an in-flight cap gets no guess while this isolate already has that many of its
 *   requests under way, and none for a while after the coordinator refused it for the cap, so a
 *   burst over the cap reaches replicas at most `maxInFlight` at a time per isolate;
 * - a miss forgets every key remembered on the guessed replica, so after a drain, a removal or a
 *   new address each isolate sends it at most the guesses already under way when its first miss
 *   comes back (and nothing after the TTL).
 */
export class LeaseMemory {
  readonly #picks = new Map<string, Remembered>();
  readonly #limitedTenants = new Map<string, number>();
  readonly #tenantActive = new Map<string, number>();
  readonly #max: number;
  readonly #ttl: number;
  readonly #cooldown: number;

  constructor(opts: LeaseMemoryOptions = {}) {
    this.#max = Math.max(1, opts.maxEntries ?? LEASE_MEMORY_DEFAULTS.maxEntries);
    this.#ttl = opts.ttlMs ?? LEASE_MEMORY_DEFAULTS.ttlMs;
    this.#cooldown = opts.tenantCooldownMs ?? LEASE_MEMORY_DEFAULTS.tenantCooldownMs;
  }

  get size(): number {
    return this.#picks.size;
  }

  /**
   * The replica to connect to early, or null when there is nothing fresh to go on. Call it after
   * `enter()` for the same request: `maxInFlight` is compared with the tenant's requests under way
   * in this isolate, this one included.
   */
  guess(pool: string, key: RoutingKey, tenant: string, now: number, maxInFlight?: number): LeasedReplica | null {
    if (key.hash === null) return null;
    if (maxInFlight !== undefined && (this.#tenantActive.get(`${pool}\0${tenant}`) ?? 0) > maxInFlight) return null;
    const limitedUntil = this.#limitedTenants.get(`${pool}\0${tenant}`);
    if (limitedUntil !== undefined) {
      if (now < limitedUntil) return null;
      this.#limitedTenants.delete(`${pool}\0${tenant}`);
    }
    const id = slot(pool, key);
    const hit = this.#picks.get(id);
    if (!hit) return null;
    if (now - hit.at > this.#ttl) {
      this.#picks.delete(id);
      return null;
    }
    return hit.replica;
  }

  /** The coordinator leased `replica` for this key. */
  remember(pool: string, key: RoutingKey, replica: LeasedReplica, now: number): void {
    if (key.hash === null) return;
    const id = slot(pool, key);
    this.#picks.delete(id); // re-insert: Map order is the LRU order
    this.#picks.set(id, { replica: { id: replica.id, url: replica.url, auth: replica.auth, ...(replica.dpRank !== undefined ? { dpRank: replica.dpRank } : {}) }, at: now });
    if (this.#picks.size > this.#max) this.#picks.delete(this.#picks.keys().next().value!);
  }

  /** The key's replica failed or the coordinator had none: guess nothing until the next lease. */
  forget(pool: string, key: RoutingKey): void {
    if (key.hash !== null) this.#picks.delete(slot(pool, key));
  }

  /** A request of this tenant started in this isolate; returns the call that ends it (idempotent). */
  enter(pool: string, tenant: string): () => void {
    const id = `${pool}\0${tenant}`;
    this.#tenantActive.set(id, (this.#tenantActive.get(id) ?? 0) + 1);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      const n = (this.#tenantActive.get(id) ?? 1) - 1;
      if (n <= 0) this.#tenantActive.delete(id);
      else this.#tenantActive.set(id, n);
    };
  }

  /** Requests of this tenant under way in this isolate (tests, diagnostics). */
  active(pool: string, tenant: string): number {
    return this.#tenantActive.get(`${pool}\0${tenant}`) ?? 0;
  }

  /** A guess of `replica` was not confirmed: it may be draining, gone or moved. Forget every key on it. */
  forgetReplica(pool: string, replica: LeasedReplica): void {
    const prefix = `${pool}\0`;
    // Whatever engine of it a key was pinned to: the replica is what was not confirmed.
    for (const [id, hit] of this.#picks) if (id.startsWith(prefix) && sameOrigin(hit.replica, replica)) this.#picks.delete(id);
  }

  /** The coordinator refused this tenant for its in-flight cap. */
  tenantLimited(pool: string, tenant: string, now: number): void {
    this.#limitedTenants.set(`${pool}\0${tenant}`, now + this.#cooldown);
    if (this.#limitedTenants.size > this.#max) this.#limitedTenants.delete(this.#limitedTenants.keys().next().value!);
  }
}

function slot(pool: string, key: RoutingKey): string {
  return `${pool}\0${key.kind}\0${key.hash}`;
}

/** Same replica at the same address with the same credentials reference, pinned to the same engine. */
export function sameReplica(a: LeasedReplica, b: LeasedReplica): boolean {
  return sameOrigin(a, b) && a.dpRank === b.dpRank;
}

/** Same replica at the same address with the same credentials reference, whichever engine. */
function sameOrigin(a: LeasedReplica, b: LeasedReplica): boolean {
  return a.id === b.id && a.url === b.url && a.auth === b.auth;
}
