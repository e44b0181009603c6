// Read, decode and validate an OpenAI request body: size limit while streaming it in, strict
// UTF-8, JSON, a nesting-depth cap, and the fields the router relies on. Unknown fields pass
// through untouched. Failures are tagged values; `errors.ts` turns them into responses.

import { z } from 'zod';
import { MAX_BODY_KEY_CHARS } from '../core/index.js';
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
  const chunks: Uint8Array[] = [];
  let total = 0;
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      const r = await race(reader.read(), Math.max(0, deadline - Date.now()));
      if (r.kind !== 'value') {
        void reader.cancel().catch(() => {});
        if (r.kind === 'timeout') return { ok: false, reason: 'request_timeout', message: `The request body was not received within ${timeoutMs} ms` };
        return { ok: false, reason: 'invalid_request', message: 'The request body could not be read' };
      }
      const { done, value } = r.value;
      if (done) break;
      total += value.byteLength;
      if (total > limit) {
        await discard(reader, limit * DISCARD_FACTOR - total, deadline);
        return tooLarge(limit);
      }
      chunks.push(value);
    }
  } catch {
    return { ok: false, reason: 'invalid_request', message: 'The request body could not be read' };
  }
  const out = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.byteLength;
  }
  return { ok: true, bytes: out };
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

const MAX_STRING = 1_000_000;

/**
 * OpenAI's cache-routing hint, a routing key source (`body:prompt_cache_key`): a non-empty
 * string of at most MAX_BODY_KEY_CHARS characters, or null. Shared by every dialect that has it.
 */
export function promptCacheKeySchema() {
  return z.string().min(1).max(MAX_BODY_KEY_CHARS).nullable().optional();
}
const contentPart = z.object({ type: z.string().max(64) }).passthrough();
const message = z
  .object({
    role: z.string().min(1).max(64),
    content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
  })
  .passthrough();

const common = {
  model: z.string().min(1).max(256),
  stream: z.boolean().optional(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).passthrough().nullable().optional(),
  max_tokens: z.number().int().min(0).max(10_000_000).nullable().optional(),
  user: z.string().max(512).optional(),
  prompt_cache_key: promptCacheKeySchema(),
};

export const chatRequestSchema = z
  .object({
    ...common,
    messages: z.array(message).min(1).max(10_000),
    tools: z.array(z.object({ type: z.string() }).passthrough()).max(1024).nullable().optional(),
  })
  .passthrough();

const tokenIds = z.array(z.number().int().min(0).max(2 ** 31));
export const completionRequestSchema = z
  .object({
    ...common,
    prompt: z.union([z.string().max(MAX_STRING * 8), z.array(z.string()).min(1).max(1024), tokenIds.min(1), z.array(tokenIds.min(1)).min(1).max(1024)]),
  })
  .passthrough();

export type ChatRequest = z.infer<typeof chatRequestSchema>;
export type CompletionRequest = z.infer<typeof completionRequestSchema>;
export type OpenAIKind = 'chat' | 'completion';

/** Validate the fields the router relies on; the original object (with unknown fields) is what gets forwarded. */
export function validateRequest(kind: OpenAIKind, body: Record<string, unknown>): { ok: true } | BodyFailure {
  return validateWith(kind === 'chat' ? chatRequestSchema : completionRequestSchema, body);
}

/** Validate `body` against a schema; the first issue becomes an OpenAI-style 400 naming the field. */
export function validateWith(schema: z.ZodType, body: Record<string, unknown>): { ok: true } | BodyFailure {
  const res = schema.safeParse(body);
  if (res.success) return { ok: true };
  return issueFailure(res.error, body);
}

function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}

/**
 * A zod validation failure as the router's tagged body failure: the first issue, named by its
 * path, in the words OpenAI's and Anthropic's APIs use: "'x' is a required property" only when
 * the field is absent (zod 4 leaves the input out of its issues, so the body is looked up), and
 * "Invalid type for 'x': expected a number, but got a string instead." for a value of the wrong
 * JSON type (OpenAI's wording).
 */
export function issueFailure(error: z.ZodError, body: unknown): BodyFailure {
  const issue = error.issues[0]!;
  const param = issue.path.map(String).join('.') || undefined;
  let value: unknown = body;
  for (const k of issue.path) value = value !== null && typeof value === 'object' && Object.hasOwn(value, k as PropertyKey) ? (value as Record<PropertyKey, unknown>)[k as PropertyKey] : undefined;
  let message: string;
  if (issue.code === 'invalid_type' && value === undefined) message = `'${param}' is a required property`;
  else if (issue.code === 'invalid_type') {
    const expected = String((issue as { expected?: unknown }).expected ?? 'another type');
    message = `Invalid type for '${param ?? 'body'}': expected ${/^[aeiou]/.test(expected) ? 'an' : 'a'} ${expected}, but got ${jsonType(value)} instead.`;
  } else message = `Invalid value for '${param ?? 'body'}': ${issue.message}`;
  return { ok: false, reason: 'invalid_request', message, param };
}
