// The continue step of forward(): a streamed answer broke after its first token (connection lost,
// an in-band error event, silence beyond idleTimeoutMs). While the client is there, the answer
// can be continued (continuation.ts) and maxContinuations allows, another replica is leased (the
// coordinator's pick for the same routing key and prompt blocks, the broken replicas excluded)
// and asked to continue the answer; its stream, past its first token, is spliced into the
// client's. The broken replica's lease is released as a failure, charged like any. A stream flow
// control paused (`preempted`, flowControl.preemptStreams) is resumed the same way, except that its
// replica is not charged, excluded or forgotten (it did nothing wrong and holds the prefix), and its
// acquire waits in the queue ahead of its tenant's other requests. I/O: through the acquire,
// attempt and first-token steps (coordinator RPCs, origin fetches).

import type { ReleaseError } from '../coordinator/stats.js';
import { acquireStep } from './acquire-step.js';
import { attemptStep, type Upstream } from './attempt-step.js';
import type { BreakWhy } from './continuation.js';
import { transformBody } from './continuation.js';
import { firstTokenStep, type Committed } from './first-token.js';
import type { Attempts, Leased } from './forward.js';
import { logError } from './finish.js';
import type { BodyTap } from './sse-tap.js';

export type Resumed = { kind: 'continued'; lease: Leased; sent: Upstream; upstream: Response; committed: Committed } | { kind: 'not'; reason: string };

const RELEASE_ERROR: Record<Exclude<BreakWhy, 'preempted'>, ReleaseError> = { in_band_error: 'upstream_5xx', idle_timeout: 'idle_timeout', stream_error: 'stream_error' };

/** A break the stream ended on: the segment's lease, its answer and tap, how it broke, when its last bytes reached the client. */
export interface Broken {
  lease: Leased;
  upstream: Response;
  tap: BodyTap;
  why: BreakWhy;
  lastWriteAt: number;
}

/**
 * Continue a broken answer on another replica, or say why not. Every try counts against
 * `maxContinuations` (a continuation that fails before its first token is charged to its replica
 * and the next try goes elsewhere); the client's wait from its last bytes to the continuation's
 * first token is added to `s.continuationGapMs`.
 */
export async function continueStep(s: Attempts, broken: Broken): Promise<Resumed> {
  const { input } = s;
  const { config, pool } = input;
  const c = s.continuation;
  // The tokens this segment's replica produced: the answer at the break less where the segment began.
  const own = Math.max(0, (c?.delivered().tokens ?? 0) - s.segmentStart);
  const paused = broken.why === 'preempted';
  let settled = false;
  const settleBroken = (outcome: string) => {
    if (settled) return;
    settled = true;
    // Continued or paused, the answer goes on; any other outcome ends the request here.
    const ends = outcome !== 'continued' && outcome !== 'paused';
    broken.lease.release({
      status: broken.upstream.status,
      // A pause is flow control's doing: not the replica's failure (stats.ts recordOutcome).
      ...(broken.why === 'preempted' ? { preempted: true } : { error: RELEASE_ERROR[broken.why] }),
      ttftMs: broken.tap.firstContentAt === null ? null : broken.tap.firstContentAt - input.startedAt,
      durationMs: Date.now() - input.startedAt,
      continuation: outcome,
      // Not continued: this release ends the request, so it carries what the stream reported (a
      // continued or paused one's usage comes spliced at the end) and earlier continuations' re-prefill.
      // Each replica is credited the tokens it produced (the request's are billed once, at its end).
      ...(ends
        ? { promptTokens: broken.tap.usage?.promptTokens ?? null, cachedTokens: broken.tap.usage?.cachedTokens ?? null, completionTokens: s.continued > 0 ? own : broken.tap.usage?.completionTokens ?? null }
        : { completionTokens: own }),
      ...(ends && s.reprefillTokens > 0 ? { reprefillTokens: s.reprefillTokens } : {}),
    });
  };
  if (paused) {
    // The slot goes back now, to the request flow control paused this stream for: the continuation
    // queues for one of its own (ahead of its tenant's other requests). Its segment is settled here,
    // as `paused`, with the tokens it produced; whether the answer resumed is the trace line's.
    s.preempted++;
    settleBroken('paused');
  } else {
    s.exclude.push(broken.lease.replica.id);
    s.memory?.forget(pool.name, input.key);
  }
  // The longest stream allowed (maxStreamMs) bounds its continuations too: no try starts past it,
  // and a try's headers and first token are awaited only until then.
  const streamDeadline = input.startedAt + config.maxStreamMs;
  const refused = !c ? (config.maxContinuations === 0 ? 'disabled' : 'api') : c.refusal();
  const reason = refused ?? (s.continuationTries >= config.maxContinuations ? 'max_continuations' : input.request.signal.aborted ? 'client_gone' : Date.now() >= streamDeadline ? 'max_duration' : null);
  const lastSegment = () => {
    if (s.continued > 0) s.segments.push({ replica: broken.lease.replica.id, completionTokens: own });
  };
  if (reason !== null || !c) {
    lastSegment();
    settleBroken(`not_attempted_${reason ?? 'api'}`);
    s.notContinued = reason ?? 'api';
    return { kind: 'not', reason: reason ?? 'api' };
  }
  // The continuation's attempts answer to the stream already under way: their refusals must not
  // finish the request (it finishes once, in the settle step), spill to another region or await a
  // quota; nothing is pinned or recorded by a response id (a continued Responses answer is never stored).
  const cs: Attempts = { ...s, continuing: true, ...(paused ? { resuming: true as const } : {}), input: { ...input, path: c.continuationPath ?? input.path, onFinish: () => {}, canSpill: false, admitted: undefined, pinResponseId: undefined, recordResponseId: undefined }, prepared: { body: c.continuationBody(s.prepared.body), stripUsageChunk: s.prepared.stripUsageChunk }, lastFailure: null };
  // The answer so far: what each continuation prefills again on top of the prompt.
  const sent = c.delivered().tokens - (c.heldBack?.() ?? 0);
  let why = 'no_replica';
  while (s.continuationTries < config.maxContinuations) {
    if (input.request.signal.aborted) {
      why = 'client_gone';
      break;
    }
    const left = streamDeadline - Date.now();
    if (left <= 0) {
      why = 'max_duration';
      break;
    }
    cs.answerTimeoutMs = Math.min(s.answerTimeoutMs, left);
    s.continuationTries++;
    cs.attempts = ++s.attempts;
    const leased = await acquireStep(cs);
    if (leased.kind === 'done') {
      // The coordinator restarted while the continuation waited in its queue (a paused stream
      // waits there): its place is lost, not the answer; the next try queues again.
      if (!leased.result.ok && leased.result.failure.reason === 'queue_lost') {
        why = 'queue_lost';
        continue;
      }
      why = 'no_replica';
      break;
    }
    // One try per continuation: a failure before its first token goes on to the next try, if any.
    const lease: Leased = { ...leased, mayRetry: true };
    const answer = await attemptStep(cs, lease);
    if (answer.kind === 'retry') {
      why = Date.now() >= streamDeadline ? 'max_duration' : 'continuation_failed';
      continue;
    }
    if (answer.kind === 'done') {
      // An origin's 5xx to the continuation (released as upstream_5xx, charged): that replica
      // failed the try, another may not. Its 4xx: the continuation request itself, not another
      // replica's to fix.
      if (!answer.result.ok) {
        // The client left while the try waited for its headers (or the try could not be made).
        why = answer.result.failure.reason === 'client_closed' || input.request.signal.aborted ? 'client_gone' : 'continuation_failed';
        if (why === 'client_gone') break;
        continue;
      }
      if (answer.result.response.status >= 500) {
        void answer.result.response.body?.cancel().catch(() => {});
        s.exclude.push(lease.replica.id);
        why = 'continuation_failed';
        continue;
      }
      why = 'continuation_refused';
      break;
    }
    const body = answer.upstream.body;
    const spliced = new Response(body ? transformBody(body, c.splice()) : null, { status: answer.upstream.status, headers: answer.upstream.headers });
    const first = await firstTokenStep(cs, lease, answer.sent, spliced, answer.deadline);
    if (first.kind === 'retry') {
      why = Date.now() >= streamDeadline ? 'max_duration' : 'continuation_failed';
      continue;
    }
    if (first.kind === 'done') {
      why = input.request.signal.aborted ? 'client_gone' : Date.now() >= streamDeadline ? 'max_duration' : 'continuation_failed';
      if (why === 'client_gone') break;
      continue;
    }
    s.continued++;
    s.continuationGapMs += Date.now() - broken.lastWriteAt;
    s.reprefillTokens += sent;
    s.earlyConnect = cs.earlyConnect;
    s.segments.push({ replica: broken.lease.replica.id, completionTokens: own });
    s.segmentStart = sent;
    settleBroken('continued');
    logError('continued', new Error(`request ${input.requestId}: replica ${broken.lease.replica.id} ${paused ? 'paused by flow control' : `broke (${broken.why})`} after ${sent} tokens (${c.delivered().from}); continued on ${lease.replica.id}`));
    return { kind: 'continued', lease, sent: answer.sent, upstream: spliced, committed: first.committed };
  }
  lastSegment();
  settleBroken(why === 'client_gone' ? 'not_attempted_client_gone' : 'failed');
  s.notContinued = why;
  return { kind: 'not', reason: why };
}
