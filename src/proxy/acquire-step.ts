// The acquire step of forward(): the coordinator's pick and lease in one call (with the
// early-connect guess already going out), this isolate's own pick when the coordinator cannot be
// reached (fail-open), and every refusal mapped to the request's failure. I/O: coordinator RPCs
// through the LeaseAgent; the early-connect fetch (attempt-step.ts openUpstream).

import { responseNotStoredMessage } from '../engines/vllm.js';
import { flowControlActive } from '../config.js';
import type { AcquireResult, QueueTicket } from '../coordinator/types.js';
import type { ReleaseOutcome } from '../coordinator/stats.js';
import { sameReplica, type LeasedReplica } from './early-connect.js';
import { openUpstream, type Upstream } from './attempt-step.js';
import type { Attempts, ForwardFailure, ForwardResult, Leased } from './forward.js';
import { done, finishUnanswered, logError, type Done } from './finish.js';
import { AttemptPreemption } from './preemption.js';

/**
 * The acquire step: the coordinator's pick and lease in one call (with the early-connect guess
 * already going out), or this isolate's pick when the coordinator is unreachable; every refusal
 * mapped to its failure.
 */
export async function acquireStep(s: Attempts): Promise<Leased | Done> {
  const { input, memory, agent, failOpenRouter, timings, exclude } = s;
  const { config, pool, coordinator } = input;
  const open = (replica: LeasedReplica): Upstream | null => openUpstream(input, s.prepared.body, replica, s.upstreamRequestId);
  // Early connect (early-connect.ts): the first attempt of a keyed request goes out to the
  // replica this key was last leased on while the acquire RPC is on its way.
  // A pinned request has one right replica, which the coordinator knows: no guessing.
  // Flow control: the acquire may wait in the coordinator's queue (coordinator/queue.ts), up to its
  // band's maxQueueMs. Not when another region may take the request now (it spills instead).
  const spillable = input.canSpill === true && s.attempts === 1 && input.pinResponseId === undefined;
  const band = flowControlActive(pool) && !spillable ? pool.flowControl.bands.find((b) => b.name === (input.queue?.band ?? pool.flowControl.defaultBand)) : undefined;
  const ticket: QueueTicket | undefined = band ? { ticket: crypto.randomUUID(), band: band.name, cost: input.queue?.cost ?? 1, weight: input.queue?.weight ?? 1, ...(s.resuming || s.preempted > 0 ? { resume: true as const } : {}) } : undefined;
  // Flow control's preemption (preemption.ts): the coordinator may ask this attempt for its slot back.
  const preemption = ticket && pool.flowControl.preempt && !s.continuing ? new AttemptPreemption(s.preempted) : undefined;
  // A pool whose acquires queued lately is at its bound: a guess would go to a full replica, past the bound.
  const remembered = s.attempts === 1 && memory && input.pinResponseId === undefined && !(ticket && agent.recentlyQueued(pool.name)) ? memory.guess(pool.name, input.key, input.tenant.id, input.startedAt, input.tenant.maxInFlight) : null;
  // An API the coordinator will not pin to an engine (noEnginePin) goes without the key's last rank.
  const guess = remembered && remembered.dpRank !== undefined && input.dialect?.noEnginePin ? { id: remembered.id, url: remembered.url, auth: remembered.auth } : remembered;
  let early = guess ? open(guess) : null;
  // A queued acquire (the pool is at its bound) cancels the early request at once: left going, it
  // would hold a slot of the engine, or a place in its FIFO ahead of leased requests, for as long
  // as the acquire waits; and this isolate's next requests make no guess (recentlyQueued).
  let earlyQueued = false;
  const onQueued =
    early && ticket
      ? () => {
          agent.noteQueued(pool.name);
          if (early && !earlyQueued) {
            earlyQueued = true;
            early.cancel();
          }
        }
      : undefined;
  // A queued acquire stops waiting when the client goes away, or when the tenant's quota refuses
  // the request meanwhile (its 429 need not wait for a slot): either way its ticket is cancelled.
  const quotaPending = s.attempts === 1 && input.admitted ? input.admitted : null;
  const stopWaiting = band ? new AbortController() : null;
  if (stopWaiting) {
    const signal = input.request.signal;
    if (signal.aborted) stopWaiting.abort();
    else signal.addEventListener('abort', () => stopWaiting.abort(), { once: true });
    quotaPending?.then((ok) => ok || stopWaiting.abort(), () => {});
  }
  let acq: AcquireResult;
  let openThis = false;
  const acquiring = agent.acquire(
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
      ...(ticket ? { queue: ticket } : {}),
      ...(preemption ? { preempt: preemption.hook } : {}),
      ...(onQueued ? { queued: onQueued } : {}),
    },
    timings,
    input.waitUntil,
    band ? { maxQueueMs: band.maxQueueMs, signal: stopWaiting!.signal } : undefined,
  );
  // The tenant's quota decision, when still under way, comes in with the first acquire.
  const [got, admitted] = await Promise.all([acquiring, quotaPending ?? true]);
  if (!admitted) {
    early?.cancel();
    return done(quotaRefused(s, got.kind === 'reply' && got.result.ok ? got.result.leaseId : null));
  }
  if (got.kind === 'cancelled') {
    // The client went away while the request waited in the queue: its ticket is cancelled.
    early?.cancel();
    finishUnanswered(s, { replica: null, status: 499, error: 'client_abort', spilled: false, earlyConnect: early ? 'miss' : s.earlyConnect });
    return done({ ok: false, failure: { reason: 'client_closed', message: 'Client closed the request' } });
  }
  if (got.kind === 'lost') {
    // Queued when the coordinator restarted (or stalled): the pool was full, so no fail-open; retriable.
    early?.cancel();
    logError('queued_acquire_lost', new Error(got.message));
    finishUnanswered(s, { replica: null, status: 503, error: 'queue_lost', spilled: false, earlyConnect: early ? 'miss' : s.earlyConnect });
    return done({ ok: false, failure: { reason: 'queue_lost', message: `The request waited for a slot in pool "${pool.name}" and its place in the queue was lost (the coordinator restarted); retry`, retryAfterSeconds: config.retryAfterSeconds } });
  }
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
      finishUnanswered(s, { replica: null, status: 503, error: failure.reason, spilled: false, earlyConnect: early ? 'miss' : s.earlyConnect });
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
      finishUnanswered(s, { replica: null, status: picked === 'tenant_limit' ? 429 : failure.reason === 'upstream_unavailable' ? 502 : failure.reason === 'upstream_timeout' ? 504 : 503, error: failure.reason, spilled: false, earlyConnect: early ? 'miss' : s.earlyConnect });
      return done({ ok: false, failure });
    }
    s.failOpen = openThis = true;
    agent.noteFallback(pool.name, coordinator, timings, input.waitUntil);
    acq = { ok: true, leaseId: '', replica: picked.replica, spilled: picked.spilled, steps: 0, deadline: 0 };
  } else acq = got.result;
  if (acq.queuedMs !== undefined) s.queueMs = (s.queueMs ?? 0) + acq.queuedMs;
  // A guess cancelled when the acquire queued is a miss whatever the pick: the request goes out again.
  if (early && (earlyQueued || !(acq.ok && sameReplica(early.replica, acq.replica)))) {
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
  return { kind: 'leased', replica, spilled: acq.spilled, matchedBlocks: acq.matchedBlocks, early, release, mayRetry: s.attempts <= config.maxRetries, ...(preemption && !openThis ? { preemption } : {}) };
}

/** The tenant's quota refused the request while its lease was acquired: the lease goes straight back. */
function quotaRefused(s: Attempts, leaseId: string | null): ForwardResult {
  const { input, agent, timings } = s;
  if (leaseId !== null) agent.release(input.coordinator, input.pool.name, leaseId, input.tenant.id, { status: 0, durationMs: 0 }, timings, input.waitUntil);
  finishUnanswered(s, { replica: null, status: 429, error: 'rate_limited', spilled: false, earlyConnect: s.earlyConnect });
  return { ok: false, failure: { reason: 'rate_limited', message: 'Rate limit reached for this API key; retry later' } };
}

/** The coordinator said no: its reason as the client's failure (the last attempt's, after a retry). */
function refused(s: Attempts, acq: Extract<AcquireResult, { ok: false }>): ForwardResult {
  const { input, memory } = s;
  const { pool } = input;
  if (acq.reason === 'tenant_limit') memory?.tenantLimited(pool.name, input.tenant.id, Date.now());
  else memory?.forget(pool.name, input.key);
  if (acq.reason === 'queue_full' || acq.reason === 'queue_timeout' || acq.reason === 'queue_cancelled') return queueRefused(s, acq);
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
        : acq.reason === 'response_not_stored'
          ? { reason: 'response_not_stored', message: responseNotStoredMessage((input.pinResponseId ?? '').slice(0, 100)), param: input.body ? 'previous_response_id' : 'response_id' }
        : acq.reason === 'response_not_found' || acq.reason === 'pinned_replica_gone' || acq.reason === 'pinned_replica_unavailable'
          ? s.lastFailure ?? pinFailure(acq.reason, input.pinResponseId ?? '', retryAfterSeconds)
          : s.lastFailure ?? { reason: 'no_healthy_replica', message: `No healthy replica in pool "${pool.name}"; retry later`, retryAfterSeconds };
  if (s.lastFailure) failure.retryAfterSeconds = retryAfterSeconds;
  const status = { tenant_limit: 429, pool_not_found: 404, upstream_unavailable: 502, upstream_timeout: 504, response_not_found: 404, response_not_stored: 404, response_replica_gone: 404, response_replica_unavailable: 409, key_revoked: 401 }[failure.reason as string] ?? 503;
  finishUnanswered(s, { replica: null, status, error: failure.reason, spilled: false, earlyConnect: s.earlyConnect });
  return { ok: false, failure };
}

/**
 * The coordinator's queue refused the request (flow control): its band's queue was full or its
 * wait ran out. 429 when its tenant holds more than its fair share of the pool, else 503; either
 * way with Retry-After from the queue's drain rate.
 */
function queueRefused(s: Attempts, acq: Extract<AcquireResult, { ok: false }>): ForwardResult {
  const { pool } = s.input;
  const band = acq.band ?? s.input.queue?.band ?? pool.flowControl.defaultBand;
  const retryAfterSeconds = Math.max(1, Math.ceil(acq.retryAfterMs / 1000));
  if (acq.reason === 'queue_cancelled') {
    finishUnanswered(s, { replica: null, status: 499, error: 'client_abort', spilled: false, earlyConnect: s.earlyConnect });
    return { ok: false, failure: { reason: 'client_closed', message: 'Client closed the request' } };
  }
  const full = acq.reason === 'queue_full';
  const reason = full ? (acq.overShare ? 'queue_full_over_share' : 'queue_full') : acq.overShare ? 'queue_timeout_over_share' : 'queue_timeout';
  const what = full ? `the "${band}" queue of pool "${pool.name}" is full` : `no slot in pool "${pool.name}" freed within the "${band}" band's wait (${((acq.queuedMs ?? 0) / 1000).toFixed(1)} s)`;
  const message = acq.overShare ? `This API key holds more than its fair share of pool "${pool.name}" and ${what}; retry after ${retryAfterSeconds} s` : `Pool "${pool.name}" is saturated: ${what}; retry after ${retryAfterSeconds} s`;
  finishUnanswered(s, { replica: null, status: acq.overShare ? 429 : 503, error: reason, spilled: false, earlyConnect: s.earlyConnect });
  return { ok: false, failure: { reason, message, retryAfterSeconds } };
}

/** A pinned request that cannot reach its replica: never another replica instead. */
function pinFailure(reason: 'response_not_found' | 'pinned_replica_gone' | 'pinned_replica_unavailable', id: string, retryAfterSeconds: number): ForwardFailure {
  const shown = id.slice(0, 100);
  if (reason === 'response_not_found') return { reason, message: `Response with id '${shown}' not found.` };
  if (reason === 'pinned_replica_gone') return { reason: 'response_replica_gone', message: `Response with id '${shown}' not found: the replica that stored it has left the pool.` };
  return { reason: 'response_replica_unavailable', message: `The replica that stored response '${shown}' is unavailable; retry later.`, retryAfterSeconds };
}
