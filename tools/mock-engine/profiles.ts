// Engine profiles of the mock: which real engine (and flags) the mock's wire behaviour follows,
// resolved once into the flags the server, the formats and the metrics read. Pure: no I/O.
//
// Every behaviour here is taken from the engine's own source (files named next to each field).
// The default is `vllm` (the current V1 API server with its default flags), so every test, demo
// and benchmark runs against the engine's real wire behaviour unless it names another profile;
// `legacy` is the mock as it was before the profiles, kept for comparison: no engine's behaviour.

import type { MetricsFlavor } from './types.js';

export const PROFILES = ['legacy', 'vllm', 'vllm-cache-report', 'sglang', 'sglang-cache-report', 'llama.cpp'] as const;
export type MockProfile = (typeof PROFILES)[number];

export type EngineFamily = 'vllm' | 'sglang' | 'llama.cpp';

/** When `usage.prompt_tokens_details.cached_tokens` is sent. */
export type CachedTokensReport = 'always' | 'when-nonzero' | 'never';

export interface ProfileBehaviour {
  profile: MockProfile;
  /** Whose error bodies, 401 and in-band error events the mock writes. */
  family: EngineFamily;
  /**
   * A stream's 200 and headers go out before queueing and prefill, and the first chunk comes
   * with the first token. vLLM returns a Starlette `StreamingResponse`, which sends
   * `http.response.start` before iterating the generator (vllm/entrypoints/openai/chat_completion/
   * api_router.py). SGLang does not: its chat and completions handlers "kick-start the generator
   * to trigger validation before HTTP 200 is sent" (`first_chunk = await generator.__anext__()`,
   * python/sglang/srt/entrypoints/openai/serving_chat.py `_handle_streaming_request`; a
   * ValueError there is a plain 400), and the first chunk (the role chunk) comes with the
   * engine's first output, so its 200 goes out with the first token; a scheduler abort before it
   * is still a 200 whose first chunk is the error. Older SGLang (before the kick-start) sent its
   * headers first. llama.cpp waits for the first result and answers an error there as a plain
   * HTTP error ("in streaming mode, the first error must be treated as non-stream response",
   * tools/server/server-context.cpp).
   */
  headersFirst: boolean;
  /**
   * vLLM: `if self.enable_prompt_tokens_details and num_cached_tokens:` (chat_completion/serving.py,
   * completion/serving.py), so only with --enable-prompt-tokens-details and a non-zero count.
   * SGLang: UsageProcessor._details_if_cached, only with --enable-cache-report and N > 0
   * (python/sglang/srt/entrypoints/openai/usage_processor.py). llama.cpp (tools/server/
   * server-task.cpp at 00efb3e, to_json_oaicompat_chat*): `usage` has the three counts only; the
   * cached count is `timings.cache_n`.
   */
  cachedTokens: CachedTokensReport;
  /**
   * `stream_options` present without `include_usage` means usage: vLLM's StreamOptions defaults
   * `include_usage` to True and should_include_usage reads it when the options are set
   * (vllm/entrypoints/openai/engine/protocol.py, vllm/entrypoints/utils.py). SGLang's defaults it
   * to False (python/sglang/srt/entrypoints/openai/protocol.py `StreamOptions.include_usage:
   * Optional[bool] = False`; serving_chat.py reads it through should_include_usage with
   * `--stream-response-default-include-usage`, off by default). llama.cpp:
   * json_value(stream_opt, "include_usage", false).
   */
  includeUsageDefault: boolean;
  /** vLLM: "Stream options can only be defined when `stream=True`." (validate_stream_options, a 400). */
  streamOptionsNeedStream: boolean;
  /**
   * An out-of-range X-data-parallel-rank on a stream is an in-band error after the 200: vLLM
   * checks it in the input processor inside AsyncLLM.generate (vllm/v1/engine/input_processor.py),
   * which the stream generator runs after the headers went out, and its `except Exception`
   * writes `data: {"error": …}` then `data: [DONE]` (chat_completion/serving.py). On the Messages
   * API the same check reaches the client as the converter's `event: error` (anthropicInBandError)
   * on a stream and as a 500 `internal_error` without one (ANTHROPIC_RANK_STATUS).
   */
  rankErrorInBand: boolean;
  /**
   * `timings` (with `cache_n`, the prompt tokens reused from the slot's cache) on the last stream
   * chunk and the non-streamed body: llama.cpp (server-task.cpp, result_timings::to_json).
   */
  timings: boolean;
  /**
   * The Responses store: vLLM keeps it off unless VLLM_ENABLE_RESPONSES_API_STORE=1
   * (vllm/entrypoints/openai/responses/serving.py `enable_store`): `store: true` is then quietly
   * turned off, `previous_response_id` is a 404 and `background` a 400.
   */
  responsesStore: boolean;
  /**
   * A Responses stream ends with `response.incomplete` for an incomplete response (the legacy
   * mock). vLLM's responses_stream_generator always ends with `response.completed`, whatever
   * the final status.
   */
  responsesIncompleteEvent: boolean;
  /**
   * vllm:cache_config_info on a data-parallel server carries the server's total num_gpu_blocks
   * on every engine's label: the engine core clients sum the engines' blocks at start-up
   * (vllm/v1/engine/utils.py) into the one CacheConfig every engine's logger labels with.
   */
  dpTotalBlocksLabel: boolean;
  /** The /metrics names the profile's engine exposes (an explicit `metricsFlavor` overrides). */
  metricsFlavor: MetricsFlavor;
  /**
   * Whether the engine can send SSE keep-alive comments (the mock's `sseKeepAliveMs`; off by
   * default, as in every engine). What was searched and found, per engine:
   * - vLLM: `--sse-keep-alive-interval` (seconds, default 0 = off; vLLM PR #51034, 2026-08):
   *   with_sse_keep_alive wraps the final SSE generator of POST /v1/chat/completions and
   *   /v1/completions (chat_completion/api_router.py, completion/api_router.py) and yields
   *   `: keep-alive\n\n` whenever the generator was idle for the interval, while queued, in
   *   prefill and between tokens (vllm/entrypoints/serve/utils/sse_keep_alive.py; before
   *   vLLM 0.30 vllm/entrypoints/openai/sse_keep_alive.py). Responses: an open PR (#54424), not
   *   merged; Messages: not wrapped. No other comment line is written by vLLM's streams.
   * - SGLang: none found. Its stream generators (python/sglang/srt/entrypoints/openai/
   *   serving_chat.py, serving_completions.py) yield only `data: …` lines; no keep-alive, ping or
   *   heartbeat option in server_args.py or the issues searched ("SSE keep-alive", "heartbeat").
   * - llama.cpp: none. A `--sse-keepalive-interval` was proposed (ggml-org/llama.cpp PR #23994,
   *   `: keepalive`) and closed unmerged; tools/server writes `data:` lines (and `error:` on a
   *   failure) only.
   * Anthropic's own API sends `event: ping` (a data event, not a comment); vLLM's Messages
   * converter does not (vllm/entrypoints/anthropic/serving.py).
   */
  sseKeepAlive: boolean;
}

/** vLLM's keep-alive comment (vllm/entrypoints/serve/utils/sse_keep_alive.py SSE_KEEP_ALIVE_COMMENT). */
export const SSE_KEEP_ALIVE_COMMENT = ': keep-alive\n\n';

const VLLM: Omit<ProfileBehaviour, 'profile' | 'cachedTokens'> = {
  family: 'vllm',
  headersFirst: true,
  includeUsageDefault: true,
  streamOptionsNeedStream: true,
  rankErrorInBand: true,
  timings: false,
  responsesStore: false,
  responsesIncompleteEvent: false,
  dpTotalBlocksLabel: true,
  metricsFlavor: 'current',
  sseKeepAlive: true,
};

const SGLANG: Omit<ProfileBehaviour, 'profile' | 'cachedTokens'> = {
  family: 'sglang',
  // The kick-started generator: headers with the first chunk (see headersFirst above).
  headersFirst: false,
  includeUsageDefault: false,
  // SGLang's ChatCompletionRequest has no such validator: stream_options is ignored without stream.
  streamOptionsNeedStream: false,
  rankErrorInBand: false,
  timings: false,
  responsesStore: false,
  responsesIncompleteEvent: false,
  dpTotalBlocksLabel: false,
  metricsFlavor: 'sglang',
  sseKeepAlive: false,
};

const BEHAVIOURS: Record<MockProfile, ProfileBehaviour> = {
  legacy: {
    profile: 'legacy',
    family: 'vllm',
    headersFirst: false,
    cachedTokens: 'always',
    includeUsageDefault: false,
    streamOptionsNeedStream: false,
    rankErrorInBand: false,
    timings: false,
    responsesStore: true,
    responsesIncompleteEvent: true,
    // The router reads cache_config_info as vLLM writes it (the server's total on every engine's
    // label, issue #26 item 4), so legacy's data-parallel metrics follow vLLM too.
    dpTotalBlocksLabel: true,
    metricsFlavor: 'current',
    sseKeepAlive: false,
  },
  vllm: { ...VLLM, profile: 'vllm', cachedTokens: 'never' },
  'vllm-cache-report': { ...VLLM, profile: 'vllm-cache-report', cachedTokens: 'when-nonzero' },
  sglang: { ...SGLANG, profile: 'sglang', cachedTokens: 'never' },
  'sglang-cache-report': { ...SGLANG, profile: 'sglang-cache-report', cachedTokens: 'when-nonzero' },
  'llama.cpp': {
    profile: 'llama.cpp',
    family: 'llama.cpp',
    headersFirst: false,
    cachedTokens: 'never',
    includeUsageDefault: false,
    streamOptionsNeedStream: false,
    rankErrorInBand: false,
    timings: true,
    responsesStore: false,
    responsesIncompleteEvent: false,
    dpTotalBlocksLabel: false,
    metricsFlavor: 'llamacpp',
    sseKeepAlive: false,
  },
};

export interface ProfileOverrides {
  headersFirst?: boolean;
  responsesStore?: boolean;
  metricsFlavor?: MetricsFlavor;
}

/** The behaviour of a profile with the caller's overrides; throws on an unknown profile. */
export function resolveProfile(name: MockProfile | undefined, o: ProfileOverrides = {}): ProfileBehaviour {
  const profile = name ?? 'vllm';
  const base = BEHAVIOURS[profile];
  if (!base) throw new Error(`mock-vllm: unknown profile ${String(name)} (one of ${PROFILES.join(', ')})`);
  return {
    ...base,
    ...(o.headersFirst !== undefined ? { headersFirst: o.headersFirst } : {}),
    ...(o.responsesStore !== undefined ? { responsesStore: o.responsesStore } : {}),
    ...(o.metricsFlavor !== undefined ? { metricsFlavor: o.metricsFlavor } : {}),
  };
}

/** Whether a stream sends usage: `stream_options.include_usage`, or the engine's default when the options are present. */
export function includeUsage(b: ProfileBehaviour, streamOptions: unknown): boolean {
  if (streamOptions === undefined || streamOptions === null || typeof streamOptions !== 'object') return false;
  const v = (streamOptions as { include_usage?: unknown }).include_usage;
  if (v === undefined) return b.includeUsageDefault;
  return v === true;
}

/** The usage object of a chat or completion response under the profile's flags. */
export function usageFor(b: ProfileBehaviour, promptTokens: number, completionTokens: number, cachedTokens: number): Record<string, unknown> {
  const usage: Record<string, unknown> = { prompt_tokens: promptTokens, total_tokens: promptTokens + completionTokens, completion_tokens: completionTokens };
  if (b.cachedTokens === 'always' || (b.cachedTokens === 'when-nonzero' && cachedTokens > 0)) {
    usage.prompt_tokens_details = { cached_tokens: cachedTokens };
  }
  return usage;
}

/**
 * An error as the engine writes it (status, JSON body):
 * - vLLM: ErrorResponse `{"error":{"message","type","param","code"}}` (engine/protocol.py);
 * - SGLang: the flat ErrorResponse `{"object":"error","message","type","param","code"}`
 *   (python/sglang/srt/entrypoints/openai/serving_base.py create_error_response);
 * - llama.cpp: `{"error":{"code","message","type"}}` with its own types (format_error_response,
 *   tools/server/server-common.cpp).
 */
export function errorJson(family: EngineFamily, e: { status: number; type: string; message: string; param?: string | null }): Record<string, unknown> {
  if (family === 'sglang') return { object: 'error', message: e.message, type: e.type, param: e.param ?? null, code: e.status };
  if (family === 'llama.cpp') return { error: { code: e.status, message: e.message, type: llamaCppErrorType(e.status) } };
  return { error: { message: e.message, type: e.type, param: e.param ?? null, code: e.status } };
}

function llamaCppErrorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 404) return 'not_found_error';
  if (status === 501) return 'not_supported_error';
  if (status === 503) return 'unavailable_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/**
 * The body of a 401 for a wrong or missing key: vLLM's and SGLang's API-key middleware answer
 * `{"error": "Unauthorized"}` (vllm/entrypoints/openai/api_server.py AuthenticationMiddleware,
 * sglang http_server.py add_api_key_middleware); llama.cpp `Invalid API Key` in its error shape.
 */
export function unauthorizedJson(family: EngineFamily): unknown {
  if (family === 'llama.cpp') return errorJson('llama.cpp', { status: 401, type: 'authentication_error', message: 'Invalid API Key' });
  return { error: 'Unauthorized' };
}

/**
 * The in-band error event of a stream that fails after its headers (status is the engine's
 * error code): vLLM and SGLang write `data: {"error": …}` then `data: [DONE]`
 * (create_streaming_error_response in the stream generators; SGLang wraps its flat body in
 * `error`); llama.cpp writes `data: {"error": …}` and ends the stream without `[DONE]`
 * ("terminate on error", server-context.cpp).
 */
export function inBandError(family: EngineFamily, e: { status: number; type: string; message: string; param?: string | null }): string {
  if (family === 'sglang') return `data: ${JSON.stringify({ error: errorJson('sglang', e) })}\n\ndata: [DONE]\n\n`;
  if (family === 'llama.cpp') return `data: ${JSON.stringify(errorJson('llama.cpp', e))}\n\n`;
  return `data: ${JSON.stringify(errorJson('vllm', e))}\n\ndata: [DONE]\n\n`;
}

/**
 * The engine error the `inBandErrorAfter` fault injects: vLLM turns a failed engine output into a
 * GenerationError ("Internal server error", 500; engine/serving.py
 * _convert_generation_error_to_streaming_response); the others as their own 500.
 */
export const ENGINE_ERROR = { status: 500, type: 'InternalServerError', message: 'Internal server error' } as const;

/**
 * What vLLM's Messages API streams when its chat stream fails: `event: error` with
 * `{"type":"error","error":{"type":"internal_error","message": …}}`, then nothing (no
 * `message_stop`). AnthropicServingMessages.message_stream_converter (vllm/entrypoints/anthropic/
 * serving.py) parses every chat chunk with `ChatCompletionStreamResponse.model_validate_json`; the
 * chat generator's error chunk (`data: {"error": …}`, above) has neither `model` nor `choices`,
 * so pydantic raises, and the converter's `except Exception as e` writes `str(e)` as the message.
 * The engine's own message survives only as the first 25 and last 24 characters of the chunk's
 * repr (pydantic-core src/errors/validation_exception.rs, `truncate_input_value`): a stale
 * data-parallel rank reads `{'error': {'message': 'da...am': None, 'code': 400}}`.
 */
export function anthropicInBandError(e: { status: number; type: string; message: string; param?: string | null }): string {
  const chunk = errorJson('vllm', e);
  const input = truncateInputValue(pythonRepr(chunk));
  const missing = (field: string) => `${field}\n  Field required [type=missing, input_value=${input}, input_type=dict]\n    For further information visit https://errors.pydantic.dev/2.12/v/missing`;
  const message = `2 validation errors for ChatCompletionStreamResponse\n${missing('model')}\n${missing('choices')}`;
  return `event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'internal_error', message } })}\n\n`;
}

/** pydantic-core's truncate_input_value: over 50 bytes, the first 25 and the last 24 around `...` (ASCII here). */
function truncateInputValue(repr: string): string {
  return repr.length > 50 ? `${repr.slice(0, 25)}...${repr.slice(repr.length - 24)}` : repr;
}

/** Python's repr of a JSON value (dicts, strings, numbers, None, booleans), as pydantic prints an input. */
function pythonRepr(v: unknown): string {
  if (v === null || v === undefined) return 'None';
  if (v === true) return 'True';
  if (v === false) return 'False';
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string') {
    // Python quotes with ' unless the text holds ' and no ".
    const q = v.includes("'") && !v.includes('"') ? '"' : "'";
    return q + v.replace(/\\/g, '\\\\').replace(new RegExp(q, 'g'), `\\${q}`).replace(/\n/g, '\\n') + q;
  }
  if (Array.isArray(v)) return `[${v.map(pythonRepr).join(', ')}]`;
  return `{${Object.entries(v as Record<string, unknown>).map(([k, x]) => `${pythonRepr(k)}: ${pythonRepr(x)}`).join(', ')}}`;
}

/**
 * A stale data-parallel rank on vLLM's non-streamed Messages API: the chat path's full generator
 * lets the input processor's ValueError through, and the Messages route's `except Exception`
 * answers 500 `internal_error` with the message (vllm/entrypoints/anthropic/api_router.py
 * create_messages), not the 400 of /v1/chat/completions.
 */
export const ANTHROPIC_RANK_STATUS = 500;
