// Continuing a broken Anthropic Messages stream (POST /v1/messages) on another replica (issue #28):
// which answers can be continued, the answer so far as the client received it, the continuation's
// upstream request and the splice of its stream into the client's. Pure: no I/O.
//
// A final assistant message is a prefill in Anthropic's API, but not on vLLM's /v1/messages: its
// handler converts the request to a ChatCompletionRequest without `continue_final_message` or
// `add_generation_prompt` (vllm/entrypoints/anthropic/serving.py `_build_base_request`), so the
// defaults apply (add_generation_prompt true: a trailing assistant message is rendered as a
// finished turn and a new one is started), and `chat_template_kwargs` cannot override them
// (ChatCompletionRequest.build_chat_params merges the request's own two flags over the kwargs,
// vllm/entrypoints/openai/chat_completion/protocol.py and vllm/renderers/params.py merge_kwargs).
// So the continuation goes where vLLM itself sends a Messages request: its chat path. The router
// converts the request as `_convert_anthropic_to_openai_request` does (system text, messages and
// their text / tool_use / tool_result / thinking blocks, tools, tool_choice, stop_sequences,
// sampling), appends the answer so far as an open final assistant message
// (`continue_final_message: true`, `add_generation_prompt: false`), posts it to
// /v1/chat/completions, and rewrites that stream into the Messages events the client's stream is
// made of (`message_stream_converter` in the same file): text deltas on the open text block's
// index, then content_block_stop, message_delta (stop_reason, usage as one replica's) and
// message_stop; no second message_start. At temperature 0 on the same model the chat render of
// the converted request is the Messages render, so the continuation is the answer's own tail.

import { AnswerBase, eventSplice, inBandErrorMessage, seamHoldback, stopList, Swallow, type AnswerContinuation } from '../../../proxy/continuation.js';
import { isCount, isRecord, parseObject, type EventReader, type Json } from '../../../proxy/sse-tap.js';

/** The chat path of the replica's engine, where the continuation goes (see above). */
export const MESSAGES_CONTINUATION_PATH = '/v1/chat/completions';

/** Claude Code's attribution block: vLLM drops it from the system prompt (serving.py `_convert_system_message`). */
const BILLING_HEADER = 'x-anthropic-billing-header';
/** Non-standard roles vLLM maps to user (protocol.py AnthropicMessage.normalize_role). */
const ROLE_MAP: Record<string, string> = { ctx: 'user', msg: 'user' };

type Converted = { ok: true; messages: Json[] } | { ok: false; why: string };

/**
 * The request's messages as vLLM's `_convert_anthropic_to_openai_request` makes them (system
 * first), or why the router cannot make them the same (a block it does not convert: images,
 * documents, a tool result holding one). Blocks vLLM converts are converted the same way here;
 * `tool_use.input` is re-serialised in Python's `json.dumps` style (`, ` and `: `, ASCII), as vLLM
 * does, though a float written `1.0` by the client reads back as `1` (JSON.parse keeps no
 * distinction): such an argument renders one character differently.
 */
export function convertMessages(body: Record<string, unknown>): Converted {
  if (!Array.isArray(body.messages)) return { ok: false, why: 'messages' };
  const system: string[] = [];
  const sys = body.system;
  if (typeof sys === 'string') {
    if (sys !== '') system.push(sys);
  } else if (Array.isArray(sys)) {
    for (const b of sys) if (isRecord(b) && b.type === 'text' && nonEmpty(b.text) && !(b.text as string).startsWith(BILLING_HEADER)) system.push(b.text as string);
  }
  const roleOf = (m: Json) => (typeof m.role === 'string' ? (ROLE_MAP[m.role] ?? m.role) : '');
  for (const m of body.messages) {
    if (!isRecord(m) || roleOf(m) !== 'system') continue;
    if (typeof m.content === 'string') system.push(m.content);
    else if (Array.isArray(m.content)) for (const b of m.content) if (isRecord(b) && b.type === 'text' && nonEmpty(b.text) && !(b.text as string).startsWith(BILLING_HEADER)) system.push(b.text as string);
  }
  const out: Json[] = [];
  if (system.length > 0) out.push({ role: 'system', content: system.join('') });
  for (const m of body.messages) {
    if (!isRecord(m)) return { ok: false, why: 'messages' };
    const role = roleOf(m);
    if (role === 'system') continue;
    const msg: Json = { role };
    if (typeof m.content === 'string') {
      msg.content = m.content;
      out.push(msg);
      continue;
    }
    if (!Array.isArray(m.content)) return { ok: false, why: 'messages' };
    const parts: Json[] = [];
    const toolCalls: Json[] = [];
    const reasoning: string[] = [];
    for (const b of m.content) {
      if (!isRecord(b)) return { ok: false, why: 'content_blocks' };
      switch (b.type) {
        case 'text':
          if (nonEmpty(b.text)) parts.push({ type: 'text', text: b.text });
          break;
        case 'thinking':
          if (typeof b.thinking === 'string') reasoning.push(b.thinking);
          break;
        case 'redacted_thinking':
          break;
        case 'tool_use':
          // vLLM invents `call_<time>` for a missing id: not reproducible.
          if (!nonEmpty(b.id)) return { ok: false, why: 'content_blocks' };
          toolCalls.push({ id: b.id, type: 'function', function: { name: typeof b.name === 'string' ? b.name : '', arguments: pyJsonDumps(isRecord(b.input) ? b.input : {}) } });
          break;
        case 'tool_result': {
          // An assistant's tool result becomes `Tool result: str(content)` (Python's repr of a list): only strings are the same here.
          if (role !== 'user') {
            if (b.content != null && typeof b.content !== 'string') return { ok: false, why: 'content_blocks' };
            parts.push({ type: 'text', text: `Tool result: ${typeof b.content === 'string' ? b.content : ''}` });
            break;
          }
          let text = '';
          if (typeof b.content === 'string') text = b.content;
          else if (Array.isArray(b.content)) {
            const texts: string[] = [];
            for (const item of b.content) {
              if (!isRecord(item)) continue;
              if (item.type === 'text') texts.push(typeof item.text === 'string' ? item.text : '');
              // Images and tool references add messages of their own: not converted here.
              else if (item.type === 'image' || item.type === 'tool_reference') return { ok: false, why: 'content_blocks' };
            }
            text = texts.join('\n');
          } else if (b.content != null) return { ok: false, why: 'content_blocks' };
          out.push({ role: 'tool', tool_call_id: typeof b.tool_use_id === 'string' ? b.tool_use_id : '', content: text });
          break;
        }
        default:
          // image, document and anything newer: not converted by the router.
          return { ok: false, why: 'content_blocks' };
      }
    }
    if (reasoning.length > 0) msg.reasoning = reasoning.join('');
    if (toolCalls.length > 0) msg.tool_calls = toolCalls;
    if (parts.length > 0) msg.content = parts.length === 1 ? (parts[0]!.text as string) : parts;
    // A user message left without content (only tool results) is not sent.
    if (!(role === 'user' && !('content' in msg))) out.push(msg);
  }
  return { ok: true, messages: out };
}

/**
 * Why a Messages request's answer can never be continued, from its top-level fields (cheap: made
 * for every streamed request), or null; its blocks are checked only at a break (convertMessages).
 */
export function messagesFieldRefusal(body: Record<string, unknown>): string | null {
  const oc = body.output_config;
  if (isRecord(oc) && oc.format != null) return 'response_format';
  const tc = body.tool_choice;
  // `any` and a named tool are structured outputs on vLLM (tool_choice required / named).
  if (isRecord(tc) && (tc.type === 'any' || tc.type === 'tool')) return 'guided_decoding';
  if (body.stop_sequences != null && !(Array.isArray(body.stop_sequences) && body.stop_sequences.every((x) => typeof x === 'string'))) return 'stop_sequences';
  if (Array.isArray(body.tools) && !body.tools.every((t) => isRecord(t) && typeof t.name === 'string')) return 'tools';
  return null;
}

/** Why a Messages request's answer can never be continued (its fields, then its blocks), or null. */
export function messagesStaticRefusal(body: Record<string, unknown>): string | null {
  const c = messagesFieldRefusal(body) ?? convertMessages(body);
  return typeof c === 'string' ? c : c.ok ? null : c.why;
}

interface StartUsage {
  input: number | null;
  cacheRead: number | null;
  cacheCreation: number | null;
}

/**
 * The answer of one Messages stream as the client received it, across its segments. Delivered
 * tokens: the text deltas counted (vLLM's Messages stream carries no running usage; one delta per
 * decode step by default, as for chat).
 */
export class AnthropicAnswer extends AnswerBase implements AnswerContinuation {
  readonly continuationPath = MESSAGES_CONTINUATION_PATH;
  readonly #static: string | null;
  readonly #body: Record<string, unknown>;
  /** The request converted as vLLM's handler converts it: made at the first break, not per request. */
  #converted: Converted | null = null;
  readonly #maxTokens: number | null;
  #dynamic: string | null = null;
  /** The text block was closed: the message went on to another block (its start says which) or ended. */
  #closed = false;
  #text = '';
  #deltas = 0;
  /** Each text delta, in order; the stop sequences; the deltas the last continuation body gave back (seamHoldback). */
  #pieces: string[] = [];
  readonly #stops: string[];
  #held = 0;
  #heldText = '';
  #messageId: string | null = null;
  /** The open text block's index: the continuation's deltas go there. */
  #textIndex: number | null = null;
  #start: StartUsage = { input: null, cacheRead: null, cacheCreation: null };

  constructor(body: Record<string, unknown>) {
    super();
    this.#body = body;
    this.#static = messagesFieldRefusal(body);
    this.#stops = stopList(body.stop_sequences);
    this.#maxTokens = typeof body.max_tokens === 'number' && Number.isInteger(body.max_tokens) ? body.max_tokens : null;
  }

  refusal(): string | null {
    this.catchUp();
    if (this.#static !== null) return this.#static;
    if (this.#dynamic !== null) return this.#dynamic;
    if (this.#closed) return 'answer_finished';
    this.#converted ??= convertMessages(this.#body);
    if (!this.#converted.ok) return this.#converted.why;
    if (this.#messageId === null || this.#textIndex === null || this.#text.length === 0) return 'no_content';
    if (this.#maxTokens !== null && this.#maxTokens - this.#deltas < 1) return 'max_tokens_reached';
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
          // vLLM's Messages stream reports an engine failure as `event: error` (its converter fails
          // on the chat stream's error chunk); an OpenAI-shaped error chunk is read the same way.
          if (type === 'error' || name === 'error' || (obj !== null && Boolean(obj.error))) {
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
    switch (type) {
      case 'message_start': {
        const m = isRecord(obj.message) ? obj.message : null;
        if (m && typeof m.id === 'string' && this.#messageId === null) {
          this.#messageId = m.id;
          const u = isRecord(m.usage) ? m.usage : {};
          this.#start = { input: isCount(u.input_tokens) ? u.input_tokens : null, cacheRead: isCount(u.cache_read_input_tokens) ? u.cache_read_input_tokens : null, cacheCreation: isCount(u.cache_creation_input_tokens) ? u.cache_creation_input_tokens : null };
        }
        break;
      }
      case 'content_block_start': {
        const b = isRecord(obj.content_block) ? obj.content_block : {};
        if (b.type === 'text' && typeof obj.index === 'number' && this.#textIndex === null) this.#textIndex = obj.index;
        else this.#dynamic ??= b.type === 'tool_use' ? 'tool_calls' : b.type === 'thinking' || b.type === 'redacted_thinking' ? 'reasoning' : 'content_blocks';
        break;
      }
      case 'content_block_delta': {
        const d = isRecord(obj.delta) ? obj.delta : {};
        if (d.type === 'text_delta') {
          if (obj.index !== this.#textIndex) this.#dynamic ??= 'content_blocks';
          if (nonEmpty(d.text)) {
            this.#text += d.text;
            this.#deltas++;
            this.#pieces.push(d.text as string);
          }
        } else this.#dynamic ??= d.type === 'input_json_delta' ? 'tool_calls' : d.type === 'thinking_delta' || d.type === 'signature_delta' ? 'reasoning' : 'content_blocks';
        break;
      }
      // vLLM closes a block only when another starts (said by that block) or the message ends.
      case 'content_block_stop':
        this.#closed = true;
        break;
      case 'message_delta':
      case 'message_stop':
        this.#dynamic ??= 'answer_finished';
        break;
    }
  }

  /** The Chat Completions request asking another replica to continue the answer (see the header). */
  heldBack(): number {
    this.catchUp();
    return this.#held;
  }

  continuationBody(prepared: string): string {
    this.catchUp();
    const b = parseObject(prepared) ?? {};
    this.#held = seamHoldback(this.#pieces, this.#stops);
    this.#heldText = this.#pieces.slice(this.#pieces.length - this.#held).join('');
    const sent = this.#deltas - this.#held;
    this.#converted ??= convertMessages(this.#body);
    const max = typeof b.max_tokens === 'number' ? b.max_tokens - sent : undefined;
    const chat: Json = {
      model: b.model,
      messages: [...(this.#converted?.ok ? this.#converted.messages : []), { role: 'assistant', content: this.#text.slice(0, this.#text.length - this.#heldText.length) }],
      add_generation_prompt: false,
      continue_final_message: true,
      // vLLM's Messages handler asks its chat path for both (`_handle_streaming_options`).
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
      ...(max !== undefined ? { max_tokens: max, max_completion_tokens: max } : {}),
    };
    if (Array.isArray(b.stop_sequences)) chat.stop = b.stop_sequences;
    for (const f of ['temperature', 'top_p', 'top_k', 'chat_template_kwargs', 'kv_transfer_params', 'cache_salt', 'request_id'] as const) if (b[f] !== undefined && b[f] !== null) chat[f] = b[f];
    if (isRecord(b.output_config) && typeof b.output_config.effort === 'string') chat.reasoning_effort = b.output_config.effort;
    if (Array.isArray(b.tools)) {
      chat.tools = b.tools.filter(isRecord).map((t) => {
        const schema = isRecord(t.input_schema) ? { ...t.input_schema } : {};
        // AnthropicTool.validate_input_schema: a schema without `type` is an object's.
        if (!('type' in schema)) schema.type = 'object';
        return { type: 'function', function: { name: t.name, ...(t.description != null ? { description: t.description } : {}), parameters: schema, ...(t.defer_loading != null ? { defer_loading: t.defer_loading } : {}) } };
      });
      const tc = isRecord(b.tool_choice) ? b.tool_choice.type : undefined;
      chat.tool_choice = tc === 'none' ? 'none' : 'auto';
    }
    return JSON.stringify(chat);
  }

  /**
   * Chat Completions chunks → the Messages events vLLM's converter makes of them
   * (serving.py `message_stream_converter`): the role chunk dropped, each content delta a
   * text_delta on the open block, the usage-only chunk the block's stop and the message_delta,
   * `[DONE]` the message_stop. Usage as one replica's: the first segment's input accounting
   * (message_start's) and the whole answer's output tokens.
   */
  splice(): (chunk: Uint8Array | null) => Uint8Array {
    this.catchUp();
    const base = this.#deltas - this.#held;
    const swallow = new Swallow(this.#heldText);
    const index = this.#textIndex ?? 0;
    let finish: string | null = null;
    let stopSequence: string | null = null;
    const event = (type: string, data: Json) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}`;
    return eventSplice((_event, data) => {
      if (data === null) return null;
      if (data.trim() === '[DONE]') return event('message_stop', {});
      const obj = parseObject(data);
      if (obj === null) return null;
      if (obj.error || obj.object === 'error') return event('error', { error: { type: 'api_error', message: inBandErrorMessage(obj) ?? 'Replica failed mid-response' } });
      const choices = Array.isArray(obj.choices) ? obj.choices : [];
      if (choices.length === 0) {
        if (!isRecord(obj.usage)) return null;
        const completion = isCount(obj.usage.completion_tokens) ? obj.usage.completion_tokens : 0;
        const prompt = isCount(obj.usage.prompt_tokens) ? Math.max(0, obj.usage.prompt_tokens - base) : 0;
        const s = this.#start;
        const usage: Json = { input_tokens: s.input ?? prompt, output_tokens: base + completion };
        if (s.cacheRead !== null) usage.cache_read_input_tokens = s.cacheRead;
        if (s.cacheCreation !== null) usage.cache_creation_input_tokens = s.cacheCreation;
        const stopReason = stopSequence !== null ? 'stop_sequence' : finish === 'length' ? 'max_tokens' : finish === 'tool_calls' ? 'tool_use' : 'end_turn';
        return `${event('content_block_stop', { index })}\n\n${event('message_delta', { delta: { stop_reason: stopReason, stop_sequence: stopSequence }, usage })}`;
      }
      const c = choices[0];
      if (!isRecord(c)) return null;
      if (typeof c.finish_reason === 'string') {
        finish = c.finish_reason;
        // vLLM's chat chunk names the stop string that ended it in `stop_reason`.
        if (c.finish_reason === 'stop' && typeof c.stop_reason === 'string') stopSequence = c.stop_reason;
      }
      const d = isRecord(c.delta) ? c.delta : {};
      // The first segment's answer was plain text: a tool call or reasoning now cannot be written
      // into its block. Said in an error event, refused so that it is not tried again.
      if ((Array.isArray(d.tool_calls) && d.tool_calls.length > 0) || nonEmpty(d.reasoning) || nonEmpty(d.reasoning_content)) {
        this.#dynamic ??= Array.isArray(d.tool_calls) && d.tool_calls.length > 0 ? 'tool_calls' : 'reasoning';
        return event('error', { error: { type: 'api_error', message: `The continuation turned into ${this.#dynamic === 'tool_calls' ? 'a tool call' : 'reasoning'}` } });
      }
      // The text given back at the seam comes again: the client has it.
      const text = typeof d.content === 'string' ? swallow.take(d.content) : '';
      if (text === '') return null;
      return event('content_block_delta', { index, delta: { type: 'text_delta', text } });
    });
  }
}

/**
 * Python's `json.dumps` with its defaults (`, ` and `: ` separators, non-ASCII as `\uXXXX`), as
 * vLLM serialises a tool_use block's input into the chat message's arguments.
 */
export function pyJsonDumps(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'string') return JSON.stringify(v).replace(/[\u0080-\uffff]/g, (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (typeof v === 'number') return Number.isFinite(v) ? JSON.stringify(v) : v > 0 ? 'Infinity' : v < 0 ? '-Infinity' : 'NaN';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (Array.isArray(v)) return `[${v.map(pyJsonDumps).join(', ')}]`;
  if (typeof v === 'object') return `{${Object.entries(v as Record<string, unknown>).map(([k, x]) => `${pyJsonDumps(k)}: ${pyJsonDumps(x)}`).join(', ')}}`;
  return 'null';
}

/** The engine's message in an error event (Anthropic's `{error:{message}}`, OpenAI's, or the flat one), bounded. */
function nonEmpty(v: unknown): boolean {
  return typeof v === 'string' && v.length > 0;
}
