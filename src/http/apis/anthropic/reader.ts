// How the tap reads an Anthropic Messages API answer (POST /v1/messages), as vLLM and SGLang
// serve it: named SSE events whose data carry `type`. Pure: no I/O.
//
// Events (https://docs.anthropic.com/en/docs/build-with-claude/streaming; vLLM
// entrypoints/anthropic/serving.py): `message_start` (message.usage: input tokens so far),
// `content_block_start`, `content_block_delta` (text_delta / thinking_delta / input_json_delta),
// `content_block_stop`, `message_delta` (usage: output_tokens, and from vLLM input_tokens and the
// cache counts), `message_stop`, `ping`, and `error` ({type:"error", error:{type, message}}).
//
// Usage in Anthropic's terms splits the prompt: input_tokens excludes cache reads and writes
// (vLLM since PR #40912: input_tokens = prompt − cached, cache_read_input_tokens = cached); older
// vLLM sends input_tokens = the whole prompt and no cache fields. Both normalize to OpenAI's
// terms as prompt = input + cache_read + cache_creation, cached = cache_read (null when absent).

import { isCount, isRecord, parseObject, type EventReader, type Json, type TapRecord, type TapUsage } from '../../../proxy/sse-tap.js';
import type { OriginErrorShape } from '../../../proxy/origin-response.js';


interface AnthropicUsageParts {
  input: number | null;
  output: number | null;
  cacheRead: number | null;
  cacheCreation: number | null;
}

/** An origin error without a usable body, Anthropic-shaped (the status's Anthropic error type). */
export function anthropicOriginError(message: string, status: number): string {
  const type = status === 404 ? 'not_found_error' : status === 401 ? 'authentication_error' : status === 403 ? 'permission_error' : status === 413 ? 'request_too_large' : status === 429 ? 'rate_limit_error' : status === 504 ? 'timeout_error' : status === 529 || status === 503 ? 'overloaded_error' : status >= 500 ? 'api_error' : 'invalid_request_error';
  return JSON.stringify({ type: 'error', error: { type, message } });
}

/** Anthropic's error shape for origin errors on /v1/messages*: `{"type":"error","error":{"type","message"}}`. */
export const anthropicErrorShape: OriginErrorShape = {
  wrap: anthropicOriginError,
  isNative: (v) => {
    const e = v.error;
    return v.type === 'error' && typeof e === 'object' && e !== null && typeof (e as Record<string, unknown>).type === 'string' && typeof (e as Record<string, unknown>).message === 'string';
  },
};

/** A fresh reader per response: usage arrives in pieces (message_start, then message_delta). */
export function anthropicReader(): EventReader {
  const parts: AnthropicUsageParts = { input: null, output: null, cacheRead: null, cacheCreation: null };
  return {
    event(name, data, rec, now) {
      if (rec.firstContentAt !== null && name === 'content_block_delta') return 'forward';
      const obj = parseObject(data);
      if (obj === null) return 'forward';
      const type = typeof obj.type === 'string' ? obj.type : name;
      switch (type) {
        case 'error':
          rec.sawError = true;
          break;
        case 'message_start':
          if (isRecord(obj.message)) mergeUsage(parts, obj.message.usage, rec);
          break;
        case 'content_block_delta': {
          const d = isRecord(obj.delta) ? obj.delta : null;
          if (rec.firstContentAt === null && d && (nonEmpty(d.text) || nonEmpty(d.thinking) || nonEmpty(d.partial_json))) rec.firstContentAt = now();
          break;
        }
        case 'message_delta':
          mergeUsage(parts, obj.usage, rec);
          break;
        case 'message_stop':
          rec.sawDone = true;
          break;
      }
      return 'forward';
    },
    body(obj, rec) {
      if (obj.type === 'error' || obj.error) {
        rec.sawError = true;
        return;
      }
      rec.sawDone = true;
      // count_tokens answers {input_tokens}: a count, not tokens spent.
      if (obj.type === 'message') mergeUsage(parts, obj.usage, rec);
    },
    errorEvent(message, _type, code) {
      const type = code === 'upstream_timeout' ? 'timeout_error' : 'api_error';
      const payload = JSON.stringify({ type: 'error', error: { type, message } });
      return new TextEncoder().encode(`event: error\ndata: ${payload}\n\n`);
    },
  };
}

function mergeUsage(parts: AnthropicUsageParts, u: unknown, rec: TapRecord): void {
  if (!isRecord(u)) return;
  if (isCount(u.input_tokens)) parts.input = u.input_tokens;
  if (isCount(u.output_tokens)) parts.output = u.output_tokens;
  if (isCount(u.cache_read_input_tokens)) parts.cacheRead = u.cache_read_input_tokens;
  if (isCount(u.cache_creation_input_tokens)) parts.cacheCreation = u.cache_creation_input_tokens;
  rec.usage = toUsage(parts);
}

function toUsage(p: AnthropicUsageParts): TapUsage | null {
  if (p.input === null || p.output === null) return null;
  return { promptTokens: p.input + (p.cacheRead ?? 0) + (p.cacheCreation ?? 0), completionTokens: p.output, cachedTokens: p.cacheRead };
}

function nonEmpty(v: unknown): boolean {
  return typeof v === 'string' && v.length > 0;
}
