// vLLM's OpenAI-compatible wire shapes: request validation, response objects, SSE chunks and
// error bodies. Pure, no I/O.
//
// Shapes follow vllm/entrypoints/openai (chat_completion/serving.py, completion/serving.py): chunks
// are serialized with exclude_unset, so a chunk carries `usage` only when it is the final
// usage-only chunk; the finish reason rides on the last content chunk together with `stop_reason`.

import { includeUsage, usageFor, type ProfileBehaviour } from './profiles.js';
import { renderChatPrompt, renderCompletionPrompt } from './prompt.js';

export type Kind = 'chat' | 'completion';

export interface ParsedRequest {
  kind: Kind;
  /** Model name to echo in responses (the requested one, or the default when absent). */
  model: string;
  prompt: string;
  maxTokens: number;
  stream: boolean;
  includeUsage: boolean;
  stop: string[];
  /**
   * The prefix-cache partition (`cache_salt`): vLLM mixes it into the hash of the prompt's first
   * block (generate_block_hash_extra_keys in vllm/v1/core/kv_cache_utils.py), and every later
   * block's hash chains from it, so two salts share no cached block.
   */
  cacheSalt?: string;
}

/**
 * `cache_salt` as vLLM's request models check it (check_cache_salt_support in
 * vllm/entrypoints/openai/engine/protocol.py and the chat/completion protocols): absent or null is
 * no salt, a non-empty string is the salt, anything else a 400.
 */
export function parseCacheSalt(b: Record<string, unknown>, maxLength = Infinity): { salt: string | undefined } | WireError {
  const v = b.cache_salt;
  if (v === undefined || v === null) return { salt: undefined };
  if (typeof v !== 'string' || v === '') return badRequest("Parameter 'cache_salt' must be a non-empty string if provided.", 'cache_salt');
  // ChatCompletionRequest / CompletionRequest: Field(min_length=1, max_length=1024), pydantic's message.
  if (v.length > maxLength) return badRequest(`cache_salt: String should have at most ${maxLength} characters`, 'cache_salt');
  return { salt: v };
}

/** vLLM's chat and completion requests cap `cache_salt` at 1024 characters (chat_completion/protocol.py). */
export const CACHE_SALT_MAX_CHARS = 1024;

export interface WireError {
  status: number;
  type: string;
  message: string;
  param?: string | null;
}

/** vLLM's ErrorResponse body. */
export function errorBody(e: WireError): string {
  return JSON.stringify({ error: { message: e.message, type: e.type, param: e.param ?? null, code: e.status } });
}

function badRequest(message: string, param: string | null = null): WireError {
  return { status: 400, type: 'BadRequestError', message, param };
}

/**
 * Validate the minimum the mock needs; unknown fields are ignored, as vLLM ignores most of them.
 * `behaviour` (the engine profile, profiles.ts) decides the stream_options rules.
 */
export function parseCompletionRequest(
  kind: Kind,
  raw: string,
  models: readonly string[],
  maxModelLen: number,
  countTokens: (s: string) => number,
  behaviour: ProfileBehaviour,
): ParsedRequest | WireError {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (err) {
    return badRequest(`JSON decode error: ${(err as Error).message}`);
  }
  if (!body || typeof body !== 'object' || Array.isArray(body)) return badRequest('Request body must be a JSON object');
  const b = body as Record<string, unknown>;

  // vLLM serves the default model when `model` is absent.
  let model = models[0]!;
  if (b.model !== undefined && b.model !== null && b.model !== '') {
    if (typeof b.model !== 'string' || !models.includes(b.model)) {
      return { status: 404, type: 'NotFoundError', message: `The model \`${String(b.model)}\` does not exist.`, param: 'model' };
    }
    model = b.model;
  }

  let prompt: string;
  if (kind === 'chat') {
    if (b.messages === undefined) return badRequest('messages: Field required', 'messages');
    if (!Array.isArray(b.messages) || b.messages.length === 0) {
      return badRequest('messages: Input should be a non-empty list', 'messages');
    }
    for (const m of b.messages) {
      if (!m || typeof m !== 'object' || typeof (m as { role?: unknown }).role !== 'string') {
        return badRequest('messages: each message needs a string `role`', 'messages');
      }
    }
    // vLLM's check_generation_prompt (chat_completion/protocol.py): both true is a 400; an absent
    // add_generation_prompt passes (the validator reads the request data, before the default).
    if (truthy(b.continue_final_message) && truthy(b.add_generation_prompt)) {
      return badRequest('Cannot set both `continue_final_message` and `add_generation_prompt` to True.');
    }
    prompt = renderChatPrompt({ messages: b.messages, tools: b.tools }, b.continue_final_message === true);
  } else {
    if (b.prompt === undefined) return badRequest('prompt: Field required', 'prompt');
    const rendered = renderCompletionPrompt(b.prompt);
    if (rendered === null) return badRequest('prompt: the mock serves one prompt (a string or token ids)', 'prompt');
    prompt = rendered;
  }

  const requested = kind === 'chat' && b.max_completion_tokens != null ? b.max_completion_tokens : b.max_tokens;
  let maxTokens = 16;
  if (requested !== undefined && requested !== null) {
    if (!Number.isInteger(requested) || (requested as number) < 1) {
      return badRequest('max_tokens must be at least 1, got ' + String(requested), 'max_tokens');
    }
    maxTokens = requested as number;
  }
  if (b.n !== undefined && b.n !== null && b.n !== 1) return badRequest('the mock serves n=1 only', 'n');
  if (b.stream !== undefined && b.stream !== null && typeof b.stream !== 'boolean') {
    return badRequest('stream: Input should be a valid boolean', 'stream');
  }

  const promptTokens = countTokens(prompt);
  if (promptTokens + maxTokens > maxModelLen) {
    return badRequest(
      `This model's maximum context length is ${maxModelLen} tokens. However, you requested ` +
        `${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion). ` +
        'Please reduce the length of the messages or completion.',
    );
  }

  // vLLM's validate_stream_options (chat_completion/protocol.py, completion/protocol.py): Python
  // truthiness, so an empty object passes and a non-empty one without `stream` is refused.
  if (behaviour.streamOptionsNeedStream && truthy(b.stream_options) && !truthy(b.stream)) {
    return badRequest('Stream options can only be defined when `stream=True`.', 'stream_options');
  }

  const salt = parseCacheSalt(b, behaviour.family === 'vllm' && behaviour.profile !== 'legacy' ? CACHE_SALT_MAX_CHARS : Infinity);
  if ('status' in salt) return salt;
  const stop = typeof b.stop === 'string' ? [b.stop] : Array.isArray(b.stop) ? b.stop.filter((s): s is string => typeof s === 'string' && s !== '') : [];
  return {
    kind,
    model,
    prompt,
    maxTokens,
    stream: b.stream === true,
    includeUsage: b.stream === true && includeUsage(behaviour, b.stream_options),
    stop,
    ...(salt.salt !== undefined ? { cacheSalt: salt.salt } : {}),
  };
}

/** Python truthiness of a JSON value, as vLLM's `data.get(...)` checks read it. */
function truthy(v: unknown): boolean {
  if (v === undefined || v === null || v === false || v === 0 || v === '') return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === 'object') return Object.keys(v).length > 0;
  return true;
}

/** A usage object under the profile's flags (profiles.ts usageFor). */
export type Usage = Record<string, unknown>;

export function makeUsage(behaviour: ProfileBehaviour, promptTokens: number, completionTokens: number, cachedTokens: number): Usage {
  return usageFor(behaviour, promptTokens, completionTokens, cachedTokens);
}

export interface ResponseIds {
  id: string;
  created: number;
  model: string;
}

const sse = (obj: unknown): string => `data: ${JSON.stringify(obj)}\n\n`;
export const SSE_DONE = 'data: [DONE]\n\n';

/** First chat chunk: the assistant role with empty content. */
export function chatRoleChunk(ids: ResponseIds): string {
  return sse({
    id: ids.id,
    object: 'chat.completion.chunk',
    created: ids.created,
    model: ids.model,
    choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
  });
}

/** A content chunk; the last one also carries `finish_reason` and `stop_reason`. */
export function deltaChunk(
  kind: Kind,
  ids: ResponseIds,
  text: string,
  finish: { reason: 'stop' | 'length'; stopReason: string | null } | null,
): string {
  const tail = finish ? { finish_reason: finish.reason, stop_reason: finish.stopReason } : { finish_reason: null };
  if (kind === 'chat') {
    return sse({
      id: ids.id,
      object: 'chat.completion.chunk',
      created: ids.created,
      model: ids.model,
      choices: [{ index: 0, delta: { content: text }, logprobs: null, ...tail }],
    });
  }
  return sse({
    id: ids.id,
    object: 'text_completion',
    created: ids.created,
    model: ids.model,
    choices: [{ index: 0, text, logprobs: null, ...(finish ? tail : { finish_reason: null, stop_reason: null }) }],
  });
}

/** The usage-only chunk sent last when `stream_options.include_usage` was asked. */
export function usageChunk(kind: Kind, ids: ResponseIds, usage: Usage): string {
  return sse({
    id: ids.id,
    object: kind === 'chat' ? 'chat.completion.chunk' : 'text_completion',
    created: ids.created,
    model: ids.model,
    choices: [],
    usage,
  });
}

/** The non-streaming response object. */
export function fullResponse(
  kind: Kind,
  ids: ResponseIds,
  text: string,
  finish: { reason: 'stop' | 'length'; stopReason: string | null },
  usage: Usage,
): unknown {
  if (kind === 'chat') {
    return {
      id: ids.id,
      object: 'chat.completion',
      created: ids.created,
      model: ids.model,
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: text, refusal: null, tool_calls: [], reasoning_content: null },
          logprobs: null,
          finish_reason: finish.reason,
          stop_reason: finish.stopReason,
        },
      ],
      service_tier: null,
      system_fingerprint: null,
      usage,
      prompt_logprobs: null,
    };
  }
  return {
    id: ids.id,
    object: 'text_completion',
    created: ids.created,
    model: ids.model,
    choices: [{ index: 0, text, logprobs: null, finish_reason: finish.reason, stop_reason: finish.stopReason, prompt_logprobs: null }],
    usage,
  };
}

/** `GET /v1/models`. */
export function modelList(models: readonly string[], created: number, maxModelLen: number): unknown {
  return {
    object: 'list',
    data: models.map((id) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root: id,
      parent: null,
      max_model_len: maxModelLen,
      permission: [],
    })),
  };
}
