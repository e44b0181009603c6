// How forward() ends a request: the lease's outcome and the one FinishedRequest (trace log,
// quota settlement) per request, whether an answer streamed to its end or none came. No I/O
// beyond the lease agent's batched release and a log line.

import type { ReleaseError, ReleaseOutcome } from '../coordinator/stats.js';
import { RESPONSES_STORE_FLAG } from '../engines/vllm.js';
import type { Attempts, FinishedRequest, ForwardResult, Leased } from './forward.js';
import type { BodyTap } from './sse-tap.js';

/** A step's last word: the request's result, nothing more to try. */
export type Done = { kind: 'done'; result: ForwardResult };
export const done = (result: ForwardResult): Done => ({ kind: 'done', result });

/** The settle step: the stream's outcome to the lease (stats) and to the trace log, once. */
export function settleStep(s: Attempts, lease: Leased, upstream: Response, tap: BodyTap, end: ReleaseError | undefined): void {
  const { input } = s;
  const ttftMs = tap.firstContentAt === null ? null : tap.firstContentAt - input.startedAt;
  const total = tap.usage?.completionTokens ?? null;
  // A continued answer: this replica produced the tokens from where its segment began (finishedRecord names each).
  const own = s.continued > 0 && total !== null ? Math.max(0, total - s.segmentStart) : total;
  if (s.continued > 0) s.segments.push({ replica: lease.replica.id, completionTokens: own ?? 0 });
  const outcome: ReleaseOutcome = {
    status: upstream.status,
    error: end,
    ttftMs,
    durationMs: Date.now() - input.startedAt,
    promptTokens: tap.usage?.promptTokens ?? null,
    cachedTokens: tap.usage?.cachedTokens ?? null,
    completionTokens: own,
    // Counted apart on the replica that did it (prefix_router_continuation_reprefill_tokens_total), never billed.
    ...(s.reprefillTokens > 0 ? { reprefillTokens: s.reprefillTokens } : {}),
  };
  // Only for a response the router asked to be stored: a `store: false` one (or a retrieve) is never recorded.
  if (input.recordResponseId !== undefined && tap.responseId !== null && tap.responseId !== input.recordResponseId && upstream.ok) outcome.responseId = tap.responseId;
  // Asked to store (the router recorded the id) and the engine says it did not: its store is off.
  const storeOff = input.recordResponseId !== undefined && upstream.ok && tap.responseStored === false;
  if (storeOff) {
    outcome.notStored = tap.responseId ?? input.recordResponseId;
    logError('responses_store_off', new Error(`request ${input.requestId}: replica ${lease.replica.id} answered store: false for response ${outcome.notStored}; its Responses store is off (vLLM: ${RESPONSES_STORE_FLAG}), so no follow-up can use it`));
  }
  lease.release(outcome);
  input.onFinish({ ...finishedRecord(s, lease, upstream, tap, end), ...(storeOff ? { warning: 'responses_store_off' as const } : {}) });
}

/** The request's one FinishedRequest for an answer that reached the client, from its tap. */
function finishedRecord(s: Attempts, lease: Leased, upstream: Response, tap: BodyTap, end: ReleaseError | undefined): FinishedRequest {
  const { input } = s;
  return {
    replica: lease.replica.id,
    status: upstream.status,
    error: end,
    ttftMs: tap.firstContentAt === null ? null : tap.firstContentAt - input.startedAt,
    durationMs: Date.now() - input.startedAt,
    promptTokens: tap.usage?.promptTokens ?? null,
    cachedTokens: tap.usage?.cachedTokens ?? null,
    completionTokens: tap.usage?.completionTokens ?? null,
    retried: s.attempts > 1,
    spilled: lease.spilled,
    attempts: s.attempts,
    matchedBlocks: lease.matchedBlocks,
    earlyConnect: s.earlyConnect,
    ...(s.failOpen ? { failOpen: s.failOpen } : {}),
    ...continuationFields(s),
    ...queueFields(s),
  };
}

/** Flow control: the band and the wait in the coordinator's queue, when the pool has a queue. */
function queueFields(s: Attempts): Partial<FinishedRequest> {
  const q = s.input.queue;
  if (!q) return {};
  return { band: q.band, ...(s.queueMs !== undefined ? { queueMs: s.queueMs } : {}), ...(s.preempted > 0 ? { preempted: s.preempted } : {}) };
}

/** What the trace line says about breaks after the first token: continuations, the client's wait, the re-prefill, a break not continued. */
function continuationFields(s: Attempts): Partial<FinishedRequest> {
  const out: Partial<FinishedRequest> = {};
  if (s.continued > 0) {
    out.continuations = s.continued;
    out.continuationGapMs = s.continuationGapMs;
    out.reprefillTokens = s.reprefillTokens;
  }
  if (s.notContinued !== undefined) out.notContinued = s.notContinued;
  if (s.segments.length > 0) out.segments = s.segments;
  return out;
}

/**
 * A stream that broke after its first token and was not continued: the broken segment's lease is
 * already released (continue-step.ts, with its outcome); only the request's FinishedRequest is left.
 */
export function settleContinued(s: Attempts, lease: Leased, upstream: Response, tap: BodyTap, end: ReleaseError | undefined): void {
  s.input.onFinish(finishedRecord(s, lease, upstream, tap, end));
}

export function logError(type: string, e: unknown): void {
  console.error(JSON.stringify({ type, message: e instanceof Error ? e.message : String(e) }));
}

/** A request that ended before an answer reached the client (refused, failed, cut before the first byte). */
export interface Unanswered {
  replica: string | null;
  status: number;
  error: FinishedRequest['error'];
  /** The attempt's lease spilled past the key's home replica. */
  spilled: boolean;
  earlyConnect: 'hit' | 'miss' | undefined;
  /** Said only where the attempt itself ran open. */
  failOpen?: boolean;
}

/** The FinishedRequest of an unanswered request: no TTFT, no usage; retries counted from `s`. */
export function finishUnanswered(s: Attempts, u: Unanswered): void {
  s.input.onFinish({
    ...(u.failOpen ? { failOpen: u.failOpen } : {}),
    replica: u.replica,
    status: u.status,
    error: u.error,
    ttftMs: null,
    durationMs: Date.now() - s.input.startedAt,
    promptTokens: null,
    cachedTokens: null,
    completionTokens: null,
    retried: s.attempts > 1,
    spilled: u.spilled,
    attempts: s.attempts,
    earlyConnect: u.earlyConnect,
    ...queueFields(s),
  });
}
