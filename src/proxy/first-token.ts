// The commit point of a streamed answer: its first content event, not its headers (vLLM sends
// its 200 and headers before queueing and prefill). Until the tap has passed a content event,
// what the replica sent (status, headers, the role chunk, the Responses or Anthropic preamble) is
// held here, not written; an in-band error event, a body that breaks or ends without an answer,
// or no first token by `firstTokenTimeoutMs` is then retried on another replica like a 5xx, and
// the client never sees it. What is content and what is an error is the dialect's reader's
// (http/apis/<dialect>/reader.ts). I/O: reads the upstream body.

import type { ReleaseError } from '../coordinator/stats.js';
import { refusesEngineRank, refusesEngineRankConverted } from '../engines/vllm.js';
import { preempted, type Upstream } from './attempt-step.js';
import type { Attempts, Leased } from './forward.js';
import { done, finishUnanswered, logError, type Done } from './finish.js';
import { race } from './race.js';
import { concatBytes, ResponseTap } from './sse-tap.js';
import { UpstreamReader } from './upstream-reader.js';

/**
 * Most bytes held before the first content event. An answer whose preamble outgrows it is
 * committed as it stands (no engine's preamble comes near: vLLM's role chunk is ~200 bytes,
 * Anthropic's `message_start` and Responses' `response.created` a few hundred).
 */
export const MAX_HELD_BYTES = 64 * 1024;

/** A streamed answer past its commit point: the tap, the body's reader and the bytes held until then. */
export interface Committed {
  tap: ResponseTap;
  reader: UpstreamReader | undefined;
  held: Uint8Array;
}

/** The tap over one attempt's answer: the dialect's reader, the clock of TTFT. */
export function newTap(s: Attempts): ResponseTap {
  const reader = s.dialect.reader(s.prepared);
  return new ResponseTap({ stream: s.stream, stripUsageChunk: s.prepared.stripUsageChunk, now: Date.now, reader: s.continuation ? s.continuation.observe(reader) : reader });
}

/** Why an answer failed before its first token. */
export type BeforeFirstToken = 'in_band_error' | 'timeout' | 'broken' | 'ended';

type Read = { kind: 'committed'; committed: Committed } | { kind: 'failed'; why: BeforeFirstToken; held: Uint8Array } | { kind: 'abort' } | { kind: 'preempted' };

const EMPTY = new Uint8Array(0);

/**
 * Read the answer through a fresh tap until its first content event (committed), an error event,
 * its end, a broken body, `deadline` (epoch ms) or the client's abort. A stream that ends cleanly
 * without content (an empty answer: the model stopped at once) is committed: it is an answer.
 */
export async function readToFirstToken(s: Attempts, upstream: Response, deadline: number, preempt?: AbortSignal): Promise<Read> {
  const tap = newTap(s);
  if (!upstream.body) return { kind: 'committed', committed: { tap, reader: undefined, held: EMPTY } };
  const reader = new UpstreamReader(upstream.body);
  const held: Uint8Array[] = [];
  let heldBytes = 0;
  const fail = (why: BeforeFirstToken): Read => {
    void reader.cancel().catch(() => {});
    return { kind: 'failed', why, held: concatBytes(held) };
  };
  for (;;) {
    const r = await race(reader.read(), Math.max(0, deadline - Date.now()), s.input.request.signal, preempt);
    if (r.kind === 'abort') {
      void reader.cancel().catch(() => {});
      return { kind: 'abort' };
    }
    // Flow control took the slot back (preemption.ts): nothing read so far went to the client.
    if (r.kind === 'preempted' || preempt?.aborted) {
      void reader.cancel().catch(() => {});
      return { kind: 'preempted' };
    }
    if (r.kind === 'timeout') return fail('timeout');
    if (r.kind === 'error') return fail('broken');
    const out = r.value.done ? tap.end() : tap.push(r.value.value);
    // A copy: the reader reuses its buffer on the next read.
    if (out.byteLength > 0) {
      held.push(out.slice());
      heldBytes += out.byteLength;
    }
    // Content first: an error event after it in the same read is a mid-stream failure (the client gets it).
    if (tap.firstContentAt !== null || heldBytes >= MAX_HELD_BYTES) return { kind: 'committed', committed: { tap, reader, held: concatBytes(held) } };
    if (tap.sawError) return fail('in_band_error');
    if (r.value.done) return tap.sawDone ? { kind: 'committed', committed: { tap, reader, held: concatBytes(held) } } : fail('ended');
  }
}

const RELEASE_ERROR: Record<BeforeFirstToken, ReleaseError> = { in_band_error: 'upstream_5xx', timeout: 'timeout', broken: 'stream_error', ended: 'stream_error' };
const WHAT: Record<BeforeFirstToken, string> = {
  in_band_error: 'an error event',
  timeout: 'no first token in time',
  broken: 'a broken connection',
  ended: 'the end of its answer without content',
};

/**
 * The first-token step of forward() for a streamed answer whose headers came (status < 400):
 * committed, or retried on another replica (the replica charged as for a 5xx, except for a stale
 * data-parallel rank, which is the router's doing), or the request's failure when no attempt is
 * left: `502` (`504` for a timeout), never a 200 with an error inside.
 */
export async function firstTokenStep(s: Attempts, lease: Leased, sent: Upstream, upstream: Response, deadline: number): Promise<{ kind: 'retry' } | Done | { kind: 'committed'; committed: Committed }> {
  const { input, memory, exclude } = s;
  const { config, pool } = input;
  const { replica, release, mayRetry, spilled } = lease;
  const read = await readToFirstToken(s, upstream, deadline, lease.preemption?.signal);
  if (read.kind === 'committed') {
    // From here the answer goes to the client: its slot is kept.
    lease.preemption?.commit();
    return read;
  }
  sent.abort.abort();
  if (read.kind === 'preempted') return preempted(s, lease, upstream.status);
  const durationMs = Date.now() - input.startedAt;
  const ended = (status: number, error: Parameters<typeof finishUnanswered>[1]['error']) => finishUnanswered(s, { replica: replica.id, status, error, spilled, earlyConnect: s.earlyConnect, failOpen: s.failOpen });
  if (read.kind === 'abort') {
    release({ status: upstream.status, error: 'client_abort', durationMs });
    ended(499, 'client_abort');
    return done({ ok: false, failure: { reason: 'client_closed', message: 'Client closed the request' } });
  }
  const why = read.why;
  // vLLM checks X-data-parallel-rank inside the stream's generator: a stale rank is an error event
  // after the 200. As for its 400 form (attempt-step.ts): unpin, go again unpinned, no charge.
  const rankRefused = why === 'in_band_error' && sent.replica.dpRank !== undefined && refusesEngineRankInBand(read.held, sent.replica.dpRank);
  if (rankRefused) memory?.forget(pool.name, input.key);
  if (rankRefused && mayRetry) {
    release({ status: upstream.status, rankRefused: true, retried: true, durationMs });
    s.rankRefused = true;
    logError('origin_rank_refused', new Error(`replica ${replica.id} refused data-parallel rank ${sent.replica.dpRank} in-band`));
    return { kind: 'retry' };
  }
  // A stale rank with no attempt left is still not the replica's failure.
  release(rankRefused ? { status: upstream.status, rankRefused: true, durationMs } : { status: upstream.status, error: RELEASE_ERROR[why], retried: mayRetry, durationMs });
  memory?.forget(pool.name, input.key);
  exclude.push(replica.id);
  // The request id (the trace line's) ties the retry to its request: the fault run counts them so.
  logError('before_first_token', new Error(`request ${input.requestId}: replica ${replica.id} answered ${upstream.status}, then ${WHAT[why]} before its first token${mayRetry ? '; retried on another replica' : ''}`));
  s.lastFailure =
    why === 'timeout'
      ? { reason: 'upstream_timeout', message: `No replica sent a first token within ${config.firstTokenTimeoutMs} ms (firstTokenTimeoutMs); retry later` }
      : { reason: 'upstream_unavailable', message: 'No replica could serve the request; retry later' };
  if (mayRetry) return { kind: 'retry' };
  ended(why === 'timeout' ? 504 : 502, s.lastFailure.reason);
  return done({ ok: false, failure: { ...s.lastFailure, retryAfterSeconds: config.retryAfterSeconds } });
}

/**
 * Whether one of the held events is vLLM's refusal of `rank`: `data: {"error":{"message":
 * "data_parallel_rank …"}}` on Chat Completions and Completions, or on the Messages API the
 * converter's `event: error` that carries what pydantic kept of it (refusesEngineRankConverted).
 */
function refusesEngineRankInBand(held: Uint8Array, rank: number): boolean {
  for (const line of new TextDecoder().decode(held).split(/\r\n|\r|\n/)) {
    if (!line.startsWith('data:')) continue;
    const data = line.slice(5).trim();
    if (refusesEngineRank(data, rank) || refusesEngineRankConverted(data)) return true;
  }
  return false;
}

