// Continuing a streamed answer that broke after its first token (issue #28): what a dialect must
// provide (the answer so far, the continuation's body, the splice of its stream into the
// client's), and the tap that spans the segments of one spliced answer. Pure: no I/O.

import { parseObject, type BodyTap, type EventReader, type TapUsage } from './sse-tap.js';

/** Characters of forwarded events an answer holds unread (AnswerBase.recordLater). */
const MAX_PENDING_CHARS = 64 * 1024;

/** How a stream broke after its first token (`preempted`: flow control paused it, flowControl.preemptStreams). */
export type BreakWhy = 'in_band_error' | 'idle_timeout' | 'stream_error' | 'preempted';

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
  /** The origin path the continuation is sent to, when not the request's own (Anthropic Messages continue through Chat Completions). */
  readonly continuationPath?: string;
  /** Completion tokens delivered so far, and how they were counted. */
  delivered(): { tokens: number; from: 'usage' | 'deltas' };
  /**
   * Of those, the tokens the last continuation body gave back to be generated again (a stop string
   * begun at the seam, seamHoldback): they are not prefilled, and not delivered twice.
   */
  heldBack?(): number;
}

/**
 * What every dialect's AnswerContinuation keeps alike: whether the segment now streaming ended in
 * an in-band error event after its first token (dropped from the client's stream), and its message.
 */
export abstract class AnswerBase {
  #errored = false;
  #errorMessage: string | null = null;
  // The forwarded events not yet read into the answer (name, data), and their characters.
  #pending: [string | null, string][] = [];
  #pendingChars = 0;

  /** The dialect's reading of one event the client received (its data parsed): the answer so far. */
  protected abstract recordEvent(name: string | null, obj: Record<string, unknown>): void;

  /**
   * An event the client received, read into the answer later: only a break (continueStep, a pause
   * for flow control) ever asks what the answer so far is, so a stream that ends normally never
   * parses its events past the first token (the parse per event was the largest share of the
   * router's own CPU per request after the copy itself: docs/benchmarks.md, #31). At most
   * MAX_PENDING_CHARS wait, so a long answer's memory stays bounded: past it they are read now.
   */
  protected recordLater(name: string | null, data: string): void {
    this.#pending.push([name, data]);
    this.#pendingChars += data.length;
    if (this.#pendingChars > MAX_PENDING_CHARS) this.catchUp();
  }

  /** Reads the waiting events into the answer, in order: call before anything reads the answer. */
  protected catchUp(): void {
    if (this.#pending.length === 0) return;
    const pending = this.#pending;
    this.#pending = [];
    this.#pendingChars = 0;
    for (const [name, data] of pending) {
      const obj = parseObject(data);
      if (obj !== null) this.recordEvent(name, obj);
    }
  }

  get errored(): boolean {
    return this.#errored;
  }
  get errorMessage(): string | null {
    return this.#errorMessage;
  }

  /** observe() starts a segment: no error in it yet. */
  protected startSegment(): void {
    this.catchUp();
    this.#errored = false;
    this.#errorMessage = null;
  }

  /** The segment's in-band error event (`event`: its data parsed) after its first token: continued, or ended with the router's event passing its message on. */
  protected segmentErrored(event: Record<string, unknown> | null): void {
    this.#errored = true;
    this.#errorMessage = inBandErrorMessage(event);
  }
}

/** An engine's in-band error event's message (`error.message`, or a flat `message`), at most 500 characters. */
export function inBandErrorMessage(event: Record<string, unknown> | null): string | null {
  if (event === null) return null;
  const e = event.error;
  const m = e !== null && typeof e === 'object' && !Array.isArray(e) ? (e as Record<string, unknown>).message : event.message;
  return typeof m === 'string' ? m.slice(0, 500) : null;
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

/**
 * Stop strings across the seam. An engine checks its stop strings against its own output only
 * (vLLM: vllm/v1/engine/detokenizer.py `check_stop_strings` over the output text), so a stop string
 * whose start the client already has (the delivered text ends in a proper prefix of it) and whose
 * end the continuation would write is never seen by the continuing engine. vLLM holds back the
 * last len(stop) - 1 characters of a stream for this (its `stop_buffer_length`), but not with
 * `include_stop_str_in_output`, and other engines differ. So the continuation gives back the
 * fewest trailing deltas that cover such a prefix: they are left out of the prefill, the engine
 * generates them again (the same tokens at temperature 0) and sees the whole stop string in its
 * own output, and the splice swallows the regenerated text the client already has.
 * Returns how many trailing deltas to give back (0: none).
 */
export function seamHoldback(deltas: readonly string[], stops: readonly string[]): number {
  const text = deltas.join('');
  let m = 0;
  for (const stop of stops) {
    for (let len = Math.min(stop.length - 1, text.length); len > m; len--) {
      if (text.endsWith(stop.slice(0, len))) {
        m = len;
        break;
      }
    }
  }
  if (m === 0) return 0;
  let k = 0;
  for (let covered = 0; covered < m && k < deltas.length; k++) covered += deltas[deltas.length - 1 - k]!.length;
  return k;
}

/** The regenerated text the client already has (seamHoldback), swallowed from the continuation's first deltas. */
export class Swallow {
  #left: string;
  constructor(text: string) {
    this.#left = text;
  }
  /** What of `delta` goes to the client. */
  take(delta: string): string {
    if (this.#left.length === 0) return delta;
    const n = Math.min(this.#left.length, delta.length);
    // At temperature 0 the engine writes the same text again; if it does not, what differs is new.
    let same = 0;
    while (same < n && delta.charCodeAt(same) === this.#left.charCodeAt(same)) same++;
    if (same < n) {
      this.#left = '';
      return delta.slice(same);
    }
    this.#left = this.#left.slice(n);
    return delta.slice(n);
  }
}

/** The stop strings of a request's `stop` field (a string or a list of strings). */
export function stopList(v: unknown): string[] {
  if (typeof v === 'string') return v === '' ? [] : [v];
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string' && x !== '') : [];
}

/**
 * A splice from SSE events: the continuation's bytes cut into complete events (WHATWG framing: an
 * empty line ends one), each rewritten by `rewrite` (null: dropped; a string is written followed
 * by a blank line, so it may hold several events). Holds at most the current partial event.
 */
export function eventSplice(rewrite: (event: string, data: string | null) => string | null): (chunk: Uint8Array | null) => Uint8Array {
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let buf = '';
  const one = (event: string): string => {
    const lines = event.split(/\r\n|\r|\n/);
    const data = lines.filter((l) => l.startsWith('data:')).map((l) => l.slice(l.charCodeAt(5) === 0x20 ? 6 : 5));
    const out = rewrite(event, data.length === 1 ? data[0]! : null);
    return out === null ? '' : `${out}\n\n`;
  };
  return (chunk) => {
    buf += chunk === null ? decoder.decode() : decoder.decode(chunk, { stream: true });
    let out = '';
    for (;;) {
      const m = /\r\n\r\n|\n\n|\r\r/.exec(buf);
      if (m === null) break;
      const event = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      out += one(event);
    }
    if (chunk === null && buf.length > 0) {
      out += one(buf);
      buf = '';
    }
    return encoder.encode(out);
  };
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
