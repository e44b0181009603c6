// The Chat Completions and Completions upstream body: fenced like every dialect's (../fence.ts),
// and a streaming request asks for usage on the client's behalf. Pure.

import type { PreparedBody, PrepareBodyOptions } from '../../../proxy/upstream-request.js';
import { fencedBody } from '../fence.js';

/**
 * The upstream body: the client's JSON, key order and unknown fields kept, except that
 * - engine control fields are removed unless the pool allows them, and the client's `cache_salt`
 *   and `request_id` always are; the router's own go in instead (appended) (../fence.ts);
 * - a streaming request gets `stream_options.include_usage: true` so the router can read token
 *   usage and cached tokens. A client asked for usage itself when it sent `include_usage: true`,
 *   or, on a vLLM pool, a `stream_options` object without an `include_usage` key: vLLM's
 *   StreamOptions defaults it to true (`include_usage: bool | None = True`, vllm/entrypoints/openai
 *   protocol), so vLLM would have sent that client its usage (and applied its
 *   `continuous_usage_stats`); the key is then written out as true and nothing is stripped. SGLang
 *   and llama.cpp default it to false (`opts.streamOptionsIncludeUsage`, the engine profile's):
 *   there such a client did not ask. When the client
 *   did not ask (no `stream_options`, null, or `include_usage` false or null), `stripUsageChunk`
 *   is true and `stream_options.continuous_usage_stats`, if the client set it, is sent as false:
 *   vLLM applies it only when `include_usage` is on (`should_include_usage`), so the client would
 *   not have seen per-chunk usage, and the tap strips only the usage-only chunk, never fields of
 *   other chunks. A `stream_options` that is neither an object nor null is left alone for the
 *   origin to reject.
 * `input` is not modified.
 */
export function prepareOpenAIBody(input: Record<string, unknown>, opts: PrepareBodyOptions = {}): PreparedBody {
  const body = fencedBody(input, opts);
  const unchanged = (): PreparedBody => ({ body: JSON.stringify(body), stripUsageChunk: false });
  if (input.stream !== true || opts.requestUsage === false) return unchanged();
  const so = input.stream_options;
  if (so !== undefined && so !== null && !isPlainObject(so)) return unchanged();
  if (isPlainObject(so) && so.include_usage === true) return unchanged();
  if (isPlainObject(so) && !Object.hasOwn(so, 'include_usage') && opts.streamOptionsIncludeUsage !== false) {
    // vLLM's default for a stream_options without the key: usage on, the client's to keep.
    const streamOptions = copyObject(so);
    streamOptions.include_usage = true;
    body.stream_options = streamOptions;
    return { body: JSON.stringify(body), stripUsageChunk: false };
  }

  const streamOptions = copyObject(isPlainObject(so) ? so : {});
  streamOptions.include_usage = true;
  if (streamOptions.continuous_usage_stats) streamOptions.continuous_usage_stats = false;
  body.stream_options = streamOptions; // replaces in place, or appends when absent
  return { body: JSON.stringify(body), stripUsageChunk: true };
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// A null-prototype copy keeps an own `__proto__` key (JSON.parse makes one) as data, in place.
function copyObject(src: Record<string, unknown>): Record<string, unknown> {
  const out = Object.create(null) as Record<string, unknown>;
  for (const key of Object.keys(src)) out[key] = src[key];
  return out;
}
