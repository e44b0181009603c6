// The Responses API continuation (issue #28), pure: which answers can be continued (the pool's
// opt-in, the request's shape, a stored response, reasoning or a tool call), the continuation's
// body (the answer so far as vLLM's partial assistant item, max_output_tokens reduced, store off)
// and the splice of its events (ids, sequence numbers, whole text, one replica's usage).

import { describe, expect, it } from 'vitest';

import { ResponsesAnswer, responsesStaticRefusal } from '../../../src/http/apis/responses/continuation.js';
import { responsesReader } from '../../../src/http/apis/responses/reader.js';
import { ResponseTap } from '../../../src/proxy/sse-tap.js';

const enc = new TextEncoder();
const dec = new TextDecoder();
let n = 0;
const ev = (type: string, o: Record<string, unknown>, s = n++) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: s, ...o })}\n\n`;
const resp = (extra: Record<string, unknown> = {}) => ({ id: 'resp_A', object: 'response', created_at: 7, status: 'in_progress', max_output_tokens: 10, store: false, output: [], usage: null, ...extra });

function opening(store = false): string[] {
  n = 0;
  return [
    ev('response.created', { response: resp({ store }) }),
    ev('response.in_progress', { response: resp({ store }) }),
    ev('response.output_item.added', { output_index: 0, item: { id: 'msg_A', type: 'message', role: 'assistant', status: 'in_progress', content: [] } }),
    ev('response.content_part.added', { output_index: 0, item_id: 'msg_A', content_index: 0, part: { type: 'output_text', text: '' } }),
    ev('response.output_text.delta', { output_index: 0, item_id: 'msg_A', content_index: 0, delta: 'one ' }),
    ev('response.output_text.delta', { output_index: 0, item_id: 'msg_A', content_index: 0, delta: 'two ' }),
  ];
}

function stream(a: ResponsesAnswer, events: string[]): string {
  const tap = new ResponseTap({ stream: true, stripUsageChunk: false, now: () => 1, reader: a.observe(responsesReader) });
  let out = '';
  for (const e of events) out += dec.decode(tap.push(enc.encode(e)));
  return out + dec.decode(tap.end());
}

const BODY = { model: 'm', stream: true, store: false, max_output_tokens: 10, input: 'hi' };

describe('which Responses answers can be continued', () => {
  it('by the request: the pool opt-in, follow-ups, background, structured output, logprobs, a forced tool, a client prefill', () => {
    expect(responsesStaticRefusal(BODY)).toBeNull();
    expect(new ResponsesAnswer(BODY, false).refusal()).toBe('continue_responses_off');
    expect(responsesStaticRefusal({ ...BODY, previous_response_id: 'resp_x' })).toBe('previous_response_id');
    expect(responsesStaticRefusal({ ...BODY, background: true })).toBe('background');
    expect(responsesStaticRefusal({ ...BODY, text: { format: { type: 'json_schema' } } })).toBe('response_format');
    expect(responsesStaticRefusal({ ...BODY, text: { format: { type: 'text' } } })).toBeNull();
    expect(responsesStaticRefusal({ ...BODY, include: ['message.output_text.logprobs'] })).toBe('logprobs');
    expect(responsesStaticRefusal({ ...BODY, tool_choice: 'required' })).toBe('guided_decoding');
    expect(responsesStaticRefusal({ ...BODY, input: [{ role: 'assistant', content: 'The answer is', status: 'in_progress' }] })).toBe('client_prefill');
  });

  it('by what streamed: a stored response, reasoning, a tool call, a finished message', () => {
    const a = new ResponsesAnswer(BODY, true);
    stream(a, opening());
    expect(a.refusal()).toBeNull();
    expect(a.delivered()).toEqual({ tokens: 2, from: 'deltas' });
    const stored = new ResponsesAnswer(BODY, true);
    stream(stored, opening(true));
    expect(stored.refusal()).toBe('responses_store');
    for (const [why, extra] of [
      ['reasoning', ev('response.reasoning_text.delta', { output_index: 0, item_id: 'rs', content_index: 0, delta: 'x' })],
      ['tool_calls', ev('response.output_item.added', { output_index: 1, item: { id: 'fc', type: 'function_call' } })],
      ['answer_finished', ev('response.output_text.done', { output_index: 0, item_id: 'msg_A', content_index: 0, text: 'one two ' })],
    ] as const) {
      const b = new ResponsesAnswer(BODY, true);
      stream(b, [...opening(), extra]);
      expect(b.refusal()).toBe(why);
    }
  });
});

describe('the Responses continuation', () => {
  it('appends the answer so far as a partial assistant item, max_output_tokens less the delivered tokens, never stored', () => {
    const a = new ResponsesAnswer(BODY, true);
    stream(a, opening());
    expect(JSON.parse(a.continuationBody(JSON.stringify({ ...BODY, request_id: 'resp_A', instructions: 'I' })))).toEqual({
      model: 'm',
      stream: true,
      store: false,
      max_output_tokens: 8,
      input: [
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'one two ', status: 'in_progress' },
      ],
      request_id: 'resp_A',
      instructions: 'I',
    });
  });

  it("splices: the continuation's opening dropped, ids and sequence numbers carried on, the text whole, one replica's usage", () => {
    const a = new ResponsesAnswer(BODY, true);
    stream(a, opening());
    n = 0;
    const item = (text: string) => ({ id: 'msg_B', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] });
    const src = [
      ev('response.created', { response: resp({ id: 'resp_B', created_at: 9, max_output_tokens: 8 }) }),
      ev('response.in_progress', { response: resp({ id: 'resp_B' }) }),
      ev('response.output_item.added', { output_index: 0, item: { id: 'msg_B', type: 'message', role: 'assistant', status: 'in_progress', content: [] } }),
      ev('response.content_part.added', { output_index: 0, item_id: 'msg_B', content_index: 0, part: { type: 'output_text', text: '' } }),
      ev('response.output_text.delta', { output_index: 0, item_id: 'msg_B', content_index: 0, delta: 'three' }),
      ev('response.output_text.done', { output_index: 0, item_id: 'msg_B', content_index: 0, text: 'three' }),
      ev('response.content_part.done', { output_index: 0, item_id: 'msg_B', content_index: 0, part: { type: 'output_text', text: 'three' } }),
      ev('response.output_item.done', { output_index: 0, item: item('three') }),
      ev('response.completed', { response: resp({ id: 'resp_B', created_at: 9, max_output_tokens: 8, status: 'completed', output: [item('three')], usage: { input_tokens: 22, input_tokens_details: { cached_tokens: 21 }, output_tokens: 1, total_tokens: 23 } }) }),
    ].join('');
    const splice = a.splice();
    const bytes = enc.encode(src);
    const out = dec.decode(splice(bytes.slice(0, 333))) + dec.decode(splice(bytes.slice(333))) + dec.decode(splice(null));
    const events = out.split('\n\n').filter(Boolean).map((e) => JSON.parse(e.slice(e.indexOf('data: ') + 6)) as Record<string, any>);
    expect(events.map((e) => [e.type, e.sequence_number])).toEqual([
      ['response.output_text.delta', 6],
      ['response.output_text.done', 7],
      ['response.content_part.done', 8],
      ['response.output_item.done', 9],
      ['response.completed', 10],
    ]);
    expect(events[0]).toMatchObject({ item_id: 'msg_A', delta: 'three' });
    expect(events[1]).toMatchObject({ item_id: 'msg_A', text: 'one two three' });
    expect(events[2]!.part.text).toBe('one two three');
    expect(events[3]!.item).toMatchObject({ id: 'msg_A', content: [{ text: 'one two three' }] });
    const r = events[4]!.response;
    expect(r).toMatchObject({ id: 'resp_A', created_at: 7, max_output_tokens: 10, store: false, status: 'completed' });
    expect(r.output[0]).toMatchObject({ id: 'msg_A', content: [{ text: 'one two three' }] });
    expect(r.usage).toEqual({ input_tokens: 20, input_tokens_details: { cached_tokens: 20 }, output_tokens: 3, total_tokens: 23 });
  });
});
