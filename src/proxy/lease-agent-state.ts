// The lease agent's vocabulary and per-pool state (proxy/lease-agent.ts is the agent): what it
// needs from a coordinator (LeaseClient), its timings and timers, the leases an isolate holds and
// the releases it owes per pool, and what an acquire comes back as. No I/O.

import type { AcquireResult, LeaseRelease, PoolView, SettleBatch, SettleResult, AcquireRequest } from '../coordinator/types.js';
import type { ReleaseOutcome } from '../coordinator/stats.js';

/** What the proxy needs from the pool's coordinator. Without `settle`, releases go one by one. */
export interface LeaseClient {
  /** The coordinator's acquire; a request with a queue ticket goes to its acquireQueued (it may wait). */
  acquire(req: AcquireRequest): Promise<AcquireResult>;
  /** Flow control: take a queued acquire's ticket out of the queue (its client went away). */
  cancelQueued?(pool: string, ticket: string): Promise<unknown>;
  release(leaseId: string, outcome: ReleaseOutcome): Promise<unknown>;
  settle?(pool: string, batch: SettleBatch): Promise<SettleResult>;
}

/** What a loop may run for per waitUntil registration: under the platform's 30 s, with room for one late timer. */
export const LOOP_BUDGET_MS = 25_000;

/** The timers the agent sleeps on (injected by tests that emulate waitUntil cancellation). */
export interface AgentTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const globalTimers: AgentTimers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};

export interface LeaseTimings {
  leaseTtlMs: number;
  renewIntervalMs: number;
  releaseFlushMs: number;
  acquireTimeoutMs: number;
  coordinatorRetryMs: number;
}

/** A lease this isolate holds. */
export interface HeldLease {
  id: string;
  replica: string;
  tenant: string;
  startedAt: number;
  spilled: boolean;
  deadline: number;
  /** Last time this lease's own renew loop ran: a loop silent for a lease TTL was cancelled with its request. */
  seenAt?: number;
}

export interface PendingRelease {
  rel: LeaseRelease;
  /** After this, the coordinator has reaped the lease anyway: stop trying. */
  until: number;
  /** In a call until then (its timeout), by the batch `sentBy`; past it, free to send again. */
  sendingUntil: number;
  sentBy: number;
}

/** A loop (flush, report) or a renewal in flight: who, and until when it may be trusted to finish. */
export interface Owner {
  token: number;
  until: number;
}

export class PoolLeases {
  readonly held = new Map<string, HeldLease>();
  /** Wakes a held lease's renew loop early (its request is over). */
  readonly wakers = new Map<string, () => void>();
  readonly pending = new Map<string, PendingRelease>();
  nextRenewAt = 0;
  /** A renewal is in a call (not a flag: a cancelled call would leave it set). */
  renewing: Owner | null = null;
  epoch: string | null = null;
  view: PoolView | null = null;
  /** Requests routed open by this isolate (running total) and the total the coordinator acknowledged. */
  fallbacksTotal = 0;
  fallbacksAcked = 0;
  /** The report loop of fallbacks (noteFallback) and the flush loop that own this pool now. */
  reporting: Owner | null = null;
  flushing: Owner | null = null;
  /** The coordinator failed or timed out: route open without asking until then. */
  openUntil = 0;
  lastFailureAt = 0;
  /** Flow control: when an acquire of this pool last waited in (or was refused by) the coordinator's queue. */
  queuedAt = -Infinity;
}

export interface Taken {
  stamp: number;
  batch: SettleBatch;
  releaseIds: string[];
  renewed: boolean;
  fallbacks: number | null;
}

/**
 * `lost`: a queued acquire (flow control) failed or outlived its band's wait: the coordinator
 * restarted under it, or is in trouble. Not a reason to fail open (the pool was full when it
 * queued) nor to open the breaker (the coordinator answered others meanwhile): a retriable 503.
 * `cancelled`: the client went away while it waited; its ticket was cancelled.
 */
export type AcquireOutcome =
  | { kind: 'reply'; result: AcquireResult }
  | { kind: 'unreachable'; why: 'timeout' | 'error' | 'breaker'; message: string }
  | { kind: 'lost'; message: string }
  | { kind: 'cancelled' };

/** A queue-eligible acquire (flow control): how long its band may wait, and its client's abort signal. */
export interface AcquireWait {
  maxQueueMs: number;
  signal?: AbortSignal;
}

/** After a queued acquire, early connect stays off for this pool this long (a guess would go to a full replica). */
export const QUEUED_QUIET_MS = 5_000;

export interface LeaseAgentCounters {
  /** Stub method calls this isolate made, by method (each one a billed Durable Object request). */
  rpcs: Record<string, number>;
  releasesRetried: number;
  releasesAbandoned: number;
  lateAcquires: number;
  /** Loops whose owner was past its deadline (cancelled with its request) and were taken over. */
  loopsTakenOver: number;
  /** Held leases dropped because their own renew loop stopped (its request was cancelled). */
  leasesOrphaned: number;
}
