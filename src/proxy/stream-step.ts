// The stream step of forward(): the answer's body through the tap (TTFT, usage) to the client,
// copied without buffering inside `waitUntil` so the lease is settled however the stream ends;
// every read and write raced against the idle and stall limits and the client's abort signal. A
// streamed answer arrives here committed (first-token.ts): its held preamble goes out first.
// I/O: the upstream body and the client's stream.

import type { RouterConfig } from '../config.js';
import type { ReleaseError } from '../coordinator/stats.js';
import type { Upstream } from './attempt-step.js';
import type { Attempts, ForwardResult, Leased } from './forward.js';
import { logError, settleContinued, settleStep } from './finish.js';
import { proxiedResponseHeaders } from './origin-response.js';
import { keepsIdle, type BodyTap } from './sse-tap.js';
import { StreamWatchdog } from './watchdog.js';
import { UpstreamReader } from './upstream-reader.js';
import { newTap, type Committed } from './first-token.js';
import { SplicedTap, type BreakWhy } from './continuation.js';
import { continueStep } from './continue-step.js';

/**
 * The stream step: the answer's body through the tap (TTFT, usage) to the client, copied inside
 * `waitUntil` so the lease is settled however the stream ends.
 */
export function streamStep(s: Attempts, lease: Leased, sent: Upstream, upstream: Response, committed: Committed | null): ForwardResult {
  const { input } = s;
  const { config } = input;
  const first = committed?.tap ?? newTap(s);
  // The segment now streaming (the first answer, then each continuation): settled once, the last.
  const seg = { lease, sent, upstream };
  const tap = committed ? new SplicedTap(first) : first;
  // workerd's native byte pipe: cheaper per chunk than a JavaScript TransformStream, and a
  // write still settles only as the client takes the bytes (the stall watchdog relies on it).
  const { readable, writable } = new IdentityTransformStream();
  const out = proxiedResponseHeaders({ sse: s.stream, requestId: input.requestId, replica: config.replicaHeader ? lease.replica.id : null });
  // Flow control may pause this stream for a tenant below its share (flowControl.preemptStreams):
  // its upstream is aborted (vLLM frees the sequence when its client goes away), the copy loop sees
  // the break as `preempted`, and the continue step resumes the answer when a slot is its tenant's
  // again. Only while it can be continued then: once, the first segment, the client still there.
  let paused = false;
  if (committed && lease.preemption && input.pool.flowControl.preemptStreams) {
    lease.preemption.pausable(() => {
      const c = s.continuation;
      // Asked once at most (AttemptPreemption); after a break's continuation the lease is another's.
      if (seg.lease !== lease || input.request.signal.aborted || !c || c.refusal() !== null || s.continuationTries >= config.maxContinuations || Date.now() >= input.startedAt + config.maxStreamMs) return false;
      paused = true;
      seg.sent.abort.abort();
      return true;
    });
  }
  input.waitUntil(
    copyBody({
      reader: committed ? committed.reader : upstream.body ? new UpstreamReader(upstream.body) : undefined,
      held: committed?.held ?? null,
      writable,
      tap,
      stream: s.stream,
      config,
      clientSignal: input.request.signal,
      abortUpstream: () => seg.sent.abort.abort(),
      // The longest stream allowed ends before the coordinator's lease deadline reaps the lease.
      deadline: input.startedAt + config.maxStreamMs,
      // Only a committed stream (past its first token) is continued; the continuation splices in.
      resume: committed
        ? async (why, lastWriteAt) => {
            // The pause is this segment's (it is never asked twice: AttemptPreemption answers once).
            paused = false;
            const r = await continueStep(s, { lease: seg.lease, upstream: seg.upstream, tap, why, lastWriteAt });
            if (r.kind === 'not') return r.reason;
            seg.lease = r.lease;
            seg.sent = r.sent;
            seg.upstream = r.upstream;
            (tap as SplicedTap).next(r.committed.tap);
            return { reader: r.committed.reader, held: r.committed.held };
          }
        : undefined,
      errored: () => (s.continuation?.errored === true ? s.continuation.errorMessage ?? '' : null),
      paused: () => paused,
    }).then(({ end, settled }) => (settled ? settleContinued(s, seg.lease, seg.upstream, tap, end) : settleStep(s, seg.lease, seg.upstream, tap, end))),
  );
  return { ok: true, response: new Response(readable, { status: upstream.status, headers: out }) };
}

interface CopyInput {
  /** The body's reader (undefined: no body), already past the held preamble when committed. */
  reader: UpstreamReader | undefined;
  /** What the tap passed before the commit (first-token.ts), written before anything else. */
  held: Uint8Array | null;
  writable: WritableStream<ArrayBuffer | ArrayBufferView>;
  tap: BodyTap;
  stream: boolean;
  config: RouterConfig;
  clientSignal: AbortSignal;
  abortUpstream: () => void;
  /** Epoch ms at which the stream is cut (`maxStreamMs` after the request arrived). */
  deadline: number;
  /**
   * A break after the first token: the continuation's reader and held bytes, or why there is none
   * (the broken segment's lease is settled either way).
   */
  resume?: (why: BreakWhy, lastWriteAt: number) => Promise<{ reader: UpstreamReader | undefined; held: Uint8Array } | string>;
  /** The segment's stream ended in an in-band error event the continuation's reader dropped: its message (null: none). */
  errored: () => string | null;
  /** Flow control paused the stream (its upstream aborted): the break that follows is `preempted`. */
  paused: () => boolean;
}


/**
 * Copy upstream → client. Every read must settle within the idle timeout and every write within
 * the client stall window (a write that does not complete means nobody is reading), and the
 * client's abort signal ends either wait at once: one watchdog per stream keeps that without a
 * timer per chunk. Resolves with how it ended (undefined = completed normally).
 */
async function copyBody(c: CopyInput): Promise<{ end: ReleaseError | undefined; settled: boolean }> {
  const writer = c.writable.getWriter();
  let reader = c.reader;
  const watch = new StreamWatchdog(c.clientSignal, [c.config.idleTimeoutMs, c.config.clientStallMs]);
  let end: ReleaseError | undefined;
  // A break not continued: its segment's lease was settled by the continue step.
  let settled = false;
  let lastWriteAt = Date.now();
  // The idle clock: the last read that carried more than SSE comments (keepsIdle).
  let lastProgressAt = Date.now();
  const write = async (bytes: Uint8Array): Promise<boolean> => {
    if (bytes.byteLength === 0) return true;
    const w = await watch.wait(writer.write(bytes), c.config.clientStallMs);
    // A keep-alive comment is not an answer's bytes: the continuation gap counts from the last content.
    if (w.kind === 'value' && !(c.stream && keepsIdle(bytes))) lastWriteAt = Date.now();
    return w.kind === 'value';
  };
  // A break after the first token: continued (the loop goes on with the new segment's reader), or
  // the error event, saying why it was not continued when the answer could have been.
  const broke = async (why: BreakWhy, msg: string, code: string, release: ReleaseError): Promise<'continued' | 'ended'> => {
    c.abortUpstream();
    if (reader) void reader.cancel().catch(() => {});
    const flushed = c.tap.end();
    if (!c.resume) {
      end = release;
      if (c.stream) await write(concat(flushed, c.tap.errorEvent(msg, 'server_error', code)));
      return 'ended';
    }
    const r = await c.resume(why, lastWriteAt);
    if (typeof r !== 'string') {
      reader = r.reader;
      if (!(await write(r.held))) {
        end = 'client_abort';
        return 'ended';
      }
      return 'continued';
    }
    end = release;
    settled = true;
    if (c.stream) await write(concat(flushed, c.tap.errorEvent(`${msg} (not continued on another replica: ${r})`, 'server_error', code)));
    return 'ended';
  };
  try {
    if (c.held && !(await write(c.held))) {
      end = 'client_abort';
      return { end, settled };
    }
    for (;;) {
      if (!reader) {
        end = (await write(c.tap.end())) ? undefined : 'client_abort';
        break;
      }
      const left = c.deadline - Date.now();
      const idleLeft = c.config.idleTimeoutMs - (Date.now() - lastProgressAt);
      const r = await watch.wait(reader.read(), Math.max(0, Math.min(idleLeft, left)));
      if (r.kind === 'abort') {
        end = 'client_abort';
        break;
      }
      if (r.kind === 'timeout' && Date.now() >= c.deadline) {
        end = 'max_duration';
        const flushed = c.tap.end();
        if (c.stream) await write(concat(flushed, c.tap.errorEvent(`Stream exceeded the longest allowed duration of ${c.config.maxStreamMs} ms`, 'server_error', 'stream_too_long')));
        break;
      }
      // Paused by flow control: whatever the aborted upstream's read gave (an error, its end, the
      // bytes it still held, which never reach the client), the answer goes on from what was sent.
      if (c.paused() && !(r.kind === 'value' && r.value.done && c.tap.sawDone)) {
        if ((await broke('preempted', 'Paused for another tenant and not resumed', 'upstream_unavailable', 'stream_error')) === 'continued') {
          lastProgressAt = Date.now();
          continue;
        }
        break;
      }
      if (r.kind === 'timeout' || r.kind === 'error') {
        const out = r.kind === 'timeout' ? await broke('idle_timeout', `Replica sent nothing (keep-alive comments aside) for ${c.config.idleTimeoutMs} ms`, 'upstream_timeout', 'idle_timeout') : await broke('stream_error', 'Replica connection failed mid-response', 'upstream_unavailable', 'stream_error');
        if (out === 'continued') {
          lastProgressAt = Date.now();
          continue;
        }
        break;
      }
      if (r.value.done) {
        // A stream that ended on a dropped in-band error event broke there.
        const failed = c.errored();
        if (failed !== null) {
          if ((await broke('in_band_error', inBandMessage(failed), 'upstream_unavailable', 'upstream_5xx')) === 'continued') continue;
          break;
        }
        if (!(await write(c.tap.end()))) end = 'client_abort';
        break;
      }
      if (!c.stream || !keepsIdle(r.value.value)) lastProgressAt = Date.now();
      const out = c.tap.push(r.value.value);
      // The write must be taken before the next read reuses the buffer `out` may view.
      if (!(await write(out))) {
        end = 'client_abort';
        break;
      }
      const failed = c.errored();
      if (failed !== null) {
        if ((await broke('in_band_error', inBandMessage(failed), 'upstream_unavailable', 'upstream_5xx')) === 'continued') continue;
        break;
      }
    }
  } catch (e) {
    end = 'stream_error';
    logError('copy_failed', e);
  } finally {
    watch.dispose();
    // A body read to its end needs no abort or cancel (each fired events and cost CPU per request).
    if (end !== undefined && !settled) {
      c.abortUpstream();
      if (reader) void reader.cancel().catch(() => {});
    }
    // Never await abort() while a write may be stalled: it can hang (WORKERD-NOTES.md).
    if (end === 'client_abort') void writer.abort().catch(() => {});
    else void writer.close().catch(() => {});
  }
  return { end, settled };
}

function inBandMessage(engine: string): string {
  return engine ? `Replica failed mid-response: ${engine}` : 'Replica failed mid-response';
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.byteLength === 0) return b;
  const out = new Uint8Array(a.byteLength + b.byteLength);
  out.set(a, 0);
  out.set(b, a.byteLength);
  return out;
}
