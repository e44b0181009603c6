// Leases (lease protocol v2, proxy/lease-agent.ts): acquire (the pick and the lease in one call),
// release, settle batches (releases, renewals, restores after a restart), reaping, tombstones and the
// tenant floor after a restart. I/O: the DO's SQLite meta rows (expired count, fallbacks, tenant floor).

import { anchorLength, hashString, hex32, pickReplica, type PrefixMatch } from '../core/index.js';
import type { PoolRuntime } from '../config.js';
import { ensureAlarm } from './alarms.js';
import { countEngineLease } from './dp-engines.js';
import { notePassiveFailure } from './health.js';
import { indexFor, unpinEngines, views } from './replicas.js';
import { noteRoutingKey } from './samples.js';
import { configOf, isHealthy, type Lease, type PoolState } from './state.js';
import { isReplicaFailure, recordOutcome, type ReleaseOutcome } from './stats.js';
import type { AcquireRequest, AcquireResult, LeaseRelease, LeaseRenewal, LeaseStats, PoolView, PreemptHook, SettleBatch, SettleResult } from './types.js';

/** Released lease ids are remembered this many TTLs, so a renewal that raced its release cannot revive it. */
const TOMBSTONE_TTLS = 2;
const MAX_TOMBSTONES = 200_000;
/** Isolates whose fallback totals are remembered (an isolate forgotten and heard again counts its total once more). */
const MAX_ISOLATES = 2_000;
/** After a restart, tenant caps also count the tenant's last persisted in-flight for one renew interval plus this. */
const RECOVERY_GRACE_MS = 1_000;
/** The replica set sent to Workers for failing open is recomputed at most this often. */
const VIEW_CACHE_MS = 250;

/** What a v2 caller gets back with every answer: the epoch, its settle result, the view. */
export type LeaseExtra = { epoch?: string; settled?: SettleResult; view?: PoolView };

/** Every replica the request could use is at the pool's per-replica bound: it may wait (queue.ts). */
export interface Saturated {
  ok: false;
  reason: 'saturated';
  extra: LeaseExtra;
}

/**
 * The pick and the lease in one call (so two requests never both see the same free slot): piggybacked
 * releases first, then revocation, the tenant's cap and a Responses pin are checked, the core picks,
 * the prefix route is recorded, and the lease is taken. `pool` null: the object serves another pool.
 * With `queue` (flow control, queue.ts): `beforePick` runs once the piggybacked releases are in (the
 * slots they freed go to those already waiting first), `mayPick` says whether the request's band may
 * take a slot now (its headroom), and a pool at its bound answers `saturated` instead of refusing.
 */
export function acquireLease(s: PoolState, pool: PoolRuntime | null, req: AcquireRequest, queue?: { beforePick(): void; mayPick?(): boolean }): AcquireResult | Saturated {
  const config = configOf(s);
  const retryAfterMs = config.retryAfterSeconds * 1000;
  if (!pool) return { ok: false, reason: 'unknown_pool', retryAfterMs };
  const now = Date.now();
  // Piggybacked releases first: the slots they free are there for this pick.
  const settled = req.settle ? settleBatch(s, req.settle, now) : undefined;
  // Only a v2 caller (it sends viewVersion) gets the epoch, the settle result and the view.
  const extra: LeaseExtra = req.viewVersion === undefined ? {} : { epoch: s.leases.epoch, ...(settled ? { settled } : {}), ...viewUnless(s, req.viewVersion, pool, now) };
  if (req.keyId !== undefined && s.revoked.has(req.keyId)) return { ok: false, reason: 'key_revoked', retryAfterMs, ...extra };
  if (tenantCapped(s, pool, req, now)) return { ok: false, reason: 'tenant_limit', retryAfterMs, ...extra };
  const pinned = req.pin ? s.responses.find(req.tenant ?? '', req.pin.responseId, now) : undefined;
  if (pinned === null) {
    s.leases.pins.not_found++;
    return { ok: false, reason: 'response_not_found', retryAfterMs, ...extra };
  }
  // Its replica answered `store: false` when it made it (its store is off): no replica has it.
  if (pinned && !pinned.stored) return { ok: false, reason: 'response_not_stored', retryAfterMs, ...extra };
  const pin = pinned?.replica;
  queue?.beforePick();
  // The request's band keeps headroom for the bands above, and the pool has no more than that free.
  if (queue?.mayPick && !queue.mayPick()) return { ok: false, reason: 'saturated', extra };
  const placed = placeLease(s, pool, req, pin, now, queue !== undefined);
  if (placed === 'saturated') return { ok: false, reason: 'saturated', extra };
  return { ...placed, ...extra };
}

/** The tenant is at its in-flight cap in this pool (its record's, else the pool's). */
export function tenantCapped(s: PoolState, pool: PoolRuntime, req: AcquireRequest, now: number): boolean {
  const tenant = req.tenant ?? '';
  const limit = req.tenantMaxInFlight ?? pool.maxInFlightPerTenant;
  const weight = Math.max(1, Math.floor(req.weight ?? 1));
  return tenant !== '' && limit !== undefined && tenantCount(s, tenant, now) + weight > limit;
}

/**
 * The pick and the lease, once the request may have one (acquireLease, or a queued request offered
 * a freed slot: queue.ts). `mayWait`: when every replica the request could use is at the pool's
 * per-replica bound, answer `saturated` rather than refuse.
 */
export function placeLease(s: PoolState, pool: PoolRuntime, req: AcquireRequest, pin: string | undefined, now: number, mayWait: boolean): AcquireResult | 'saturated' {
  const config = configOf(s);
  const retryAfterMs = config.retryAfterSeconds * 1000;
  const tenant = req.tenant ?? '';
  const weight = Math.max(1, Math.floor(req.weight ?? 1));
  let prefixMatch: PrefixMatch | undefined;
  const sessionKey = sessionKeyOf(req);
  const blocks = pool.strategyImpl.usesPrefix && req.blocks && req.blocks.length > 0 ? req.blocks : undefined;
  if (blocks) {
    prefixMatch = s.engineMatcher.match(indexFor(s, pool), s.ring.ids, s.replicas, blocks, s.leases.matchScratch, sessionKey);
  }
  const ctx = {
    ring: s.ring,
    replicas: s.pickState.current(s.replicas, pool, now),
    totals: s.pickState.totals,
    key: req.key,
    exclude: req.exclude && req.exclude.length > 0 ? new Set(req.exclude) : undefined,
    random: Math.random,
    cursor: s.leases.cursor,
    prefixMatch,
    pin,
  };
  let res = pickReplica(pool.strategyImpl, pool.fallbackImpl, ctx);
  // Passive exclusion (max_fails) is a soft signal: when it leaves nothing else to try, a replica
  // that passes its active health check is better than failing a request no byte has left for.
  if (!res.ok && s.replicas.some((r) => r.activeUp && r.passiveDownUntil > now)) {
    res = pickReplica(pool.strategyImpl, pool.fallbackImpl, { ...ctx, replicas: views(s, now, pool, true), totals: undefined });
  }
  if (!res.ok && mayWait && atBound(s, pool, ctx.exclude, pin, now)) return 'saturated';
  if (pin !== undefined) s.leases.pins[res.ok ? 'hit' : res.reason === 'pinned_replica_gone' ? 'gone' : 'unavailable']++;
  if (!res.ok) return { ok: false, reason: res.reason, retryAfterMs };
  const r = s.replicas[res.index]!;
  // A data-parallel replica: the engine too (longest match, else fewest leases; dp-engines.ts).
  const engine = blocks && r.dp.pinned && req.pinEngine !== false ? s.engineMatcher.pick(res.index, r.dp, req.key ?? blocks[0]!) : null;
  // Not pinned on a replica whose engines are apart: vLLM's balancer picks, no slot knows which.
  const slot = engine ? r.dp.slots[engine.slot]! : r.dp.pinned ? null : r.id;
  const matchedBlocks = engine ? engine.matched : prefixMatch ? (prefixMatch.matched[res.index] ?? -1) : undefined;
  // Recorded now: vLLM caches the prompt once its prefill is done, long before the stream
  // ends (recording at release lost 6 points of hit rate on multi-turn chat, docs/benchmarks.md).
  if (blocks && slot !== null) s.prefixIndex!.recordRoute(slot, blocks, sessionKey);
  // vLLM picks the engine: a route to the replica all the same (its recent share, the key's home).
  else if (blocks) s.prefixIndex!.noteRoute(r.dp.slots[0]!, sessionKey);
  if (res.cursor !== undefined) s.leases.cursor = res.cursor;
  if (req.key !== null) {
    noteRoutingKey(s, pool, now, req.keyKind, hex32(req.key));
  }
  if (req.record) s.responses.record(tenant, req.record.responseId, r.id, now, config.responseAffinityTtlMs, config.responseAffinityMaxEntries);
  const lease: Lease = { id: crypto.randomUUID(), replica: r, tenant, deadline: now + config.leaseTtlMs, spilled: res.spilled, startedAt: now, ...(weight > 1 ? { weight } : {}) };
  // Retracted on failure (release): a request refused (4xx) or failed never filled the cache.
  if (blocks && slot !== null) lease.prefix = { blocks, from: Math.max(0, matchedBlocks ?? 0), count: anchorLength(blocks.length), slot };
  if (engine) lease.engine = { dp: r.dp, slot: engine.slot };
  addLease(s, lease);
  ensureAlarm(s, lease.deadline);
  const result: AcquireResult = { ok: true, leaseId: lease.id, replica: { id: r.id, url: r.url, auth: r.auth, ...(engine ? { dpRank: engine.slot } : {}) }, spilled: res.spilled, steps: res.steps, deadline: lease.deadline, matchedBlocks };
  if (req.guess) {
    const g = req.guess;
    const guessed = g.id === r.id ? r : s.replicas.find((x) => x.id === g.id);
    result.guessUsable = guessed !== undefined && !guessed.draining && isHealthy(guessed, now) && guessed.url === g.url && guessed.auth === g.auth;
  }
  return result;
}

/**
 * The pick failed because the replicas it could use are full, not gone: one that is healthy, not
 * drained by an operator, not excluded (and the pinned one, for a pinned request) is at the pool's
 * per-replica bound. A slot there will free; the request may wait for it.
 */
function atBound(s: PoolState, pool: PoolRuntime, exclude: Set<string> | undefined, pin: string | undefined, now: number): boolean {
  const cap = pool.maxInFlightPerReplica;
  if (cap === undefined) return false;
  void now;
  return s.replicas.some((r) => r.inFlight >= cap && !r.draining && r.activeUp && !exclude?.has(r.id) && (pin === undefined || r.id === pin));
}

/**
 * End a lease and record its outcome (stats, passive failure, prefix route retracted on failure).
 * Idempotent: false for a lease not held (released, expired, or from before a restart), tombstoned either way.
 */
export function releaseLease(s: PoolState, rel: LeaseRelease, now: number): boolean {
  const { id: leaseId, outcome } = rel;
  const lease = s.leases.byId.get(leaseId);
  if (!lease) {
    // A lease from before a restart that no renewal brought back yet: it no longer counts for its tenant.
    if (rel.tenant && !s.leases.tombstones.has(leaseId)) lowerFloor(s, rel.tenant, now);
    tombstone(s, leaseId, now);
    return false;
  }
  tombstone(s, leaseId, now);
  dropLease(s, lease);
  const r = lease.replica;
  // The engine named its response otherwise than the router asked (an engine that ignores
  // `request_id`): remember the id it reported, on the replica that made it.
  if (outcome.responseId) {
    const config = configOf(s);
    s.responses.record(lease.tenant, outcome.responseId, r.id, Date.now(), config.responseAffinityTtlMs, config.responseAffinityMaxEntries);
  }
  // The replica answered `store: false` for a response the router asked it to store.
  if (typeof outcome.notStored === 'string') s.responses.markNotStored(lease.tenant, outcome.notStored);
  if (s.replicas.includes(r)) {
    settlePrefix(s, lease, outcome);
    // vLLM refused the rank the router sent: its engines changed since the scrape.
    if (outcome.rankRefused && r.dp.pinned) unpinEngines(s, r);
    recordOutcome(r.stats, outcome, lease.spilled);
    s.statsDirty = true;
    if (isReplicaFailure(outcome)) notePassiveFailure(s, r, Date.now());
  }
  if (outcome.earlyConnect !== undefined) {
    const guessed = s.replicas.find((x) => x.id === outcome.earlyReplica);
    if (guessed) {
      if (outcome.earlyConnect === 'hit') guessed.stats.earlyConnectHits++;
      else guessed.stats.earlyConnectMisses++;
      s.statsDirty = true;
    }
  }
  return true;
}

/** One isolate's batch (lease protocol v2): releases, then renewals (restoring leases this instance does not know), then its fail-open count. */
export function settleBatch(s: PoolState, batch: SettleBatch, now: number): SettleResult {
  const ttlMs = configOf(s).leaseTtlMs;
  let released = 0;
  for (const rel of batch.releases ?? []) if (releaseLease(s, rel, now)) released++;
  let renewed = 0;
  let restored = 0;
  const gone: string[] = [];
  const deadline = now + ttlMs;
  for (const ren of batch.renew ?? []) {
    const lease = s.leases.byId.get(ren.id);
    if (lease) {
      lease.deadline = deadline;
      renewed++;
    } else if (restoreLease(s, ren, deadline, now)) restored++;
    else gone.push(ren.id);
  }
  const fb = batch.fallbacks;
  const before = fb && typeof fb.isolate === 'string' && fb.isolate.length <= 64 && Number.isFinite(fb.total) ? (s.leases.isolateFallbacks.get(fb.isolate) ?? 0) : Infinity;
  if (fb && fb.total > before) {
    s.leases.fallbacks += Math.floor(fb.total - before);
    s.leases.isolateFallbacks.delete(fb.isolate);
    s.leases.isolateFallbacks.set(fb.isolate, fb.total);
    // Isolates come and go: remember the most recent ones only.
    if (s.leases.isolateFallbacks.size > MAX_ISOLATES) s.leases.isolateFallbacks.delete(s.leases.isolateFallbacks.keys().next().value!);
    s.leases.lastFallbackAt = now;
    s.leases.fallbacksDirty = true;
  }
  if (renewed + restored > 0) ensureAlarm(s, deadline);
  return { epoch: s.leases.epoch, released, renewed, restored, gone, deadline };
}

/** Reap the leases whose renewals stopped (their Worker died): deadline passed. */
export function expireLeases(s: PoolState, now: number): void {
  let expired = 0;
  for (const lease of [...s.leases.byId.values()]) {
    if (lease.deadline <= now) {
      dropLease(s, lease);
      expired++;
    }
  }
  if (expired > 0) {
    s.leases.expired += expired;
    s.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('expired_leases', ?)", String(s.leases.expired));
  }
}

/** Drop tombstones past their time (oldest first); `force` also trims a full set to 90%. */
export function pruneTombstones(s: PoolState, now: number, force = false): void {
  for (const [id, until] of s.leases.tombstones) {
    if (until > now && !(force && s.leases.tombstones.size > MAX_TOMBSTONES * 0.9)) break;
    s.leases.tombstones.delete(id);
  }
}

/** When the leases need the alarm: the next deadline, and once per renew interval while any are held (the tenant floor). */
export function leaseWakeAt(s: PoolState, now: number): number {
  const b = s.leases;
  let next = Infinity;
  for (const l of b.byId.values()) next = Math.min(next, l.deadline);
  if (b.byId.size > 0 || b.tenantsDirty) next = Math.min(next, now + configOf(s).renewIntervalMs);
  return next;
}

/** Lease RPCs by method since this instance started (the snapshot). */
export function countRpc(s: PoolState, method: string): void {
  s.leases.rpcs[method] = (s.leases.rpcs[method] ?? 0) + 1;
}

/** The lease protocol's part of the pool snapshot. */
export function leaseSnapshot(s: PoolState, now: number): LeaseStats {
  const b = s.leases;
  return {
    epoch: b.epoch,
    startedAt: b.startedAt,
    ttlMs: configOf(s).leaseTtlMs,
    restoredLeases: b.restored,
    lastRestoredAt: b.lastRestoredAt,
    fallbacks: b.fallbacks,
    lastFallbackAt: b.lastFallbackAt,
    rpcs: { ...b.rpcs },
    recoveryUntil: b.recoveryUntil > now ? b.recoveryUntil : 0,
  };
}

/**
 * The lease book as a (re)started instance has it: no leases (soft state, kept in memory only:
 * DESIGN.md, rebuilt from the Workers' renewals within one renew interval; writing each one to
 * SQLite put a storage write and its output gate on every acquire and release, bench:proxy: ~4x
 * fewer requests/s at 16 clients), the persisted counters. Rows an older version persisted are dropped.
 */
export function loadLeases(s: PoolState): void {
  const b = s.leases;
  const meta = s.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'expired_leases'").toArray()[0];
  b.expired = meta ? Number(meta.v) : 0;
  const fb = s.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'fallbacks'").toArray()[0];
  if (fb) {
    const saved = JSON.parse(fb.v) as { fallbacks: number; lastFallbackAt: number; isolates?: Record<string, number> };
    b.fallbacks = saved.fallbacks;
    b.lastFallbackAt = saved.lastFallbackAt;
    b.isolateFallbacks = new Map(Object.entries(saved.isolates ?? {}));
  }
  b.byId.clear();
  b.tenantInFlight.clear();
  s.sql.exec('DELETE FROM leases');
}

/** A restart in place, memory dropped and storage kept: a new epoch, and what this instance remembered of its leases forgotten. */
export function forgetLeases(s: PoolState): void {
  const b = s.leases;
  b.epoch = crypto.randomUUID();
  b.startedAt = Date.now();
  b.tombstones.clear();
  b.restored = 0;
  b.lastRestoredAt = 0;
  b.rpcs = {};
  b.view = null;
  b.cursor = 0;
  b.tenantFloor.clear();
  b.recoveryUntil = 0;
}

/** The fallback counters the Workers reported, when they changed since the last save. */
export function persistFallbacks(s: PoolState): void {
  const b = s.leases;
  if (!b.fallbacksDirty) return;
  b.fallbacksDirty = false;
  s.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('fallbacks', ?)", JSON.stringify({ fallbacks: b.fallbacks, lastFallbackAt: b.lastFallbackAt, isolates: Object.fromEntries(b.isolateFallbacks) }));
}

/** Tenant in-flight counts as the alarm last saw them: a restarted instance's floor for tenant caps. */
export function persistTenantFloor(s: PoolState, force: boolean): void {
  if (!s.leases.tenantsDirty && !force) return;
  s.leases.tenantsDirty = false;
  s.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('tenants', ?)", JSON.stringify({ at: Date.now(), tenants: Object.fromEntries(s.leases.tenantInFlight) }));
}

/** After a restart: each tenant's last persisted in-flight counts against its cap until renewals have rebuilt it. */
export function loadRecoveryFloor(s: PoolState): void {
  const row = s.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'tenants'").toArray()[0];
  if (!row) return;
  let saved: { at: number; tenants: Record<string, number> };
  try {
    saved = JSON.parse(row.v) as typeof saved;
  } catch {
    return;
  }
  const config = configOf(s);
  // Leases older than one TTL would have been reaped by now anyway.
  if (Date.now() - saved.at > config.leaseTtlMs) return;
  for (const [t, n] of Object.entries(saved.tenants)) if (n > 0) s.leases.tenantFloor.set(t, n);
  if (s.leases.tenantFloor.size > 0) s.leases.recoveryUntil = Date.now() + config.renewIntervalMs + RECOVERY_GRACE_MS;
  s.leases.tenantsDirty = true;
}

/**
 * Rebuild a lease this instance does not know from its renewal: it restarted, or it reaped the
 * lease while renewals were late. Not for a lease released before (tombstone: a renewal that
 * crossed its own release), nor for a replica no longer in the pool. No cap check: the stream
 * is already running, and the count must say so.
 */
function restoreLease(s: PoolState, ren: LeaseRenewal, deadline: number, now: number): boolean {
  if (typeof ren.id !== 'string' || ren.id.length === 0 || ren.id.length > 64 || s.leases.tombstones.has(ren.id)) return false;
  const replica = s.replicas.find((r) => r.id === ren.replica);
  if (!replica) return false;
  const tenant = typeof ren.tenant === 'string' ? ren.tenant : '';
  addLease(s, { id: ren.id, replica, tenant, deadline, spilled: ren.spilled === true, startedAt: Number.isFinite(ren.startedAt) ? ren.startedAt : now });
  lowerFloor(s, tenant, now);
  s.leases.restored++;
  s.leases.lastRestoredAt = now;
  return true;
}

/** Count a lease in: its replica, engine, prefix blocks and tenant. */
function addLease(s: PoolState, lease: Lease): void {
  s.leases.byId.set(lease.id, lease);
  lease.replica.inFlight++;
  s.pickState.moved(lease.replica);
  if (lease.prefix) lease.replica.leaseBlocks += lease.prefix.count;
  if (lease.engine) countEngineLease(lease.engine, lease.replica.dp, lease.prefix?.count ?? 0, 1);
  if (lease.tenant) {
    s.leases.tenantInFlight.set(lease.tenant, (s.leases.tenantInFlight.get(lease.tenant) ?? 0) + (lease.weight ?? 1));
    s.leases.tenantsDirty = true;
  }
}

/** Count a lease out (release or reap); the inverse of addLease. */
function dropLease(s: PoolState, lease: Lease): void {
  s.leases.byId.delete(lease.id);
  if (lease.preempt) disposeHook(lease.preempt.hook);
  // A slot freed: the drain rate flow control's Retry-After is computed from (queue.ts).
  s.queue.drain.note(Date.now());
  if (lease.replica.inFlight > 0) lease.replica.inFlight--;
  s.pickState.moved(lease.replica);
  if (lease.prefix) lease.replica.leaseBlocks = Math.max(0, lease.replica.leaseBlocks - lease.prefix.count);
  if (lease.engine) countEngineLease(lease.engine, lease.replica.dp, lease.prefix?.count ?? 0, -1);
  if (lease.tenant) {
    s.leases.tenantsDirty = true;
    const w = lease.weight ?? 1;
    const n = (s.leases.tenantInFlight.get(lease.tenant) ?? w) - w;
    if (n > 0) s.leases.tenantInFlight.set(lease.tenant, n);
    else s.leases.tenantInFlight.delete(lease.tenant);
  }
}

/** A request that failed (no 2xx) never filled the cache: take back the blocks its route added. */
function settlePrefix(s: PoolState, lease: Lease, outcome: ReleaseOutcome): void {
  const p = lease.prefix;
  lease.prefix = undefined;
  if (p === undefined || s.prefixIndex === null || (outcome.status >= 200 && outcome.status < 300)) return;
  s.prefixIndex.forget(p.slot, p.blocks, p.from);
}

/** Remember a released id for TOMBSTONE_TTLS lease TTLs, so a late renewal cannot restore it. */
function tombstone(s: PoolState, id: string, now: number): void {
  s.leases.tombstones.delete(id);
  s.leases.tombstones.set(id, now + TOMBSTONE_TTLS * configOf(s).leaseTtlMs);
  if (s.leases.tombstones.size > MAX_TOMBSTONES) pruneTombstones(s, now, true);
}

/**
 * A tenant's in-flight for its cap. During recovery it also counts the leases it held before the
 * restart that no renewal has brought back (and no release has ended) yet.
 */
function tenantCount(s: PoolState, tenant: string, now: number): number {
  const live = s.leases.tenantInFlight.get(tenant) ?? 0;
  if (now >= s.leases.recoveryUntil) return live;
  return live + (s.leases.tenantFloor.get(tenant) ?? 0);
}

/** One of the tenant's leases from before the restart is accounted for (restored or released). */
function lowerFloor(s: PoolState, tenant: string, now: number): void {
  if (!tenant || now >= s.leases.recoveryUntil) return;
  const f = (s.leases.tenantFloor.get(tenant) ?? 0) - 1;
  if (f > 0) s.leases.tenantFloor.set(tenant, f);
  else s.leases.tenantFloor.delete(tenant);
}

/** What a Worker fails open over, unless it already holds this version. */
function viewUnless(s: PoolState, version: string, pool: PoolRuntime, now: number): { view?: PoolView } {
  if (!s.leases.view || now - s.leases.view.at >= VIEW_CACHE_MS) {
    const replicas = s.replicas.map((r) => ({ id: r.id, url: r.url, auth: r.auth, weight: r.weight, healthy: isHealthy(r, now), draining: r.draining }));
    s.leases.view = { at: now, view: { version: hex32(hashString(`${pool.name}|${JSON.stringify(replicas)}`)), replicas } };
  }
  return s.leases.view.view.version === version ? {} : { view: s.leases.view.view };
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

/** Let go of a Worker's preemption callback (an RPC stub the object duplicated to keep; a plain function in tests). */
export function disposeHook(hook: PreemptHook): void {
  const dispose = (Symbol as unknown as { dispose?: symbol }).dispose;
  if (dispose === undefined) return;
  try {
    (hook as unknown as Record<symbol, (() => void) | undefined>)[dispose]?.();
  } catch {
    // Already disposed, or its isolate is gone: nothing held.
  }
}
