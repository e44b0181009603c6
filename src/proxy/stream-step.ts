// The stream step of forward(): the answer's body through the tap (TTFT, usage) to the client,
// copied without buffering inside `waitUntil` so the lease is settled however the stream ends;
// every read and write raced against the idle and stall limits and the client's abort signal.
// I/O: the upstream body and the client's stream.

import type { RouterConfig } from '../config.js';
import type { ReleaseError } from '../coordinator/stats.js';
import type { Upstream } from './attempt-step.js';
import type { Attempts, ForwardResult, Leased } from './forward.js';
import { logError, settleStep } from './finish.js';
import { proxiedResponseHeaders } from './origin-response.js';
import { ResponseTap, type BodyTap } from './sse-tap.js';
import { StreamWatchdog } from './watchdog.js';

/**
 * The stream step: the answer's body through the tap (TTFT, usage) to the client, copied inside
 * `waitUntil` so the lease is settled however the stream ends.
 */
export function streamStep(s: Attempts, lease: Leased, sent: Upstream, upstream: Response): ForwardResult {
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
