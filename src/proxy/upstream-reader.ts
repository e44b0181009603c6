// The upstream body's reader: whole HTTP chunks per read where workerd allows it (one isolate
// wake-up per SSE event). No I/O of its own beyond reading the stream it is given.

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
 * One buffer is lent to each read: its bytes view it. A caller that hands them back with `recycle()`
 * once they are written (the copy loop) has the next read reuse it; otherwise the next read gets a
 * new one. `read()` returns workerd's own promise, with no async frame of its own: one promise
 * fewer per event on the stream's hot path. Falls back to a default reader for a non-byte stream.
 */
export class UpstreamReader {
  readonly #byob: ReadableStreamBYOBReader | null;
  readonly #plain: ReadableStreamDefaultReader<Uint8Array> | null;
  #buffer: ArrayBuffer | null = null;

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

  /** The next whole chunk (`done` at the end; a BYOB end may carry an empty view, never bytes). */
  read(): Promise<ReadableStreamReadResult<Uint8Array>> {
    if (this.#plain) return this.#plain.read();
    const buffer = this.#buffer ?? new ArrayBuffer(READ_BUFFER_BYTES);
    this.#buffer = null;
    return this.#byob!.readAtLeast(MIN_READ_BYTES, new Uint8Array(buffer));
  }

  /** The bytes of the last read were written and are no longer needed: the next read reuses their buffer. */
  recycle(bytes: Uint8Array): void {
    if (this.#byob && bytes.buffer.byteLength === READ_BUFFER_BYTES) this.#buffer = bytes.buffer as ArrayBuffer;
  }

  cancel(): Promise<void> {
    return (this.#byob ?? this.#plain)!.cancel();
  }
}
