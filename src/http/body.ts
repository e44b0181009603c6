// Read and decode a request body, for every API: size limit while streaming it in, strict UTF-8,
// JSON, a nesting-depth cap. Each dialect validates its own fields (http/apis/<dialect>/).
// Failures are tagged values; `errors.ts` turns them into responses.

import { z } from 'zod';
import { MAX_BODY_KEY_CHARS } from '../core/index.js';
import { readUpTo } from '../proxy/bounded-read.js';
import { race } from '../proxy/race.js';
import type { ErrorReason } from './errors.js';

export const MAX_JSON_DEPTH = 64;

export type BodyFailure = { ok: false; reason: ErrorReason; message: string; param?: string };
export type Parsed<T> = { ok: true; value: T; bytes: number } | BodyFailure;

/**
 * Read at most `limit` bytes within `timeoutMs`; a larger body fails before it is all read, and a
 * body that trickles in (or never ends) fails with 408 at the deadline.
 *
 * A body refused for its size is still read and thrown away before the 413, up to
 * `DISCARD_FACTOR × limit` bytes in all and within `timeoutMs` ("lingering close"): answering and
 * closing with unread bytes in the receive buffer makes the kernel reset the connection, and a
 * reset that reaches a client still sending discards the 413 before it is read (a 3 MiB upload on
 * loopback: 9 resets in 10 tries). A body declared larger than that is refused at once.
 */
export async function readLimited(request: Request, limit: number, timeoutMs = 30_000): Promise<{ ok: true; bytes: Uint8Array } | BodyFailure> {
  const declared = request.headers.get('content-length');
  if (declared !== null) {
    if (!/^\d+$/.test(declared)) return { ok: false, reason: 'invalid_request', message: 'Content-Length is not a number' };
    if (Number(declared) > limit) {
      if (request.body && Number(declared) <= limit * DISCARD_FACTOR) await discard(request.body.getReader(), Number(declared), Date.now() + timeoutMs);
      return tooLarge(limit);
    }
  }
  if (!request.body) return { ok: true, bytes: new Uint8Array(0) };
  const reader = request.body.getReader();
  const deadline = Date.now() + timeoutMs;
  // One byte past the limit is enough to know the body is too large.
  const r = await readUpTo(reader, limit + 1, deadline);
  if (r.kind !== 'read') {
    void reader.cancel().catch(() => {});
    if (r.kind === 'timeout') return { ok: false, reason: 'request_timeout', message: `The request body was not received within ${timeoutMs} ms` };
    return { ok: false, reason: 'invalid_request', message: 'The request body could not be read' };
  }
  if (!r.ended) {
    await discard(reader, limit * DISCARD_FACTOR - r.total, deadline);
    return tooLarge(limit);
  }
  return { ok: true, bytes: r.bytes };
}

/** How much of a refused body is read and thrown away before the 413, as a multiple of the limit. */
const DISCARD_FACTOR = 4;

/** Read and drop up to `maxBytes` more before `deadline`, then cancel whatever is left. Never rejects. */
async function discard(reader: ReadableStreamDefaultReader<Uint8Array>, maxBytes: number, deadline: number): Promise<void> {
  let left = maxBytes;
  try {
    while (left > 0) {
      const r = await race(reader.read(), Math.max(0, deadline - Date.now()));
      if (r.kind !== 'value' || r.value.done) break;
      left -= r.value.value.byteLength;
    }
  } catch {
    // the client went away: nothing left to drain
  }
  void reader.cancel().catch(() => {});
}

function tooLarge(limit: number): BodyFailure {
  return { ok: false, reason: 'body_too_large', message: `Request body exceeds the limit of ${limit} bytes` };
}

const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });

/** Strict UTF-8 decode and JSON parse of an object body with a depth cap. */
export function parseJsonObject(bytes: Uint8Array): Parsed<Record<string, unknown>> {
  let text: string;
  try {
    text = decoder.decode(bytes);
  } catch {
    return { ok: false, reason: 'invalid_encoding', message: 'Request body is not valid UTF-8' };
  }
  if (text.trim() === '') return { ok: false, reason: 'invalid_json', message: 'Request body is empty; expected a JSON object' };
  // Depth is checked on the text before parsing so a deeply nested body never reaches a recursive walk.
  if (exceedsDepth(text, MAX_JSON_DEPTH)) return { ok: false, reason: 'invalid_json', message: `JSON nesting exceeds ${MAX_JSON_DEPTH} levels` };
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { ok: false, reason: 'invalid_json', message: `Request body is not valid JSON: ${(e as Error).message.slice(0, 120)}` };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return { ok: false, reason: 'invalid_json', message: 'Request body must be a JSON object' };
  // `1e400` parses to Infinity, which JSON.stringify would forward as `null`: refuse it instead.
  if (hasNonFiniteNumber(value)) return { ok: false, reason: 'invalid_json', message: 'Request body has a number out of range' };
  return { ok: true, value: value as Record<string, unknown>, bytes: bytes.byteLength };
}

/** Any number in the parsed value that is not finite (the depth cap bounds the stack). */
function hasNonFiniteNumber(root: object): boolean {
  const stack: unknown[] = [root];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === 'number') {
      if (!Number.isFinite(v)) return true;
    } else if (v !== null && typeof v === 'object') {
      for (const k of Object.keys(v)) stack.push((v as Record<string, unknown>)[k]);
    }
  }
  return false;
}

/** Bracket depth outside strings, in one pass. */
export function exceedsDepth(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92 /* \ */) i++;
      else if (c === 34 /* " */) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 123 || c === 91) {
      if (++depth > max) return true;
    } else if (c === 125 || c === 93) depth--;
  }
  return false;
}

/**
 * OpenAI's cache-routing hint, a routing key source (`body:prompt_cache_key`): a non-empty
 * string of at most MAX_BODY_KEY_CHARS characters, or null. Shared by every dialect that has it.
 */
export function promptCacheKeySchema() {
  return z.string().min(1).max(MAX_BODY_KEY_CHARS).nullable().optional();
}
