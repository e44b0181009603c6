// The streaming proxy, one step per module: acquire a lease (acquire-step.ts), call the origin
// and retry on another replica before its answer's headers (attempt-step.ts) and, streaming,
// before its first content event, the commit point (first-token.ts), stream the body through the
// tap (TTFT, usage) without buffering past that point (stream-step.ts), and settle the lease and
// the finished request once the stream ends, inside `ctx.waitUntil`, or when none came (finish.ts).
// This module holds the request's types and the loop over attempts. Leases are held, renewed and released in batches by the isolate's
// LeaseAgent (lease-agent.ts); an unreachable coordinator fails open (lease-fallback.ts).
// I/O: through the steps (origin fetches, coordinator RPCs).

import type { RoutingKey } from '../core/index.js';
import type { RouterConfig, PoolRuntime } from '../config.js';
import type { ReleaseError, ReleaseOutcome } from '../coordinator/stats.js';
import { engineProfile } from '../engines/index.js';
import type { EventReader } from './sse-tap.js';
import type { PreparedBody, PrepareBodyOptions } from './upstream-request.js';
import type { LeaseMemory, LeasedReplica } from './early-connect.js';
import type { OriginErrorShape } from './origin-response.js';
import { LeaseAgent, type LeaseClient, type LeaseTimings } from './lease-agent.js';
import { FailOpenRouter } from './lease-fallback.js';
import { acquireStep } from './acquire-step.js';
import { attemptStep, type Upstream } from './attempt-step.js';
import { streamStep } from './stream-step.js';
import { firstTokenStep } from './first-token.js';
import type { Done } from './finish.js';
import type { AnswerContinuation } from './continuation.js';
import type { AttemptPreemption } from './preemption.js';

export type { LeaseClient };

/** This isolate's leases (renewals, batched releases) and its fail-open router. */
export const isolateLeases = new LeaseAgent();
export const isolateFailOpenRouter = new FailOpenRouter();

function leaseTimings(c: RouterConfig): LeaseTimings {
  return { leaseTtlMs: c.leaseTtlMs, renewIntervalMs: c.renewIntervalMs, releaseFlushMs: c.releaseFlushMs, acquireTimeoutMs: c.acquireTimeoutMs, coordinatorRetryMs: c.coordinatorRetryMs };
}

/**
 * Flow control refusals (coordinator/queue.ts): the band's queue was full or its wait ran out; with
 * `_over_share` the tenant held more than its fair share of the pool (429), else the pool is
 * saturated (503). `queue_lost`: the coordinator restarted (or stalled) while the request waited.
 */
export type QueueFailureReason = 'queue_full' | 'queue_timeout' | 'queue_full_over_share' | 'queue_timeout_over_share' | 'queue_lost';

/** Tagged failure the HTTP layer maps to a status (see http/errors.ts). */
export interface ForwardFailure {
  reason: 'no_healthy_replica' | 'tenant_limit' | 'rate_limited' | 'upstream_unavailable' | 'upstream_timeout' | 'pool_not_found' | 'client_closed' | 'response_not_found' | 'response_not_stored' | 'response_replica_gone' | 'response_replica_unavailable' | 'key_revoked' | QueueFailureReason;
  message: string;
  retryAfterSeconds?: number;
  /** The request field the failure is about (OpenAI's `param`). */
  param?: string;
}

export interface FinishedRequest {
  replica: string | null;
  status: number;
  error?: ReleaseError | ForwardFailure['reason'];
  ttftMs: number | null;
  durationMs: number;
  promptTokens: number | null;
  cachedTokens: number | null;
  completionTokens: number | null;
  retried: boolean;
  spilled: boolean;
  attempts: number;
  /** prefix-aware: leading blocks the chosen replica was believed to hold. */
  matchedBlocks?: number;
  /** Early connect: the guessed replica was the coordinator's pick (hit) or was cancelled (miss). */
  earlyConnect?: 'hit' | 'miss';
  /** The coordinator could not be reached in time: the replica was picked by this isolate (fail-open). */
  failOpen?: boolean;
  /** A stream broken after its first token was continued on another replica this many times (continue-step.ts). */
  continuations?: number;
  /** The client's wait across those continuations: last token before each break to the continuation's first. */
  continuationGapMs?: number;
  /** The continuations' prompt tokens past the original prompt: prefilled again, not billed. */
  reprefillTokens?: number;
  /** A break after the first token that was not continued, and why (continue-step.ts). */
  notContinued?: string;
  /**
   * `responses_store_off`: the router asked the replica to store the response and its answer said
   * `store: false` (vLLM without VLLM_ENABLE_RESPONSES_API_STORE); a follow-up of it will be refused.
   */
  warning?: 'responses_store_off';
  /**
   * A continued answer's segments in order: each replica and the completion tokens it produced
   * (those it generated again at a stop-string seam included); the request's completionTokens is
   * the client's, billed once.
   */
  segments?: { replica: string; completionTokens: number }[];
  /** Flow control: the request's band, and how long it waited in the coordinator's queue (absent: it did not). */
  band?: string;
  queueMs?: number;
  /** Flow control took its slot back before its first token this many times (proxy/preemption.ts); it queued again each time. */
  preempted?: number;
}

export interface ForwardInput {
  request: Request;
  waitUntil: (p: Promise<unknown>) => void;
  env: object;
  config: RouterConfig;
  pool: PoolRuntime;
  coordinator: LeaseClient;
  /** The API's name (release outcomes, stats). */
  kind: string;
  /** How this API's body is rewritten and its answer read (http/apis/<dialect>/). */
  dialect: UpstreamDialect;
  path: string;
  /** GET and DELETE (Responses retrieve / delete) send no body; default POST. */
  method?: 'POST' | 'GET' | 'DELETE';
  /** The parsed request body; null for a request without one (it is sent without a body). */
  body: Record<string, unknown> | null;
  key: RoutingKey;
  /**
   * Responses API: the response this request must reach the replica of (a hard pin), and the id
   * the router asked the engine to give the response it creates (recorded with the pick).
   */
  pinResponseId?: string;
  recordResponseId?: string;
  /** `sequences`: what the request counts against the tenant's cap (n / best_of, engine-fields.ts). */
  tenant: { id: string; maxInFlight?: number; keyId?: string; sequences?: number };
  /** The tenant's cache_salt for this pool (http/cache-salt.ts); null: none. */
  cacheSalt?: string | null;
  /** The per-tenant HMAC of the client's session header sent upstream as x-session-id (http/cache-salt.ts sessionTagFor); absent: none. */
  sessionTag?: string | null;
  /** The id sent upstream (header and body): always the router's, never the client's. */
  upstreamRequestId?: string;
  /** Chained prompt-block hashes for a prefix-aware pool's coordinator. */
  blocks?: Uint32Array;
  requestId: string;
  startedAt: number;
  /** The answer is an SSE stream (default: the body's `stream: true`). */
  stream?: boolean;
  /**
   * A quota decision still under way (http/quota-admission.ts pendingDecision): awaited with the
   * first acquire, before any origin is contacted. False ends the request as `rate_limited`, its
   * lease given back. Early connect must be off meanwhile (leaseMemory undefined).
   */
  admitted?: Promise<boolean>;
  /** This isolate's memory of recent leases by key; early connect is off without it. */
  leaseMemory?: LeaseMemory;
  /** Called once per request when it is finished (trace log). */
  onFinish: (r: FinishedRequest) => void;
  /**
   * Another region's pool serves this model: when this pool cannot take the request before anything
   * went out (no healthy replica, saturated, coordinator unreachable), return `spill` instead of
   * failing open or answering, and do not call onFinish. Never for a pinned request (its stored
   * response lives on one replica of this pool).
   */
  canSpill?: boolean;
  /**
   * Flow control (the pool's `flowControl`, coordinator/queue.ts): the request's band (checked
   * against the pool's bands and the tenant's allowed ones), its cost in the pool's fairness unit,
   * and the tenant's fair-share weight. Absent: the pool's default band, cost 1, weight 1.
   */
  queue?: { band: string; cost: number; weight: number };
  /** Defaults: this isolate's. */
  leases?: LeaseAgent;
  failOpenRouter?: FailOpenRouter;
}

/** What the proxy needs from an API dialect (http/apis/): the body the origin gets and how its answer is read. */
export interface UpstreamDialect {
  /** `opts`: the tenant's cache_salt, the router's request id, the pool's allowed engine fields. */
  prepareBody(body: Record<string, unknown>, opts: PrepareBodyOptions): PreparedBody;
  reader(prepared: PreparedBody): EventReader;
  /** This API's error shape for an origin's error answer (default OpenAI's). */
  originError?: OriginErrorShape;
  /** vLLM's endpoint for this API ignores `X-data-parallel-rank`: no engine is pinned (coordinator/dp-engines.ts). */
  readonly noEnginePin?: true;
  /** A streamed answer of this API can be continued on another replica after a break (continuation.ts); absent: never. */
  continuation?(body: Record<string, unknown>, pool: PoolRuntime): AnswerContinuation;
}

export type ForwardResult = { ok: true; response: Response } | { ok: false; failure: ForwardFailure; spill?: true };

export async function forward(input: ForwardInput): Promise<ForwardResult> {
  // Only a keyed strategy sends a key to the same replica again; for least-load and round-robin a
  // remembered pick says nothing about the next one.
  const memory = input.config.earlyConnect && input.pool.strategyImpl.keyed ? input.leaseMemory : undefined;
  if (!memory) return forwardWith(input, undefined);
  // Early connect counts this tenant's requests under way in this isolate until each one ends.
  const leave = memory.enter(input.pool.name, input.tenant.id);
  const onFinish = input.onFinish;
  try {
    return await forwardWith({ ...input, onFinish: (r) => (leave(), onFinish(r)) }, memory);
  } catch (e) {
    leave();
    throw e;
  }
}

/**
 * One request's state across its attempts: what every step reads, and what an attempt leaves for
 * the next (the replicas tried, the last failure, how early connect and fail-open went).
 */
export interface Attempts {
  readonly input: ForwardInput;
  readonly memory: LeaseMemory | undefined;
  readonly stream: boolean;
  readonly dialect: UpstreamDialect;
  /** The upstream body; a continuation's attempts get their own (continue-step.ts). */
  prepared: PreparedBody;
  readonly upstreamRequestId: string;
  /**
   * Streaming: `firstTokenTimeoutMs`, from sending an attempt to its first content event (headers
   * included). Non-streaming: `nonStreamTimeoutMs`, its headers come only when generation ends.
   * A continuation's tries are capped by what is left of `maxStreamMs` (continue-step.ts).
   */
  answerTimeoutMs: number;
  readonly agent: LeaseAgent;
  readonly failOpenRouter: FailOpenRouter;
  readonly timings: LeaseTimings;
  readonly exclude: string[];
  attempts: number;
  lastFailure: ForwardFailure | null;
  earlyConnect: 'hit' | 'miss' | undefined;
  failOpen: boolean;
  /** A replica refused the router's engine pin (its data-parallel engines changed): retry unpinned. */
  rankRefused: boolean;
  /** The answer so far and how to continue it (a streamed answer of a dialect that can); shared by the request's segments. */
  readonly continuation: AnswerContinuation | undefined;
  /** Continuations tried (each counts against maxContinuations), and those that took over the stream. */
  continuationTries: number;
  continued: number;
  /** Sum of the client's waits across continued breaks (ms). */
  continuationGapMs: number;
  /** The answer so far, prefilled again by each continuation that took over (tokens as delivered() counts them). */
  reprefillTokens: number;
  /** The last break not continued, and why. */
  notContinued?: string;
  /** Where in the answer (delivered tokens) the segment now streaming starts: what its replica did not produce. */
  segmentStart: number;
  /** The segments that ended (a continued break, or the last one not continued): each replica's own completion tokens. */
  segments: { replica: string; completionTokens: number }[];
  /** Flow control: time the acquires waited in the coordinator's queue (ms, summed over attempts); undefined: never queued. */
  queueMs?: number;
  /** Attempts that gave their slot back to flow control's preemption (not counted in `attempts`). */
  preempted: number;
  /** A continuation's tries (continue-step.ts): the client is mid-answer, so never preempted. */
  readonly continuing?: true;
  /** The continuation of a stream flow control paused (flowControl.preemptStreams): its acquire waits ahead of its tenant's other requests. */
  readonly resuming?: true;
}

/** An attempt's replica: leased from the coordinator, or picked by this isolate (fail-open). */
export interface Leased {
  kind: 'leased';
  replica: LeasedReplica;
  spilled: boolean;
  matchedBlocks?: number;
  /** The early-connect request to this replica, already on its way (a confirmed guess). */
  early: Upstream | null;
  /** Ends the lease (batched by the agent) or the fail-open count; once per attempt. */
  release: (outcome: ReleaseOutcome) => void;
  mayRetry: boolean;
  /** Flow control's preemption of this attempt (the pool's `flowControl.preempt`, a queued acquire). */
  preemption?: AttemptPreemption;
}

/** acquire → attempt (headers) → first token (streaming; retried elsewhere before it) → stream → settle, per attempt. */
async function forwardWith(input: ForwardInput, memory: LeaseMemory | undefined): Promise<ForwardResult> {
  const s = startAttempts(input, memory);
  for (;;) {
    s.attempts++;
    const lease = await acquireStep(s);
    if (lease.kind === 'done') return lease.result;
    const answer = await attemptStep(s, lease);
    if (answer.kind === 'retry') continue;
    if (answer.kind === 'done') return answer.result;
    // An answer that is not an event stream has no first token to wait for: committed as it comes.
    if (!s.stream || !isEventStream(answer.upstream)) {
      lease.preemption?.commit();
      return streamStep(s, lease, answer.sent, answer.upstream, null);
    }
    const first = await firstTokenStep(s, lease, answer.sent, answer.upstream, answer.deadline);
    if (first.kind === 'retry') continue;
    if (first.kind === 'done') return first.result;
    return streamStep(s, lease, answer.sent, answer.upstream, first.committed);
  }
}

function isEventStream(r: Response): boolean {
  return (r.headers.get('content-type') ?? '').toLowerCase().startsWith('text/event-stream');
}

function startAttempts(input: ForwardInput, memory: LeaseMemory | undefined): Attempts {
  const { config, pool, body } = input;
  const stream = input.stream ?? body?.stream === true;
  const dialect = input.dialect;
  const upstreamRequestId = input.upstreamRequestId ?? crypto.randomUUID();
  const prepared = body ? dialect.prepareBody(body, { cacheSalt: input.cacheSalt, requestId: upstreamRequestId, allowEngineFields: pool.allowEngineFields, streamOptionsIncludeUsage: engineProfile(pool.engine).streamOptionsIncludeUsage }) : { body: '', stripUsageChunk: false };
  return {
    input,
    memory,
    stream,
    dialect,
    prepared,
    upstreamRequestId,
    // Reaching the non-streaming limit is the request's fault, not the replica's (not a passive failure).
    answerTimeoutMs: stream ? config.firstTokenTimeoutMs : config.nonStreamTimeoutMs,
    agent: input.leases ?? isolateLeases,
    failOpenRouter: input.failOpenRouter ?? isolateFailOpenRouter,
    timings: leaseTimings(config),
    exclude: [],
    attempts: 0,
    lastFailure: null,
    earlyConnect: undefined,
    failOpen: false,
    rankRefused: false,
    continuation: stream && body && config.maxContinuations > 0 ? dialect.continuation?.(body, pool) : undefined,
    continuationTries: 0,
    continued: 0,
    continuationGapMs: 0,
    reprefillTokens: 0,
    segmentStart: 0,
    segments: [],
    preempted: 0,
  };
}
