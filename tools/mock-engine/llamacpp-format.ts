// Chat Completions and Completions as llama.cpp's server writes them (profile `llama.cpp`): its
// chunk and body shapes, `usage` without cached-token details and `timings` on the last chunk.
// Pure, no I/O.
//
// Shapes from ggml-org/llama.cpp tools/server/server-task.cpp (00efb3e):
// server_task_result_cmpl_partial / _final::to_json_oaicompat_chat_stream, to_json_oaicompat_chat,
// to_json_oaicompat; the stream ends with `data: [DONE]` (server-context.cpp). Keys in
// nlohmann::ordered_json insertion order. `timings.cache_n` is the prompt tokens reused from the
// slot's cache, `prompt_n` the ones processed (result_timings::to_json).

import type { Kind, ResponseIds } from './openai-format.js';
import type { Counts, Finish, WireFormat } from './wire-format.js';

/** llama.cpp's `system_fingerprint`: its build info (`b<number>-<commit>`). */
const BUILD_INFO = 'b0-mock';

const sse = (obj: unknown): string => `data: ${JSON.stringify(obj)}\n\n`;

function usage(c: Counts): Record<string, number> {
  return { completion_tokens: c.completionTokens, prompt_tokens: c.promptTokens, total_tokens: c.completionTokens + c.promptTokens };
}

/** result_timings::to_json: tokens and milliseconds of the prompt (uncached part) and of generation. */
export function timings(c: Counts): Record<string, number> {
  const promptN = c.promptTokens - c.cachedTokens;
  const promptMs = c.promptMs ?? 0;
  const predictedMs = c.predictedMs ?? 0;
  return {
    cache_n: c.cachedTokens,
    prompt_n: promptN,
    prompt_ms: promptMs,
    prompt_per_token_ms: promptN > 0 ? promptMs / promptN : 0,
    prompt_per_second: promptMs > 0 ? (1e3 / promptMs) * promptN : 0,
    predicted_n: c.completionTokens,
    predicted_ms: predictedMs,
    predicted_per_token_ms: c.completionTokens > 0 ? predictedMs / c.completionTokens : 0,
    predicted_per_second: predictedMs > 0 ? (1e3 / predictedMs) * c.completionTokens : 0,
  };
}

const finishReason = (done: Finish): string => (done.reason === 'stop' ? 'stop' : 'length');

export function llamaCppFormat(kind: Kind, ids: ResponseIds, includeUsage: boolean): WireFormat {
  const chatChunk = (choice: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
    choices: [choice],
    created: ids.created,
    id: ids.id,
    model: ids.model,
    system_fingerprint: BUILD_INFO,
    object: 'chat.completion.chunk',
    ...extra,
  });
  const textChunk = (text: string, finish: string | null, extra: Record<string, unknown> = {}) => ({
    choices: [{ text, index: 0, logprobs: null, finish_reason: finish }],
    created: ids.created,
    model: ids.model,
    system_fingerprint: BUILD_INFO,
    object: 'text_completion',
    ...extra,
    id: ids.id,
  });
  return {
    // The first partial result carries the role (its content null) before the first token's text.
    open: () => (kind === 'chat' ? [sse(chatChunk({ finish_reason: null, index: 0, delta: { role: 'assistant', content: null } }))] : []),
    delta: (text) => {
      if (text === '') return [];
      if (kind === 'chat') return [sse(chatChunk({ finish_reason: null, index: 0, delta: { content: text } }))];
      return [sse(textChunk(text, null))];
    },
    close: (_text, done, c) => {
      if (kind === 'completion') {
        // /v1/completions: the final result is to_json_oaicompat, usage and timings included.
        return [sse(textChunk('', finishReason(done), { usage: usage(c), timings: timings(c) })), 'data: [DONE]\n\n'];
      }
      const chunks: Record<string, unknown>[] = [chatChunk({ finish_reason: finishReason(done), index: 0, delta: {} })];
      if (includeUsage) chunks.push({ ...chatChunk({}), choices: [], usage: usage(c) });
      // `timings` rides on whichever chunk is last.
      chunks[chunks.length - 1] = { ...chunks[chunks.length - 1], timings: timings(c) };
      return [...chunks.map(sse), 'data: [DONE]\n\n'];
    },
    full: (text, done, c) => {
      if (kind === 'chat') {
        return {
          choices: [{ finish_reason: finishReason(done), index: 0, message: { role: 'assistant', content: text } }],
          created: ids.created,
          model: ids.model,
          system_fingerprint: BUILD_INFO,
          object: 'chat.completion',
          usage: usage(c),
          id: ids.id,
          timings: timings(c),
        };
      }
      return { ...textChunk(text, finishReason(done), { usage: usage(c) }), timings: timings(c) };
    },
  };
}
