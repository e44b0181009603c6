// The tap over an upstream response body: passes bytes through unchanged (dropping only events
// the proxy asked for on the client's behalf, such as the usage-only chunk) and records TTFT,
// token usage, completion and errors on the way. The SSE framing is shared; what an event means is
// the API's `EventReader`, each dialect's in its own folder (http/apis/<dialect>/reader.ts).
// Pure: no I/O, no timers; the clock is passed in.
//
// Framing follows the WHATWG SSE parser (https://html.spec.whatwg.org/multipage/server-sent-events.html):
// lines end in CRLF, LF or CR; an empty line ends an event. The tap scans bytes and decodes an
// event only once it is complete, so a chunk boundary anywhere (inside a CRLF, inside a multi-byte
// UTF-8 character) changes nothing. It holds at most the current partial event, capped at
// `maxEventBytes`; a larger event is forwarded as it arrives, unparsed.

export interface TapOptions {
  /** The upstream body is an SSE stream (`stream: true` in the request). */
  stream: boolean;
  /** Drop the usage-only event (`choices: []` plus `usage`): the proxy asked for it, the client did not. */
  stripUsageChunk: boolean;
  /** The clock, in whatever unit the caller wants back in `firstContentAt`. */
  now: () => number;
  /** How this API's events and bodies are read: the API dialect's own (http/apis/<dialect>/reader.ts). */
  reader: EventReader;
  /** Largest SSE event the tap buffers to inspect (default 1 MiB); a larger one passes unparsed. */
  maxEventBytes?: number;
  /** Non-streaming only: largest body copy kept to read `usage` at EOF (default 4 MiB). */
  maxBodyBytes?: number;
}

export interface TapUsage {
  promptTokens: number;
  completionTokens: number;
  /** Cached prompt tokens as the engine reported them (`usage.prompt_tokens_details.cached_tokens`, llama.cpp's `timings.cache_n`, the dialects' own fields); null when it did not: unknown, never 0 (vLLM needs `--enable-prompt-tokens-details`, SGLang `--enable-cache-report`). */
  cachedTokens: number | null;
}

/**
 * What a tap has learnt so far; an `EventReader` writes into it. Counts are in OpenAI's sense
 * whatever the API: `promptTokens` includes the cached ones.
 */
export interface TapRecord {
  firstContentAt: number | null;
  usage: TapUsage | null;
  sawDone: boolean;
  sawError: boolean;
  /** Responses API: the id of the response the replica made (and may have stored). */
  responseId: string | null;
  /** Responses API: the response object's `store` as the engine answered it (vLLM says false when its store is off). */
  responseStored?: boolean | null;
}

/**
 * One API's reading of its stream and body: the tap frames SSE events and hands each complete
 * one over; the reader records TTFT, usage, completion and errors in `rec` and decides whether the
 * client gets the event. Pure; must not throw on any input (a replica is untrusted).
 */
export interface EventReader {
  /** A complete event carrying data; `name` is its `event:` field (null when absent). */
  event(name: string | null, data: string, rec: TapRecord, now: () => number): 'forward' | 'drop';
  /** Non-streaming: the whole body parsed as a JSON object. */
  body(obj: Record<string, unknown>, rec: TapRecord): void;
  /** The bytes the proxy writes when the upstream stream dies mid-way, in this API's shape. */
  errorEvent(message: string, type: string, code: string): Uint8Array;
}

/** What the proxy needs from a tap over any API's response body (ResponseTap is the one). */
export interface BodyTap {
  push(chunk: Uint8Array): Uint8Array;
  end(): Uint8Array;
  readonly firstContentAt: number | null;
  readonly usage: TapUsage | null;
  readonly sawDone: boolean;
  readonly sawError: boolean;
  readonly responseId: string | null;
  /** Responses API: the engine's `store` on the response it made; null when it did not say. */
  readonly responseStored?: boolean | null;
  errorEvent(message: string, type: string, code: string): Uint8Array;
}

export const DEFAULT_MAX_EVENT_BYTES = 1 << 20;
export const DEFAULT_MAX_BODY_BYTES = 4 << 20;

const LF = 0x0a;
const CR = 0x0d;
const EMPTY = new Uint8Array(0);
// Shared: a non-streaming decode keeps no state between calls, and one per tap cost a
// constructor call per request.
const decoder = new TextDecoder();

/**
 * Feed every upstream chunk to `push()` and write what it returns to the client; call `end()` at
 * upstream EOF and write that too. The getters are meaningful at any point (the proxy reads them
 * in its `finally`, including after a mid-stream failure).
 *
 * Streaming (as the default OpenAI reader records it; other readers document their own):
 * - `firstContentAt`: `now()` when the first event with content passed: chat `delta.content`,
 *   `delta.reasoning_content` or `delta.reasoning` non-empty, or `delta.tool_calls` non-empty;
 *   completions `text` non-empty. vLLM's first chat chunk (role only, content "") does not count.
 *   An oversized (unparsed) event counts as content: a megabyte of model output is content.
 * - `usage`: from the last event whose `usage` is an object. That is the usage-only chunk at the
 *   end, or with `continuous_usage_stats` the running total in every chunk (so a stream cut
 *   short still reports the tokens spent so far).
 * - `sawDone`: a `data: [DONE]` event passed. `sawError`: an event named `error`, or data with a
 *   truthy `error` field (the shape the openai SDK throws on) or vLLM's older flat
 *   `{"object":"error"}`. vLLM sends `[DONE]` after its own error event, so both may be true.
 * - `events`: events carrying a data field (including `[DONE]` and stripped ones); comments and
 *   stray blank lines are forwarded but not counted.
 *
 * Non-streaming: bytes are forwarded as they come; `firstContentAt` is the first byte;
 * `usage`/`sawError` come from parsing a bounded copy at `end()`; `sawDone` is true at `end()`
 * when the body parsed as JSON without an error, or was too large to check.
 */
export class ResponseTap implements BodyTap {
  readonly #stream: boolean;
  readonly #now: () => number;
  readonly #reader: EventReader;
  readonly #maxEvent: number;
  readonly #maxBody: number;

  // The current partial event (streaming) or the body copy (non-streaming), as owned copies.
  #parts: Uint8Array[] = [];
  #partLen = 0;
  // Scanner state. `#lineLen`: bytes of the current line so far. `#prevCR`: the last byte was a CR
  // ending a line, so an LF next is part of the same terminator. `#crlfTail`: that CR also ended an
  // event, so the LF belongs to that event and shares its fate (forwarded or dropped).
  #lineLen = 0;
  #prevCR = false;
  #crlfTail: 'forward' | 'drop' | null = null;
  // The current event outgrew maxEventBytes: it is being forwarded as it arrives.
  #oversized = false;
  #bodyOverflow = false;
  #ended = false;

  readonly #rec: TapRecord = { firstContentAt: null, usage: null, sawDone: false, sawError: false, responseId: null };
  #events = 0;
  #oversizedEvents = 0;

  constructor(opts: TapOptions) {
    this.#stream = opts.stream;
    this.#now = opts.now;
    this.#reader = opts.reader;
    this.#maxEvent = positiveOr(opts.maxEventBytes, DEFAULT_MAX_EVENT_BYTES);
    this.#maxBody = positiveOr(opts.maxBodyBytes, DEFAULT_MAX_BODY_BYTES);
  }

  get firstContentAt(): number | null {
    return this.#rec.firstContentAt;
  }
  get usage(): TapUsage | null {
    return this.#rec.usage;
  }
  get sawDone(): boolean {
    return this.#rec.sawDone;
  }
  get sawError(): boolean {
    return this.#rec.sawError;
  }
  get responseStored(): boolean | null {
    return this.#rec.responseStored ?? null;
  }

  get responseId(): string | null {
    return this.#rec.responseId;
  }

  errorEvent(message: string, type: string, code: string): Uint8Array {
    return this.#reader.errorEvent(message, type, code);
  }
  get events(): number {
    return this.#events;
  }
  /** Events forwarded unparsed because they exceeded `maxEventBytes`. */
  get oversizedEvents(): number {
    return this.#oversizedEvents;
  }

  /** Takes the next upstream chunk; returns the bytes to forward to the client now (maybe empty). */
  push(chunk: Uint8Array): Uint8Array {
    if (this.#ended) throw new Error('ResponseTap: push() after end()');
    if (chunk.length === 0) return EMPTY;
    return this.#stream ? this.#pushStream(chunk) : this.#pushBody(chunk);
  }

  /** Upstream EOF: returns whatever is still held (a trailing event with no blank line after it). */
  end(): Uint8Array {
    if (this.#ended) return EMPTY;
    this.#ended = true;
    if (!this.#stream) {
      this.#finishBody();
      return EMPTY;
    }
    if (this.#oversized) {
      this.#oversized = false;
      return EMPTY;
    }
    if (this.#partLen === 0) return EMPTY;
    // A server that closes without the final blank line still sent this event; treat it as one.
    const parts = this.#takeParts();
    const bytes = concatBytes(parts);
    return this.#inspect(bytes) === 'forward' ? bytes : EMPTY;
  }

  #pushStream(chunk: Uint8Array): Uint8Array {
    const out: Uint8Array[] = [];
    const n = chunk.length;
    let segStart = 0; // start in `chunk` of the bytes of the current event not yet forwarded or held
    // Jump from line terminator to line terminator (native indexOf) rather than testing each byte
    // in JavaScript: a stream is mostly line content. -1 = no such byte in the rest of the chunk.
    let lf = chunk.indexOf(LF);
    let cr = chunk.indexOf(CR);
    let i = 0;
    while (i < n) {
      if (this.#prevCR) {
        this.#prevCR = false;
        if (chunk[i] === LF) {
          if (this.#crlfTail !== null) {
            // i === segStart here: the CR that ended the previous event was the last byte before.
            if (this.#crlfTail === 'forward') out.push(chunk.subarray(i, i + 1));
            this.#crlfTail = null;
            segStart = i + 1;
          }
          i++;
          continue;
        }
      }
      this.#crlfTail = null;
      if (lf !== -1 && lf < i) lf = chunk.indexOf(LF, i);
      if (cr !== -1 && cr < i) cr = chunk.indexOf(CR, i);
      const t = lf === -1 ? cr : cr === -1 ? lf : Math.min(lf, cr);
      if (t === -1) {
        this.#lineLen += n - i;
        break;
      }
      this.#lineLen += t - i;
      const b = chunk[t]!;
      if (b === CR) this.#prevCR = true;
      if (this.#lineLen === 0) {
        // An empty line: the event ends with this byte.
        const fate = this.#completeEvent(chunk.subarray(segStart, t + 1), out);
        if (b === CR) this.#crlfTail = fate;
        segStart = t + 1;
      }
      this.#lineLen = 0;
      i = t + 1;
    }
    if (segStart < chunk.length) {
      const rest = chunk.subarray(segStart);
      if (this.#oversized) {
        out.push(rest);
      } else {
        this.#parts.push(rest.slice());
        this.#partLen += rest.length;
        if (this.#partLen > this.#maxEvent) {
          this.#startOversized();
          out.push(...this.#takeParts());
        }
      }
    }
    return concatBytes(out); // a single piece (often a view of `chunk`) is returned as is
  }

  /** The event whose last bytes are `tail` is complete; appends what to forward to `out`. */
  #completeEvent(tail: Uint8Array, out: Uint8Array[]): 'forward' | 'drop' {
    if (this.#oversized) {
      this.#oversized = false;
      out.push(tail);
      return 'forward';
    }
    if (this.#partLen + tail.length > this.#maxEvent) {
      // Decided by the event's total size alone, so the outcome does not depend on chunking.
      this.#startOversized();
      this.#oversized = false;
      out.push(...this.#takeParts(), tail);
      return 'forward';
    }
    const parts = this.#takeParts();
    const bytes = parts.length === 0 ? tail : concatBytes([...parts, tail]);
    if (this.#inspect(bytes) === 'drop') return 'drop';
    out.push(bytes);
    return 'forward';
  }

  #startOversized(): void {
    this.#oversized = true;
    this.#events++;
    this.#oversizedEvents++;
    if (this.#rec.firstContentAt === null) this.#rec.firstContentAt = this.#now();
  }

  #takeParts(): Uint8Array[] {
    const parts = this.#parts;
    this.#parts = [];
    this.#partLen = 0;
    return parts;
  }

  /** Reads one complete event; records what it says and decides whether the client gets it. */
  #inspect(bytes: Uint8Array): 'forward' | 'drop' {
    const text = decoder.decode(bytes);
    const payload = singleDataLine(text);
    if (payload === null) {
      const data: string[] = [];
      let eventName: string | null = null;
      for (const line of text.split(/\r\n|\r|\n/)) {
        if (line === '' || line.charCodeAt(0) === 0x3a /* ':' comment */) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? '' : line.slice(colon + 1);
        if (value.charCodeAt(0) === 0x20) value = value.slice(1);
        if (field === 'data') data.push(value);
        else if (field === 'event') eventName = value;
      }
      if (eventName === 'error') this.#rec.sawError = true;
      if (data.length === 0) return 'forward';
      this.#events++;
      return this.#reader.event(eventName, data.join('\n'), this.#rec, this.#now);
    }
    this.#events++;
    return this.#reader.event(null, payload, this.#rec, this.#now);
  }

  #pushBody(chunk: Uint8Array): Uint8Array {
    if (this.#rec.firstContentAt === null) this.#rec.firstContentAt = this.#now();
    if (!this.#bodyOverflow) {
      if (this.#partLen + chunk.length > this.#maxBody) {
        this.#bodyOverflow = true;
        this.#takeParts();
      } else {
        this.#parts.push(chunk.slice());
        this.#partLen += chunk.length;
      }
    }
    return chunk;
  }

  #finishBody(): void {
    if (this.#bodyOverflow) {
      this.#rec.sawDone = true;
      return;
    }
    if (this.#partLen === 0) return;
    const obj = parseObject(decoder.decode(concatBytes(this.#takeParts())));
    if (obj !== null) this.#reader.body(obj, this.#rec);
  }
}

/**
 * The SSE bytes the proxy writes when the upstream stream dies mid-way (upstream reset, stall
 * timeout), after which it closes the stream: an OpenAI-shaped error event, then `data: [DONE]`.
 *
 * Why `[DONE]` follows: it is what vLLM itself sends after a mid-stream error (its stream
 * generators `yield "data: [DONE]\n\n"` after `create_streaming_error_response`), so a client sees
 * the same bytes whether the replica or the router gave up. The openai SDK (v6,
 * `core/streaming.mjs` `Stream.fromSSEResponse`) throws `APIError` (no status, `.error` = the
 * object, `.code`/`.type`/`.param` from it, message = `error.message`) as soon as a data event
 * parses to an object with a truthy `error`, and never reads the `[DONE]` after it. The error event
 * is what matters: a stream that just ends without `[DONE]` is a normal completion to that SDK.
 * JSON.stringify escapes CR/LF, so the message cannot break out of its event.
 */
export function sseErrorEvent(message: string, type: string, code: string | number | null): Uint8Array {
  const payload = JSON.stringify({ error: { message, type, param: null, code } });
  return new TextEncoder().encode(`data: ${payload}\n\ndata: [DONE]\n\n`);
}

/** A parsed JSON object (the event readers' currency). */
export type Json = Record<string, unknown>;

/**
 * The payload of the usual event, one `data:` line and its terminators (`data: {...}\n\n`),
 * without splitting the text into lines; null for any other shape (the general parser's job).
 */
function singleDataLine(text: string): string | null {
  if (!text.startsWith('data:')) return null;
  let end = text.length;
  while (end > 5 && (text.charCodeAt(end - 1) === LF || text.charCodeAt(end - 1) === CR)) end--;
  const start = text.charCodeAt(5) === 0x20 ? 6 : 5;
  const nl = text.indexOf('\n', start);
  if ((nl >= 0 && nl < end) || text.lastIndexOf('\r', end - 1) >= start) return null;
  return start >= end ? '' : text.slice(start, end);
}

export function isRecord(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** `text` as a JSON object, or null (not JSON, or not an object). */
export function parseObject(text: string): Json | null {
  try {
    const v: unknown = JSON.parse(text);
    return isRecord(v) ? v : null;
  } catch {
    return null;
  }
}

/** A token count as engines report it: a finite number ≥ 0. */
export function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0;
}

function positiveOr(v: number | undefined, fallback: number): number {
  return v !== undefined && Number.isFinite(v) && v > 0 ? v : fallback;
}

/** The parts as one array: none → empty, one → itself (no copy), more → a new array. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  if (parts.length === 0) return EMPTY;
  if (parts.length === 1) return parts[0]!;
  let len = 0;
  for (const p of parts) len += p.length;
  const out = new Uint8Array(len);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const COMMENTS_ONLY = /^(?:(?::[^\r\n]*)?(?:\r\n|\r|\n))*$/;

/**
 * Whether a read of a stream held nothing but whole SSE comment lines and blank lines: vLLM's
 * `: keep-alive` (--sse-keep-alive-interval, vllm/entrypoints/serve/utils/sse_keep_alive.py),
 * which its API server writes whenever the generator is idle, also while the engine is stuck. It
 * proves the API server's event loop, not the answer's progress, so it does not reset the idle
 * clock (`idleTimeoutMs`); it is forwarded as it came. A comment split across reads counts as
 * progress (never cut for it).
 */
export function keepsIdle(bytes: Uint8Array): boolean {
  if (bytes.byteLength === 0 || bytes[0] !== 0x3a /* ':' */) return false;
  return COMMENTS_ONLY.test(new TextDecoder().decode(bytes));
}
