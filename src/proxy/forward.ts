// The streaming proxy, one step per function: acquire a lease (acquireStep), call the origin and
// retry on another replica only before the first byte (attemptStep), stream the body through the
// tap (TTFT, usage) without buffering (streamStep), and settle the lease and the trace line once
// the stream ends, inside `ctx.waitUntil` (settleStep). Leases are held, renewed and released in
// batches by the isolate's LeaseAgent (lease-agent.ts); an unreachable coordinator fails open
// (lease-fallback.ts). I/O: origin fetches, coordinator RPCs.

import type { RoutingKey } from '../core/index.js';
import type { RouterConfig, PoolRuntime } from '../config.js';
import type { AcquireRequest, AcquireResult } from '../coordinator/types.js';
import { resolveOriginAuth } from '../origin/origin-auth.js';
import type { ReleaseError, ReleaseOutcome } from '../coordinator/stats.js';
import { race } from './race.js';
import { openAIReader, ResponseTap, type BodyTap, type EventReader } from './sse-tap.js';
import { StreamWatchdog } from './watchdog.js';
import { buildUpstreamHeaders, prepareUpstreamBody, refusesEngineRank, upstreamExtraHeaders, type PreparedBody, type PrepareBodyOptions } from './upstream-request.js';
import { sameReplica, type LeaseMemory, type LeasedReplica } from './early-connect.js';
import { originErrorBody, proxiedResponseHeaders, type OriginErrorShape } from './origin-response.js';
import { replicaEndpoint } from '../config.js';
import { LeaseAgent, type LeaseClient, type LeaseTimings } from './lease-agent.js';
import { FailOpenRouter } from './lease-fallback.js';

export type { LeaseClient };

/** This isolate's leases (renewals, batched releases) and its fail-open router. */
export const isolateLeases = new LeaseAgent();
export const isolateFailOpenRouter = new FailOpenRouter();

function leaseTimings(c: RouterConfig): LeaseTimings {
  return { leaseTtlMs: c.leaseTtlMs, renewIntervalMs: c.renewIntervalMs, releaseFlushMs: c.releaseFlushMs, acquireTimeoutMs: c.acquireTimeoutMs, coordinatorRetryMs: c.coordinatorRetryMs };
}

/** Tagged failure the HTTP layer maps to a status (see http/errors.ts). */
export interface ForwardFailure {
  reason: 'no_healthy_replica' | 'tenant_limit' | 'upstream_unavailable' | 'upstream_timeout' | 'pool_not_found' | 'client_closed' | 'response_not_found' | 'response_replica_gone' | 'response_replica_unavailable' | 'key_revoked';
  message: string;
  retryAfterSeconds?: number;
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
}

export interface ForwardInput {
  request: Request;
  waitUntil: (p: Promise<unknown>) => void;
  env: object;
  config: RouterConfig;
  pool: PoolRuntime;
  coordinator: LeaseClient;
  /** The API, for the default dialect when `dialect` is not given. */
  kind: string;
  /** How this API's body is rewritten and its answer read; default: OpenAI chat / completions by `kind`. */
  dialect?: UpstreamDialect;
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
  /** The id sent upstream (header and body): always the router's, never the client's. */
  upstreamRequestId?: string;
  /** Chained prompt-block hashes for a prefix-aware pool's coordinator. */
  blocks?: Uint32Array;
  requestId: string;
  startedAt: number;
  /** The answer is an SSE stream (default: the body's `stream: true`). */
  stream?: boolean;
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
  /** Defaults: this isolate's. */
  leases?: LeaseAgent;
  failOpenRouter?: FailOpenRouter;
}

/**
 * What the proxy needs from an API dialect (http/apis/): the body the origin gets and how its
 * answer is read. Chat Completions and Completions are the default for `kind`.
 */
export interface UpstreamDialect {
  /** `opts`: the tenant's cache_salt, the router's request id, the pool's allowed engine fields. */
  prepareBody(body: Record<string, unknown>, opts: PrepareBodyOptions): PreparedBody;
  reader(prepared: PreparedBody): EventReader;
  /** This API's error shape for an origin's error answer (default OpenAI's). */
  originError?: OriginErrorShape;
  /** vLLM's endpoint for this API ignores `X-data-parallel-rank`: no engine is pinned (coordinator/dp-engines.ts). */
  readonly noEnginePin?: true;
}

export type ForwardResult = { ok: true; response: Response } | { ok: false; failure: ForwardFailure; spill?: true };

/** An origin's answer to the router's credentials (vLLM --api-key, Cloudflare Access), not to the tenant's request. */
const ORIGIN_AUTH_STATUS = new Set([401, 403, 407]);

/**
 * Whether an origin's answer is retried on another replica before the first byte (nothing has
 * reached the client) and counted against this one: the client's message and the log line's
 * type, or null when the answer goes to the client.
 * - 502/503/504: the replica (or its gateway) could not serve it;
 * - a redirect, never followed (the replica is misconfigured or hostile);
 * - 401/403/407: the replica refused the router's origin credentials (a rotated key), which the
 *   tenant can do nothing about and SDKs read as "your API key is wrong";
 * - a status without a body (204, 205): no answer to a generation request.
 * An origin 500 is answered to the client: it is about this request, and retrying it would let
 * one request count against every replica.
 */
function retriedAnswer(status: number): { message: string; log: string | null } | null {
  if (status === 502 || status === 503 || status === 504) return { message: 'No replica could serve the request; retry later', log: null };
  if (status >= 300 && status < 400) return { message: `The replica answered with a redirect (${status}), which the router never follows; retry later`, log: 'origin_redirect' };
  if (ORIGIN_AUTH_STATUS.has(status)) return { message: `The replica refused the router's origin credentials (${status}); retry later`, log: 'origin_unusable_answer' };
  if (status < 200 || status === 204 || status === 205) return { message: `The replica answered ${status} without a body; retry later`, log: 'origin_unusable_answer' };
  return null;
}

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
interface Attempts {
  readonly input: ForwardInput;
  readonly memory: LeaseMemory | undefined;
  readonly stream: boolean;
  readonly dialect: UpstreamDialect;
  readonly prepared: PreparedBody;
  readonly upstreamRequestId: string;
  /** A non-streaming answer's headers come only when generation ends: its own total limit. */
  readonly firstByteMs: number;
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
}

/** An attempt's replica: leased from the coordinator, or picked by this isolate (fail-open). */
interface Leased {
  kind: 'leased';
  replica: LeasedReplica;
  spilled: boolean;
  matchedBlocks?: number;
  /** The early-connect request to this replica, already on its way (a confirmed guess). */
  early: Upstream | null;
  /** Ends the lease (batched by the agent) or the fail-open count; once per attempt. */
  release: (outcome: ReleaseOutcome) => void;
  mayRetry: boolean;
}

type Done = { kind: 'done'; result: ForwardResult };
const done = (result: ForwardResult): Done => ({ kind: 'done', result });

/** acquire → attempt (first byte, retried elsewhere before it) → stream → settle, per attempt. */
async function forwardWith(input: ForwardInput, memory: LeaseMemory | undefined): Promise<ForwardResult> {
  const s = startAttempts(input, memory);
  for (;;) {
    s.attempts++;
    const lease = await acquireStep(s);
    if (lease.kind === 'done') return lease.result;
    const answer = await attemptStep(s, lease);
    if (answer.kind === 'retry') continue;
    if (answer.kind === 'done') return answer.result;
    return streamStep(s, lease, answer.sent, answer.upstream);
  }
}

function startAttempts(input: ForwardInput, memory: LeaseMemory | undefined): Attempts {
  const { config, pool, body } = input;
  const stream = input.stream ?? body?.stream === true;
  const dialect = input.dialect ?? openAIDialect(input.kind === 'completion' ? 'completion' : 'chat');
  const upstreamRequestId = input.upstreamRequestId ?? crypto.randomUUID();
  const prepared = body ? dialect.prepareBody(body, { cacheSalt: input.cacheSalt, requestId: upstreamRequestId, allowEngineFields: pool.allowEngineFields }) : { body: '', stripUsageChunk: false };
  return {
    input,
    memory,
    stream,
    dialect,
    prepared,
    upstreamRequestId,
    // Reaching the non-streaming limit is the request's fault, not the replica's (not a passive failure).
    firstByteMs: stream ? config.firstByteTimeoutMs : config.nonStreamTimeoutMs,
    agent: input.leases ?? isolateLeases,
    failOpenRouter: input.failOpenRouter ?? isolateFailOpenRouter,
    timings: leaseTimings(config),
    exclude: [],
    attempts: 0,
    lastFailure: null,
    earlyConnect: undefined,
    failOpen: false,
    rankRefused: false,
  };
}

/**
 * The acquire step: the coordinator's pick and lease in one call (with the early-connect guess
 * already going out), or this isolate's pick when the coordinator is unreachable; every refusal
 * mapped to its failure.
 */
async function acquireStep(s: Attempts): Promise<Leased | Done> {
  const { input, memory, agent, failOpenRouter, timings, exclude } = s;
  const { config, pool, coordinator } = input;
  const open = (replica: LeasedReplica): Upstream | null => openUpstream(input, s.prepared.body, replica, s.upstreamRequestId);
  // Early connect (early-connect.ts): the first attempt of a keyed request goes out to the
  // replica this key was last leased on while the acquire RPC is on its way.
  // A pinned request has one right replica, which the coordinator knows: no guessing.
  const remembered = s.attempts === 1 && memory && input.pinResponseId === undefined ? memory.guess(pool.name, input.key, input.tenant.id, input.startedAt, input.tenant.maxInFlight) : null;
  // An API the coordinator will not pin to an engine (noEnginePin) goes without the key's last rank.
  const guess = remembered && remembered.dpRank !== undefined && input.dialect?.noEnginePin ? { id: remembered.id, url: remembered.url, auth: remembered.auth } : remembered;
  let early = guess ? open(guess) : null;
  let acq: AcquireResult;
  let openThis = false;
  const got = await agent.acquire(
    coordinator,
    {
      pool: pool.name,
      key: input.key.hash,
      keyKind: input.key.kind,
      exclude,
      tenant: input.tenant.id,
      tenantMaxInFlight: input.tenant.maxInFlight,
      ...(input.tenant.sequences && input.tenant.sequences > 1 ? { weight: input.tenant.sequences } : {}),
      ...(input.tenant.keyId ? { keyId: `${input.tenant.id}/${input.tenant.keyId}` } : {}),
      blocks: input.blocks,
      ...(input.dialect?.noEnginePin || s.rankRefused ? { pinEngine: false } : {}),
      ...(early ? { guess: early.replica } : {}),
      ...(input.pinResponseId !== undefined ? { pin: { responseId: input.pinResponseId } } : {}),
      ...(input.recordResponseId !== undefined ? { record: { responseId: input.recordResponseId } } : {}),
    },
    timings,
    input.waitUntil,
  );
  if (got.kind === 'unreachable') {
    // The coordinator failed, missed acquireTimeoutMs, or did so recently (breaker): no lease.
    if (got.why !== 'breaker') logError('acquire_failed', new Error(got.message));
    if (input.canSpill && s.attempts === 1 && input.pinResponseId === undefined) {
      early?.cancel();
      return done({ ok: false, spill: true, failure: { reason: 'no_healthy_replica', message: `The coordinator of pool "${pool.name}" is unavailable; retry later`, retryAfterSeconds: config.retryAfterSeconds } });
    }
    // A pinned request (Responses follow-up) must reach the one replica that stored its response.
    if (input.pinResponseId !== undefined) {
      early?.cancel();
      const failure = pinFailure('pinned_replica_unavailable', input.pinResponseId, config.retryAfterSeconds);
      finish(input, null, 503, failure.reason, s.attempts > 1, false, s.attempts, early ? 'miss' : s.earlyConnect);
      return done({ ok: false, failure });
    }
    // Fail open: this isolate picks (the early guess is the key's last replica: keep it).
    const limit = input.tenant.maxInFlight ?? pool.maxInFlightPerTenant;
    const picked = limit !== undefined && failOpenRouter.tenantOpen(pool.name, input.tenant.id) >= limit ? 'tenant_limit' : early ? { replica: early.replica, spilled: false } : failOpenRouter.pick(pool, agent.view(pool.name), input.key.hash, exclude, Math.random);
    if (picked === null || picked === 'tenant_limit') {
      early?.cancel();
      const failure: ForwardFailure =
        picked === 'tenant_limit'
          ? { reason: 'tenant_limit', message: 'Too many concurrent requests for this API key; retry later', retryAfterSeconds: config.retryAfterSeconds }
          : { ...(s.lastFailure ?? { reason: 'no_healthy_replica', message: `The coordinator of pool "${pool.name}" is unavailable; retry later` }), retryAfterSeconds: config.retryAfterSeconds };
      finish(input, null, picked === 'tenant_limit' ? 429 : failure.reason === 'upstream_unavailable' ? 502 : 503, failure.reason, s.attempts > 1, false, s.attempts, early ? 'miss' : s.earlyConnect);
      return done({ ok: false, failure });
    }
    s.failOpen = openThis = true;
    agent.noteFallback(pool.name, coordinator, timings, input.waitUntil);
    acq = { ok: true, leaseId: '', replica: picked.replica, spilled: picked.spilled, steps: 0, deadline: 0 };
  } else acq = got.result;
  if (early && !(acq.ok && sameReplica(early.replica, acq.replica))) {
    early.cancel();
    // Drained, down, removed or moved: no key of this isolate's should be guessed onto it again.
    if (!acq.ok ? acq.reason === 'no_healthy_replica' : acq.guessUsable === false) memory?.forgetReplica(pool.name, early.replica);
    early = null;
    s.earlyConnect = 'miss';
  } else if (early) s.earlyConnect = 'hit';
  if (!acq.ok) return done(refused(s, acq));

  const replica = acq.replica;
  // A spill past a busy home is not remembered: the home is likely free again for the key's
  // next request, and a guess of the spill target would then be cancelled (the simulator: half
  // the misses for a fifth fewer hits, bounded-hash on the Mooncake trace). prefix-aware's picks
  // follow its index, which sends the key where it went last, so they are remembered.
  if (acq.spilled && pool.strategyImpl.usesPrefix !== true) memory?.forget(pool.name, input.key);
  else memory?.remember(pool.name, input.key, replica, Date.now());
  // The first lease's release says how the early connect went (the guessed replica's counter).
  const guessed = s.attempts === 1 && guess && s.earlyConnect ? { earlyConnect: s.earlyConnect, earlyReplica: guess.id } : {};
  const leaseId = acq.leaseId;
  // A lease is held (renewed with the isolate's others) until released; an open pick only counts locally.
  const leaveOpen = openThis ? failOpenRouter.enter(pool.name, replica.id, input.tenant.id) : null;
  if (!openThis) input.waitUntil(agent.hold(coordinator, pool.name, { id: leaseId, replica: replica.id, tenant: input.tenant.id, startedAt: Date.now(), spilled: acq.spilled, deadline: acq.deadline }, timings));
  const release = (outcome: ReleaseOutcome) => {
    if (leaveOpen) leaveOpen();
    else agent.release(coordinator, pool.name, leaseId, input.tenant.id, { ...outcome, ...guessed, api: input.kind }, timings, input.waitUntil);
  };
  return { kind: 'leased', replica, spilled: acq.spilled, matchedBlocks: acq.matchedBlocks, early, release, mayRetry: s.attempts <= config.maxRetries };
}

/** The coordinator said no: its reason as the client's failure (the last attempt's, after a retry). */
function refused(s: Attempts, acq: Extract<AcquireResult, { ok: false }>): ForwardResult {
  const { input, memory } = s;
  const { pool } = input;
  if (acq.reason === 'tenant_limit') memory?.tenantLimited(pool.name, input.tenant.id, Date.now());
  else memory?.forget(pool.name, input.key);
  // Nothing went out yet: another region may have a healthy replica.
  if (input.canSpill && s.attempts === 1 && input.pinResponseId === undefined && acq.reason === 'no_healthy_replica') return { ok: false, spill: true, failure: { reason: 'no_healthy_replica', message: `No healthy replica in pool "${pool.name}"; retry later`, retryAfterSeconds: Math.ceil(acq.retryAfterMs / 1000) } };
  const retryAfterSeconds = Math.ceil(acq.retryAfterMs / 1000);
  const failure: ForwardFailure =
    acq.reason === 'key_revoked'
      ? { reason: 'key_revoked', message: 'This API key has been revoked.' }
      : acq.reason === 'tenant_limit'
      ? { reason: 'tenant_limit', message: 'Too many concurrent requests for this API key; retry later', retryAfterSeconds }
      : acq.reason === 'unknown_pool'
        ? { reason: 'pool_not_found', message: `Pool "${pool.name}" is not configured` }
        : acq.reason === 'response_not_found' || acq.reason === 'pinned_replica_gone' || acq.reason === 'pinned_replica_unavailable'
          ? s.lastFailure ?? pinFailure(acq.reason, input.pinResponseId ?? '', retryAfterSeconds)
          : s.lastFailure ?? { reason: 'no_healthy_replica', message: `No healthy replica in pool "${pool.name}"; retry later`, retryAfterSeconds };
  if (s.lastFailure) failure.retryAfterSeconds = retryAfterSeconds;
  const status = { tenant_limit: 429, pool_not_found: 404, upstream_unavailable: 502, response_not_found: 404, response_replica_gone: 404, response_replica_unavailable: 409, key_revoked: 401 }[failure.reason as string] ?? 503;
  finish(input, null, status, failure.reason, s.attempts > 1, false, s.attempts, s.earlyConnect);
  return { ok: false, failure };
}

/**
 * The attempt step: send to the leased replica and race its answer's headers against the
 * first-byte limit and the client going away. Gateway errors, redirects and unreachable origins
 * are retried on another replica while attempts remain (nothing has reached the client yet); an
 * origin's own error answer is passed on.
 */
async function attemptStep(s: Attempts, lease: Leased): Promise<{ kind: 'retry' } | Done | { kind: 'answer'; sent: Upstream; upstream: Response }> {
  const { input, memory, exclude } = s;
  const { config, pool } = input;
  const { replica, release, mayRetry, spilled } = lease;
  const sent = lease.early ?? openUpstream(input, s.prepared.body, replica, s.upstreamRequestId);
  if (!sent) {
    release({ status: 0, error: 'connect', retried: mayRetry, durationMs: Date.now() - input.startedAt });
    memory?.forget(pool.name, input.key);
    exclude.push(replica.id);
    s.lastFailure = { reason: 'upstream_unavailable', message: 'No replica could be reached; retry later' };
    if (mayRetry) return { kind: 'retry' };
    finish(input, replica.id, 502, 'upstream_unavailable', s.attempts > 1, spilled, s.attempts, s.earlyConnect, s.failOpen);
    return done({ ok: false, failure: s.lastFailure });
  }

  const upstreamAbort = sent.abort;
  const fetched = await race(sent.response, s.firstByteMs, input.request.signal);

  const retried = fetched.kind === 'value' ? retriedAnswer(fetched.value.status) : null;
  if (fetched.kind !== 'value' || retried !== null) {
    upstreamAbort.abort();
    const durationMs = Date.now() - input.startedAt;
    const ended = (status: number, reason: FinishedRequest['error']) => finish(input, replica.id, status, reason, s.attempts > 1, spilled, s.attempts, s.earlyConnect, s.failOpen);
    if (fetched.kind === 'abort') {
      release({ status: 0, error: 'client_abort', durationMs });
      ended(499, 'client_abort');
      return done({ ok: false, failure: { reason: 'client_closed', message: 'Client closed the request' } });
    }
    if (fetched.kind === 'timeout' && !s.stream) {
      release({ status: 0, error: 'max_duration', durationMs });
      ended(504, 'upstream_timeout');
      return done({ ok: false, failure: { reason: 'upstream_timeout', message: `The request did not complete within ${config.nonStreamTimeoutMs} ms (nonStreamTimeoutMs); stream long generations`, retryAfterSeconds: config.retryAfterSeconds } });
    }
    if (fetched.kind === 'timeout') {
      // A replica slow to answer may still be working on it: a retry would double the load.
      release({ status: 0, error: 'timeout', durationMs });
      ended(504, 'upstream_timeout');
      return done({ ok: false, failure: { reason: 'upstream_timeout', message: `Replica did not answer within ${config.firstByteTimeoutMs} ms`, retryAfterSeconds: config.retryAfterSeconds } });
    }
    const status = fetched.kind === 'value' ? fetched.value.status : 0;
    if (fetched.kind === 'value') void fetched.value.body?.cancel().catch(() => {});
    release({ status, error: fetched.kind === 'value' ? 'upstream_5xx' : 'connect', retried: mayRetry, durationMs });
    memory?.forget(pool.name, input.key);
    exclude.push(replica.id);
    s.lastFailure = { reason: 'upstream_unavailable', message: retried?.message ?? 'No replica could serve the request; retry later' };
    if (retried?.log) logError(retried.log, new Error(`replica ${replica.id} answered ${status}: ${retried.message}`));
    if (mayRetry) return { kind: 'retry' };
    ended(502, 'upstream_unavailable');
    return done({ ok: false, failure: { ...s.lastFailure, retryAfterSeconds: config.retryAfterSeconds } });
  }

  const upstream = fetched.value;
  if (upstream.status < 400) return { kind: 'answer', sent, upstream };
  const text = await originErrorBody(upstream, sent.secrets, config.idleTimeoutMs, input.dialect?.originError);
  // vLLM refused the router's own X-data-parallel-rank (the server's engines changed since the
  // last scrape): the router's doing, not the client's. The replica is unpinned (the release says
  // so) and the request goes again, unpinned, while attempts remain.
  const rankRefused = upstream.status === 400 && sent.replica.dpRank !== undefined && refusesEngineRank(text, sent.replica.dpRank);
  if (rankRefused && mayRetry) {
    release({ status: 400, rankRefused: true, retried: true, durationMs: Date.now() - input.startedAt });
    memory?.forget(pool.name, input.key);
    s.rankRefused = true;
    logError('origin_rank_refused', new Error(`replica ${replica.id} refused data-parallel rank ${sent.replica.dpRank}`));
    return { kind: 'retry' };
  }
  // No attempt left: the client gets vLLM's 400, and the replica is unpinned all the same (else
  // every pinned request there is refused until the next scrape).
  if (rankRefused) memory?.forget(pool.name, input.key);
  const settle = rankRefused ? (o: ReleaseOutcome) => release({ ...o, rankRefused: true }) : release;
  return done(answerOriginError(input, upstream.status, text, sent, { release: settle, attempts: s.attempts, spilled, earlyConnect: s.earlyConnect, matchedBlocks: lease.matchedBlocks, failOpen: s.failOpen }));
}

/**
 * The stream step: the answer's body through the tap (TTFT, usage) to the client, copied inside
 * `waitUntil` so the lease is settled however the stream ends.
 */
function streamStep(s: Attempts, lease: Leased, sent: Upstream, upstream: Response): ForwardResult {
  const { input } = s;
  const { config } = input;
  const tap = new ResponseTap({ stream: s.stream, stripUsageChunk: s.prepared.stripUsageChunk, now: Date.now, reader: s.dialect.reader(s.prepared) });
  // workerd's native byte pipe: cheaper per chunk than a JavaScript TransformStream, and a
  // write still settles only as the client takes the bytes (the stall watchdog relies on it).
  const { readable, writable } = new IdentityTransformStream();
  const out = proxiedResponseHeaders({ sse: s.stream, requestId: input.requestId, replica: config.replicaHeader ? lease.replica.id : null });
  input.waitUntil(
    copyBody({
      upstream,
      writable,
      tap,
      stream: s.stream,
      config,
      clientSignal: input.request.signal,
      abortUpstream: () => sent.abort.abort(),
      // The longest stream allowed ends before the coordinator's lease deadline reaps the lease.
      deadline: input.startedAt + config.maxStreamMs,
    }).then((end) => settleStep(s, lease, upstream, tap, end)),
  );
  return { ok: true, response: new Response(readable, { status: upstream.status, headers: out }) };
}

/** The settle step: the stream's outcome to the lease (stats) and to the trace log, once. */
function settleStep(s: Attempts, lease: Leased, upstream: Response, tap: ResponseTap, end: ReleaseError | undefined): void {
  const { input } = s;
  const ttftMs = tap.firstContentAt === null ? null : tap.firstContentAt - input.startedAt;
  const outcome: ReleaseOutcome = {
    status: upstream.status,
    error: end,
    ttftMs,
    durationMs: Date.now() - input.startedAt,
    promptTokens: tap.usage?.promptTokens ?? null,
    cachedTokens: tap.usage?.cachedTokens ?? null,
    completionTokens: tap.usage?.completionTokens ?? null,
  };
  if (tap.responseId !== null && tap.responseId !== input.recordResponseId && upstream.ok) outcome.responseId = tap.responseId;
  lease.release(outcome);
  input.onFinish({
    replica: lease.replica.id,
    status: upstream.status,
    error: end,
    ttftMs,
    durationMs: outcome.durationMs!,
    promptTokens: outcome.promptTokens ?? null,
    cachedTokens: outcome.cachedTokens ?? null,
    completionTokens: outcome.completionTokens ?? null,
    retried: s.attempts > 1,
    spilled: lease.spilled,
    attempts: s.attempts,
    matchedBlocks: lease.matchedBlocks,
    earlyConnect: s.earlyConnect,
    ...(s.failOpen ? { failOpen: s.failOpen } : {}),
  });
}

/** An origin's error answer (≥ 400, not retried): `text` is its JSON or an OpenAI error, read bounded, credentials redacted (originErrorBody). */
function answerOriginError(
  input: ForwardInput,
  status: number,
  text: string,
  sent: Upstream,
  o: { release: (outcome: ReleaseOutcome) => void; attempts: number; spilled: boolean; earlyConnect?: 'hit' | 'miss'; matchedBlocks?: number; failOpen?: boolean },
): ForwardResult {
  const durationMs = Date.now() - input.startedAt;
  const error = status >= 500 ? ({ error: 'upstream_5xx' } as const) : {};
  o.release({ status: status, ...error, durationMs });
  input.onFinish({
    replica: sent.replica.id,
    status: status,
    ...error,
    ttftMs: null,
    durationMs,
    promptTokens: null,
    cachedTokens: null,
    completionTokens: null,
    retried: o.attempts > 1,
    spilled: o.spilled,
    attempts: o.attempts,
    matchedBlocks: o.matchedBlocks,
    earlyConnect: o.earlyConnect,
    ...(o.failOpen ? { failOpen: true } : {}),
  });
  const headers = proxiedResponseHeaders({ sse: false, requestId: input.requestId, replica: input.config.replicaHeader ? sent.replica.id : null });
  return { ok: true, response: new Response(text, { status: status, headers }) };
}

interface CopyInput {
  upstream: Response;
  writable: WritableStream<ArrayBuffer | ArrayBufferView>;
  tap: BodyTap;
  stream: boolean;
  config: RouterConfig;
  clientSignal: AbortSignal;
  abortUpstream: () => void;
  /** Epoch ms at which the stream is cut (`maxStreamMs` after the request arrived). */
  deadline: number;
}

/**
 * Copy upstream → client. Every read must settle within the idle timeout and every write within
 * the client stall window (a write that does not complete means nobody is reading), and the
 * client's abort signal ends either wait at once: one watchdog per stream keeps that without a
 * timer per chunk. Resolves with how it ended (undefined = completed normally).
 */
async function copyBody(c: CopyInput): Promise<ReleaseError | undefined> {
  const writer = c.writable.getWriter();
  const reader = c.upstream.body ? new UpstreamReader(c.upstream.body) : undefined;
  const watch = new StreamWatchdog(c.clientSignal, [c.config.idleTimeoutMs, c.config.clientStallMs]);
  let end: ReleaseError | undefined;
  const write = async (bytes: Uint8Array): Promise<boolean> => {
    if (bytes.byteLength === 0) return true;
    const w = await watch.wait(writer.write(bytes), c.config.clientStallMs);
    return w.kind === 'value';
  };
  try {
    if (!reader) {
      end = (await write(c.tap.end())) ? undefined : 'client_abort';
      return end;
    }
    for (;;) {
      const left = c.deadline - Date.now();
      const r = await watch.wait(reader.read(), Math.max(0, Math.min(c.config.idleTimeoutMs, left)));
      if (r.kind === 'abort') {
        end = 'client_abort';
        break;
      }
      if (r.kind === 'timeout' || r.kind === 'error') {
        const overLong = r.kind === 'timeout' && Date.now() >= c.deadline;
        end = overLong ? 'max_duration' : r.kind === 'timeout' ? 'idle_timeout' : 'stream_error';
        const msg = overLong
          ? `Stream exceeded the longest allowed duration of ${c.config.maxStreamMs} ms`
          : r.kind === 'timeout'
            ? `Replica sent nothing for ${c.config.idleTimeoutMs} ms`
            : 'Replica connection failed mid-response';
        const code = overLong ? 'stream_too_long' : r.kind === 'timeout' ? 'upstream_timeout' : 'upstream_unavailable';
        const flushed = c.tap.end();
        if (c.stream) await write(concat(flushed, c.tap.errorEvent(msg, 'server_error', code)));
        break;
      }
      if (r.value.done) {
        if (!(await write(c.tap.end()))) end = 'client_abort';
        break;
      }
      const out = c.tap.push(r.value.value);
      // The write must be taken before the next read reuses the buffer `out` may view.
      if (!(await write(out))) {
        end = 'client_abort';
        break;
      }
    }
  } catch (e) {
    end = 'stream_error';
    logError('copy_failed', e);
  } finally {
    watch.dispose();
    // A body read to its end needs no abort or cancel (each fired events and cost CPU per request).
    if (end !== undefined) {
      c.abortUpstream();
      if (reader) void reader.cancel().catch(() => {});
    }
    // Never await abort() while a write may be stalled: it can hang (WORKERD-NOTES.md).
    if (end === 'client_abort') void writer.abort().catch(() => {});
    else void writer.close().catch(() => {});
  }
  return end;
}

/** Bytes a read waits for (or the end of the body): see UpstreamReader. */
const MIN_READ_BYTES = 32;
const READ_BUFFER_BYTES = 16 * 1024;

/**
 * Reads the upstream body in whole HTTP chunks where the runtime allows it. workerd's chunked
 * decoder reads the chunk-size line with a small read and hands the bytes that came with it (28
 * of a 221-byte SSE event) to the next `read()`, then the rest to the one after: two isolate
 * wake-ups per event, each costing more CPU than the tap's parsing (docs/benchmarks.md, "Proxy
 * overhead"). `readAtLeast(32)` makes that one read return the whole chunk, which is already in
 * the socket buffer. The price: a body that sends fewer than 32 bytes in total and then pauses
 * (an SSE comment used as a keep-alive) is held until more bytes or the end arrive; vLLM's
 * events are JSON objects far above that, and its final `data: [DONE]` is followed by the end.
 *
 * One buffer is reused: a read's bytes must be written (and the write taken) before the next
 * read, which the copy loop does anyway. Falls back to a default reader for a non-byte stream.
 */
class UpstreamReader {
  readonly #byob: ReadableStreamBYOBReader | null;
  readonly #plain: ReadableStreamDefaultReader<Uint8Array> | null;
  #buffer: ArrayBuffer = new ArrayBuffer(READ_BUFFER_BYTES);

  constructor(body: ReadableStream<Uint8Array>) {
    let byob: ReadableStreamBYOBReader | null = null;
    try {
      // readAtLeast is workerd's; a stream without BYOB reads (or a runtime without it) reads plainly.
      byob = typeof ReadableStreamBYOBReader.prototype.readAtLeast === 'function' ? body.getReader({ mode: 'byob' }) : null;
    } catch {
      byob = null;
    }
    this.#byob = byob;
    this.#plain = byob ? null : body.getReader();
  }

  async read(): Promise<ReadableStreamReadResult<Uint8Array>> {
    if (this.#plain) return this.#plain.read();
    const r = await this.#byob!.readAtLeast(MIN_READ_BYTES, new Uint8Array(this.#buffer));
    if (r.value) this.#buffer = r.value.buffer as ArrayBuffer;
    if (r.done) return { done: true, value: undefined };
    return { done: false, value: r.value };
  }

  cancel(): Promise<void> {
    return (this.#byob ?? this.#plain)!.cancel();
  }
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.byteLength === 0) return b;
  const out = new Uint8Array(a.byteLength + b.byteLength);
  out.set(a, 0);
  out.set(b, a.byteLength);
  return out;
}

/** An upstream request on its way: its response promise and the controller that aborts it. */
interface Upstream {
  replica: LeasedReplica;
  response: Promise<Response>;
  abort: AbortController;
  /** The origin credential values sent with it (redacted from an error body it echoes). */
  secrets: string[];
  /** Give up on it: abort the fetch and drop whatever it brings. */
  cancel(): void;
}

/**
 * Send the request to a replica, or null when the replica's origin credentials do not resolve.
 * The controller is aborted by this code on every path that gives up on the upstream (a client
 * abort ends the first-byte race or wakes the copy loop's watchdog), so no abort listener per
 * request.
 */
function openUpstream(input: ForwardInput, body: string, replica: LeasedReplica, upstreamRequestId: string): Upstream | null {
  const auth = resolveOriginAuth(input.env, replica.auth);
  if (!auth.ok) {
    logError('origin_auth', new Error(`replica ${replica.id}: ${auth.problem}`));
    return null;
  }
  const abort = new AbortController();
  const headers = buildUpstreamHeaders(input.request.headers, auth.auth, upstreamExtraHeaders(upstreamRequestId, input.requestId, replica.dpRank), input.pool.forwardHeaders);
  const method = input.method ?? 'POST';
  // redirect: 'manual': an origin's 3xx comes back as an answer (an upstream error above), never
  // re-sent with the prompt and the origin's credentials to wherever it points.
  const response = fetch(replicaEndpoint(replica.url, input.path), { method, headers, ...(method === 'POST' && input.body ? { body } : {}), signal: abort.signal, redirect: 'manual' });
  // An early request can fail (a replica gone) while nothing awaits it yet (the acquire is in
  // flight): handled here so it is not an unhandled rejection; race() and cancel() still see it.
  response.catch(() => {});
  return {
    replica,
    response,
    abort,
    secrets: Object.values(auth.headers),
    cancel() {
      abort.abort();
      response.then((r) => r.body?.cancel(), () => {}).catch(() => {});
    },
  };
}

/** A pinned request that cannot reach its replica: never another replica instead. */
function pinFailure(reason: 'response_not_found' | 'pinned_replica_gone' | 'pinned_replica_unavailable', id: string, retryAfterSeconds: number): ForwardFailure {
  const shown = id.slice(0, 100);
  if (reason === 'response_not_found') return { reason, message: `Response with id '${shown}' not found.` };
  if (reason === 'pinned_replica_gone') return { reason: 'response_replica_gone', message: `Response with id '${shown}' not found: the replica that stored it has left the pool.` };
  return { reason: 'response_replica_unavailable', message: `The replica that stored response '${shown}' is unavailable; retry later.`, retryAfterSeconds };
}

const OPENAI_DIALECTS = {
  chat: { prepareBody: (b: Record<string, unknown>, o: PrepareBodyOptions) => prepareUpstreamBody(b, o), reader: (p: PreparedBody) => openAIReader('chat', p.stripUsageChunk) },
  completion: { prepareBody: (b: Record<string, unknown>, o: PrepareBodyOptions) => prepareUpstreamBody(b, o), reader: (p: PreparedBody) => openAIReader('completion', p.stripUsageChunk) },
} satisfies Record<string, UpstreamDialect>;

function openAIDialect(kind: 'chat' | 'completion'): UpstreamDialect {
  return OPENAI_DIALECTS[kind];
}

function finish(input: ForwardInput, replica: string | null, status: number, error: FinishedRequest['error'], retried: boolean, spilled: boolean, attempts: number, earlyConnect?: 'hit' | 'miss', failOpen?: boolean): void {
  input.onFinish({
    ...(failOpen ? { failOpen } : {}),
    replica,
    status,
    error,
    ttftMs: null,
    durationMs: Date.now() - input.startedAt,
    promptTokens: null,
    cachedTokens: null,
    completionTokens: null,
    retried,
    spilled,
    attempts,
    earlyConnect,
  });
}

function logError(type: string, e: unknown): void {
  console.error(JSON.stringify({ type, message: e instanceof Error ? e.message : String(e) }));
}
