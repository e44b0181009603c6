// The pool's replicas: binding the object to its pool, the replica set and its ring, admin
// changes (add, replace, weight, drain, remove), and the per-replica snapshot. I/O: the DO's
// SQLite storage (the schema, the replicas and stats tables, meta 'pool').

import { buildRing, PrefixIndex, type PrefixIndexStats, type ReplicaView } from '../core/index.js';
import { replicaSchema, replicaUrlProblem, type PoolRuntime, type ReplicaConfig } from '../config.js';
import { ensureAlarm } from './alarms.js';
import { dropEngines, engineSnapshots, pushCapacities, singleEngine } from './dp-engines.js';
import { replicaView } from './pick-state.js';
import { boundPool, configOf, isHealthy, type PoolState, type ReplicaLive } from './state.js';
import { emptyStats, type ReplicaStats } from './stats.js';
import type { AdminResult, ReplicaSnapshot } from './types.js';
import { emptyHitRateWindow, windowHitRate } from '../engines/hit-rate.js';

/** The `leases` table is only emptied (leases.ts: rows an older version persisted). */
const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replicas (id TEXT PRIMARY KEY, url TEXT NOT NULL, weight INTEGER NOT NULL, auth TEXT NOT NULL, draining INTEGER NOT NULL, position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, replica TEXT NOT NULL, tenant TEXT NOT NULL, deadline INTEGER NOT NULL, spilled INTEGER NOT NULL, started_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stats (replica TEXT PRIMARY KEY, json TEXT NOT NULL);
`;

/** Create the tables if new; returns the pool this object was bound to before, if any. */
export function openStorage(sql: SqlStorage): string | undefined {
  sql.exec(SCHEMA);
  return sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'pool'").toArray()[0]?.v;
}

/** Bind the object to `pool` (persisted), seeding its replicas from configuration when it has none yet. */
export function bindPool(s: PoolState, name: string, pool: PoolRuntime): void {
  s.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('pool', ?)", name);
  const count = s.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM replicas').one().n;
  if (count === 0) {
    pool.replicas.forEach((r, i) => s.sql.exec('INSERT INTO replicas (id, url, weight, auth, draining, position) VALUES (?, ?, ?, ?, ?, ?)', r.id, r.url, r.weight, r.auth, r.draining ? 1 : 0, i));
  }
}

/** The replicas and their stats from storage, as after a restart: health, load and engines start over. */
export function loadReplicas(s: PoolState, name: string): void {
  s.poolName = name;
  const rows = s.sql.exec<{ id: string; url: string; weight: number; auth: string; draining: number; position: number }>('SELECT * FROM replicas ORDER BY position').toArray();
  const stats = new Map(s.sql.exec<{ replica: string; json: string }>('SELECT * FROM stats').toArray().map((row) => [row.replica, row.json]));
  s.engineMatcher.invalidate();
  s.replicas = rows.map((row) => {
    const r = liveReplica({ id: row.id, url: row.url, weight: row.weight, auth: row.auth, draining: row.draining === 1 }, row.position);
    const saved = stats.get(row.id);
    if (saved) r.stats = { ...emptyStats(), ...(JSON.parse(saved) as ReplicaStats) };
    return r;
  });
  rebuildRing(s);
}

/** Per-replica stats, when a release changed them since the last save. */
export function persistStats(s: PoolState): void {
  if (!s.statsDirty) return;
  s.statsDirty = false;
  s.storage.transactionSync(() => {
    for (const r of s.replicas) s.sql.exec('INSERT OR REPLACE INTO stats (replica, json) VALUES (?, ?)', r.id, JSON.stringify(r.stats));
  });
}

/** Create or replace a replica (admin PUT). Keeps its in-flight count and stats. */
export function upsertReplica(s: PoolState, input: unknown): AdminResult<ReplicaSnapshot> {
  const parsed = replicaSchema.safeParse(input);
  if (!parsed.success) return { ok: false, reason: 'invalid', message: parsed.error.issues.map((i) => `${i.path.join('.') || 'replica'}: ${i.message}`).join('; ') };
  const cfg = parsed.data;
  // The schema accepts loopback (a local run: `npm start`, tests); a deployed configuration (no
  // `local = true`) reaches nothing there, so the admin API refuses it as deploy:check does.
  if (!configOf(s).local) {
    const problem = replicaUrlProblem(cfg.url, 'edge');
    if (problem) return { ok: false, reason: 'invalid', message: `url: ${problem}` };
  }
  const existing = s.replicas.find((r) => r.id === cfg.id);
  if (existing && existing.url !== cfg.url) unpinEngines(s, existing);
  if (existing) Object.assign(existing, { url: cfg.url, weight: cfg.weight, auth: cfg.auth, draining: cfg.draining });
  else {
    s.replicas.push(liveReplica(cfg, s.replicas.reduce((m, r) => Math.max(m, r.position + 1), 0)));
    s.engineMatcher.invalidate();
  }
  saveReplicas(s);
  rebuildRing(s);
  ensureAlarm(s, Date.now() + 100);
  return { ok: true, value: replicaSnapshot(s, s.replicas.find((r) => r.id === cfg.id)!, Date.now()) };
}

/** Change weight and/or drain state (admin PATCH). */
export function patchReplica(s: PoolState, pool: string, id: string, patch: { weight?: number; draining?: boolean }): AdminResult<ReplicaSnapshot> {
  const r = s.replicas.find((x) => x.id === id);
  if (!r) return { ok: false, reason: 'not_found', message: `no replica "${id}" in pool "${pool}"` };
  const candidate = replicaSchema.safeParse({ id: r.id, url: r.url, auth: r.auth, weight: patch.weight ?? r.weight, draining: patch.draining ?? r.draining });
  if (!candidate.success) return { ok: false, reason: 'invalid', message: candidate.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ') };
  r.weight = candidate.data.weight;
  r.draining = candidate.data.draining;
  saveReplicas(s);
  rebuildRing(s);
  return { ok: true, value: replicaSnapshot(s, r, Date.now()) };
}

/** Remove a replica (admin DELETE). Streams in flight on it are not cut: the Worker holds them. */
export function removeReplica(s: PoolState, pool: string, id: string): AdminResult<{ id: string; inFlight: number }> {
  const i = s.replicas.findIndex((x) => x.id === id);
  if (i < 0) return { ok: false, reason: 'not_found', message: `no replica "${id}" in pool "${pool}"` };
  const [r] = s.replicas.splice(i, 1);
  s.engineMatcher.invalidate();
  dropEngines(s.prefixIndex, r!.dp.slots, id);
  s.sql.exec('DELETE FROM replicas WHERE id = ?', id);
  s.sql.exec('DELETE FROM stats WHERE replica = ?', id);
  rebuildRing(s);
  return { ok: true, value: { id, inFlight: r!.inFlight } };
}

export function replicaSnapshot(s: PoolState, r: ReplicaLive, now: number, indexStats: PrefixIndexStats | null = s.prefixIndex ? s.prefixIndex.stats() : null): ReplicaSnapshot {
  return {
    id: r.id,
    url: r.url,
    weight: r.weight,
    auth: r.auth,
    draining: r.draining,
    healthy: isHealthy(r, now),
    activeUp: r.activeUp,
    passiveDownUntil: r.passiveDownUntil > now ? r.passiveDownUntil : 0,
    inFlight: r.inFlight,
    lastCheckAt: r.lastCheckAt,
    lastCheckError: r.lastCheckError,
    stats: r.stats,
    vllm: { ...r.vllm, hitRate: windowHitRate(r.hitWindow) },
    ...(r.dp.pinned ? { engines: engineSnapshots(r.dp, indexStats) } : {}),
  };
}

/** The core's view of the replicas; `ignorePassive` counts passively excluded replicas as healthy. */
export function views(s: PoolState, now: number, pool: PoolRuntime, ignorePassive: boolean): ReplicaView[] {
  return s.replicas.map((r) => replicaView(r, now, pool, ignorePassive));
}

/** Forget a replica's engine slots and pin nothing there until a scrape names its engines again. */
export function unpinEngines(s: PoolState, r: ReplicaLive): void {
  dropEngines(s.prefixIndex, r.dp.slots, r.id);
  r.dp = singleEngine(r.id);
  s.engineMatcher.invalidate();
}

/** The prefix index of a prefix-aware pool, made on first use with each replica's engine capacities. */
export function indexFor(s: PoolState, pool: PoolRuntime): PrefixIndex {
  if (!s.prefixIndex) {
    s.prefixIndex = new PrefixIndex({ defaultCapacity: pool.prefixCapacityBlocks, maxEntries: pool.prefixIndexMaxEntries });
    for (const r of s.replicas) pushCapacities(s.prefixIndex, r.dp);
  }
  return s.prefixIndex;
}

function liveReplica(cfg: ReplicaConfig, position: number): ReplicaLive {
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
    leaseBlocks: 0,
    dp: singleEngine(cfg.id),
    vllm: { generation: 'none', hitRate: null, waiting: null, running: null, kvUsage: null, blockSize: null, numGpuBlocks: null, lastScrapeAt: 0, scrapeError: null },
    hitWindow: emptyHitRateWindow(),
    prevSample: null,
  };
}

function saveReplicas(s: PoolState): void {
  s.storage.transactionSync(() => {
    for (const r of s.replicas) {
      s.sql.exec('INSERT OR REPLACE INTO replicas (id, url, weight, auth, draining, position) VALUES (?, ?, ?, ?, ?, ?)', r.id, r.url, r.weight, r.auth, r.draining ? 1 : 0, r.position);
    }
  });
}

function rebuildRing(s: PoolState): void {
  const ppw = boundPool(s)?.pointsPerWeight;
  // Compares the signature before hashing anything: a PATCH that only drains keeps the ring.
  s.ring = buildRing(s.replicas.map((r) => ({ id: r.id, weight: r.weight })), ppw, s.ring);
  // Every change of membership, weight or draining comes through here (admin, load, restart).
  s.pickState.invalidate();
}
