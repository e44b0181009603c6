// Continuing a broken Responses API stream (POST /v1/responses) on another replica (issue #28):
// which answers can be continued, the answer so far, the continuation's request and the splice of
// its events into the client's stream. Pure: no I/O.
//
// vLLM's Responses API continues a partial assistant message: when the last input item is a
// message (or reasoning) whose `status` is `in_progress` or `incomplete`, it renders the chat with
// `continue_final_message` and without the generation prompt (vllm/entrypoints/openai/responses/
// utils.py `should_continue_final_message`, read by ResponsesRequest.build_chat_params in
// responses/protocol.py; vllm-project/vllm#32100, January 2026). An older vLLM renders such an item
// as a finished turn and starts a new message, so a pool turns this on (`continueResponses`) only
// for replicas that have it. The continuation is the same request with the answer so far appended
// as that item and `max_output_tokens` reduced; its events are rewritten into the first
// response's: its created / in_progress / output_item.added / content_part.added dropped, ids
// (response, item), `sequence_number`s carried on, the done events' text and the final response's
// output made whole, the usage one replica's.
//
// Not continued: a follow-up (`previous_response_id`: the conversation is stored on one replica),
// a stored response (`store` in effect, as response.created says: the first replica keeps the
// broken response under its id, and the continuing one would store only the tail), background
// responses, structured output, logprobs, a forced tool, and an answer with reasoning, a tool
// call or a second output item.

import { AnswerBase, eventSplice, seamHoldback, stopList, Swallow, type AnswerContinuation } from '../../../proxy/continuation.js';
import { isCount, isRecord, parseObject, type EventReader, type Json } from '../../../proxy/sse-tap.js';

/** Why a Responses request's answer can never be continued (its shape), or null. */
export function responsesStaticRefusal(b: Record<string, unknown>): string | null {
  if (typeof b.previous_response_id === 'string') return 'previous_response_id';
  if (b.background === true) return 'background';
  if (isRecord(b.text) && isRecord(b.text.format) && b.text.format.type !== 'text') return 'response_format';
  if (b.structured_outputs != null) return 'guided_decoding';
  if (b.tool_choice === 'required' || isRecord(b.tool_choice)) return 'guided_decoding';
  if (Array.isArray(b.include) && b.include.includes('message.output_text.logprobs')) return 'logprobs';
  if (b.prompt != null) return 'prompt_template';
  if (Array.isArray(b.input)) {
    const last = b.input[b.input.length - 1];
    // The client's own partial message: continuing it needs its text left as it is.
    if (isRecord(last) && (last.status === 'in_progress' || last.status === 'incomplete')) return 'client_prefill';
  } else if (typeof b.input !== 'string') return 'input';
  return null;
}

interface First {
  response: Json;
  itemId: string;
  outputIndex: number;
  contentIndex: number;
}

/**
 * The answer of one Responses stream as the client received it, across its segments. Delivered
 * tokens: the output_text deltas counted (one per decode step by default).
 */
export class ResponsesAnswer extends AnswerBase implements AnswerContinuation {
  readonly #static: string | null;
  #dynamic: string | null = null;
  #text = '';
  #deltas = 0;
  /** Each text delta, in order; vLLM's `stop` extension; the deltas the last continuation body gave back (seamHoldback). */
  #pieces: string[] = [];
  readonly #stops: string[];
  #held = 0;
  #heldText = '';
  #lastSeq = -1;
  #first: First | null = null;
  #response: Json | null = null;
  #item: { id: string; outputIndex: number } | null = null;

  constructor(body: Record<string, unknown>, enabled: boolean) {
    super();
    this.#static = enabled ? responsesStaticRefusal(body) : 'continue_responses_off';
    this.#stops = stopList(body.stop);
  }

  refusal(): string | null {
    this.catchUp();
    if (this.#static !== null) return this.#static;
    if (this.#dynamic !== null) return this.#dynamic;
    if (this.#first === null || this.#text.length === 0) return 'no_content';
    const max = this.#first.response.max_output_tokens;
    if (typeof max === 'number' && max - this.#deltas < 1) return 'max_tokens_reached';
    return null;
  }

  delivered(): { tokens: number; from: 'usage' | 'deltas' } {
    this.catchUp();
    return { tokens: this.#deltas, from: 'deltas' };
  }

  observe(inner: EventReader): EventReader {
    this.startSegment();
    return {
      event: (name, data, rec, now) => {
        if (this.errored) return 'drop';
        // Only an event that may be an error (the word in its name or data) is parsed now; the
        // others are read into the answer when a break asks for it (AnswerBase.recordLater).
        if (name === 'error' || data.includes('error')) {
          const obj = parseObject(data);
          const type = obj !== null && typeof obj.type === 'string' ? obj.type : name;
          if (type === 'error' || (obj !== null && Boolean(obj.error) && type !== 'response.failed')) {
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

  protected recordEvent(name: string | null, obj: Json): void {
    this.#record(typeof obj.type === 'string' ? obj.type : name, obj);
  }

  #record(type: string | null, obj: Json): void {
    if (typeof obj.sequence_number === 'number') this.#lastSeq = Math.max(this.#lastSeq, obj.sequence_number);
    switch (type) {
      case 'response.created':
        if (isRecord(obj.response) && this.#response === null) {
          this.#response = obj.response;
          // vLLM turns `store` off quietly when its store is disabled: the response says which.
          if (obj.response.store === true) this.#dynamic ??= 'responses_store';
        }
        break;
      case 'response.output_item.added': {
        const it = isRecord(obj.item) ? obj.item : {};
        if (it.type === 'message' && this.#item === null && typeof it.id === 'string' && typeof obj.output_index === 'number') this.#item = { id: it.id, outputIndex: obj.output_index };
        else this.#dynamic ??= it.type === 'reasoning' ? 'reasoning' : it.type === 'function_call' || it.type === 'custom_tool_call' ? 'tool_calls' : 'content_blocks';
        break;
      }
      case 'response.content_part.added':
        if (this.#first === null && this.#response && this.#item && obj.item_id === this.#item.id && typeof obj.content_index === 'number') {
          this.#first = { response: this.#response, itemId: this.#item.id, outputIndex: this.#item.outputIndex, contentIndex: obj.content_index };
        } else this.#dynamic ??= 'content_blocks';
        break;
      case 'response.output_text.delta':
        if (this.#first === null || obj.item_id !== this.#first.itemId || obj.content_index !== this.#first.contentIndex) this.#dynamic ??= 'content_blocks';
        else if (typeof obj.delta === 'string' && obj.delta.length > 0) {
          this.#text += obj.delta;
          this.#deltas++;
          this.#pieces.push(obj.delta);
        }
        break;
      default:
        if (type === null) break;
        if (type.startsWith('response.reasoning')) this.#dynamic ??= 'reasoning';
        else if (type.includes('call')) this.#dynamic ??= 'tool_calls';
        else if (type.endsWith('.done') || type === 'response.completed' || type === 'response.incomplete' || type === 'response.failed') this.#dynamic ??= 'answer_finished';
        else if (type.endsWith('.delta') || type.endsWith('.added')) this.#dynamic ??= 'content_blocks';
    }
  }

  heldBack(): number {
    this.catchUp();
    return this.#held;
  }

  continuationBody(prepared: string): string {
    this.catchUp();
    const b = parseObject(prepared) ?? {};
    this.#held = seamHoldback(this.#pieces, this.#stops);
    this.#heldText = this.#pieces.slice(this.#pieces.length - this.#held).join('');
    const input = typeof b.input === 'string' ? [{ role: 'user', content: b.input }] : Array.isArray(b.input) ? b.input : [];
    // The form vllm-project/vllm#32100 documents: an assistant message with a string content and a status.
    b.input = [...input, { role: 'assistant', content: this.#text.slice(0, this.#text.length - this.#heldText.length), status: 'in_progress' }];
    if (typeof b.max_output_tokens === 'number') b.max_output_tokens -= this.#deltas - this.#held;
    // Nothing of it is kept: the continuing replica must not store a response under the client's id.
    b.store = false;
    return JSON.stringify(b);
  }

  /**
   * The continuation's events as the first response's: see the header. `base` tokens were
   * delivered before it; the original prompt is the continuation's input less them.
   */
  splice(): (chunk: Uint8Array | null) => Uint8Array {
    this.catchUp();
    const first = this.#first!;
    const base = this.#deltas - this.#held;
    const swallow = new Swallow(this.#heldText);
    // The text the continuation's own done events leave out: what was prefilled.
    const head = this.#text.slice(0, this.#text.length - this.#heldText.length);
    const write = (type: string, data: Json) => `event: ${type}\ndata: ${JSON.stringify({ ...data, type, sequence_number: ++this.#lastSeq })}`;
    const wholeItem = (item: unknown): unknown => {
      if (!isRecord(item)) return item;
      const content = Array.isArray(item.content) ? item.content.map((p) => (isRecord(p) && typeof p.text === 'string' ? { ...p, text: head + p.text } : p)) : item.content;
      return { ...item, id: first.itemId, content };
    };
    return eventSplice((_event, data) => {
      if (data === null) return null;
      const obj = parseObject(data);
      if (obj === null) return null;
      const type = typeof obj.type === 'string' ? obj.type : null;
      switch (type) {
        case 'response.created':
        case 'response.in_progress':
        case 'response.output_item.added':
        case 'response.content_part.added':
          return null;
        case 'response.output_text.delta': {
          // The text given back at the seam comes again: the client has it.
          const delta = typeof obj.delta === 'string' ? swallow.take(obj.delta) : '';
          if (delta === '') return null;
          return write(type, { ...obj, delta, item_id: first.itemId, output_index: first.outputIndex, content_index: first.contentIndex });
        }
        case 'response.output_text.done':
          return write(type, { ...obj, item_id: first.itemId, output_index: first.outputIndex, content_index: first.contentIndex, text: head + (typeof obj.text === 'string' ? obj.text : '') });
        case 'response.content_part.done': {
          const part = isRecord(obj.part) && typeof obj.part.text === 'string' ? { ...obj.part, text: head + obj.part.text } : obj.part;
          return write(type, { ...obj, item_id: first.itemId, output_index: first.outputIndex, content_index: first.contentIndex, part });
        }
        case 'response.output_item.done':
          return write(type, { ...obj, output_index: first.outputIndex, item: wholeItem(obj.item) });
        case 'response.completed':
        case 'response.incomplete':
        case 'response.failed': {
          const r = isRecord(obj.response) ? obj.response : {};
          const orig = first.response;
          const out: Json = { ...r, id: orig.id, created_at: orig.created_at, max_output_tokens: orig.max_output_tokens, store: orig.store };
          if (Array.isArray(r.output)) out.output = r.output.map((it) => (isRecord(it) && it.type === 'message' ? wholeItem(it) : it));
          if (isRecord(r.usage) && isCount(r.usage.input_tokens) && isCount(r.usage.output_tokens)) {
            const input = Math.max(0, r.usage.input_tokens - base);
            const output = base + r.usage.output_tokens;
            const details = isRecord(r.usage.input_tokens_details) ? { ...r.usage.input_tokens_details } : null;
            if (details && isCount(details.cached_tokens)) details.cached_tokens = Math.min(details.cached_tokens, input);
            out.usage = { ...r.usage, input_tokens: input, output_tokens: output, total_tokens: input + output, ...(details ? { input_tokens_details: details } : {}) };
          }
          return write(type, { ...obj, response: out });
        }
        default:
          // An error event (observed as the break), or anything else of the message: renumbered.
          return write(type ?? 'message', obj);
      }
    });
  }
}

