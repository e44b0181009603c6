// Continuing a broken Chat Completions or Completions stream on another replica (issue #28): which
// answers can be continued, the answer so far as the client received it, the continuation's
// upstream body, and the splice of its stream into the client's. Pure: no I/O.
//
// Chat continues through vLLM's `continue_final_message: true` with `add_generation_prompt:
// false` and the answer so far as a final assistant message: vLLM renders the chat "so that the
// final message in the chat is open-ended, without any EOS tokens" and the model "will continue
// this message rather than starting a new one"; its `check_generation_prompt` validator refuses
// both flags true ("Cannot set both `continue_final_message` and `add_generation_prompt` to
// True."), and `add_generation_prompt` defaults to true, so both are sent
// (vllm/entrypoints/openai/chat_completion/protocol.py, ChatCompletionRequest). Completions
// continue from the prompt plus the text so far. Both continue from text, not token ids: the
// chat endpoint takes no assistant token ids, and the text as delivered is what the client has
// (a re-tokenisation at the seam may differ from the original's tokens; at temperature 0 on the
// same model the greedy continuation of the same text is the same text).

import { AnswerBase, eventSplice, seamHoldback, stopList, Swallow, type AnswerContinuation } from '../../../proxy/continuation.js';
import { isCount, isRecord, parseObject, type EventReader, type Json } from '../../../proxy/sse-tap.js';

const GUIDED_FIELDS = ['guided_json', 'guided_regex', 'guided_choice', 'guided_grammar', 'guided_whitespace_pattern', 'structured_outputs', 'structural_tag'];

/** Why a request's answer can never be continued (its shape), or null. */
export function staticRefusal(kind: 'chat' | 'completion', b: Record<string, unknown>): string | null {
  if ((typeof b.n === 'number' && b.n > 1) || (typeof b.best_of === 'number' && b.best_of > 1)) return 'n_gt_1';
  if (b.use_beam_search === true) return 'beam_search';
  if ((kind === 'chat' && b.logprobs === true) || (kind === 'completion' && b.logprobs != null) || b.top_logprobs != null || b.prompt_logprobs != null) return 'logprobs';
  if (isRecord(b.response_format) && b.response_format.type !== 'text') return 'response_format';
  for (const f of GUIDED_FIELDS) if (b[f] != null) return 'guided_decoding';
  if (b.echo === true) return 'echo';
  if (kind === 'chat') {
    if (!Array.isArray(b.messages)) return 'messages';
    // The client's own prefill: continuing it needs its text, and its render, left as they are.
    if (b.continue_final_message === true || b.add_generation_prompt === false) return 'client_prefill';
  } else {
    if (!(typeof b.prompt === 'string' || (Array.isArray(b.prompt) && b.prompt.length === 1 && typeof b.prompt[0] === 'string'))) return 'prompt_not_text';
    if (b.suffix != null) return 'suffix';
  }
  return null;
}

/**
 * The answer of one Chat Completions or Completions stream (n = 1) as the client received it,
 * across its segments. Delivered tokens: the running `usage.completion_tokens` when the stream
 * carries it (`continuous_usage_stats`), else the number of content deltas (vLLM sends one per
 * decode step by default, so that is the token count except where its detokenizer held text back
 * for an incomplete character or a stop string and sent it with a later token).
 */
export class OpenAIAnswer extends AnswerBase implements AnswerContinuation {
  readonly #kind: 'chat' | 'completion';
  readonly #static: string | null;
  readonly #maxTokens: number | null;
  #dynamic: string | null = null;
  #text = '';
  #deltas = 0;
  /** Each content delta's text, in order (seamHoldback). */
  #pieces: string[] = [];
  readonly #stops: string[];
  /** Trailing deltas the last continuation body gave back, and their text (swallowed by the splice). */
  #held = 0;
  #heldText = '';
  #usageCompletion: number | null = null;
  /** The original prompt's tokens: from running usage, or from the first continuation's usage. */
  #promptTokens: number | null = null;
  #ids: { id: unknown; created: unknown; model: unknown; fingerprint: unknown; hasFingerprint: boolean } | null = null;

  constructor(kind: 'chat' | 'completion', body: Record<string, unknown>) {
    super();
    this.#kind = kind;
    this.#static = staticRefusal(kind, body);
    this.#stops = stopList(body.stop);
    const m = kind === 'chat' && body.max_completion_tokens != null ? body.max_completion_tokens : body.max_tokens;
    this.#maxTokens = typeof m === 'number' && Number.isInteger(m) ? m : null;
  }

  refusal(): string | null {
    this.catchUp();
    if (this.#static !== null) return this.#static;
    if (this.#dynamic !== null) return this.#dynamic;
    if (this.#ids === null || this.#text.length === 0) return 'no_content';
    if (this.#maxTokens !== null && this.#maxTokens - this.delivered().tokens < 1) return 'max_tokens_reached';
    return null;
  }

  delivered(): { tokens: number; from: 'usage' | 'deltas' } {
    this.catchUp();
    return this.#usageCompletion !== null ? { tokens: this.#usageCompletion, from: 'usage' } : { tokens: this.#deltas, from: 'deltas' };
  }

  observe(inner: EventReader): EventReader {
    this.startSegment();
    return {
      event: (name, data, rec, now) => {
        // After a dropped error event, the engine's `[DONE]` and anything else of that segment.
        if (this.errored) return 'drop';
        if (data.trim() === '[DONE]') return inner.event(name, data, rec, now);
        // Only an event that may be an error (the word in its name or data) is parsed now; the
        // others are read into the answer when a break asks for it (AnswerBase.recordLater).
        if (name === 'error' || data.includes('error')) {
          const obj = parseObject(data);
          if (name === 'error' || (obj !== null && (Boolean(obj.error) || obj.object === 'error'))) {
            // Before the first token it is the commit point's to retry (first-token.ts). After it,
            // the stream broke: continued, or ended with the router's event saying why not.
            if (rec.firstContentAt === null) return inner.event(name, data, rec, now);
            this.segmentErrored(obj);
            return 'drop';
          }
        }
        const verdict = inner.event(name, data, rec, now);
        // A request whose shape is never continued keeps no answer.
        if (verdict === 'forward' && this.#static === null) this.recordLater(name, data);
        return verdict;
      },
      body: (obj, rec) => inner.body(obj, rec),
      errorEvent: (m, t, c) => inner.errorEvent(m, t, c),
    };
  }

  protected recordEvent(_name: string | null, obj: Json): void {
    this.#record(obj);
  }

  #record(obj: Json): void {
    if (this.#ids === null && typeof obj.id === 'string') {
      this.#ids = { id: obj.id, created: obj.created, model: obj.model, fingerprint: obj.system_fingerprint, hasFingerprint: Object.hasOwn(obj, 'system_fingerprint') };
    }
    if (isRecord(obj.usage) && Array.isArray(obj.choices) && obj.choices.length > 0) {
      // Running usage (continuous_usage_stats): the tokens so far, counted by the engine.
      if (isCount(obj.usage.completion_tokens)) this.#usageCompletion = obj.usage.completion_tokens;
      if (isCount(obj.usage.prompt_tokens) && this.#promptTokens === null) this.#promptTokens = obj.usage.prompt_tokens;
    }
    if (!Array.isArray(obj.choices)) return;
    for (const choice of obj.choices) {
      if (!isRecord(choice)) continue;
      if (choice.index !== undefined && choice.index !== 0) this.#dynamic ??= 'n_gt_1';
      if (choice.logprobs != null) this.#dynamic ??= 'logprobs';
      if (choice.finish_reason != null) this.#dynamic ??= 'answer_finished';
      let text: unknown;
      if (this.#kind === 'chat') {
        const d = choice.delta;
        if (!isRecord(d)) continue;
        if (Array.isArray(d.tool_calls) && d.tool_calls.length > 0) this.#dynamic ??= 'tool_calls';
        if (nonEmpty(d.reasoning_content) || nonEmpty(d.reasoning)) this.#dynamic ??= 'reasoning';
        text = d.content;
      } else text = choice.text;
      if (nonEmpty(text)) {
        this.#text += text;
        this.#deltas++;
        this.#pieces.push(text as string);
      }
    }
  }

  heldBack(): number {
    this.catchUp();
    return this.#held;
  }

  /** The continuation's body: the answer so far less the deltas given back at the seam (seamHoldback), the stop list as it was. */
  continuationBody(prepared: string): string {
    this.catchUp();
    const body = parseObject(prepared) ?? {};
    this.#held = seamHoldback(this.#pieces, this.#stops);
    this.#heldText = this.#pieces.slice(this.#pieces.length - this.#held).join('');
    const text = this.#text.slice(0, this.#text.length - this.#heldText.length);
    const sent = this.delivered().tokens - this.#held;
    if (this.#kind === 'chat') {
      const messages = Array.isArray(body.messages) ? body.messages : [];
      body.messages = [...messages, { role: 'assistant', content: text }];
      body.add_generation_prompt = false;
      body.continue_final_message = true;
      if (typeof body.max_completion_tokens === 'number') body.max_completion_tokens -= sent;
    } else {
      body.prompt = (Array.isArray(body.prompt) ? String(body.prompt[0]) : String(body.prompt)) + text;
    }
    if (typeof body.max_tokens === 'number') body.max_tokens -= sent;
    if (typeof body.min_tokens === 'number') body.min_tokens = Math.max(0, body.min_tokens - sent);
    return JSON.stringify(body);
  }

  splice(): (chunk: Uint8Array | null) => Uint8Array {
    this.catchUp();
    const base = this.delivered().tokens - this.#held;
    const swallow = new Swallow(this.#heldText);
    return eventSplice((event, data) => {
      if (data === null) return event;
      const obj = parseObject(data);
      if (obj === null || obj.error || obj.object === 'error') return event;
      return this.#spliceChunk(obj, base, swallow);
    });
  }

  /** One event of the continuation as the first replica would have sent it; null: dropped (its role chunk). */
  #spliceChunk(obj: Json, base: number, swallow: Swallow): string | null {
    const ids = this.#ids!;
    obj.id = ids.id;
    obj.created = ids.created;
    obj.model = ids.model;
    if (ids.hasFingerprint) obj.system_fingerprint = ids.fingerprint;
    else delete obj.system_fingerprint;
    if (this.#kind === 'chat' && Array.isArray(obj.choices)) {
      for (const choice of obj.choices) {
        if (!isRecord(choice) || !isRecord(choice.delta) || !('role' in choice.delta)) continue;
        delete choice.delta.role;
        // vLLM's first chunk: the role and an empty content; the client had its own.
        const empty = !nonEmpty(choice.delta.content) && Object.keys(choice.delta).every((k) => k === 'content') && choice.finish_reason == null;
        if (empty && obj.choices.length === 1 && !isRecord(obj.usage)) return null;
      }
    }
    // The text given back at the seam comes again: the client has it.
    if (Array.isArray(obj.choices)) {
      for (const choice of obj.choices) {
        if (!isRecord(choice)) continue;
        if (this.#kind === 'chat' && isRecord(choice.delta) && typeof choice.delta.content === 'string') choice.delta.content = swallow.take(choice.delta.content);
        else if (this.#kind === 'completion' && typeof choice.text === 'string') choice.text = swallow.take(choice.text);
      }
      const only = obj.choices.length === 1 && isRecord(obj.choices[0]) ? obj.choices[0] : null;
      const emptied = only !== null && only.finish_reason == null && !isRecord(obj.usage) && (this.#kind === 'chat' ? isRecord(only.delta) && Object.keys(only.delta).every((k) => k === 'content') && only.delta.content === '' : only.text === '');
      if (emptied) return null;
    }
    if (isRecord(obj.usage)) {
      const u = obj.usage;
      if (isCount(u.prompt_tokens) && isCount(u.completion_tokens)) {
        // The continuation's prompt is the original's plus the answer so far (`base` tokens).
        const prompt = this.#promptTokens ?? Math.max(0, u.prompt_tokens - base);
        this.#promptTokens ??= prompt;
        u.prompt_tokens = prompt;
        u.completion_tokens = base + u.completion_tokens;
        u.total_tokens = prompt + (u.completion_tokens as number);
        const d = u.prompt_tokens_details;
        if (isRecord(d) && isCount(d.cached_tokens)) d.cached_tokens = Math.min(d.cached_tokens, prompt);
      }
    }
    return `data: ${JSON.stringify(obj)}`;
  }
}

/** The engine's message in an error event (`{"error":{"message"}}` or the flat `{"object":"error","message"}`), bounded. */
function nonEmpty(v: unknown): boolean {
  return typeof v === 'string' && v.length > 0;
}
