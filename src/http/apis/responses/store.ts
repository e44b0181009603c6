// What the router says when a replica no longer has a response the router knows it made: vLLM's
// Responses store is off by default, and then every `previous_response_id`, retrieve and cancel
// is a 404 that reads like an unknown id. Pure.
//
// vLLM (vllm/entrypoints/openai/responses/serving.py): `enable_store` is
// VLLM_ENABLE_RESPONSES_API_STORE; without it `store: true` is turned off quietly (the response
// says `store: false`), `background` is a 400, and `previous_response_id` and the by-id routes look
// the id up in an empty store and answer `_make_not_found_error`: 404, "Response with id '<id>'
// not found.", param `response_id`: the same bytes as for an id the engine never made.
//
// Detected at creation too: a response the router asked to store (`store` not false) whose answer
// says `store: false` was not stored; the coordinator marks its id, and a later follow-up,
// retrieve or cancel of it is answered `response_not_stored` at once (coordinator pin
// `not_stored`), no engine asked.
//
// How the router tells the two apart: its own record. An id this tenant's requests never made
// (or that expired from the affinity table) is answered 404 by the router itself, before any
// engine is asked (coordinator pin `not_found`). So an engine's 404 naming the id means the replica
// that made it no longer has it: its store is off ("Responses store disabled. GET /v1/responses
// will always return 404.", vLLM's start-up warning), it restarted (the store is in memory), or
// newer releases' store evicted it (their store TTL and size bounds).

import { RESPONSES_STORE_FLAG, responseNotStoredMessage } from '../../../engines/vllm.js';
import { openAIOriginError, openAIErrorShape, type OriginErrorShape } from '../../../proxy/origin-response.js';

export { RESPONSES_STORE_FLAG };

/** The error code a client gets for a response its replica no longer has. */
export const STORE_UNAVAILABLE_CODE = 'response_not_stored';

/**
 * OpenAI's error shape, with an engine's 404 for `responseId` explained: the replica that made the
 * response does not have it, most likely because its Responses store is off. `param` names what
 * the client sent (`previous_response_id` on a follow-up, `response_id` on a retrieve or cancel).
 */
export function storeErrorShape(responseId: string, param: 'previous_response_id' | 'response_id'): OriginErrorShape {
  return {
    wrap: openAIOriginError,
    isNative: openAIErrorShape.isNative,
    explain(status, v) {
      if (status !== 404 || !namesId(v, responseId)) return null;
      return JSON.stringify({
        error: {
          message: responseNotStoredMessage(responseId),
          type: 'invalid_request_error',
          param,
          code: STORE_UNAVAILABLE_CODE,
        },
      });
    },
  };
}

/** The engine's error message names the id (vLLM's "Response with id '<id>' not found."), so it is about that response and not, say, the model. */
function namesId(v: Record<string, unknown>, id: string): boolean {
  const e = v.error;
  const message = typeof e === 'object' && e !== null ? (e as Record<string, unknown>).message : typeof v.message === 'string' ? v.message : v.detail;
  return typeof message === 'string' && message.includes(id);
}
