// PoolCoordinator: one Durable Object per pool (`idFromName(pool)`). Owns the pool's replicas
// (persisted in SQLite), leases (in-flight counts), health, per-replica stats, and the alarm
// that expires leases, checks health and scrapes vLLM metrics. The pick itself is the pure
// core's; this class loads state, calls it, saves, and returns typed results. I/O: DO storage,
// health-check and metrics fetches to the replicas from the alarm.

import { DurableObject } from 'cloudflare:workers';
import { buildRing, pickReplica, type KeyKind, type ReplicaView, type Ring } from '../core/index.js';
import { loadConfig, replicaSchema, type PoolRuntime, type ReplicaConfig } from '../config.js';
import { resolveOriginAuth } from './origin-auth.js';
import { emptyStats, isReplicaFailure, recordOutcome, type ReleaseOutcome, type ReplicaStats } from './stats.js';

export interface AcquireRequest {
  pool: string;
  /** 32-bit hash of the routing key, or null. */
  key: number | null;
  keyKind: KeyKind;
  /** Replica ids to skip (a retry excludes the one that failed). */
  exclude?: string[];
  tenant?: string;
  /** The tenant's own in-flight cap in this pool, if its record sets one. */
  tenantMaxInFlight?: number;
}

export type AcquireFailureReason = 'no_healthy_replica' | 'tenant_limit' | 'unknown_pool';

export type AcquireResult =
  | {
      ok: true;
      leaseId: string;
      replica: { id: string; url: string; auth: string };
      spilled: boolean;
      steps: number;
      deadline: number;
    }
  | { ok: false; reason: AcquireFailureReason; retryAfterMs: number };

export interface ReplicaSnapshot {
  id: string;
  url: string;
  weight: number;
  auth: string;
  draining: boolean;
  healthy: boolean;
  /** Active health check state (HAProxy fall/rise). */
  activeUp: boolean;
  /** Passive (NGINX max_fails) exclusion end, epoch ms; 0 when not excluded. */
  passiveDownUntil: number;
  inFlight: number;
  lastCheckAt: number;
  lastCheckError: string | null;
  stats: ReplicaStats;
}

export interface PoolSnapshot {
  pool: string;
  strategy: string;
  fallback: string;
  keys: string[];
  loadSignal: string;
  at: number;
  leases: number;
  expiredLeases: number;
  replicas: ReplicaSnapshot[];
}

export type AdminResult<T> = { ok: true; value: T } | { ok: false; reason: 'unknown_pool' | 'not_found' | 'invalid'; message: string };

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
}

interface Lease {
  id: string;
  replica: string;
  tenant: string;
  deadline: number;
  spilled: boolean;
  startedAt: number;
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

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(SCHEMA);
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
    const tenant = req.tenant ?? '';
    const limit = req.tenantMaxInFlight ?? pool.maxInFlightPerTenant;
    if (tenant && limit !== undefined && (this.tenantInFlight.get(tenant) ?? 0) >= limit) return { ok: false, reason: 'tenant_limit', retryAfterMs };

    const res = pickReplica(pool.strategyImpl, pool.fallbackImpl, {
      ring: this.ring,
      replicas: this.views(now),
      key: req.key,
      exclude: req.exclude && req.exclude.length > 0 ? new Set(req.exclude) : undefined,
      random: Math.random,
      cursor: this.cursor,
    });
    if (!res.ok) return { ok: false, reason: res.reason, retryAfterMs };
    if (res.cursor !== undefined) this.cursor = res.cursor;
    const r = this.replicas[res.index]!;
    const lease: Lease = { id: crypto.randomUUID(), replica: r.id, tenant, deadline: now + config.maxStreamMs, spilled: res.spilled, startedAt: now };
    this.leases.set(lease.id, lease);
    r.inFlight++;
    if (tenant) this.tenantInFlight.set(tenant, (this.tenantInFlight.get(tenant) ?? 0) + 1);
    this.sql.exec('INSERT INTO leases (id, replica, tenant, deadline, spilled, started_at) VALUES (?, ?, ?, ?, ?, ?)', lease.id, r.id, tenant, lease.deadline, res.spilled ? 1 : 0, now);
    this.ensureAlarm(lease.deadline);
    return { ok: true, leaseId: lease.id, replica: { id: r.id, url: r.url, auth: r.auth }, spilled: res.spilled, steps: res.steps, deadline: lease.deadline };
  }

  /** Idempotent: a second release of the same lease (or of an expired one) changes nothing. */
  release(leaseId: string, outcome: ReleaseOutcome): { released: boolean } {
    const lease = this.leases.get(leaseId);
    if (!lease) return { released: false };
    this.dropLease(lease);
    const r = this.replicas.find((x) => x.id === lease.replica);
    if (r) {
      recordOutcome(r.stats, outcome, lease.spilled);
      this.statsDirty = true;
      if (isReplicaFailure(outcome)) this.notePassiveFailure(r, Date.now());
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
      })),
    };
  }

  /** Create or replace a replica (admin PUT). Keeps its in-flight count and stats. */
  upsertReplica(pool: string, input: unknown): AdminResult<ReplicaSnapshot> {
    if (!this.ensurePool(pool)) return { ok: false, reason: 'unknown_pool', message: `no pool named "${pool}"` };
    const parsed = replicaSchema.safeParse(input);
    if (!parsed.success) return { ok: false, reason: 'invalid', message: parsed.error.issues.map((i) => `${i.path.join('.') || 'replica'}: ${i.message}`).join('; ') };
    const cfg = parsed.data;
    const existing = this.replicas.find((r) => r.id === cfg.id);
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
    this.sql.exec('DELETE FROM replicas WHERE id = ?', id);
    this.sql.exec('DELETE FROM stats WHERE replica = ?', id);
    this.rebuildRing();
    return { ok: true, value: { id, inFlight: r!.inFlight } };
  }

  // ---- alarm: lease expiry, active health checks, stats persistence ---------------------------

  override async alarm(): Promise<void> {
    const now = Date.now();
    this.expireLeases(now);
    const pool = this.poolName ? this.poolConfig(this.poolName) : null;
    if (pool && this.replicas.length > 0 && now >= this.nextHealthAt) {
      this.nextHealthAt = now + pool.healthIntervalMs;
      await this.checkHealth(pool);
    }
    this.persistStats();
    this.scheduleNext(Date.now());
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
          if (r.activeUp && r.consecutiveFails >= pool.fall) r.activeUp = false;
        }
      }),
    );
  }

  // ---- internals ---------------------------------------------------------------------------

  private async probe(r: ReplicaLive, timeoutMs: number): Promise<string | null> {
    const auth = resolveOriginAuth(this.env, r.auth);
    if (!auth.ok) return auth.problem;
    try {
      const res = await fetch(new URL('/health', r.url), { headers: auth.headers, signal: AbortSignal.timeout(timeoutMs) });
      await res.body?.cancel();
      return res.ok ? null : `status ${res.status}`;
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
    this.leases.clear();
    this.tenantInFlight.clear();
    for (const l of this.sql.exec<{ id: string; replica: string; tenant: string; deadline: number; spilled: number; started_at: number }>('SELECT * FROM leases')) {
      const lease: Lease = { id: l.id, replica: l.replica, tenant: l.tenant, deadline: l.deadline, spilled: l.spilled === 1, startedAt: l.started_at };
      this.leases.set(lease.id, lease);
      const r = this.replicas.find((x) => x.id === lease.replica);
      if (r) r.inFlight++;
      if (lease.tenant) this.tenantInFlight.set(lease.tenant, (this.tenantInFlight.get(lease.tenant) ?? 0) + 1);
    }
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
    const members = this.replicas.map((r) => ({ id: r.id, weight: r.weight }));
    const next = buildRing(members, ppw);
    if (next.signature !== this.ring.signature) this.ring = next;
  }

  private isHealthy(r: ReplicaLive, now: number): boolean {
    return r.activeUp && now >= r.passiveDownUntil;
  }

  private views(now: number): ReplicaView[] {
    return this.replicas.map((r) => ({ id: r.id, weight: r.weight, inFlight: r.inFlight, healthy: this.isHealthy(r, now), draining: r.draining }));
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
    const r = this.replicas.find((x) => x.id === lease.replica);
    if (r && r.inFlight > 0) r.inFlight--;
    if (lease.tenant) {
      const n = (this.tenantInFlight.get(lease.tenant) ?? 1) - 1;
      if (n > 0) this.tenantInFlight.set(lease.tenant, n);
      else this.tenantInFlight.delete(lease.tenant);
    }
    this.sql.exec('DELETE FROM leases WHERE id = ?', lease.id);
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
    if (pool && this.replicas.length > 0) next = Math.max(now + 50, this.nextHealthAt);
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
