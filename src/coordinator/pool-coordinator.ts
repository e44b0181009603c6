// PoolCoordinator: one Durable Object per pool (`idFromName(pool)`). Owns the pool's replicas
// (persisted in SQLite), leases (in-flight counts; short and renewed in batches, rebuilt from
// renewals after a restart: lease protocol v2, proxy/lease-agent.ts), health, per-replica stats,
// and the alarm that expires leases, checks health and scrapes vLLM metrics. The pick itself is the pure
// core's; this class loads state, calls it, saves, and returns typed results. I/O: DO storage,
// health-check and metrics fetches to the replicas from the alarm.

import { DurableObject } from 'cloudflare:workers';
import { anchorLength, buildRing, hashString, hex32, pickReplica, PrefixIndex, PrefixMatchScratch, type PrefixMatch, type ReplicaView, type Ring } from '../core/index.js';
import { loadConfig, replicaEndpoint, replicaSchema, type PoolRuntime, type ReplicaConfig } from '../config.js';
import {
  createHotKeyState,
  emptyImbalanceState,
  evaluateHotKeys,
  evaluateImbalance,
  recordHotKey,
  type HotKeyAlert,
  type HotKeyState,
  type ImbalanceState,
} from '../observability/alerts.js';
import { resolveOriginAuth } from '../origin/origin-auth.js';
import { parsePromText } from './prom-text.js';
import { emptyStats, histogramQuantile, isReplicaFailure, recordOutcome, type Histogram, type ReleaseOutcome, type ReplicaStats } from './stats.js';
import { kvCapacity, kvCapacityFromTotals } from './kv-capacity.js';
import { PickState, replicaView } from './pick-state.js';
import { emptyHitRateWindow, extractEngineSample, pushSample, windowHitRate, type HitRateWindowState } from './vllm-metrics.js';
import { applyEngineScrape, countEngineLease, dropEngines, EngineMatcher, engineSnapshots, pushCapacities, singleEngine, slotBudget, type DpEngines, type EngineLease } from './dp-engines.js';

/** Released lease ids are remembered this many TTLs, so a renewal that raced its release cannot revive it. */
const TOMBSTONE_TTLS = 2;
const MAX_TOMBSTONES = 200_000;
/** Isolates whose fallback totals are remembered (an isolate forgotten and heard again counts its total once more). */
const MAX_ISOLATES = 2_000;
/** After a restart, tenant caps also count the tenant's last persisted in-flight for one renew interval plus this. */
const RECOVERY_GRACE_MS = 1_000;
/** The replica set sent to Workers for failing open is recomputed at most this often. */
const VIEW_CACHE_MS = 250;

export * from './types.js';
import type { PinResult } from './types.js';
import type { AcquireRequest, AcquireResult, AdminResult, LeaseRelease, LeaseRenewal, PoolAlert, PoolSample, PoolSnapshot, PoolView, ReplicaSample, ReplicaSnapshot, SettleBatch, SettleResult, VllmView } from './types.js';
import { runLimited, readCapped } from './origin-fetch.js';
import { ensureAlarm, nextSlice, scheduleNext } from './alarms.js';
import { checkHealth, checkOne, notePassiveFailure } from './health.js';
import { scrapeMetrics, scrapeOne } from './scrape.js';
import { evaluateAlerts, noteRoutingKey, takeSample } from './samples.js';
import { bindPool, indexFor, loadReplicas, openStorage, patchReplica, persistStats, removeReplica, replicaSnapshot, unpinEngines, upsertReplica, views } from './replicas.js';
import { boundPool, configOf, createState, isHealthy, noFaults, poolConfig, type Lease, type PoolState, type ReplicaLive } from './state.js';
import { dropRelease, failIfOutage, noteReaped, setFaults, type FaultRequest } from './test-faults.js';
import { SAMPLE_COUNT, SAMPLE_MS } from './types.js';

export class PoolCoordinatorImpl extends DurableObject<Env> {
  /** Everything this object knows in memory (state.ts); modules get it passed in. */
  private readonly state: PoolState;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    const name = openStorage(ctx.storage.sql);
    this.state = createState(ctx.storage, env);
    if (name) this.load(name);
    this.loadRecoveryFloor();
  }

  // ---- RPC surface -------------------------------------------------------------------------

  acquire(req: AcquireRequest): AcquireResult {
    this.countRpc('acquire');
    failIfOutage(this.state.fault);
    const pool = this.ensurePool(req.pool);
    const config = loadConfig(this.state.env.ROUTER_CONFIG);
    const retryAfterMs = config.retryAfterSeconds * 1000;
    if (!pool) return { ok: false, reason: 'unknown_pool', retryAfterMs };
    const now = Date.now();
    // Piggybacked releases first: the slots they free are there for this pick.
    const settled = req.settle ? this.applySettle(req.settle, now) : undefined;
    // Only a v2 caller (it sends viewVersion) gets the epoch, the settle result and the view.
    const extra = req.viewVersion === undefined ? {} : { epoch: this.state.leases.epoch, ...(settled ? { settled } : {}), ...this.viewUnless(req.viewVersion, pool, now) };
    if (req.keyId !== undefined && this.state.revoked.has(req.keyId)) return { ok: false, reason: 'key_revoked', retryAfterMs, ...extra };
    const tenant = req.tenant ?? '';
    const limit = req.tenantMaxInFlight ?? pool.maxInFlightPerTenant;
    const weight = Math.max(1, Math.floor(req.weight ?? 1));
    if (tenant && limit !== undefined && this.tenantCount(tenant, now) + weight > limit) return { ok: false, reason: 'tenant_limit', retryAfterMs, ...extra };
    const pin = req.pin ? this.state.responses.lookup(tenant, req.pin.responseId, now) : undefined;
    if (pin === null) {
      this.state.leases.pins.not_found++;
      return { ok: false, reason: 'response_not_found', retryAfterMs, ...extra };
    }

    let prefixMatch: PrefixMatch | undefined;
    const sessionKey = sessionKeyOf(req);
    const blocks = pool.strategyImpl.usesPrefix && req.blocks && req.blocks.length > 0 ? req.blocks : undefined;
    if (blocks) {
      prefixMatch = this.state.engineMatcher.match(indexFor(this.state, pool), this.state.ring.ids, this.state.replicas, blocks, this.state.leases.matchScratch, sessionKey);
    }
    const ctx = {
      ring: this.state.ring,
      replicas: this.state.pickState.current(this.state.replicas, pool, now),
      totals: this.state.pickState.totals,
      key: req.key,
      exclude: req.exclude && req.exclude.length > 0 ? new Set(req.exclude) : undefined,
      random: Math.random,
      cursor: this.state.leases.cursor,
      prefixMatch,
      pin,
    };
    let res = pickReplica(pool.strategyImpl, pool.fallbackImpl, ctx);
    // Passive exclusion (max_fails) is a soft signal: when it leaves nothing else to try, a replica
    // that passes its active health check is better than failing a request no byte has left for.
    if (!res.ok && this.state.replicas.some((r) => r.activeUp && r.passiveDownUntil > now)) {
      res = pickReplica(pool.strategyImpl, pool.fallbackImpl, { ...ctx, replicas: views(this.state, now, pool, true), totals: undefined });
    }
    if (pin !== undefined) this.state.leases.pins[res.ok ? 'hit' : res.reason === 'pinned_replica_gone' ? 'gone' : 'unavailable']++;
    if (!res.ok) return { ok: false, reason: res.reason, retryAfterMs, ...extra };
    const r = this.state.replicas[res.index]!;
    // A data-parallel replica: the engine too (longest match, else fewest leases; dp-engines.ts).
    const engine = blocks && r.dp.pinned && req.pinEngine !== false ? this.state.engineMatcher.pick(res.index, r.dp, req.key ?? blocks[0]!) : null;
    // Not pinned on a replica whose engines are apart: vLLM's balancer picks, no slot knows which.
    const slot = engine ? r.dp.slots[engine.slot]! : r.dp.pinned ? null : r.id;
    const matchedBlocks = engine ? engine.matched : prefixMatch ? (prefixMatch.matched[res.index] ?? -1) : undefined;
    // Recorded now: vLLM caches the prompt once its prefill is done, long before the stream
    // ends (recording at release lost 6 points of hit rate on multi-turn chat, docs/benchmarks.md).
    if (blocks && slot !== null) this.state.prefixIndex!.recordRoute(slot, blocks, sessionKey);
    // vLLM picks the engine: a route to the replica all the same (its recent share, the key's home).
    else if (blocks) this.state.prefixIndex!.noteRoute(r.dp.slots[0]!, sessionKey);
    if (res.cursor !== undefined) this.state.leases.cursor = res.cursor;
    if (req.key !== null) {
      noteRoutingKey(this.state, pool, now, req.keyKind, hex32(req.key));
    }
    if (req.record) this.state.responses.record(tenant, req.record.responseId, r.id, now, config.responseAffinityTtlMs, config.responseAffinityMaxEntries);
    const lease: Lease = { id: crypto.randomUUID(), replica: r, tenant, deadline: now + config.leaseTtlMs, spilled: res.spilled, startedAt: now, ...(weight > 1 ? { weight } : {}) };
    // Retracted on failure (release): a request refused (4xx) or failed never filled the cache.
    if (blocks && slot !== null) lease.prefix = { blocks, from: Math.max(0, matchedBlocks ?? 0), count: anchorLength(blocks.length), slot };
    if (engine) lease.engine = { dp: r.dp, slot: engine.slot };
    this.addLease(lease);
    ensureAlarm(this.state, lease.deadline);
    const result: AcquireResult = { ok: true, leaseId: lease.id, replica: { id: r.id, url: r.url, auth: r.auth, ...(engine ? { dpRank: engine.slot } : {}) }, spilled: res.spilled, steps: res.steps, deadline: lease.deadline, matchedBlocks, ...extra };
    if (req.guess) {
      const g = req.guess;
      const guessed = g.id === r.id ? r : this.state.replicas.find((x) => x.id === g.id);
      result.guessUsable = guessed !== undefined && !guessed.draining && isHealthy(guessed, now) && guessed.url === g.url && guessed.auth === g.auth;
    }
    return result;
  }

  /** Idempotent: a second release of the same lease (or of an expired one) changes nothing. */
  /** Revoke API keys (`tenant/keyId`) for this pool: persisted, refused from the next acquire on. */
  revokeKeys(keyIds: string[]): { revoked: number } {
    this.countRpc('revokeKeys');
    return { revoked: this.state.revoked.add(keyIds, Date.now()) };
  }

  release(leaseId: string, outcome: ReleaseOutcome): { released: boolean } {
    this.countRpc('release');
    failIfOutage(this.state.fault);
    return { released: this.releaseOne({ id: leaseId, outcome }, Date.now()) };
  }

  /**
   * One isolate's batch for this pool (lease protocol v2): its releases, then, once per renew
   * interval, every lease it still holds. A renewal of a lease this instance does not know (it
   * restarted, or reaped a lease whose renewals were late) rebuilds it, so in-flight per replica
   * and per tenant are whole again within one renew interval of a restart.
   */
  settle(pool: string, batch: SettleBatch): SettleResult {
    this.countRpc('settle');
    failIfOutage(this.state.fault);
    const now = Date.now();
    if (!this.ensurePool(pool)) return { epoch: this.state.leases.epoch, released: 0, renewed: 0, restored: 0, gone: [], deadline: now };
    return this.applySettle(batch, now);
  }

  /**
   * Test hooks, refused unless the configuration sets testHooks (only test configurations do; the
   * admin route is behind the admin token too): an outage window in which every lease RPC fails,
   * the next N releases dropped on purpose, or a restart (the object is reset, memory lost).
   */
  async testFault(pool: string, f: FaultRequest): Promise<{ ok: boolean }> {
    if (!loadConfig(this.state.env.ROUTER_CONFIG).testHooks || !this.ensurePool(pool)) return { ok: false };
    const now = Date.now();
    setFaults(this.state.fault, f, now);
    if (f.restart) this.restartInPlace();
    if (f.abort) {
      // A real reset of the object, just after this call has answered. Under `wrangler dev` the
      // next call to a reset object sometimes waited seconds or failed: the fault run uses restart.
      this.persistTenantFloor(true);
      await this.ctx.storage.sync();
      setTimeout(() => this.ctx.abort('test fault: abort'), 20);
    }
    return { ok: true };
  }

  /**
   * A restart without the runtime's reset: memory is dropped and rebuilt by the constructor's own
   * path from storage (replicas, stats, the tenant floor), with a new epoch: leases, in-flight
   * counts, health state, the prefix index and tombstones are gone, as after an eviction or deploy.
   */
  private restartInPlace(): void {
    this.persistStats();
    this.persistTenantFloor(true);
    this.state.leases.epoch = crypto.randomUUID();
    this.state.leases.startedAt = Date.now();
    this.state.leases.tombstones.clear();
    this.state.leases.restored = 0;
    this.state.leases.lastRestoredAt = 0;
    this.state.leases.rpcs = {};
    this.state.prefixIndex = null;
    this.state.leases.view = null;
    this.state.board.hotKeys = null;
    this.state.leases.cursor = 0;
    this.state.leases.tenantFloor.clear();
    this.state.leases.recoveryUntil = 0;
    this.state.fault = noFaults();
    this.load(this.state.poolName!);
    this.loadRecoveryFloor();
  }

  private releaseOne(rel: LeaseRelease, now: number): boolean {
    const { id: leaseId, outcome } = rel;
    const lease = this.state.leases.byId.get(leaseId);
    if (!lease) {
      // A lease from before a restart that no renewal brought back yet: it no longer counts for its tenant.
      if (rel.tenant && !this.state.leases.tombstones.has(leaseId)) this.lowerFloor(rel.tenant, now);
      this.tombstone(leaseId, now);
      return false;
    }
    if (dropRelease(this.state.fault, leaseId, now)) return true;
    this.tombstone(leaseId, now);
    this.dropLease(lease);
    const r = lease.replica;
    // The engine named its response otherwise than the router asked (an engine that ignores
    // `request_id`): remember the id it reported, on the replica that made it.
    if (outcome.responseId) {
      const config = loadConfig(this.state.env.ROUTER_CONFIG);
      this.state.responses.record(lease.tenant, outcome.responseId, r.id, Date.now(), config.responseAffinityTtlMs, config.responseAffinityMaxEntries);
    }
    if (this.state.replicas.includes(r)) {
      this.settlePrefix(lease, outcome);
      // vLLM refused the rank the router sent: its engines changed since the scrape.
      if (outcome.rankRefused && r.dp.pinned) unpinEngines(this.state, r);
      recordOutcome(r.stats, outcome, lease.spilled);
      this.state.statsDirty = true;
      if (isReplicaFailure(outcome)) notePassiveFailure(this.state, r, Date.now());
    }
    if (outcome.earlyConnect !== undefined) {
      const guessed = this.state.replicas.find((x) => x.id === outcome.earlyReplica);
      if (guessed) {
        if (outcome.earlyConnect === 'hit') guessed.stats.earlyConnectHits++;
        else guessed.stats.earlyConnectMisses++;
        this.state.statsDirty = true;
      }
    }
    return true;
  }

  snapshot(pool?: string): PoolSnapshot | null {
    const p = this.ensurePool(pool ?? this.state.poolName ?? '');
    if (!p) return null;
    const now = Date.now();
    const indexStats = this.state.prefixIndex ? this.state.prefixIndex.stats() : null;
    return {
      pool: p.name,
      strategy: p.strategyImpl.name,
      fallback: p.fallbackImpl.name,
      keys: [...p.keys],
      loadSignal: p.loadSignal,
      at: now,
      leases: this.state.leases.byId.size,
      expiredLeases: this.state.leases.expired,
      lease: {
        epoch: this.state.leases.epoch,
        startedAt: this.state.leases.startedAt,
        ttlMs: loadConfig(this.state.env.ROUTER_CONFIG).leaseTtlMs,
        restoredLeases: this.state.leases.restored,
        lastRestoredAt: this.state.leases.lastRestoredAt,
        fallbacks: this.state.leases.fallbacks,
        lastFallbackAt: this.state.leases.lastFallbackAt,
        rpcs: { ...this.state.leases.rpcs },
        recoveryUntil: this.state.leases.recoveryUntil > now ? this.state.leases.recoveryUntil : 0,
        ...(this.state.fault.dropped.length > 0 ? { droppedReleases: this.state.fault.dropped.slice(-1000) } : {}),
      },
      replicas: this.state.replicas.map((r) => replicaSnapshot(this.state, r, now, indexStats)),
      responseAffinity: { entries: this.state.responses.size, pins: { ...this.state.leases.pins } },
      prefixIndex: indexStats ? (({ entries, blocks, approxBytes, maxEntries, evictions }) => ({ entries, blocks, approxBytes, maxEntries, evictions }))(indexStats) : null,
      alerts: this.state.board.alerts,
      samples: this.state.board.samples,
    };
  }

  /** Create or replace a replica (admin PUT). Keeps its in-flight count and stats. */
  upsertReplica(pool: string, input: unknown): AdminResult<ReplicaSnapshot> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    return upsertReplica(this.state, input);
  }

  /** Change weight and/or drain state (admin PATCH). */
  patchReplica(pool: string, id: string, patch: { weight?: number; draining?: boolean }): AdminResult<ReplicaSnapshot> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    return patchReplica(this.state, pool, id, patch);
  }

  /** Remove a replica (admin DELETE). Streams in flight on it are not cut: the Worker holds them. */
  removeReplica(pool: string, id: string): AdminResult<{ id: string; inFlight: number }> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    return removeReplica(this.state, pool, id);
  }

  // ---- alarm: lease expiry, active health checks, stats persistence ---------------------------

  override async alarm(): Promise<void> {
    // The alarm that fired is gone: forget it, and always schedule the next one, even if this round throws.
    this.state.alarm.pending = null;
    try {
      await this.runAlarm();
    } finally {
      const now = Date.now();
      await scheduleNext(this.state, now, this.leaseWakeAt(now));
    }
  }

  private async runAlarm(): Promise<void> {
    const now = Date.now();
    this.expireLeases(now);
    this.pruneTombstones(now);
    const pool = boundPool(this.state);
    if (pool && this.state.replicas.length > 0) {
      // Health and scrape rounds are spread over ticks: each tick takes the next slice of replicas,
      // and at most healthConcurrency fetches leave at once (a Durable Object has few simultaneous
      // outgoing connections; a timeout only starts when its fetch does).
      const tasks: (() => Promise<void>)[] = [];
      if (now >= this.state.alarm.nextHealthAt) {
        const slice = nextSlice(this.state, 'health', pool, pool.healthIntervalMs, now);
        for (const r of slice) tasks.push(() => checkOne(this.state, r, pool));
      }
      if (now >= this.state.alarm.nextScrapeAt) {
        const slice = nextSlice(this.state, 'scrape', pool, pool.scrapeIntervalMs, now);
        for (const r of slice) tasks.push(() => scrapeOne(this.state, r, pool));
      }
      await runLimited(tasks, pool.healthConcurrency);
    }
    if (pool && now >= this.state.alarm.nextSampleAt) {
      this.state.alarm.nextSampleAt = now + SAMPLE_MS;
      takeSample(this.state, Date.now());
      evaluateAlerts(this.state, pool, Date.now());
    }
    this.persistStats();
    this.persistTenantFloor(false);
  }

  /** Run one round of active health checks now over every replica (also used by tests and the admin API). */
  async checkHealth(pool: PoolRuntime): Promise<void> {
    await checkHealth(this.state, pool);
  }

  /** Scrape every replica's vLLM /metrics once (also used by tests). */
  async scrapeMetrics(pool: PoolRuntime): Promise<void> {
    await scrapeMetrics(this.state, pool);
  }

  // ---- internals ---------------------------------------------------------------------------

  /** A request that failed (no 2xx) never filled the cache: take back the blocks its route added. */
  private settlePrefix(lease: Lease, outcome: ReleaseOutcome): void {
    const p = lease.prefix;
    lease.prefix = undefined;
    if (p === undefined || this.state.prefixIndex === null || (outcome.status >= 200 && outcome.status < 300)) return;
    this.state.prefixIndex.forget(p.slot, p.blocks, p.from);
  }

  /** Bind this object to its pool on first use, seeding replicas from configuration. */
  private ensurePool(name: string): PoolRuntime | null {
    if (this.state.poolName !== null) return this.state.poolName === name ? poolConfig(this.state, name) : null;
    const pool = poolConfig(this.state, name);
    if (!pool) return null;
    bindPool(this.state, name, pool);
    this.load(name);
    return pool;
  }

  private load(name: string): void {
    loadReplicas(this.state, name);
    const meta = this.state.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'expired_leases'").toArray()[0];
    this.state.leases.expired = meta ? Number(meta.v) : 0;
    const fb = this.state.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'fallbacks'").toArray()[0];
    if (fb) {
      const saved = JSON.parse(fb.v) as { fallbacks: number; lastFallbackAt: number; isolates?: Record<string, number> };
      this.state.leases.fallbacks = saved.fallbacks;
      this.state.leases.lastFallbackAt = saved.lastFallbackAt;
      this.state.leases.isolateFallbacks = new Map(Object.entries(saved.isolates ?? {}));
    }
    // Leases are soft state, kept in memory only (DESIGN.md: lost on eviction, rebuilt from the
    // Workers' renewals within one renew interval). Writing each one to SQLite put a storage write and its output gate on every
    // acquire and release (bench:proxy: ~4x fewer requests/s at 16 clients). Rows an older
    // version persisted are dropped.
    this.state.leases.byId.clear();
    this.state.leases.tenantInFlight.clear();
    this.state.sql.exec('DELETE FROM leases');
    ensureAlarm(this.state, Date.now() + 100);
  }

  private dropLease(lease: Lease): void {
    this.state.leases.byId.delete(lease.id);
    if (lease.replica.inFlight > 0) lease.replica.inFlight--;
    this.state.pickState.moved(lease.replica);
    if (lease.prefix) lease.replica.leaseBlocks = Math.max(0, lease.replica.leaseBlocks - lease.prefix.count);
    if (lease.engine) countEngineLease(lease.engine, lease.replica.dp, lease.prefix?.count ?? 0, -1);
    if (lease.tenant) {
      this.state.leases.tenantsDirty = true;
      const w = lease.weight ?? 1;
      const n = (this.state.leases.tenantInFlight.get(lease.tenant) ?? w) - w;
      if (n > 0) this.state.leases.tenantInFlight.set(lease.tenant, n);
      else this.state.leases.tenantInFlight.delete(lease.tenant);
    }
  }

  private addLease(lease: Lease): void {
    this.state.leases.byId.set(lease.id, lease);
    lease.replica.inFlight++;
    this.state.pickState.moved(lease.replica);
    if (lease.prefix) lease.replica.leaseBlocks += lease.prefix.count;
    if (lease.engine) countEngineLease(lease.engine, lease.replica.dp, lease.prefix?.count ?? 0, 1);
    if (lease.tenant) {
      this.state.leases.tenantInFlight.set(lease.tenant, (this.state.leases.tenantInFlight.get(lease.tenant) ?? 0) + (lease.weight ?? 1));
      this.state.leases.tenantsDirty = true;
    }
  }

  /**
   * A tenant's in-flight for its cap. During recovery it also counts the leases it held before the
   * restart that no renewal has brought back (and no release has ended) yet.
   */
  private tenantCount(tenant: string, now: number): number {
    const live = this.state.leases.tenantInFlight.get(tenant) ?? 0;
    if (now >= this.state.leases.recoveryUntil) return live;
    return live + (this.state.leases.tenantFloor.get(tenant) ?? 0);
  }

  /** One of the tenant's leases from before the restart is accounted for (restored or released). */
  private lowerFloor(tenant: string, now: number): void {
    if (!tenant || now >= this.state.leases.recoveryUntil) return;
    const f = (this.state.leases.tenantFloor.get(tenant) ?? 0) - 1;
    if (f > 0) this.state.leases.tenantFloor.set(tenant, f);
    else this.state.leases.tenantFloor.delete(tenant);
  }

  private applySettle(batch: SettleBatch, now: number): SettleResult {
    const ttlMs = loadConfig(this.state.env.ROUTER_CONFIG).leaseTtlMs;
    let released = 0;
    for (const rel of batch.releases ?? []) if (this.releaseOne(rel, now)) released++;
    let renewed = 0;
    let restored = 0;
    const gone: string[] = [];
    const deadline = now + ttlMs;
    for (const ren of batch.renew ?? []) {
      const lease = this.state.leases.byId.get(ren.id);
      if (lease) {
        lease.deadline = deadline;
        renewed++;
      } else if (this.restoreLease(ren, deadline, now)) restored++;
      else gone.push(ren.id);
    }
    const fb = batch.fallbacks;
    const before = fb && typeof fb.isolate === 'string' && fb.isolate.length <= 64 && Number.isFinite(fb.total) ? (this.state.leases.isolateFallbacks.get(fb.isolate) ?? 0) : Infinity;
    if (fb && fb.total > before) {
      this.state.leases.fallbacks += Math.floor(fb.total - before);
      this.state.leases.isolateFallbacks.delete(fb.isolate);
      this.state.leases.isolateFallbacks.set(fb.isolate, fb.total);
      // Isolates come and go: remember the most recent ones only.
      if (this.state.leases.isolateFallbacks.size > MAX_ISOLATES) this.state.leases.isolateFallbacks.delete(this.state.leases.isolateFallbacks.keys().next().value!);
      this.state.leases.lastFallbackAt = now;
      this.state.leases.fallbacksDirty = true;
    }
    if (renewed + restored > 0) ensureAlarm(this.state, deadline);
    return { epoch: this.state.leases.epoch, released, renewed, restored, gone, deadline };
  }

  /**
   * Rebuild a lease this instance does not know from its renewal: it restarted, or it reaped the
   * lease while renewals were late. Not for a lease released before (tombstone: a renewal that
   * crossed its own release), nor for a replica no longer in the pool. No cap check: the stream
   * is already running, and the count must say so.
   */
  private restoreLease(ren: LeaseRenewal, deadline: number, now: number): boolean {
    if (typeof ren.id !== 'string' || ren.id.length === 0 || ren.id.length > 64 || this.state.leases.tombstones.has(ren.id)) return false;
    const replica = this.state.replicas.find((r) => r.id === ren.replica);
    if (!replica) return false;
    const tenant = typeof ren.tenant === 'string' ? ren.tenant : '';
    this.addLease({ id: ren.id, replica, tenant, deadline, spilled: ren.spilled === true, startedAt: Number.isFinite(ren.startedAt) ? ren.startedAt : now });
    this.lowerFloor(tenant, now);
    this.state.leases.restored++;
    this.state.leases.lastRestoredAt = now;
    return true;
  }

  private tombstone(id: string, now: number): void {
    this.state.leases.tombstones.delete(id);
    this.state.leases.tombstones.set(id, now + TOMBSTONE_TTLS * loadConfig(this.state.env.ROUTER_CONFIG).leaseTtlMs);
    if (this.state.leases.tombstones.size > MAX_TOMBSTONES) this.pruneTombstones(now, true);
  }

  private pruneTombstones(now: number, force = false): void {
    for (const [id, until] of this.state.leases.tombstones) {
      if (until > now && !(force && this.state.leases.tombstones.size > MAX_TOMBSTONES * 0.9)) break;
      this.state.leases.tombstones.delete(id);
    }
  }

  /** What a Worker fails open over, unless it already holds this version. */
  private viewUnless(version: string, pool: PoolRuntime, now: number): { view?: PoolView } {
    if (!this.state.leases.view || now - this.state.leases.view.at >= VIEW_CACHE_MS) {
      const replicas = this.state.replicas.map((r) => ({ id: r.id, url: r.url, auth: r.auth, weight: r.weight, healthy: isHealthy(r, now), draining: r.draining }));
      this.state.leases.view = { at: now, view: { version: hex32(hashString(`${pool.name}|${JSON.stringify(replicas)}`)), replicas } };
    }
    return this.state.leases.view.view.version === version ? {} : { view: this.state.leases.view.view };
  }

  private countRpc(method: string): void {
    this.state.leases.rpcs[method] = (this.state.leases.rpcs[method] ?? 0) + 1;
  }

  /** Tenant in-flight counts as the alarm last saw them: a restarted instance's floor for tenant caps. */
  private persistTenantFloor(force: boolean): void {
    if (!this.state.leases.tenantsDirty && !force) return;
    this.state.leases.tenantsDirty = false;
    this.state.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('tenants', ?)", JSON.stringify({ at: Date.now(), tenants: Object.fromEntries(this.state.leases.tenantInFlight) }));
  }

  private loadRecoveryFloor(): void {
    const row = this.state.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'tenants'").toArray()[0];
    if (!row) return;
    let saved: { at: number; tenants: Record<string, number> };
    try {
      saved = JSON.parse(row.v) as typeof saved;
    } catch {
      return;
    }
    const config = loadConfig(this.state.env.ROUTER_CONFIG);
    // Leases older than one TTL would have been reaped by now anyway.
    if (Date.now() - saved.at > config.leaseTtlMs) return;
    for (const [t, n] of Object.entries(saved.tenants)) if (n > 0) this.state.leases.tenantFloor.set(t, n);
    if (this.state.leases.tenantFloor.size > 0) this.state.leases.recoveryUntil = Date.now() + config.renewIntervalMs + RECOVERY_GRACE_MS;
    this.state.leases.tenantsDirty = true;
  }

  /** When the leases need the alarm: the next deadline, and once per renew interval while any are held (the tenant floor). */
  private leaseWakeAt(now: number): number {
    const b = this.state.leases;
    let next = Infinity;
    for (const l of b.byId.values()) next = Math.min(next, l.deadline);
    if (b.byId.size > 0 || b.tenantsDirty) next = Math.min(next, now + configOf(this.state).renewIntervalMs);
    return next;
  }

  private expireLeases(now: number): void {
    let expired = 0;
    for (const lease of [...this.state.leases.byId.values()]) {
      if (lease.deadline <= now) {
        this.dropLease(lease);
        expired++;
      }
    }
    if (expired > 0) {
      this.state.leases.expired += expired;
      this.state.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('expired_leases', ?)", String(this.state.leases.expired));
      noteReaped(this.state.fault, this.state.leases.byId, now);
    }
  }

  private persistStats(): void {
    persistStats(this.state);
    if (this.state.leases.fallbacksDirty) {
      this.state.leases.fallbacksDirty = false;
      const b = this.state.leases;
      this.state.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('fallbacks', ?)", JSON.stringify({ fallbacks: b.fallbacks, lastFallbackAt: b.lastFallbackAt, isolates: Object.fromEntries(b.isolateFallbacks) }));
    }
  }
}

/**
 * The routing key when it names a session (a header key, `x-session-id` by default), else null:
 * prefix-aware's index remembers where session keys went to tell a session's next turn from a
 * new session (PrefixIndex.keyHomeOf). A tenant, prefix or body key is shared by many sessions,
 * so its last replica says nothing about this conversation; those fall back to the coverage test.
 */
function sessionKeyOf(req: AcquireRequest): number | null {
  return req.keyKind === 'header' ? req.key : null;
}
