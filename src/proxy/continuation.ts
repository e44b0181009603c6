// Continuing a streamed answer that broke after its first token (issue #28): what a dialect must
// provide (the answer so far, the continuation's body, the splice of its stream into the
// client's), and the tap that spans the segments of one spliced answer. Pure: no I/O.

import type { BodyTap, EventReader, TapUsage } from './sse-tap.js';

/** How a stream broke after its first token. */
export type BreakWhy = 'in_band_error' | 'idle_timeout' | 'stream_error';

/**
 * One request's answer as the client has received it, and how to continue it elsewhere; one per
 * request, shared by its segments. Made by the dialect (UpstreamDialect.continuation).
 */
export interface AnswerContinuation {
  /**
   * Why this answer cannot be continued now, or null: the request's shape (n > 1, logprobs,
   * response_format, guided decoding…) or what has streamed so far (tool calls, reasoning, the
   * finish already sent).
   */
  refusal(): string | null;
  /**
   * Wraps an attempt's event reader: records the answer as the client gets it and drops an
   * in-band error event after the first token (and what follows it): the break is continued
   * invisibly, or ended with the router's event saying why not (`errored` says it happened).
   */
  observe(inner: EventReader): EventReader;
  /** The current segment ended with an in-band error event after its first token, dropped from the client's stream. */
  readonly errored: boolean;
  /** That event's message, passed on in the router's own error event when the answer is not continued. */
  readonly errorMessage: string | null;
  /** The upstream body asking another replica to continue the answer, from the first attempt's. */
  continuationBody(prepared: string): string;
  /** Rewrites the continuation's upstream SSE bytes into the client's stream (ids, role chunk, usage). */
  splice(): (chunk: Uint8Array | null) => Uint8Array;
  /** Completion tokens delivered so far, and how they were counted. */
  delivered(): { tokens: number; from: 'usage' | 'deltas' };
}

/**
 * The tap of a spliced answer: the current segment's tap does the work; TTFT is the first
 * segment's, usage the last one any segment reported (the continuation's is rewritten to the
 * whole answer's by the splice).
 */
export class SplicedTap implements BodyTap {
  #cur: BodyTap;
  readonly #firstContentAt: number | null;
  #usage: TapUsage | null;

  constructor(first: BodyTap) {
    this.#cur = first;
    this.#firstContentAt = first.firstContentAt;
    this.#usage = null;
  }

  /** The next segment's tap takes over. */
  next(tap: BodyTap): void {
    this.#usage = this.#cur.usage ?? this.#usage;
    this.#cur = tap;
  }

  push(chunk: Uint8Array): Uint8Array {
    return this.#cur.push(chunk);
  }
  end(): Uint8Array {
    return this.#cur.end();
  }
  get firstContentAt(): number | null {
    return this.#firstContentAt ?? this.#cur.firstContentAt;
  }
  get usage(): TapUsage | null {
    return this.#cur.usage ?? this.#usage;
  }
  get sawDone(): boolean {
    return this.#cur.sawDone;
  }
  get sawError(): boolean {
    return this.#cur.sawError;
  }
  get responseId(): string | null {
    return this.#cur.responseId;
  }
  get responseStored(): boolean | null {
    return this.#cur.responseStored ?? null;
  }
  errorEvent(message: string, type: string, code: string): Uint8Array {
    return this.#cur.errorEvent(message, type, code);
  }
}

/** A pull-through transform of a body's bytes (the splice) as a ReadableStream. */
export function transformBody(body: ReadableStream<Uint8Array>, f: (chunk: Uint8Array | null) => Uint8Array): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      for (;;) {
        const r = await reader.read();
        if (r.done) {
          const tail = f(null);
          if (tail.byteLength > 0) controller.enqueue(tail);
          controller.close();
          return;
        }
        const out = f(r.value);
        if (out.byteLength > 0) {
          controller.enqueue(out);
          return;
        }
      }
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}
