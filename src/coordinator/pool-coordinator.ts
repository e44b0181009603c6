// PoolCoordinator: one Durable Object per pool (`idFromName(pool)`), a thin shell over one module
// per concern: leases.ts (acquire, release, settle, reaping), replicas.ts (replicas and their storage),
// health.ts, scrape.ts, samples.ts and alarms.ts, all over one state object (state.ts).
// This class binds the pool, loads state, delegates, and returns typed results; its methods are the
// RPC surface the Worker calls. I/O: DO storage, the alarm, and (from it) fetches to the replicas.

import { DurableObject } from 'cloudflare:workers';
import type { PoolRuntime } from '../config.js';
import { ensureAlarm, nextSlice, scheduleNext } from './alarms.js';
import { checkHealth, checkOne } from './health.js';
import {
  countRpc,
  expireLeases,
  leaseSnapshot,
  leaseWakeAt,
  loadLeases,
  loadRecoveryFloor,
  persistFallbacks,
  persistTenantFloor,
  pruneTombstones,
  releaseLease,
  settleBatch,
} from './leases.js';
import { runLimited } from './origin-fetch.js';
import { acquireNow, acquireOrWait, cancelQueued, drainQueue, queueSnapshot } from './queue.js';
import { bindPool, loadReplicas, openStorage, patchReplica, persistStats, removeReplica, replicaSnapshot, upsertReplica } from './replicas.js';
import { evaluateAlerts, takeSample } from './samples.js';
import { scrapeMetrics, scrapeOne } from './scrape.js';
import { boundPool, createState, poolConfig, type PoolState } from './state.js';
import type { ReleaseOutcome } from './stats.js';
import { SAMPLE_MS, type AcquireRequest, type AcquireResult, type AdminResult, type PoolSnapshot, type ReplicaSnapshot, type SettleBatch, type SettleResult } from './types.js';

export * from './types.js';

export class PoolCoordinatorImpl extends DurableObject<Env> {
  /** Everything this object knows in memory (state.ts); the modules get it passed in. */
  protected readonly state: PoolState;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    const name = openStorage(ctx.storage.sql);
    this.state = createState(ctx.storage, env);
    if (name) this.load(name);
    loadRecoveryFloor(this.state);
  }

  // ---- RPC surface -------------------------------------------------------------------------

  acquire(req: AcquireRequest): AcquireResult {
    countRpc(this.state, 'acquire');
    return acquireNow(this.state, this.ensurePool(req.pool), req);
  }

  /**
   * acquire for a request that may wait (flow control, queue.ts; the Worker calls it instead of
   * acquire when the pool has a queue): when every usable replica is at its bound, this call stays
   * open until a slot frees or the band's wait runs out; the object serves other calls meanwhile.
   * Counted as an acquire: it is the request's one acquire call.
   */
  acquireQueued(req: AcquireRequest): AcquireResult | Promise<AcquireResult> {
    countRpc(this.state, 'acquire');
    return acquireOrWait(this.state, this.ensurePool(req.pool), req);
  }

  /**
   * A queued acquire whose client went away (the Worker saw its request's abort signal): out of the
   * queue at once; its acquire call answers `queue_cancelled`. Sent only on abandonment.
   */
  cancelQueued(pool: string, ticket: string): { cancelled: boolean } {
    countRpc(this.state, 'cancelQueued');
    return { cancelled: cancelQueued(this.state, this.ensurePool(pool), ticket) };
  }

  /** Revoke API keys (`tenant/keyId`) for this pool: persisted, refused from the next acquire on. */
  revokeKeys(keyIds: string[]): { revoked: number } {
    countRpc(this.state, 'revokeKeys');
    return { revoked: this.state.revoked.add(keyIds, Date.now()) };
  }

  /** Idempotent: a second release of the same lease (or of an expired one) changes nothing. */
  release(leaseId: string, outcome: ReleaseOutcome): { released: boolean } {
    countRpc(this.state, 'release');
    const released = releaseLease(this.state, { id: leaseId, outcome }, Date.now());
    drainQueue(this.state, boundPool(this.state));
    return { released };
  }

  /**
   * One isolate's batch for this pool (lease protocol v2): its releases, then, once per renew
   * interval, every lease it still holds. A renewal of a lease this instance does not know (it
   * restarted, or reaped a lease whose renewals were late) rebuilds it, so in-flight per replica
   * and per tenant are whole again within one renew interval of a restart.
   */
  settle(pool: string, batch: SettleBatch): SettleResult {
    countRpc(this.state, 'settle');
    const now = Date.now();
    const p = this.ensurePool(pool);
    if (!p) return { epoch: this.state.leases.epoch, released: 0, renewed: 0, restored: 0, gone: [], deadline: now };
    const res = settleBatch(this.state, batch, now);
    drainQueue(this.state, p);
    return res;
  }

  snapshot(pool?: string): PoolSnapshot | null {
    const s = this.state;
    const p = this.ensurePool(pool ?? s.poolName ?? '');
    if (!p) return null;
    const now = Date.now();
    const indexStats = s.prefixIndex ? s.prefixIndex.stats() : null;
    return {
      pool: p.name,
      strategy: p.strategyImpl.name,
      fallback: p.fallbackImpl.name,
      keys: [...p.keys],
      loadSignal: p.loadSignal,
      at: now,
      leases: s.leases.byId.size,
      expiredLeases: s.leases.expired,
      lease: leaseSnapshot(s, now),
      replicas: s.replicas.map((r) => replicaSnapshot(s, r, now, indexStats)),
      responseAffinity: { entries: s.responses.size, pins: { ...s.leases.pins } },
      prefixIndex: indexStats ? (({ entries, blocks, approxBytes, maxEntries, evictions }) => ({ entries, blocks, approxBytes, maxEntries, evictions }))(indexStats) : null,
      alerts: s.board.alerts,
      ...((q) => (q ? { queue: q } : {}))(queueSnapshot(s, p, now)),
      samples: s.board.samples,
    };
  }

  /** Create or replace a replica (admin PUT). Keeps its in-flight count and stats. */
  upsertReplica(pool: string, input: unknown): AdminResult<ReplicaSnapshot> {
    const p = this.ensurePool(pool);
    if (!p) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    const res = upsertReplica(this.state, input);
    drainQueue(this.state, p);
    return res;
  }

  /** Change weight and/or drain state (admin PATCH). */
  patchReplica(pool: string, id: string, patch: { weight?: number; draining?: boolean }): AdminResult<ReplicaSnapshot> {
    const p = this.ensurePool(pool);
    if (!p) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    const res = patchReplica(this.state, pool, id, patch);
    drainQueue(this.state, p);
    return res;
  }

  /** Remove a replica (admin DELETE). Streams in flight on it are not cut: the Worker holds them. */
  removeReplica(pool: string, id: string): AdminResult<{ id: string; inFlight: number }> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    return removeReplica(this.state, pool, id);
  }

  /** Run one round of active health checks now over every replica (also used by tests and the admin API). */
  async checkHealth(pool: PoolRuntime): Promise<void> {
    await checkHealth(this.state, pool);
    drainQueue(this.state, boundPool(this.state));
  }

  /** Scrape every replica's vLLM /metrics once (also used by tests). */
  async scrapeMetrics(pool: PoolRuntime): Promise<void> {
    await scrapeMetrics(this.state, pool);
  }

  // ---- alarm: lease expiry, active health checks, metrics scrape, samples, persistence -------

  override async alarm(): Promise<void> {
    // The alarm that fired is gone: forget it, and always schedule the next one, even if this round throws.
    this.state.alarm.pending = null;
    try {
      await this.runAlarm();
    } finally {
      const now = Date.now();
      await scheduleNext(this.state, now, leaseWakeAt(this.state, now));
    }
  }

  private async runAlarm(): Promise<void> {
    const s = this.state;
    const now = Date.now();
    expireLeases(s, now);
    pruneTombstones(s, now);
    const pool = boundPool(s);
    if (pool && s.replicas.length > 0) {
      // Health and scrape rounds are spread over ticks: each tick takes the next slice of replicas,
      // and at most healthConcurrency fetches leave at once (a Durable Object has few simultaneous
      // outgoing connections; a timeout only starts when its fetch does).
      const tasks: (() => Promise<void>)[] = [];
      if (now >= s.alarm.nextHealthAt) {
        for (const r of nextSlice(s, 'health', pool, pool.healthIntervalMs, now)) tasks.push(() => checkOne(s, r, pool));
      }
      if (now >= s.alarm.nextScrapeAt) {
        for (const r of nextSlice(s, 'scrape', pool, pool.scrapeIntervalMs, now)) tasks.push(() => scrapeOne(s, r, pool));
      }
      await runLimited(tasks, pool.healthConcurrency);
    }
    if (pool && now >= s.alarm.nextSampleAt) {
      s.alarm.nextSampleAt = now + SAMPLE_MS;
      takeSample(s, Date.now());
      evaluateAlerts(s, pool, Date.now());
    }
    // Leases reaped, replicas back up: slots for those waiting.
    drainQueue(s, pool);
    persistStats(s);
    persistFallbacks(s);
    persistTenantFloor(s, false);
  }

  // ---- binding and loading -------------------------------------------------------------------

  /** Bind this object to its pool on first use, seeding replicas from configuration. */
  protected ensurePool(name: string): PoolRuntime | null {
    const s = this.state;
    if (s.poolName !== null) return s.poolName === name ? poolConfig(s, name) : null;
    const pool = poolConfig(s, name);
    if (!pool) return null;
    bindPool(s, name, pool);
    this.load(name);
    return pool;
  }

  /** The pool's replicas and lease counters from storage; the alarm armed for the first health round. */
  protected load(name: string): void {
    loadReplicas(this.state, name);
    loadLeases(this.state);
    ensureAlarm(this.state, Date.now() + 100);
  }
}
