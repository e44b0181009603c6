// How the tap reads a keyless API's answer (embeddings, rerank, score, tokenize, detokenize): one
// JSON body, never a stream. Pure: no I/O.

import { isRecord, sseErrorEvent, type EventReader, type TapRecord } from '../../../proxy/sse-tap.js';

/**
 * Reads a keyless answer (one JSON body; these APIs do not stream): usage for the stats and the
 * trace log. Embeddings and score report `usage.prompt_tokens`; rerank `usage.total_tokens` (and
 * `prompt_tokens` in newer vLLM); tokenize the token `count`. Nothing is cached or generated.
 */
export const keylessReader: EventReader = {
  event: () => 'forward',
  body(obj, rec: TapRecord) {
    if (isRecord(obj.error) || (obj.object === 'error' && typeof obj.message === 'string')) {
      rec.sawError = true;
      return;
    }
    rec.sawDone = true;
    const u = isRecord(obj.usage) ? obj.usage : null;
    const prompt = u && isCount(u.prompt_tokens) ? u.prompt_tokens : u && isCount(u.total_tokens) ? u.total_tokens : isCount(obj.count) ? obj.count : null;
    if (prompt !== null) rec.usage = { promptTokens: prompt, completionTokens: 0, cachedTokens: null };
  },
  errorEvent: sseErrorEvent,
};


/** A count as these APIs report it: a whole number ≥ 0. */
function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}
