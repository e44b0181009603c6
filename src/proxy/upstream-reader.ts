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
 * One buffer is reused: a read's bytes must be written (and the write taken) before the next
 * read, which the copy loop does anyway. Falls back to a default reader for a non-byte stream.
 */
export class UpstreamReader {
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
