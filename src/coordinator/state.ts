// The PoolCoordinator's in-memory state as one plain object, passed to each concern's module
// (leases, replicas, health, scrape, samples, alarms); each section says who owns it.
// I/O: none beyond createState opening the response-affinity and revocation tables.

import { buildRing, DrainRate, PrefixMatchScratch, RecentShares, type PrefixIndex, type Ring } from '../core/index.js';
import { loadConfig, type PoolRuntime, type ReplicaConfig, type RouterConfig } from '../config.js';
import { emptyImbalanceState, type HotKeyState, type ImbalanceState } from './alerts.js';
import { EngineMatcher, type DpEngines, type EngineLease } from './dp-engines.js';
import { PickState } from './pick-state.js';
import { ResponseAffinity } from './response-affinity.js';
import { RevocationList } from './revocations.js';
import type { Histogram, ReplicaStats } from './stats.js';
import type { PinResult, PoolAlert, PoolSample, PoolView, PreemptHook, VllmView } from './types.js';
import type { HitRateWindowState } from '../engines/hit-rate.js';
import type { QueueBook } from './queue.js';

export interface ReplicaLive extends ReplicaConfig {
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
  /** prefix-aware: router blocks of the prompts of the leases in flight on it (recorded at pick time). */
  leaseBlocks: number;
  /** prefix-aware: its index slots, one per data-parallel engine when pinned (dp-engines.ts). */
  dp: DpEngines;
  hitWindow: HitRateWindowState;
  /** Counters at the previous dashboard sample, for per-interval rates. */
  prevSample: { requests: number; promptTokens: number; cachedTokens: number; cacheReportedPromptTokens: number; ttft: Histogram } | null;
}

export interface Lease {
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
  /** prefix-aware: the route recorded at pick time into index slot `slot`, retracted if the request fails (release). */
  prefix?: { blocks: Uint32Array; from: number; count: number; slot: string };
  /** The data-parallel engine it was pinned to (dp-engines.ts). */
  engine?: EngineLease;
  /** What it counts against the tenant's cap: the sequences it runs (n / best_of); 1 when absent. */
  weight?: number;
  /**
   * Flow control's preemption (queue.ts): the Worker's callback (kept past its acquire call: a
   * duplicated RPC stub, disposed with the lease), the request's band index and fair-share weight,
   * and whether it was asked already. Soft: a lease rebuilt after a restart has none.
   */
  preempt?: { hook: PreemptHook; band: number; fairWeight: number; asked: boolean };
}

/** Owned by leases.ts: the leases and what lease protocol v2 keeps about them (soft state unless noted). */
export interface LeaseBook {
  byId: Map<string, Lease>;
  tenantInFlight: Map<string, number>;
  /** The pick's round-robin cursor. */
  cursor: number;
  /** Leases reaped by the alarm (persisted: meta 'expired_leases'). */
  expired: number;
  /** This instance: a Worker that sees a new epoch renews at once. */
  epoch: string;
  startedAt: number;
  /** Released lease id → until when a renewal of it is refused. Insertion order = time order. */
  tombstones: Map<string, number>;
  restored: number;
  lastRestoredAt: number;
  /** Fail-open picks the Workers reported (persisted: meta 'fallbacks'). */
  fallbacks: number;
  /** Per isolate, the running total of fallbacks it last reported (persisted with the sum). */
  isolateFallbacks: Map<string, number>;
  lastFallbackAt: number;
  fallbacksDirty: boolean;
  rpcs: Record<string, number>;
  /** Per tenant: leases it held before a restart not yet restored or released (meta 'tenants'); counted until recoveryUntil. */
  tenantFloor: Map<string, number>;
  recoveryUntil: number;
  tenantsDirty: boolean;
  /** The replica set sent to Workers for failing open, and when it was computed. */
  view: { at: number; view: PoolView } | null;
  /** How pinned requests fared since this instance started (the snapshot and /metrics). */
  pins: Record<PinResult, number>;
  readonly matchScratch: PrefixMatchScratch;
}

/** Owned by alarms.ts: when the next alarm is armed, and the health and scrape rounds' progress. */
export interface AlarmSchedule {
  /** The alarm time this instance armed (or is arming), null when none or unknown. */
  pending: number | null;
  nextHealthAt: number;
  nextScrapeAt: number;
  nextSampleAt: number;
  cursors: { health: number; scrape: number };
  roundStart: { health: number; scrape: number };
}

/** Owned by samples.ts: the dashboard history and the alerts. */
export interface SampleBoard {
  samples: PoolSample[];
  hotKeys: HotKeyState | null;
  imbalance: ImbalanceState;
  alerts: PoolAlert[];
}

export interface PoolState {
  /** Read for the configuration and origin credentials on every use (tests swap it). */
  env: Env;
  readonly storage: DurableObjectStorage;
  readonly sql: SqlStorage;
  /** The pool this object is bound to on first use (persisted: meta 'pool'). */
  poolName: string | null;
  // ---- replicas.ts (replicas and stats persisted in SQLite) ----
  replicas: ReplicaLive[];
  ring: Ring;
  /** The views and totals the pick reads, kept between acquires (pick-state.ts): told of every change. */
  pickState: PickState<ReplicaLive>;
  /** prefix-aware pools: which prompt blocks were recently sent to each replica (soft state). */
  prefixIndex: PrefixIndex | null;
  engineMatcher: EngineMatcher;
  statsDirty: boolean;
  /** Revoked API keys (`tenant/keyId`), persisted: checked in acquire (revocations.ts). */
  readonly revoked: RevocationList;
  /** Responses API: which replica stored each response id, per tenant (persisted). */
  readonly responses: ResponseAffinity;
  leases: LeaseBook;
  /** Flow control: the requests waiting for a slot (queue.ts; soft state). */
  queue: QueueBook;
  alarm: AlarmSchedule;
  board: SampleBoard;
}

export function createState(storage: DurableObjectStorage, env: Env): PoolState {
  const sql = storage.sql;
  return {
    env,
    storage,
    sql,
    poolName: null,
    replicas: [],
    ring: buildRing([]),
    pickState: new PickState<ReplicaLive>(),
    prefixIndex: null,
    engineMatcher: new EngineMatcher(),
    statsDirty: false,
    responses: new ResponseAffinity(sql),
    revoked: new RevocationList(sql),
    leases: newLeaseBook(),
    queue: { fq: null, bandsKey: '', drain: new DrainRate(10), admitted: {}, rejected: {}, wait: {}, weights: new Map(), recent: new RecentShares(), reserveHeld: 0, preemptAsked: 0, preempted: 0 },
    alarm: { pending: null, nextHealthAt: 0, nextScrapeAt: 0, nextSampleAt: 0, cursors: { health: 0, scrape: 0 }, roundStart: { health: 0, scrape: 0 } },
    board: { samples: [], hotKeys: null, imbalance: emptyImbalanceState(), alerts: [] },
  };
}

function newLeaseBook(): LeaseBook {
  return {
    byId: new Map(),
    tenantInFlight: new Map(),
    cursor: 0,
    expired: 0,
    epoch: crypto.randomUUID(),
    startedAt: Date.now(),
    tombstones: new Map(),
    restored: 0,
    lastRestoredAt: 0,
    fallbacks: 0,
    isolateFallbacks: new Map(),
    lastFallbackAt: 0,
    fallbacksDirty: false,
    rpcs: {},
    tenantFloor: new Map(),
    recoveryUntil: 0,
    tenantsDirty: false,
    view: null,
    pins: { hit: 0, not_found: 0, gone: 0, unavailable: 0 },
    matchScratch: new PrefixMatchScratch(),
  };
}

export function configOf(s: PoolState): RouterConfig {
  return loadConfig(s.env.ROUTER_CONFIG);
}

export function poolConfig(s: PoolState, name: string): PoolRuntime | null {
  return configOf(s).poolByName.get(name) ?? null;
}

/** The configuration of the pool this object is bound to, if any. */
export function boundPool(s: PoolState): PoolRuntime | null {
  return s.poolName ? poolConfig(s, s.poolName) : null;
}

export function isHealthy(r: ReplicaLive, now: number): boolean {
  return r.activeUp && now >= r.passiveDownUntil;
}
