// Plain data types of the coordinator's RPC surface and snapshot, shared by the Worker,
// the renderers and tests. Types and constants only; no I/O.

import type { KeyKind } from '../core/index.js';
import type { HotKeyAlert, ImbalanceAlert } from '../observability/alerts.js';
import type { ReleaseOutcome, ReplicaStats } from './stats.js';
import type { VllmGeneration } from './vllm-metrics.js';

export type { ReleaseOutcome };

/** Dashboard history: one sample every SAMPLE_MS, SAMPLE_COUNT kept (15 minutes). */
export const SAMPLE_MS = 10_000;
export const SAMPLE_COUNT = 90;

/** What the last scrape of a replica's vLLM /metrics said. */
export interface VllmView {
  generation: VllmGeneration;
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
  /** The replica the Worker already sent this request to (early connect, proxy/early-connect.ts). */
  guess?: { id: string; url: string; auth: string };
  /** Responses API: the request must reach the replica that stored this response id (this tenant's). */
  pin?: { responseId: string };
  /** Responses API: remember that the picked replica stores this response id for this tenant. */
  record?: { responseId: string };
}

/**
 * `response_not_found`: no replica is known to store the pinned id for this tenant.
 * `pinned_replica_gone`: the replica that stored it left the pool (its responses went with it).
 * `pinned_replica_unavailable`: that replica is down for now.
 */
export type AcquireFailureReason = 'no_healthy_replica' | 'tenant_limit' | 'unknown_pool' | 'response_not_found' | 'pinned_replica_gone' | 'pinned_replica_unavailable' | 'key_revoked';

export type AcquireResult =
  | {
      ok: true;
      leaseId: string;
      replica: { id: string; url: string; auth: string };
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
  vllm: VllmView;
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
  /** prefix-aware pools: the approximate prefix index's size. */
  prefixIndex: { entries: number; blocks: number; approxBytes: number; maxEntries: number; evictions: number } | null;
  alerts: PoolAlert[];
  /** Last 15 minutes in 10 s samples, oldest first. */
  samples: PoolSample[];
}

export type AdminResult<T> = { ok: true; value: T } | { ok: false; reason: 'unknown_pool' | 'not_found' | 'invalid'; message: string };

