// How the tap reads an OpenAI Responses API answer (POST /v1/responses, GET /v1/responses/{id}
// with ?stream=true), as vLLM serves it: named SSE events whose data carry `type` and
// `sequence_number`. Pure: no I/O.
//
// Events (openai-python types/responses, vLLM responses/serving.py responses_stream_generator):
// `response.created` and `response.in_progress` carry the response object (its `id`); content
// arrives as `response.output_text.delta`, `response.reasoning_text.delta`,
// `response.function_call_arguments.delta`, ...; the end is `response.completed` (or
// `response.incomplete`, `response.failed`) whose `response.usage` has input_tokens,
// input_tokens_details.cached_tokens and output_tokens; an `error` event reports a failure.

import { isCount, isRecord, parseObject, type EventReader, type Json, type TapUsage } from '../../../proxy/sse-tap.js';


/** Events whose non-empty `delta` is model output: the first one is the time to first token. */
const CONTENT_DELTAS = new Set([
  'response.output_text.delta',
  'response.refusal.delta',
  'response.reasoning_text.delta',
  'response.reasoning_summary_text.delta',
  'response.function_call_arguments.delta',
  'response.custom_tool_call_input.delta',
  'response.code_interpreter_call_code.delta',
  'response.mcp_call_arguments.delta',
]);

/** Events that end a response and carry the final response object. */
const FINAL = new Set(['response.completed', 'response.incomplete', 'response.failed']);

export const responsesReader: EventReader = {
  event(name, data, rec, now) {
    // Past the first content only the end and errors matter: most events are deltas.
    if (rec.firstContentAt !== null && rec.responseId !== null && name !== null && name.endsWith('.delta')) return 'forward';
    const obj = parseObject(data);
    if (obj === null) return 'forward';
    const type = typeof obj.type === 'string' ? obj.type : name;
    if (type === null) return 'forward';
    if (type === 'error') {
      rec.sawError = true;
      return 'forward';
    }
    const response = isRecord(obj.response) ? obj.response : null;
    if (rec.responseId === null && response && typeof response.id === 'string' && response.id !== '') rec.responseId = response.id;
    // vLLM's answer says whether it stored the response (`store: false` when its store is off).
    if (response && typeof response.store === 'boolean') rec.responseStored = response.store;
    if (rec.firstContentAt === null && CONTENT_DELTAS.has(type) && typeof obj.delta === 'string' && obj.delta.length > 0) rec.firstContentAt = now();
    if (FINAL.has(type)) {
      const usage = response ? readResponsesUsage(response.usage) : null;
      if (usage) rec.usage = usage;
      if (type === 'response.failed') rec.sawError = true;
      else rec.sawDone = true;
    }
    return 'forward';
  },
  body(obj, rec) {
    if (obj.object !== 'response') {
      // vLLM's ErrorResponse ({"error": {...}}) or anything else that is not a response object.
      if (obj.error || obj.object === 'error') rec.sawError = true;
      return;
    }
    if (typeof obj.id === 'string' && obj.id !== '') rec.responseId = obj.id;
    if (typeof obj.store === 'boolean') rec.responseStored = obj.store;
    rec.usage = readResponsesUsage(obj.usage);
    if (obj.status === 'failed') rec.sawError = true;
    else rec.sawDone = true;
  },
  errorEvent(message, _type, code) {
    // ResponseErrorEvent: {type: "error", code, message, param, sequence_number}. The sequence
    // number of an event the router adds is unknown; the SDKs do not check it.
    const payload = JSON.stringify({ type: 'error', code, message, param: null, sequence_number: 0 });
    return new TextEncoder().encode(`event: error\ndata: ${payload}\n\n`);
  },
};

/**
 * For answers about a response made earlier (retrieve, its `?stream=true` replay, cancel): the
 * same reading without usage. The tokens were spent, and counted, by the request that made the
 * response; counting them again on every poll would inflate the replica's token counters and hit
 * rate and charge the tenant's quota once per poll.
 */
export const storedResponseReader: EventReader = {
  event(name, data, rec, now) {
    const out = responsesReader.event(name, data, rec, now);
    rec.usage = null;
    return out;
  },
  body(obj, rec) {
    responsesReader.body(obj, rec);
    rec.usage = null;
  },
  errorEvent: responsesReader.errorEvent,
};

/** Responses usage in OpenAI's chat terms: prompt = input_tokens (cached included), cached from input_tokens_details. */
export function readResponsesUsage(u: unknown): TapUsage | null {
  if (!isRecord(u) || !isCount(u.input_tokens) || !isCount(u.output_tokens)) return null;
  const details = u.input_tokens_details;
  const cached = isRecord(details) && isCount(details.cached_tokens) ? details.cached_tokens : null;
  return { promptTokens: u.input_tokens, completionTokens: u.output_tokens, cachedTokens: cached };
}
