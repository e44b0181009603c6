// The stream step of forward(): the answer's body through the tap (TTFT, usage) to the client,
// copied without buffering inside `waitUntil` so the lease is settled however the stream ends;
// every read and write raced against the idle and stall limits and the client's abort signal. A
// streamed answer arrives here committed (first-token.ts): its held preamble goes out first.
// I/O: the upstream body and the client's stream.

import type { RouterConfig } from '../config.js';
import type { ReleaseError } from '../coordinator/stats.js';
import type { Upstream } from './attempt-step.js';
import type { Attempts, ForwardResult, Leased } from './forward.js';
import { logError, settleStep } from './finish.js';
import { proxiedResponseHeaders } from './origin-response.js';
import { ResponseTap, type BodyTap } from './sse-tap.js';
import { StreamWatchdog } from './watchdog.js';
import { UpstreamReader } from './upstream-reader.js';
import type { Committed } from './first-token.js';

/**
 * The stream step: the answer's body through the tap (TTFT, usage) to the client, copied inside
 * `waitUntil` so the lease is settled however the stream ends.
 */
export function streamStep(s: Attempts, lease: Leased, sent: Upstream, upstream: Response, committed: Committed | null): ForwardResult {
  const { input } = s;
  const { config } = input;
  const tap = committed?.tap ?? newTap(s);
  // workerd's native byte pipe: cheaper per chunk than a JavaScript TransformStream, and a
  // write still settles only as the client takes the bytes (the stall watchdog relies on it).
  const { readable, writable } = new IdentityTransformStream();
  const out = proxiedResponseHeaders({ sse: s.stream, requestId: input.requestId, replica: config.replicaHeader ? lease.replica.id : null });
  input.waitUntil(
    copyBody({
      reader: committed ? committed.reader : upstream.body ? new UpstreamReader(upstream.body) : undefined,
      held: committed?.held ?? null,
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

/** The tap over one attempt's answer: the dialect's reader, the clock of TTFT. */
export function newTap(s: Attempts): ResponseTap {
  return new ResponseTap({ stream: s.stream, stripUsageChunk: s.prepared.stripUsageChunk, now: Date.now, reader: s.dialect.reader(s.prepared) });
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
}

/**
 * Copy upstream → client. Every read must settle within the idle timeout and every write within
 * the client stall window (a write that does not complete means nobody is reading), and the
 * client's abort signal ends either wait at once: one watchdog per stream keeps that without a
 * timer per chunk. Resolves with how it ended (undefined = completed normally).
 */
async function copyBody(c: CopyInput): Promise<ReleaseError | undefined> {
  const writer = c.writable.getWriter();
  const reader = c.reader;
  const watch = new StreamWatchdog(c.clientSignal, [c.config.idleTimeoutMs, c.config.clientStallMs]);
  let end: ReleaseError | undefined;
  const write = async (bytes: Uint8Array): Promise<boolean> => {
    if (bytes.byteLength === 0) return true;
    const w = await watch.wait(writer.write(bytes), c.config.clientStallMs);
    return w.kind === 'value';
  };
  try {
    if (c.held && !(await write(c.held))) {
      end = 'client_abort';
      return end;
    }
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

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.byteLength === 0) return b;
  const out = new Uint8Array(a.byteLength + b.byteLength);
  out.set(a, 0);
  out.set(b, a.byteLength);
  return out;
}

