// The Anthropic Messages continuation (issue #28), pure: the request converted to vLLM's chat
// request as its Messages handler converts it (vllm/entrypoints/anthropic/serving.py
// `_convert_anthropic_to_openai_request`), which answers can be continued, the continuation's body
// (continue_final_message, max_tokens less the delivered tokens) and the splice of its chat stream
// into Messages events (one message, the open block's index, stop_reason and usage as one replica's).

import { describe, expect, it } from 'vitest';

import { AnthropicAnswer, convertMessages, messagesStaticRefusal, pyJsonDumps } from '../../../src/http/apis/anthropic/continuation.js';
import { anthropicReader } from '../../../src/http/apis/anthropic/reader.js';
import { ResponseTap } from '../../../src/proxy/sse-tap.js';

const enc = new TextEncoder();
const dec = new TextDecoder();
const named = (type: string, o: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...o })}\n\n`;
const chat = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;

const START = named('message_start', { message: { id: 'msg_A', type: 'message', role: 'assistant', model: 'm', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 30, output_tokens: 0, cache_read_input_tokens: 16, cache_creation_input_tokens: 0 } } });
const TEXT_START = named('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
const delta = (text: string, index = 0) => named('content_block_delta', { index, delta: { type: 'text_delta', text } });

function stream(a: AnthropicAnswer, events: string[]): string {
  const tap = new ResponseTap({ stream: true, stripUsageChunk: false, now: () => 1, reader: a.observe(anthropicReader()) });
  let out = '';
  for (const e of events) out += dec.decode(tap.push(enc.encode(e)));
  return out + dec.decode(tap.end());
}

const BODY = { model: 'm', max_tokens: 10, stream: true, messages: [{ role: 'user', content: 'hi' }] };

describe("the request as vLLM's Messages handler converts it", () => {
  it('system text (billing header dropped, system-role messages appended), roles mapped, one text part a string, several a list', () => {
    const c = convertMessages({
      system: [{ type: 'text', text: 'x-anthropic-billing-header: cc=1' }, { type: 'text', text: 'Be terse. ' }, { type: 'text', text: '' }],
      messages: [
        { role: 'system', content: 'And kind.' },
        { role: 'ctx', content: [{ type: 'text', text: 'a' }] },
        { role: 'assistant', content: [{ type: 'text', text: 'b' }, { type: 'text', text: 'c' }] },
        { role: 'user', content: 'd' },
      ],
    });
    expect(c).toEqual({
      ok: true,
      messages: [
        { role: 'system', content: 'Be terse. And kind.' },
        { role: 'user', content: 'a' },
        { role: 'assistant', content: [{ type: 'text', text: 'b' }, { type: 'text', text: 'c' }] },
        { role: 'user', content: 'd' },
      ],
    });
  });

  it('tool_use → tool_calls with json.dumps arguments; a user tool_result → a tool message before the user text; thinking → reasoning', () => {
    const c = convertMessages({
      messages: [
        { role: 'user', content: 'go' },
        { role: 'assistant', content: [{ type: 'thinking', thinking: 'hmm', signature: 's' }, { type: 'text', text: 'calling' }, { type: 'tool_use', id: 'tu1', name: 'f', input: { a: [1, 'é'], b: { c: true } } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: [{ type: 'text', text: 'r1' }, { type: 'text', text: 'r2' }] }, { type: 'text', text: 'thanks' }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: 'only' }] },
      ],
    });
    expect(c).toEqual({
      ok: true,
      messages: [
        { role: 'user', content: 'go' },
        { role: 'assistant', reasoning: 'hmm', tool_calls: [{ id: 'tu1', type: 'function', function: { name: 'f', arguments: '{"a": [1, "\\u00e9"], "b": {"c": true}}' } }], content: 'calling' },
        { role: 'tool', tool_call_id: 'tu1', content: 'r1\nr2' },
        { role: 'user', content: 'thanks' },
        // A user message of tool results only is not sent itself.
        { role: 'tool', tool_call_id: 'tu1', content: 'only' },
      ],
    });
    expect(pyJsonDumps({ k: 'a\n"b"', n: null, f: 1.5 })).toBe('{"k": "a\\n\\"b\\"", "n": null, "f": 1.5}');
  });

  it('refuses what it cannot convert the same way, and what vLLM decodes under a grammar', () => {
    expect(messagesStaticRefusal(BODY)).toBeNull();
    expect(messagesStaticRefusal({ ...BODY, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'u' } }] }] })).toBe('content_blocks');
    expect(messagesStaticRefusal({ ...BODY, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', content: [{ type: 'image' }] }] }] })).toBe('content_blocks');
    expect(messagesStaticRefusal({ ...BODY, messages: [{ role: 'assistant', content: [{ type: 'tool_use', name: 'f', input: {} }] }] })).toBe('content_blocks');
    expect(messagesStaticRefusal({ ...BODY, output_config: { format: { type: 'json_schema', schema: {} } } })).toBe('response_format');
    expect(messagesStaticRefusal({ ...BODY, tool_choice: { type: 'any' } })).toBe('guided_decoding');
    expect(messagesStaticRefusal({ ...BODY, tool_choice: { type: 'tool', name: 'f' } })).toBe('guided_decoding');
    expect(messagesStaticRefusal({ ...BODY, tool_choice: { type: 'auto' }, tools: [{ name: 'f', input_schema: {} }] })).toBeNull();
  });
});

describe('which answers can be continued', () => {
  it('a text block under way can; a tool_use or thinking block, a closed block or a finished message cannot', () => {
    const a = new AnthropicAnswer(BODY);
    stream(a, [START, TEXT_START, delta('Hello ')]);
    expect(a.refusal()).toBeNull();
    expect(a.delivered()).toEqual({ tokens: 1, from: 'deltas' });
    for (const [why, events] of [
      ['tool_calls', [named('content_block_stop', { index: 0 }), named('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 't', name: 'f', input: {} } })]],
      ['reasoning', [named('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'x' } })]],
      ['answer_finished', [named('content_block_stop', { index: 0 })]],
    ] as const) {
      const b = new AnthropicAnswer(BODY);
      stream(b, [START, TEXT_START, delta('Hello '), ...events]);
      expect(b.refusal()).toBe(why);
    }
    const none = new AnthropicAnswer(BODY);
    stream(none, [START, TEXT_START]);
    expect(none.refusal()).toBe('no_content');
  });

  it("an error event after content is dropped (its message kept for the router's own); before content it passes", () => {
    const a = new AnthropicAnswer(BODY);
    const out = stream(a, [START, TEXT_START, delta('Hello '), named('error', { error: { type: 'internal_error', message: 'engine died' } })]);
    expect(a.errored).toBe(true);
    expect(a.errorMessage).toBe('engine died');
    expect(out).not.toContain('engine died');
    const b = new AnthropicAnswer(BODY);
    expect(stream(b, [START, named('error', { error: { type: 'internal_error', message: 'early' } })])).toContain('early');
    expect(b.errored).toBe(false);
  });
});

describe('the continuation', () => {
  it('asks the chat path to continue the open assistant message, max_tokens less what was delivered, the stop list and sampling carried', () => {
    const a = new AnthropicAnswer({ ...BODY, system: 'S', stop_sequences: ['END'], temperature: 0, top_k: 1, tools: [{ name: 'f', input_schema: { properties: {} } }] });
    stream(a, [START, TEXT_START, delta('Hello '), delta('there ')]);
    expect(a.continuationPath).toBe('/v1/chat/completions');
    const body = JSON.parse(a.continuationBody(JSON.stringify({ ...BODY, system: 'S', stop_sequences: ['END'], temperature: 0, top_k: 1, metadata: { user_id: 'u' }, cache_salt: 'salt', request_id: 'rid', tools: [{ name: 'f', input_schema: { properties: {} } }] })));
    expect(body).toEqual({
      model: 'm',
      messages: [
        { role: 'system', content: 'S' },
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'Hello there ' },
      ],
      add_generation_prompt: false,
      continue_final_message: true,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
      max_tokens: 8,
      max_completion_tokens: 8,
      stop: ['END'],
      temperature: 0,
      top_k: 1,
      cache_salt: 'salt',
      request_id: 'rid',
      tools: [{ type: 'function', function: { name: 'f', parameters: { properties: {}, type: 'object' } } }],
      tool_choice: 'auto',
    });
  });

  it("splices the chat stream into the message's events: no role chunk, the block's index, its stop, message_delta with one replica's usage, message_stop", () => {
    const a = new AnthropicAnswer(BODY);
    stream(a, [START, named('ping', {}), named('content_block_start', { index: 2, content_block: { type: 'text', text: '' } }), delta('one ', 2), delta('two ', 2)]);
    const splice = a.splice();
    const base = { id: 'chatcmpl-B', object: 'chat.completion.chunk', created: 1, model: 'm' };
    const src = [
      chat({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }),
      chat({ ...base, choices: [{ index: 0, delta: { content: 'three ' }, finish_reason: null }] }),
      chat({ ...base, choices: [{ index: 0, delta: { content: 'four' }, finish_reason: 'stop', stop_reason: 'END' }] }),
      chat({ ...base, choices: [], usage: { prompt_tokens: 32, completion_tokens: 3, total_tokens: 35 } }),
      'data: [DONE]\n\n',
    ].join('');
    // Cut anywhere: the splice holds a partial event.
    const bytes = enc.encode(src);
    const out = dec.decode(splice(bytes.slice(0, 100))) + dec.decode(splice(bytes.slice(100))) + dec.decode(splice(null));
    const events = out.split('\n\n').filter(Boolean).map((e) => ({ name: /^event: (\S+)/.exec(e)?.[1], data: JSON.parse(e.slice(e.indexOf('data: ') + 6)) as Record<string, unknown> }));
    expect(events).toEqual([
      { name: 'content_block_delta', data: { type: 'content_block_delta', index: 2, delta: { type: 'text_delta', text: 'three ' } } },
      { name: 'content_block_delta', data: { type: 'content_block_delta', index: 2, delta: { type: 'text_delta', text: 'four' } } },
      { name: 'content_block_stop', data: { type: 'content_block_stop', index: 2 } },
      { name: 'message_delta', data: { type: 'message_delta', delta: { stop_reason: 'stop_sequence', stop_sequence: 'END' }, usage: { input_tokens: 30, output_tokens: 5, cache_read_input_tokens: 16, cache_creation_input_tokens: 0 } } },
      { name: 'message_stop', data: { type: 'message_stop' } },
    ]);
  });

  it("the chat path's error chunk becomes an error event; a tool call in the continuation is refused, not retried", () => {
    const a = new AnthropicAnswer(BODY);
    stream(a, [START, TEXT_START, delta('one ')]);
    const out = dec.decode(a.splice()(enc.encode(chat({ error: { message: 'boom', type: 'InternalServerError', code: 500 } }))));
    expect(out).toBe(`event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'api_error', message: 'boom' } })}\n\n`);
    const tool = dec.decode(a.splice()(enc.encode(chat({ id: 'x', choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'c', function: { name: 'f', arguments: '' } }] }, finish_reason: null }] }))));
    expect(tool).toContain('event: error');
    expect(a.refusal()).toBe('tool_calls');
  });
});
