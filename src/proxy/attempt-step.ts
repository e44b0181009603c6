// The attempt step of forward(): send to the leased replica, race its answer's headers against
// the request's answer limit and the client going away, retry gateway errors, redirects,
// unreachable origins and (streaming) a replica with no answer in time on another replica while
// attempts remain, and pass an origin's own error answer on. A streamed answer is not committed
// by its headers: first-token.ts reads on to the first content event.
// I/O: origin fetches.

import { replicaEndpoint } from '../config.js';
import type { ReleaseOutcome } from '../coordinator/stats.js';
import { resolveOriginAuth } from '../origin/origin-auth.js';
import type { LeasedReplica } from './early-connect.js';
import type { Attempts, FinishedRequest, ForwardInput, ForwardResult, Leased } from './forward.js';
import { done, finishUnanswered, logError, type Done } from './finish.js';
import { originErrorBody, proxiedResponseHeaders } from './origin-response.js';
import { race } from './race.js';
import { buildUpstreamHeaders, upstreamExtraHeaders } from './upstream-request.js';
import { refusesEngineRank } from '../engines/vllm.js';

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

/**
 * The attempt step: send to the leased replica and race its answer's headers against the
 * first-byte limit and the client going away. Gateway errors, redirects and unreachable origins
 * are retried on another replica while attempts remain (nothing has reached the client yet); an
 * origin's own error answer is passed on.
 */
export async function attemptStep(s: Attempts, lease: Leased): Promise<{ kind: 'retry' } | Done | { kind: 'answer'; sent: Upstream; upstream: Response; deadline: number }> {
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
    finishUnanswered(s, { replica: replica.id, status: 502, error: 'upstream_unavailable', spilled, earlyConnect: s.earlyConnect, failOpen: s.failOpen });
    return done({ ok: false, failure: s.lastFailure });
  }

  const upstreamAbort = sent.abort;
  // Streaming: one limit from here to the first content event, headers included (first-token.ts).
  const deadline = Date.now() + s.answerTimeoutMs;
  const fetched = await race(sent.response, s.answerTimeoutMs, input.request.signal, lease.preemption?.signal);
  if (fetched.kind === 'preempted') {
    upstreamAbort.abort();
    return preempted(s, lease, 0);
  }

  const retried = fetched.kind === 'value' ? retriedAnswer(fetched.value.status) : null;
  if (fetched.kind !== 'value' || retried !== null) {
    upstreamAbort.abort();
    const durationMs = Date.now() - input.startedAt;
    const ended = (status: number, error: FinishedRequest['error']) => finishUnanswered(s, { replica: replica.id, status, error, spilled, earlyConnect: s.earlyConnect, failOpen: s.failOpen });
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
      // No headers, so no first token, by firstTokenTimeoutMs: the request is aborted on this
      // replica (vLLM stops a request whose client went away), so a retry elsewhere does not
      // double the load. Charged to the replica like a 5xx.
      release({ status: 0, error: 'timeout', retried: mayRetry, durationMs });
      memory?.forget(pool.name, input.key);
      exclude.push(replica.id);
      s.lastFailure = { reason: 'upstream_timeout', message: `No replica sent a first token within ${config.firstTokenTimeoutMs} ms (firstTokenTimeoutMs); retry later` };
      if (mayRetry) return { kind: 'retry' };
      ended(504, 'upstream_timeout');
      return done({ ok: false, failure: { ...s.lastFailure, retryAfterSeconds: config.retryAfterSeconds } });
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
  if (upstream.status < 400) return { kind: 'answer', sent, upstream, deadline };
  const text = await originErrorBody(upstream, sent.secrets, config.idleTimeoutMs, input.dialect?.originError);
  // vLLM refused the router's own X-data-parallel-rank (the server's engines changed since the
  // last scrape): the router's doing, not the client's. The replica is unpinned (the release says
  // so) and the request goes again, unpinned, while attempts remain. A 400 on Chat Completions and
  // Completions; vLLM's Messages route answers the same ValueError as a 500 `internal_error`
  // (vllm/entrypoints/anthropic/api_router.py create_messages, `except Exception`).
  const rankRefused = (upstream.status === 400 || upstream.status === 500) && sent.replica.dpRank !== undefined && refusesEngineRank(text, sent.replica.dpRank);
  if (rankRefused && mayRetry) {
    release({ status: upstream.status, rankRefused: true, retried: true, durationMs: Date.now() - input.startedAt });
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

export interface Upstream {
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
export function openUpstream(input: ForwardInput, body: string, replica: LeasedReplica, upstreamRequestId: string): Upstream | null {
  const auth = resolveOriginAuth(input.env, replica.auth);
  if (!auth.ok) {
    logError('origin_auth', new Error(`replica ${replica.id}: ${auth.problem}`));
    return null;
  }
  const abort = new AbortController();
  const headers = buildUpstreamHeaders(input.request.headers, auth.auth, upstreamExtraHeaders(upstreamRequestId, input.requestId, replica.dpRank), input.pool.forwardHeaders, input.sessionTag);
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

/**
 * Flow control took this attempt's slot back before anything went to the client (preemption.ts):
 * the upstream request is aborted (vLLM frees a request whose client went away), the lease goes
 * back marked `preempted` (its replica not charged), and the request queues again; the attempt is
 * not counted against maxRetries.
 */
export function preempted(s: Attempts, lease: Leased, status: number): { kind: 'retry' } {
  lease.release({ status, preempted: true, durationMs: Date.now() - s.input.startedAt });
  s.attempts--;
  s.preempted++;
  return { kind: 'retry' };
}
