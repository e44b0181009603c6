// How one API writes a generation: the SSE events before, during and after the tokens, and the
// non-streaming body. The engine (server.ts `run`) is the same for every API; only this differs.
// Pure, no I/O.

import { llamaCppFormat } from './llamacpp-format.js';
import { chatRoleChunk, deltaChunk, fullResponse, makeUsage, SSE_DONE, usageChunk, type Kind, type ResponseIds } from './openai-format.js';
import type { ProfileBehaviour } from './profiles.js';

export interface Finish {
  reason: 'stop' | 'length';
  stopReason: string | null;
}

/** Token counts of one generation, in OpenAI's terms (prompt includes the cached tokens). */
export interface Counts {
  promptTokens: number;
  completionTokens: number;
  cachedTokens: number;
  /** Time spent on prefill and on decode so far, ms (llama.cpp's `timings`). */
  promptMs?: number;
  predictedMs?: number;
}

export interface WireFormat {
  /** SSE events before the first token. */
  open(counts: Counts): string[];
  /** SSE events for a piece of output text (the last one carries `finish`). */
  delta(text: string, finish: Finish | null): string[];
  /** SSE events after the last token. */
  close(text: string, done: Finish, counts: Counts): string[];
  /** The non-streaming JSON body. */
  full(text: string, done: Finish, counts: Counts): unknown;
  /** The in-band error event a mid-stream engine failure is written as (default: the profile's OpenAI-shaped one). */
  inBandError?(message: string): string;
  /** Called once the generation ended (completed or not), whatever the transport. */
  finished?(text: string, done: Finish | null, counts: Counts): void;
}

/** Chat Completions and Completions in the profile's engine's shapes (llama.cpp's in llamacpp-format.ts). */
export function openAIFormat(kind: Kind, ids: ResponseIds, includeUsage: boolean, behaviour: ProfileBehaviour): WireFormat {
  if (behaviour.timings) return llamaCppFormat(kind, ids, includeUsage);
  const usage = (c: Counts) => makeUsage(behaviour, c.promptTokens, c.completionTokens, c.cachedTokens);
  return {
    open: () => (kind === 'chat' ? [chatRoleChunk(ids)] : []),
    delta: (text, finish) => [deltaChunk(kind, ids, text, finish)],
    close: (_text, _done, c) => [...(includeUsage ? [usageChunk(kind, ids, usage(c))] : []), SSE_DONE],
    full: (text, done, c) => fullResponse(kind, ids, text, done, usage(c)),
  };
}

/** `event: <type>\ndata: <json>\n\n`, as vLLM writes Responses and Anthropic events. */
export function namedEvent(type: string, data: unknown): string {
  return `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
}
