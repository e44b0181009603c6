// How the tap reads a Chat Completions or Completions answer (POST /v1/chat/completions,
// /v1/completions) as vLLM streams it: data-only SSE events, `data: [DONE]` last. Pure: no I/O.

import { isCount, isRecord, parseObject, sseErrorEvent, type EventReader, type Json, type TapUsage } from '../../../proxy/sse-tap.js';

/**
 * Chat Completions and Completions as vLLM streams them (data-only events, `data: [DONE]` last).
 * - TTFT at the first event with content: chat `delta.content`, `delta.reasoning_content` or
 *   `delta.reasoning` non-empty, or `delta.tool_calls` non-empty; completions `text` non-empty.
 *   vLLM's first chat chunk (role only, content "") does not count.
 * - usage from the last event whose `usage` is an object; the usage-only chunk (`choices: []`) is
 *   dropped when the proxy asked for it on the client's behalf (`strip`).
 * - an error: data with a truthy `error` field (the shape the openai SDK throws on) or vLLM's
 *   older flat `{"object":"error"}`.
 */
export function openAIReader(kind: 'chat' | 'completion', strip: boolean): EventReader {
  return {
    event(_name, payload, rec, now) {
      if (payload.trim() === '[DONE]') {
        rec.sawDone = true;
        return 'forward';
      }
      // Past the first content event only usage and errors matter: skip parsing the bulk of chunks.
      if (rec.firstContentAt !== null && !payload.includes('"usage"') && !payload.includes('error')) return 'forward';
      const obj = parseObject(payload);
      if (obj === null) return 'forward';
      if (isErrorBody(obj)) rec.sawError = true;
      const usage = readUsage(obj.usage, obj.timings);
      if (usage !== null) rec.usage = usage;
      if (rec.firstContentAt === null && hasContent(obj, kind)) rec.firstContentAt = now();
      const usageOnly = isRecord(obj.usage) && Array.isArray(obj.choices) && obj.choices.length === 0;
      return usageOnly && strip ? 'drop' : 'forward';
    },
    body(obj, rec) {
      if (isErrorBody(obj)) {
        rec.sawError = true;
        return;
      }
      rec.sawDone = true;
      rec.usage = readUsage(obj.usage, obj.timings);
    },
    errorEvent: sseErrorEvent,
  };
}

function isErrorBody(obj: Json): boolean {
  return Boolean(obj.error) || obj.object === 'error';
}

/**
 * Usage in OpenAI's terms. Cached tokens are null ("unknown", never 0) unless the engine reported
 * them: `usage.prompt_tokens_details.cached_tokens` (vLLM only with
 * --enable-prompt-tokens-details, SGLang only with --enable-cache-report, both leaving it out
 * when 0), else llama.cpp's `timings.cache_n` next to `usage` (its server never puts the count
 * in `usage`: tools/server/server-task.cpp, result_timings; `prompt_n` is the rest).
 */
function readUsage(u: unknown, timings: unknown): TapUsage | null {
  if (!isRecord(u) || !isCount(u.prompt_tokens) || !isCount(u.completion_tokens)) return null;
  const details = u.prompt_tokens_details;
  let cached = isRecord(details) && isCount(details.cached_tokens) ? details.cached_tokens : null;
  if (cached === null && isRecord(timings) && isCount(timings.cache_n)) cached = timings.cache_n;
  return { promptTokens: u.prompt_tokens, completionTokens: u.completion_tokens, cachedTokens: cached };
}

function nonEmptyString(v: unknown): boolean {
  return typeof v === 'string' && v.length > 0;
}

function hasContent(obj: Json, kind: 'chat' | 'completion'): boolean {
  if (!Array.isArray(obj.choices)) return false;
  for (const choice of obj.choices) {
    if (!isRecord(choice)) continue;
    if (kind === 'completion') {
      if (nonEmptyString(choice.text)) return true;
      continue;
    }
    const d = choice.delta;
    if (!isRecord(d)) continue;
    if (nonEmptyString(d.content) || nonEmptyString(d.reasoning_content) || nonEmptyString(d.reasoning)) return true;
    if (Array.isArray(d.tool_calls) && d.tool_calls.length > 0) return true;
  }
  return false;
}

