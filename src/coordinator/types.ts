// Plain data types of the coordinator's RPC surface and snapshot, shared by the Worker,
// the renderers and tests. Types and constants only; no I/O.

import type { KeyKind } from '../core/index.js';
import type { HotKeyAlert, ImbalanceAlert } from './alerts.js';
import type { ReleaseOutcome, ReplicaStats } from './stats.js';
import type { SampleGeneration } from '../engines/index.js';

export type { ReleaseOutcome };

/** Dashboard history: one sample every SAMPLE_MS, SAMPLE_COUNT kept (15 minutes). */
export const SAMPLE_MS = 10_000;
export const SAMPLE_COUNT = 90;

/** What the last scrape of a replica's vLLM /metrics said. */
export interface VllmView {
  generation: SampleGeneration;
  /** Prefix-cache hit rate over the pool's hitRateWindowMs, from counter deltas (or V0's gauge). */
  hitRate: number | null;
  waiting: number | null;
  running: number | null;
  kvUsage: number | null;
  blockSize: number | null;
  numGpuBlocks: number | null;
  lastScrapeAt: number;
  scrapeError: string | null;
}

export interface ReplicaSample {
  inFlight: number;
  waiting: number | null;
  requests: number;
  routerHitRate: number | null;
  vllmHitRate: number | null;
  ttftP50: number | null;
  ttftP95: number | null;
  healthy: boolean;
}

export interface PoolSample {
  at: number;
  replicas: Record<string, ReplicaSample>;
}

export type PoolAlert = ImbalanceAlert | HotKeyAlert;

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
  /** What the request counts against the tenant's cap: the sequences it runs (n / best_of); default 1. */
  weight?: number;
  /** `<tenant>/<keyId>` of the API key: refused when revoked (revokeKeys). */
  keyId?: string;
  /** Chained prompt-block hashes, sent only when the pool's strategy is prefix-aware. */
  blocks?: Uint32Array;
  /** false: the request's API cannot be pinned to a data-parallel engine (vLLM ignores the rank there). */
  pinEngine?: boolean;
  /** The replica the Worker already sent this request to (early connect, proxy/early-connect.ts). */
  guess?: { id: string; url: string; auth: string };
  /** Responses API: the request must reach the replica that stored this response id (this tenant's). */
  pin?: { responseId: string };
  /** Responses API: remember that the picked replica stores this response id for this tenant. */
  record?: { responseId: string };
  /** Releases and renewals of this isolate riding on the acquire (lease protocol v2), settled first. */
  settle?: SettleBatch;
  /** The replica-set version this isolate holds for failing open; a different one is sent back. */
  viewVersion?: string;
  /**
   * Flow control (issue #29, coordinator/queue.ts): the request may wait for a slot when every
   * replica is at its bound. `ticket` names it for cancelQueued (chosen by the Worker, so a cancel
   * needs no answer first); `band` one of the pool's flowControl bands; `cost` in the pool's
   * fairness unit; `weight` the tenant's fair-share weight.
   */
  queue?: QueueTicket;
  /**
   * Flow control's preemption (the pool's `flowControl.preempt`, coordinator/queue.ts): the
   * Worker's callback, kept with the lease. Called (a Worker RPC stub: from the Durable Object back
   * into the request's own isolate, not a billed Durable Object request) when a tenant below its
   * fair share waits and this request's tenant is over its own; true: the Worker gives the slot
   * back (nothing went to its client yet: it aborts the attempt, releases the lease and queues
   * again), false: too late (committed).
   */
  preempt?: PreemptHook;
  /**
   * Flow control: called once when the acquire starts waiting in the queue (coordinator/queue.ts),
   * while the call is still open (a Worker RPC stub, not a billed Durable Object request). The
   * Worker sends it with an early-connect guess: a request already on its way to a replica of a
   * pool at its bound would otherwise hold an engine slot, or a place in the engine's own FIFO,
   * ahead of the leased requests for as long as its acquire waits (proxy/acquire-step.ts).
   */
  queued?: () => void;
}

/** The Worker's answer to a preemption: true, it gives its slot back (proxy/acquire-step.ts). */
export type PreemptHook = () => boolean | Promise<boolean>;

export interface QueueTicket {
  ticket: string;
  band: string;
  cost: number;
  weight: number;
  /**
   * A request that was admitted once and gave its slot back to flow control's preemption (before
   * its first token, or a stream paused past it): it waits ahead of its tenant's other requests,
   * as vLLM puts a preempted request back at the front of its waiting queue
   * (vllm/v1/core/sched/scheduler.py `_preempt_request`: `self.waiting.prepend_request`).
   */
  resume?: true;
}

/** A live lease as the Worker holds it: enough to rebuild it after a coordinator restart. */
export interface LeaseRenewal {
  id: string;
  replica: string;
  tenant: string;
  /** The Worker's view of the lease's deadline (epoch ms), for the record. */
  deadline: number;
  startedAt: number;
  spilled: boolean;
}

export interface LeaseRelease {
  id: string;
  outcome: ReleaseOutcome;
  /** The lease's tenant: lets a restarted coordinator lower its recovery floor for it. */
  tenant?: string;
}

/**
 * What one isolate sends for one pool in one call (proxy/lease-agent.ts): its finished leases,
 * and, once per renew interval, every lease it still holds. Releases are applied before renewals.
 */
export interface SettleBatch {
  releases: LeaseRelease[];
  renew?: LeaseRenewal[];
  /**
   * Requests this isolate has routed open (coordinator unreachable) since it started: a running
   * total, so a report that is delivered twice (its answer was lost) is counted once.
   */
  fallbacks?: { isolate: string; total: number };
}

export interface SettleResult {
  /** This coordinator instance; a new one means a restart (renew at once). */
  epoch: string;
  released: number;
  renewed: number;
  /** Leases this instance did not know and rebuilt from the renewal (after a restart). */
  restored: number;
  /** Renewed ids the coordinator refuses (released before): the Worker drops them. */
  gone: string[];
  /** New deadline of every renewed lease. */
  deadline: number;
}

/** The replica set and health as one coordinator saw it: what an isolate fails open over. */
export interface PoolView {
  version: string;
  replicas: { id: string; url: string; auth: string; weight: number; healthy: boolean; draining: boolean }[];
}

/**
 * `response_not_found`: no replica is known to store the pinned id for this tenant.
 * `response_not_stored`: the replica that made the pinned id answered `store: false` (its store is off).
 * `pinned_replica_gone`: the replica that stored it left the pool (its responses went with it).
 * `pinned_replica_unavailable`: that replica is down for now.
 */
export type PinResult = 'hit' | 'not_found' | 'gone' | 'unavailable';

/**
 * Flow control refusals (coordinator/queue.ts): `queue_full` (the band's queue is at its length,
 * or the request was shed from it), `queue_timeout` (no slot within the band's maxQueueMs),
 * `queue_cancelled` (the Worker cancelled its ticket: its client went away). With them `overShare`:
 * the tenant held more than its fair share (429), else the pool is saturated (503).
 */
export type QueueRefusalReason = 'queue_full' | 'queue_timeout' | 'queue_cancelled';

export type AcquireFailureReason = 'no_healthy_replica' | 'tenant_limit' | 'unknown_pool' | 'response_not_found' | 'response_not_stored' | 'pinned_replica_gone' | 'pinned_replica_unavailable' | 'key_revoked' | QueueRefusalReason;

export type AcquireResult =
  | {
      ok: true;
      leaseId: string;
      /** `dpRank`: the data-parallel engine to pin it to (vLLM's X-data-parallel-rank), only for a replica with several engines. */
      replica: { id: string; url: string; auth: string; dpRank?: number };
      spilled: boolean;
      steps: number;
      deadline: number;
      /** prefix-aware: leading blocks the chosen replica was believed to hold (-1 unknown). */
      matchedBlocks?: number;
      /**
       * With `guess`: whether the guessed replica still takes new requests at that address (in the
       * pool, not draining, healthy, same URL and auth). False tells the Worker to stop guessing it.
       */
      guessUsable?: boolean;
      epoch?: string;
      settled?: SettleResult;
      /** The pool's replica set and health when the request's `viewVersion` is not the current one. */
      view?: PoolView;
      /** Flow control: how long it waited in the coordinator's queue (ms; absent: not queued), and its band. */
      queuedMs?: number;
      band?: string;
    }
  | { ok: false; reason: AcquireFailureReason; retryAfterMs: number; epoch?: string; settled?: SettleResult; view?: PoolView; overShare?: boolean; queuedMs?: number; band?: string };

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
  vllm: VllmView;
  /** A replica pinned per data-parallel engine (coordinator/dp-engines.ts): each engine's slot. */
  engines?: EngineSnapshot[];
}

export interface EngineSnapshot {
  /** The rank sent as X-data-parallel-rank. */
  rank: number;
  /** Its `engine` label in vLLM's /metrics. */
  engine: string;
  /** The router's leases in flight on it. */
  inFlight: number;
  /** Router blocks its index slot holds, and the slot's capacity (null: not scraped yet). */
  indexEntries: number;
  indexCapacity: number | null;
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
  /** Lease protocol v2: leases rebuilt from renewals after a restart, releases retried, RPC entries by method. */
  lease?: LeaseStats;
  replicas: ReplicaSnapshot[];
  /** prefix-aware pools: the approximate prefix index's size. */
  prefixIndex: { entries: number; blocks: number; approxBytes: number; maxEntries: number; evictions: number } | null;
  /**
   * Responses API affinity: response ids remembered, and how pinned requests fared since the
   * coordinator started (`hit`: reached their replica's pick; the rest were refused).
   */
  responseAffinity?: { entries: number; pins: Record<PinResult, number> };
  alerts: PoolAlert[];
  /** Flow control (coordinator/queue.ts): absent when the pool has none (off, or no per-replica bound). */
  queue?: QueueSnapshot;
  /** Last 15 minutes in 10 s samples, oldest first. */
  samples: PoolSample[];
}

export interface LeaseStats {
  epoch: string;
  startedAt: number;
  ttlMs: number;
  restoredLeases: number;
  /** When the last lease was rebuilt from a renewal (epoch ms; 0 never): with startedAt, how long recovery took. */
  lastRestoredAt: number;
  /** Requests Workers routed open while this coordinator was unreachable (reported afterwards). */
  fallbacks: number;
  /** Last time a Worker reported routing open (epoch ms), 0 never. */
  lastFallbackAt: number;
  /** RPC calls that reached this coordinator, by method (the billed Durable Object requests). */
  rpcs: Record<string, number>;
  /** Until then, tenant caps also count what the tenant held before a restart (epoch ms; 0: none). */
  recoveryUntil: number;
}

export type AdminResult<T> = { ok: true; value: T } | { ok: false; reason: 'unknown_pool' | 'not_found' | 'invalid'; message: string };


/** The pool's queue as the snapshot shows it (/metrics, the dashboard, the admin API). */
export interface QueueSnapshot {
  /** Requests waiting now, per band (every configured band, highest first). */
  depth: Record<string, number>;
  /** Requests admitted after waiting, per band, since this instance started. */
  admitted: Record<string, number>;
  /** Refusals by band and reason (`queue_full`, `queue_timeout`, `queue_cancelled`, `queue_lost`) as `band|reason`. */
  rejected: Record<string, number>;
  /** Seconds waited by the requests admitted, per band (TTFT_BUCKETS_S bounds). */
  wait: Record<string, { counts: number[]; sum: number; count: number }>;
  /** Slots freed per second over the last 10 s: what Retry-After is computed from. */
  drainPerSecond: number;
  /** The tenants with the most requests waiting (at most 20), how many each, and how long its oldest has waited (ms). */
  tenants: { tenant: string; queued: number; oldestWaitMs: number }[];
  /** The per-replica bound the queue keeps (maxInFlightPerReplica). */
  boundPerReplica: number;
  /** How long the oldest request still waiting has waited (ms; 0 when none waits). */
  oldestWaitMs: number;
  /** The pool's flowControl.shareReserve (0: work-conserving). */
  shareReserve: number;
  /** Requests the share reserve held back since the coordinator started (each once). */
  reserveHeld: number;
  /** The pool's flowControl.preempt. */
  preempt: boolean;
  /** Preemptions since the coordinator started: asked of a Worker, and given up (its slot freed for a tenant below its share). */
  preemptAsked: number;
  preempted: number;
}
