// PoolCoordinator: one Durable Object per pool (`idFromName(pool)`). Owns the pool's replicas
// (persisted in SQLite), leases (in-flight counts), health, per-replica stats, and the alarm
// that expires leases, checks health and scrapes vLLM metrics. The pick itself is the pure
// core's; this class loads state, calls it, saves, and returns typed results. I/O: DO storage,
// health-check and metrics fetches to the replicas from the alarm.

import { DurableObject } from 'cloudflare:workers';
import { ResponseAffinity } from './response-affinity.js';
import { buildRing, hex32, pickReplica, PrefixIndex, type PrefixMatch, type ReplicaView, type Ring } from '../core/index.js';
import { loadConfig, replicaEndpoint, replicaSchema, type PoolRuntime, type ReplicaConfig } from '../config.js';
import { RevocationList } from './revocations.js';
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
import { resolveOriginAuth } from './origin-auth.js';
import { parsePromText } from './prom-text.js';
import { emptyStats, histogramQuantile, isReplicaFailure, recordOutcome, type Histogram, type ReleaseOutcome, type ReplicaStats } from './stats.js';
import { indexCapacityOf, kvCapacity, kvCapacityFromTotals } from './kv-capacity.js';
import { emptyHitRateWindow, extractEngineSample, pushSample, windowHitRate, type HitRateWindowState } from './vllm-metrics.js';

const SCRAPE_TIMEOUT_MS = 2_000;
/**
 * A lease outlives maxStreamMs by this much: the Worker cuts a stream at maxStreamMs itself and
 * releases the lease; the alarm reaps only leases whose Worker is gone.
 */
const LEASE_GRACE_MS = 10_000;
const MAX_SCRAPE_BYTES = 4 * 1024 * 1024;

export * from './types.js';
import type { AcquireRequest, AcquireResult, AdminResult, PoolAlert, PoolSample, PoolSnapshot, ReplicaSample, ReplicaSnapshot, VllmView } from './types.js';
import { SAMPLE_COUNT, SAMPLE_MS } from './types.js';

interface ReplicaLive extends ReplicaConfig {
  position: number;
  inFlight: number;
  activeUp: boolean;
  consecutiveFails: number;
  consecutiveOks: number;
  failTimes: number[];
  passiveDownUntil: number;
  lastCheckAt: number;
  lastCheckError: string | null;
  stats: ReplicaStats;
  vllm: VllmView;
  /** prefix-aware: index capacity in router blocks from the last scrape (free KV, kv-capacity.ts), null until known. */
  indexCapacity: number | null;
  hitWindow: HitRateWindowState;
  /** Counters at the previous dashboard sample, for per-interval rates. */
  prevSample: { requests: number; promptTokens: number; cachedTokens: number; ttft: Histogram } | null;
}

interface Lease {
  id: string;
  /**
   * The replica object the lease was taken on, not its id: a replica removed and added again
   * under the same id is a new object, and the old one's streams must not change its counts.
   */
  replica: ReplicaLive;
  tenant: string;
  deadline: number;
  spilled: boolean;
  startedAt: number;
  /** Counted against the tenant's cap (sequences). */
  weight: number;
  /** prefix-aware: the request's prompt blocks, recorded in the index when it succeeds (release). */
  blocks?: Uint32Array;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replicas (id TEXT PRIMARY KEY, url TEXT NOT NULL, weight INTEGER NOT NULL, auth TEXT NOT NULL, draining INTEGER NOT NULL, position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, replica TEXT NOT NULL, tenant TEXT NOT NULL, deadline INTEGER NOT NULL, spilled INTEGER NOT NULL, started_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stats (replica TEXT PRIMARY KEY, json TEXT NOT NULL);
`;

export class PoolCoordinatorImpl extends DurableObject<Env> {
  private sql: SqlStorage;
  private poolName: string | null = null;
  private replicas: ReplicaLive[] = [];
  private ring: Ring = buildRing([]);
  private leases = new Map<string, Lease>();
  private tenantInFlight = new Map<string, number>();
  private cursor = 0;
  private expiredLeases = 0;
  private statsDirty = false;
  private nextHealthAt = 0;
  private nextScrapeAt = 0;
  private nextSampleAt = 0;
  private samples: PoolSample[] = [];
  private hotKeys: HotKeyState | null = null;
  private imbalance: ImbalanceState = emptyImbalanceState();
  private alerts: PoolAlert[] = [];
  /** prefix-aware pools: which prompt blocks were recently sent to each replica (soft state). */
  private prefixIndex: PrefixIndex | null = null;
  private matchScratch = new Int32Array(0);
  /** Revoked API keys (`tenant/keyId`), persisted: checked in acquire (revocations.ts). */
  private revoked: RevocationList;
  /** Responses API: which replica stored each response id, per tenant (persisted). */
  private responses: ResponseAffinity;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(SCHEMA);
    this.revoked = new RevocationList(this.sql);
    this.responses = new ResponseAffinity(this.sql);
    const name = this.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'pool'").toArray()[0]?.v;
    if (name) this.load(name);
  }

  // ---- RPC surface -------------------------------------------------------------------------

  acquire(req: AcquireRequest): AcquireResult {
    const pool = this.ensurePool(req.pool);
    const config = loadConfig(this.env.ROUTER_CONFIG);
    const retryAfterMs = config.retryAfterSeconds * 1000;
    if (!pool) return { ok: false, reason: 'unknown_pool', retryAfterMs };
    const now = Date.now();
    if (req.keyId !== undefined && this.revoked.has(req.keyId)) return { ok: false, reason: 'key_revoked', retryAfterMs };
    const tenant = req.tenant ?? '';
    const limit = req.tenantMaxInFlight ?? pool.maxInFlightPerTenant;
    const weight = Math.max(1, Math.floor(req.weight ?? 1));
    if (tenant && limit !== undefined && (this.tenantInFlight.get(tenant) ?? 0) + weight > limit) return { ok: false, reason: 'tenant_limit', retryAfterMs };
    const pin = req.pin ? this.responses.lookup(tenant, req.pin.responseId, now) : undefined;
    if (pin === null) return { ok: false, reason: 'response_not_found', retryAfterMs };

    let prefixMatch: PrefixMatch | undefined;
    const blocks = pool.strategyImpl.usesPrefix && req.blocks && req.blocks.length > 0 ? req.blocks : undefined;
    if (blocks) {
      const index = this.indexFor(pool);
      if (this.matchScratch.length !== this.replicas.length) this.matchScratch = new Int32Array(this.replicas.length);
      prefixMatch = { blocks: blocks.length, matched: index.matchAll(this.ring.ids, blocks, this.matchScratch) };
    }
    const ctx = {
      ring: this.ring,
      replicas: this.views(now, pool, false),
      key: req.key,
      exclude: req.exclude && req.exclude.length > 0 ? new Set(req.exclude) : undefined,
      random: Math.random,
      cursor: this.cursor,
      prefixMatch,
      pin,
    };
    let res = pickReplica(pool.strategyImpl, pool.fallbackImpl, ctx);
    // Passive exclusion (max_fails) is a soft signal: when it leaves nothing else to try, a replica
    // that passes its active health check is better than failing a request no byte has left for.
    if (!res.ok && this.replicas.some((r) => r.activeUp && r.passiveDownUntil > now)) {
      res = pickReplica(pool.strategyImpl, pool.fallbackImpl, { ...ctx, replicas: this.views(now, pool, true) });
    }
    if (!res.ok) return { ok: false, reason: res.reason, retryAfterMs };
    const matchedBlocks = prefixMatch ? (prefixMatch.matched[res.index] ?? -1) : undefined;
    if (res.cursor !== undefined) this.cursor = res.cursor;
    if (req.key !== null) {
      this.hotKeys ??= createHotKeyState({ windowMs: pool.hotKeyWindowMs });
      recordHotKey(this.hotKeys, now, req.keyKind, hex32(req.key));
    }
    const r = this.replicas[res.index]!;
    if (req.record) this.responses.record(tenant, req.record.responseId, r.id, now, config.responseAffinityTtlMs, config.responseAffinityMaxEntries);
    const lease: Lease = { id: crypto.randomUUID(), replica: r, tenant, deadline: now + config.maxStreamMs + LEASE_GRACE_MS, spilled: res.spilled, startedAt: now, weight };
    // Recorded on success only (release): a request refused (4xx) or failed never filled the cache.
    if (blocks) lease.blocks = blocks;
    this.leases.set(lease.id, lease);
    r.inFlight++;
    if (tenant) this.tenantInFlight.set(tenant, (this.tenantInFlight.get(tenant) ?? 0) + weight);
    this.ensureAlarm(lease.deadline);
    const result: AcquireResult = { ok: true, leaseId: lease.id, replica: { id: r.id, url: r.url, auth: r.auth }, spilled: res.spilled, steps: res.steps, deadline: lease.deadline, matchedBlocks };
    if (req.guess) {
      const g = req.guess;
      const guessed = g.id === r.id ? r : this.replicas.find((x) => x.id === g.id);
      result.guessUsable = guessed !== undefined && !guessed.draining && this.isHealthy(guessed, now) && guessed.url === g.url && guessed.auth === g.auth;
    }
    return result;
  }

  /** Revoke API keys (`tenant/keyId`) for this pool: persisted, effective for the next acquire. */
  revokeKeys(keyIds: string[]): { revoked: number } {
    return { revoked: this.revoked.add(keyIds, Date.now()) };
  }

  /** Idempotent: a second release of the same lease (or of an expired one) changes nothing. */
  release(leaseId: string, outcome: ReleaseOutcome): { released: boolean } {
    const lease = this.leases.get(leaseId);
    if (!lease) return { released: false };
    this.dropLease(lease);
    const r = lease.replica;
    // The engine named its response otherwise than the router asked (an engine that ignores
    // `request_id`): remember the id it reported, on the replica that made it.
    if (outcome.responseId) {
      const config = loadConfig(this.env.ROUTER_CONFIG);
      this.responses.record(lease.tenant, outcome.responseId, r.id, Date.now(), config.responseAffinityTtlMs, config.responseAffinityMaxEntries);
    }
    if (this.replicas.includes(r)) {
      this.recordPrefix(lease, outcome);
      recordOutcome(r.stats, outcome, lease.spilled);
      this.statsDirty = true;
      if (isReplicaFailure(outcome)) this.notePassiveFailure(r, Date.now());
    }
    if (outcome.earlyConnect !== undefined) {
      const guessed = this.replicas.find((x) => x.id === outcome.earlyReplica);
      if (guessed) {
        if (outcome.earlyConnect === 'hit') guessed.stats.earlyConnectHits++;
        else guessed.stats.earlyConnectMisses++;
        this.statsDirty = true;
      }
    }
    return { released: true };
  }

  snapshot(pool?: string): PoolSnapshot | null {
    const p = this.ensurePool(pool ?? this.poolName ?? '');
    if (!p) return null;
    const now = Date.now();
    return {
      pool: p.name,
      strategy: p.strategyImpl.name,
      fallback: p.fallbackImpl.name,
      keys: [...p.keys],
      loadSignal: p.loadSignal,
      at: now,
      leases: this.leases.size,
      expiredLeases: this.expiredLeases,
      replicas: this.replicas.map((r) => ({
        id: r.id,
        url: r.url,
        weight: r.weight,
        auth: r.auth,
        draining: r.draining,
        healthy: this.isHealthy(r, now),
        activeUp: r.activeUp,
        passiveDownUntil: r.passiveDownUntil > now ? r.passiveDownUntil : 0,
        inFlight: r.inFlight,
        lastCheckAt: r.lastCheckAt,
        lastCheckError: r.lastCheckError,
        stats: r.stats,
        vllm: { ...r.vllm, hitRate: windowHitRate(r.hitWindow) },
      })),
      prefixIndex: this.prefixIndex ? (({ entries, blocks, approxBytes, maxEntries, evictions }) => ({ entries, blocks, approxBytes, maxEntries, evictions }))(this.prefixIndex.stats()) : null,
      alerts: this.alerts,
      samples: this.samples,
    };
  }

  /** Create or replace a replica (admin PUT). Keeps its in-flight count and stats. */
  upsertReplica(pool: string, input: unknown): AdminResult<ReplicaSnapshot> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    const parsed = replicaSchema.safeParse(input);
    if (!parsed.success) return { ok: false, reason: 'invalid', message: parsed.error.issues.map((i) => `${i.path.join('.') || 'replica'}: ${i.message}`).join('; ') };
    const cfg = parsed.data;
    const existing = this.replicas.find((r) => r.id === cfg.id);
    if (existing && existing.url !== cfg.url) this.prefixIndex?.dropReplica(existing.id);
    if (existing) Object.assign(existing, { url: cfg.url, weight: cfg.weight, auth: cfg.auth, draining: cfg.draining });
    else this.replicas.push(this.liveReplica(cfg, this.nextPosition()));
    this.saveReplicas();
    this.rebuildRing();
    this.ensureAlarm(Date.now() + 100);
    return { ok: true, value: this.snapshot()!.replicas.find((r) => r.id === cfg.id)! };
  }

  /** Change weight and/or drain state (admin PATCH). */
  patchReplica(pool: string, id: string, patch: { weight?: number; draining?: boolean }): AdminResult<ReplicaSnapshot> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    const r = this.replicas.find((x) => x.id === id);
    if (!r) return { ok: false, reason: 'not_found', message: `no replica "${id}" in pool "${pool}"` };
    const candidate = replicaSchema.safeParse({ id: r.id, url: r.url, auth: r.auth, weight: patch.weight ?? r.weight, draining: patch.draining ?? r.draining });
    if (!candidate.success) return { ok: false, reason: 'invalid', message: candidate.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ') };
    r.weight = candidate.data.weight;
    r.draining = candidate.data.draining;
    this.saveReplicas();
    this.rebuildRing();
    return { ok: true, value: this.snapshot()!.replicas.find((x) => x.id === id)! };
  }

  /** Remove a replica (admin DELETE). Streams in flight on it are not cut: the Worker holds them. */
  removeReplica(pool: string, id: string): AdminResult<{ id: string; inFlight: number }> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    const i = this.replicas.findIndex((x) => x.id === id);
    if (i < 0) return { ok: false, reason: 'not_found', message: `no replica "${id}" in pool "${pool}"` };
    const [r] = this.replicas.splice(i, 1);
    this.prefixIndex?.dropReplica(id);
    this.sql.exec('DELETE FROM replicas WHERE id = ?', id);
    this.sql.exec('DELETE FROM stats WHERE replica = ?', id);
    this.rebuildRing();
    return { ok: true, value: { id, inFlight: r!.inFlight } };
  }

  // ---- alarm: lease expiry, active health checks, stats persistence ---------------------------

  override async alarm(): Promise<void> {
    // The alarm that fired is gone: forget it, and always schedule the next one, even if this round throws.
    this.pendingAlarm = null;
    try {
      await this.runAlarm();
    } finally {
      this.scheduleNext(Date.now());
    }
  }

  private async runAlarm(): Promise<void> {
    const now = Date.now();
    this.expireLeases(now);
    const pool = this.poolName ? this.poolConfig(this.poolName) : null;
    const work: Promise<void>[] = [];
    if (pool && this.replicas.length > 0 && now >= this.nextHealthAt) {
      this.nextHealthAt = now + pool.healthIntervalMs;
      work.push(this.checkHealth(pool));
    }
    if (pool && this.replicas.length > 0 && now >= this.nextScrapeAt) {
      this.nextScrapeAt = now + pool.scrapeIntervalMs;
      work.push(this.scrapeMetrics(pool));
    }
    await Promise.all(work);
    if (pool && now >= this.nextSampleAt) {
      this.nextSampleAt = now + SAMPLE_MS;
      this.takeSample(Date.now());
      this.evaluateAlerts(pool, Date.now());
    }
    this.persistStats();
  }

  /** Run one round of active health checks now (also used by tests and the admin API). */
  async checkHealth(pool: PoolRuntime): Promise<void> {
    await Promise.all(
      this.replicas.map(async (r) => {
        const ok = await this.probe(r, pool.healthTimeoutMs);
        r.lastCheckAt = Date.now();
        if (ok === null) {
          r.lastCheckError = null;
          r.consecutiveOks++;
          r.consecutiveFails = 0;
          if (!r.activeUp && r.consecutiveOks >= pool.rise) r.activeUp = true;
        } else {
          r.lastCheckError = ok;
          r.consecutiveFails++;
          r.consecutiveOks = 0;
          if (r.activeUp && r.consecutiveFails >= pool.fall) {
            r.activeUp = false;
            // A replica that went down may come back with an empty cache: forget what it held.
            this.prefixIndex?.dropReplica(r.id);
          }
        }
      }),
    );
  }

  /** Scrape every replica's vLLM /metrics once (also used by tests). */
  async scrapeMetrics(pool: PoolRuntime): Promise<void> {
    await Promise.all(
      this.replicas.map(async (r) => {
        const at = Date.now();
        const auth = resolveOriginAuth(this.env, r.auth);
        if (!auth.ok) {
          r.vllm = { ...r.vllm, lastScrapeAt: at, scrapeError: auth.problem };
          return;
        }
        try {
          // redirect: 'manual': an origin never sends the router (and its credentials) elsewhere.
          const res = await fetch(replicaEndpoint(r.url, '/metrics'), { headers: auth.headers, signal: AbortSignal.timeout(Math.min(SCRAPE_TIMEOUT_MS, pool.scrapeIntervalMs)), redirect: 'manual' });
          if (!res.ok) {
            await res.body?.cancel();
            r.vllm = { ...r.vllm, lastScrapeAt: at, scrapeError: res.status >= 300 && res.status < 400 ? `redirect (status ${res.status}) not followed` : `status ${res.status}` };
            return;
          }
          const text = await res.text();
          const parsed = parsePromText(text.length > MAX_SCRAPE_BYTES ? text.slice(0, MAX_SCRAPE_BYTES) : text);
          const sample = extractEngineSample(parsed, at);
          const resetsBefore = r.hitWindow.resets;
          r.hitWindow = pushSample(r.hitWindow, sample, pool.hitRateWindowMs);
          // A counter reset is a vLLM restart: its prefix cache is empty, whatever health saw.
          if (r.hitWindow.resets > resetsBefore) this.prefixIndex?.dropReplica(r.id);
          r.indexCapacity = indexCapacityOf(kvCapacity(parsed) ?? kvCapacityFromTotals(sample.numGpuBlocks, sample.blockSize, sample.kvUsage)) ?? r.indexCapacity;
          if (this.prefixIndex && r.indexCapacity !== null) this.prefixIndex.setCapacity(r.id, r.indexCapacity);
          r.vllm = {
            generation: sample.generation,
            hitRate: windowHitRate(r.hitWindow),
            waiting: sample.waiting ?? null,
            running: sample.running ?? null,
            kvUsage: sample.kvUsage ?? null,
            blockSize: sample.blockSize ?? null,
            numGpuBlocks: sample.numGpuBlocks ?? null,
            lastScrapeAt: at,
            scrapeError: null,
          };
        } catch (e) {
          r.vllm = { ...r.vllm, lastScrapeAt: at, scrapeError: (e as Error).name === 'TimeoutError' ? 'timeout' : 'connection failed' };
        }
      }),
    );
  }

  // ---- internals ---------------------------------------------------------------------------

  /** A successful request's blocks now sit in the replica's cache (evictable once it finished). */
  private recordPrefix(lease: Lease, outcome: ReleaseOutcome): void {
    const blocks = lease.blocks;
    lease.blocks = undefined;
    if (blocks === undefined || this.prefixIndex === null || outcome.status < 200 || outcome.status >= 300) return;
    this.prefixIndex.recordRoute(lease.replica.id, blocks);
  }

  private indexFor(pool: PoolRuntime): PrefixIndex {
    if (!this.prefixIndex) {
      this.prefixIndex = new PrefixIndex({ defaultCapacity: pool.prefixCapacityBlocks, maxEntries: pool.prefixIndexMaxEntries });
      for (const r of this.replicas) {
        if (r.indexCapacity !== null) this.prefixIndex.setCapacity(r.id, r.indexCapacity);
      }
    }
    return this.prefixIndex;
  }

  /** One dashboard sample: per-replica rates over the interval since the previous one. */
  private takeSample(now: number): void {
    const replicas: Record<string, ReplicaSample> = {};
    for (const r of this.replicas) {
      const prev = r.prevSample;
      const s = r.stats;
      const dPrompt = prev ? s.promptTokens - prev.promptTokens : 0;
      const dTtft: Histogram | null = prev
        ? { counts: s.ttft.counts.map((c, i) => c - (prev.ttft.counts[i] ?? 0)), sum: s.ttft.sum - prev.ttft.sum, count: s.ttft.count - prev.ttft.count }
        : null;
      replicas[r.id] = {
        inFlight: r.inFlight,
        waiting: r.vllm.waiting,
        requests: prev ? s.requests - prev.requests : 0,
        routerHitRate: prev && dPrompt > 0 ? (s.cachedTokens - prev.cachedTokens) / dPrompt : null,
        vllmHitRate: windowHitRate(r.hitWindow),
        ttftP50: dTtft ? histogramQuantile(dTtft, 0.5) : null,
        ttftP95: dTtft ? histogramQuantile(dTtft, 0.95) : null,
        healthy: this.isHealthy(r, now),
      };
      r.prevSample = { requests: s.requests, promptTokens: s.promptTokens, cachedTokens: s.cachedTokens, ttft: { counts: [...s.ttft.counts], sum: s.ttft.sum, count: s.ttft.count } };
    }
    this.samples.push({ at: now, replicas });
    if (this.samples.length > SAMPLE_COUNT) this.samples.splice(0, this.samples.length - SAMPLE_COUNT);
  }

  private evaluateAlerts(pool: PoolRuntime, now: number): void {
    const waiting: Record<string, number> = {};
    for (const r of this.replicas) if (r.vllm.waiting !== null && now - r.vllm.lastScrapeAt < 3 * pool.scrapeIntervalMs) waiting[r.id] = r.vllm.waiting;
    const imb = evaluateImbalance(this.imbalance, { now, waiting }, { factor: pool.imbalanceFactor, offset: pool.imbalanceOffset, holdMs: pool.imbalanceHoldMs });
    this.imbalance = imb.state;
    for (const e of imb.events) console.log(JSON.stringify({ type: 'alert', alert: 'queue_imbalance', event: e.type, pool: pool.name, replica: e.replica, waiting: e.waiting, threshold: e.threshold, median: e.median, reason: e.reason }));
    let hot: HotKeyAlert[] = [];
    if (this.hotKeys) {
      const res = evaluateHotKeys(this.hotKeys, now, { threshold: pool.hotKeyShare, minCount: pool.hotKeyMinCount });
      this.hotKeys = res.state;
      hot = res.alerts;
      for (const e of res.events) console.log(JSON.stringify({ type: 'alert', alert: 'hot_key', event: e.type, pool: pool.name, keyKind: e.keyKind, keyHash: e.keyHash, share: Math.round(e.share * 1000) / 1000 }));
    }
    this.alerts = [...imb.alerts, ...hot];
  }

  private async probe(r: ReplicaLive, timeoutMs: number): Promise<string | null> {
    const auth = resolveOriginAuth(this.env, r.auth);
    if (!auth.ok) return auth.problem;
    try {
      const res = await fetch(replicaEndpoint(r.url, '/health'), { headers: auth.headers, signal: AbortSignal.timeout(timeoutMs), redirect: 'manual' });
      await res.body?.cancel();
      return res.ok ? null : res.status >= 300 && res.status < 400 ? `redirect (status ${res.status}) not followed` : `status ${res.status}`;
    } catch (e) {
      return (e as Error).name === 'TimeoutError' ? 'timeout' : 'connection failed';
    }
  }

  private poolConfig(name: string): PoolRuntime | null {
    return loadConfig(this.env.ROUTER_CONFIG).poolByName.get(name) ?? null;
  }

  /** Bind this object to its pool on first use, seeding replicas from configuration. */
  private ensurePool(name: string): PoolRuntime | null {
    if (this.poolName !== null) return this.poolName === name ? this.poolConfig(name) : null;
    const pool = this.poolConfig(name);
    if (!pool) return null;
    this.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('pool', ?)", name);
    const count = this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM replicas').one().n;
    if (count === 0) {
      pool.replicas.forEach((r, i) => this.sql.exec('INSERT INTO replicas (id, url, weight, auth, draining, position) VALUES (?, ?, ?, ?, ?, ?)', r.id, r.url, r.weight, r.auth, r.draining ? 1 : 0, i));
    }
    this.load(name);
    return pool;
  }

  private load(name: string): void {
    this.poolName = name;
    const rows = this.sql.exec<{ id: string; url: string; weight: number; auth: string; draining: number; position: number }>('SELECT * FROM replicas ORDER BY position').toArray();
    const stats = new Map(this.sql.exec<{ replica: string; json: string }>('SELECT * FROM stats').toArray().map((s) => [s.replica, s.json]));
    this.replicas = rows.map((row) => {
      const r = this.liveReplica({ id: row.id, url: row.url, weight: row.weight, auth: row.auth, draining: row.draining === 1 }, row.position);
      const saved = stats.get(row.id);
      if (saved) r.stats = { ...emptyStats(), ...(JSON.parse(saved) as ReplicaStats) };
      return r;
    });
    const meta = this.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'expired_leases'").toArray()[0];
    this.expiredLeases = meta ? Number(meta.v) : 0;
    // Leases are soft state, kept in memory only (DESIGN.md: lost on eviction, rebuilt by new
    // traffic). Writing each one to SQLite put a storage write and its output gate on every
    // acquire and release (bench:proxy: ~4x fewer requests/s at 16 clients). Rows an older
    // version persisted are dropped.
    this.leases.clear();
    this.tenantInFlight.clear();
    this.sql.exec('DELETE FROM leases');
    this.rebuildRing();
    this.ensureAlarm(Date.now() + 100);
  }

  private liveReplica(cfg: ReplicaConfig, position: number): ReplicaLive {
    return {
      ...cfg,
      position,
      inFlight: 0,
      activeUp: true,
      consecutiveFails: 0,
      consecutiveOks: 0,
      failTimes: [],
      passiveDownUntil: 0,
      lastCheckAt: 0,
      lastCheckError: null,
      stats: emptyStats(),
      indexCapacity: null,
      vllm: { generation: 'none', hitRate: null, waiting: null, running: null, kvUsage: null, blockSize: null, numGpuBlocks: null, lastScrapeAt: 0, scrapeError: null },
      hitWindow: emptyHitRateWindow(),
      prevSample: null,
    };
  }

  private nextPosition(): number {
    return this.replicas.reduce((m, r) => Math.max(m, r.position + 1), 0);
  }

  private saveReplicas(): void {
    this.ctx.storage.transactionSync(() => {
      for (const r of this.replicas) {
        this.sql.exec('INSERT OR REPLACE INTO replicas (id, url, weight, auth, draining, position) VALUES (?, ?, ?, ?, ?, ?)', r.id, r.url, r.weight, r.auth, r.draining ? 1 : 0, r.position);
      }
    });
  }

  private rebuildRing(): void {
    const pool = this.poolName ? this.poolConfig(this.poolName) : null;
    const ppw = pool?.pointsPerWeight;
    // Compares the signature before hashing anything: a PATCH that only drains keeps the ring.
    this.ring = buildRing(this.replicas.map((r) => ({ id: r.id, weight: r.weight })), ppw, this.ring);
  }

  private isHealthy(r: ReplicaLive, now: number): boolean {
    return r.activeUp && now >= r.passiveDownUntil;
  }

  /** The core's view of the replicas; `ignorePassive` counts passively excluded replicas as healthy. */
  private views(now: number, pool: PoolRuntime, ignorePassive: boolean): ReplicaView[] {
    const withWaiting = pool.loadSignal === 'inflight+waiting';
    return this.replicas.map((r) => ({
      id: r.id,
      weight: r.weight,
      // inflight+waiting also counts the replica's own vLLM queue that other clients put there.
      inFlight: withWaiting ? r.inFlight + (r.vllm.waiting ?? 0) : r.inFlight,
      healthy: ignorePassive ? r.activeUp : this.isHealthy(r, now),
      draining: r.draining,
    }));
  }

  private notePassiveFailure(r: ReplicaLive, now: number): void {
    const pool = this.poolName ? this.poolConfig(this.poolName) : null;
    if (!pool) return;
    r.failTimes = r.failTimes.filter((t) => t > now - pool.failWindowMs);
    r.failTimes.push(now);
    if (r.failTimes.length >= pool.maxFails) {
      r.passiveDownUntil = now + pool.failTimeoutMs;
      r.failTimes = [];
    }
  }

  private dropLease(lease: Lease): void {
    this.leases.delete(lease.id);
    if (lease.replica.inFlight > 0) lease.replica.inFlight--;
    if (lease.tenant) {
      const n = (this.tenantInFlight.get(lease.tenant) ?? lease.weight) - lease.weight;
      if (n > 0) this.tenantInFlight.set(lease.tenant, n);
      else this.tenantInFlight.delete(lease.tenant);
    }
  }

  private expireLeases(now: number): void {
    let expired = 0;
    for (const lease of [...this.leases.values()]) {
      if (lease.deadline <= now) {
        this.dropLease(lease);
        expired++;
      }
    }
    if (expired > 0) {
      this.expiredLeases += expired;
      this.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('expired_leases', ?)", String(this.expiredLeases));
    }
  }

  private persistStats(): void {
    if (!this.statsDirty) return;
    this.statsDirty = false;
    this.ctx.storage.transactionSync(() => {
      for (const r of this.replicas) this.sql.exec('INSERT OR REPLACE INTO stats (replica, json) VALUES (?, ?)', r.id, JSON.stringify(r.stats));
    });
  }

  /** The alarm runs while the pool has replicas (health) or leases (expiry), and stops otherwise. */
  private scheduleNext(now: number): void {
    const pool = this.poolName ? this.poolConfig(this.poolName) : null;
    let next = Infinity;
    if (pool && this.replicas.length > 0) next = Math.max(now + 50, Math.min(this.nextHealthAt, this.nextScrapeAt, this.nextSampleAt));
    for (const l of this.leases.values()) next = Math.min(next, l.deadline);
    this.pendingAlarm = next === Infinity ? null : next;
    if (next !== Infinity) void this.ctx.storage.setAlarm(next);
    else void this.ctx.storage.deleteAlarm();
  }

  private pendingAlarm: number | null = null;
  private ensureAlarm(at: number): void {
    if (this.pendingAlarm !== null && this.pendingAlarm <= at) return;
    this.pendingAlarm = at;
    void this.ctx.storage.getAlarm().then((current) => {
      if (current === null || current > at) return this.ctx.storage.setAlarm(at);
    });
  }
}
