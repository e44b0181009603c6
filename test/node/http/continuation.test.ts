// The Chat Completions / Completions continuation (issue #28), pure: which answers can be
// continued (the request's shape and what has streamed: tool calls, n > 1, reasoning), the
// continuation's body (vLLM's continue_final_message, max_tokens reduced) and the splice of its
// stream (ids, role chunk, usage). The mock's side: a prompt ending in its own answer goes on from there.

import { describe, expect, it } from 'vitest';

import { OpenAIAnswer, staticRefusal } from '../../../src/http/apis/openai-chat/continuation.js';
import { openAIReader } from '../../../src/http/apis/openai-chat/reader.js';
import { ResponseTap } from '../../../src/proxy/sse-tap.js';
import { outputStart, outputToken, promptSeed, renderChatPrompt } from '../../../tools/mock-engine/prompt.js';

const enc = new TextEncoder();
const dec = new TextDecoder();
const ev = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const chunk = (delta: Record<string, unknown>, extra: Record<string, unknown> = {}) => ev({ id: 'chatcmpl-A', object: 'chat.completion.chunk', created: 100, model: 'm', system_fingerprint: 'fp-A', choices: [{ index: 0, delta, logprobs: null, finish_reason: null }], ...extra });

/** Feed `events` through a tap whose reader the answer observes; returns what the client got. */
function stream(a: OpenAIAnswer, events: string[]): string {
  const tap = new ResponseTap({ stream: true, stripUsageChunk: false, now: () => 1, reader: a.observe(openAIReader('chat', false)) });
  let out = '';
  for (const e of events) out += dec.decode(tap.push(enc.encode(e)));
  return out + dec.decode(tap.end());
}

const BODY = { model: 'm', stream: true, max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] };

describe('which answers can be continued', () => {
  it('refuses by the request: n > 1, logprobs, response_format, guided decoding, a client prefill, a non-text prompt', () => {
    expect(staticRefusal('chat', { ...BODY, n: 2 })).toBe('n_gt_1');
    expect(staticRefusal('chat', { ...BODY, logprobs: true })).toBe('logprobs');
    expect(staticRefusal('chat', { ...BODY, response_format: { type: 'json_schema' } })).toBe('response_format');
    expect(staticRefusal('chat', { ...BODY, response_format: { type: 'text' } })).toBeNull();
    expect(staticRefusal('chat', { ...BODY, structured_outputs: { json: {} } })).toBe('guided_decoding');
    expect(staticRefusal('chat', { ...BODY, continue_final_message: true })).toBe('client_prefill');
    expect(staticRefusal('completion', { model: 'm', prompt: [1, 2, 3] })).toBe('prompt_not_text');
    expect(staticRefusal('completion', { model: 'm', prompt: 'x', logprobs: 2 })).toBe('logprobs');
    expect(staticRefusal('chat', { ...BODY, tools: [{ type: 'function', function: { name: 'f' } }] })).toBeNull();
  });

  it('refuses by what streamed: a tool call in progress, reasoning, a second choice', () => {
    for (const [why, delta, extra] of [
      ['tool_calls', { tool_calls: [{ index: 0, id: 'c1', type: 'function', function: { name: 'f', arguments: '{' } }] }, {}],
      ['reasoning', { reasoning_content: 'hmm' }, {}],
      ['n_gt_1', { content: 'b' }, { choices: [{ index: 1, delta: { content: 'b' }, finish_reason: null }] }],
    ] as const) {
      const a = new OpenAIAnswer('chat', { ...BODY, tools: [] });
      stream(a, [chunk({ role: 'assistant', content: '' }), chunk({ content: 'Hello' }), chunk(delta, extra)]);
      expect(a.refusal()).toBe(why);
    }
  });

  it('an in-band error after content is dropped (the router continues or says why not, with its message); before content it is the commit point\'s', () => {
    const err = ev({ error: { message: 'engine died', type: 'InternalServerError', code: 500 } });
    const a = new OpenAIAnswer('chat', BODY);
    const out = stream(a, [chunk({ role: 'assistant', content: '' }), chunk({ content: 'Hello' }), err, 'data: [DONE]\n\n']);
    expect(a.errored).toBe(true);
    expect(out).not.toContain('engine died');
    expect(out).not.toContain('[DONE]');
    expect(a.errorMessage).toBe('engine died');
    const b = new OpenAIAnswer('chat', { ...BODY, logprobs: true });
    expect(stream(b, [chunk({ content: 'Hello' }), err])).not.toContain('engine died');
    expect(b.errored).toBe(true);
    expect(b.refusal()).toBe('logprobs');
    // Before the first token: passed to the reader (first-token.ts retries it), not dropped.
    const c = new OpenAIAnswer('chat', BODY);
    const tap = new ResponseTap({ stream: true, stripUsageChunk: false, now: () => 1, reader: c.observe(openAIReader('chat', false)) });
    tap.push(enc.encode(chunk({ role: 'assistant', content: '' }) + err));
    expect(tap.sawError).toBe(true);
    expect(c.errored).toBe(false);
  });
});

describe('the continuation', () => {
  it("asks for the answer so far as an open final assistant message, max_tokens less what was delivered", () => {
    const a = new OpenAIAnswer('chat', BODY);
    stream(a, [chunk({ role: 'assistant', content: '' }), chunk({ content: 'Hel' }), chunk({ content: 'lo' })]);
    expect(a.refusal()).toBeNull();
    expect(a.delivered()).toEqual({ tokens: 2, from: 'deltas' });
    const body = JSON.parse(a.continuationBody(JSON.stringify({ ...BODY, stream_options: { include_usage: true } })));
    expect(body.messages.at(-1)).toEqual({ role: 'assistant', content: 'Hello' });
    expect(body).toMatchObject({ continue_final_message: true, add_generation_prompt: false, max_tokens: 8 });
  });

  it('reads the answer from events it kept unparsed, in order, however long the answer and whenever it is asked', () => {
    // The events past the first token are parsed only when a break asks (AnswerBase.recordLater);
    // past 64 KiB waiting they are read at once. The answer must be the same either way.
    const pieces = Array.from({ length: 3000 }, (_, i) => (i === 7 ? ' an error, said the model' : ` w${i}`));
    const a = new OpenAIAnswer('chat', { ...BODY, max_tokens: 5000 });
    const tap = new ResponseTap({ stream: true, stripUsageChunk: false, now: () => 1, reader: a.observe(openAIReader('chat', false)) });
    tap.push(enc.encode(chunk({ role: 'assistant', content: '' })));
    pieces.forEach((p, i) => {
      tap.push(enc.encode(chunk({ content: p })));
      // Asked mid-stream (as a pause for flow control asks), then the stream goes on.
      if (i === 10) expect(a.delivered()).toEqual({ tokens: 11, from: 'deltas' });
    });
    expect(a.errored).toBe(false);
    expect(a.refusal()).toBeNull();
    expect(a.delivered()).toEqual({ tokens: 3000, from: 'deltas' });
    const body = JSON.parse(a.continuationBody(JSON.stringify({ ...BODY, max_tokens: 5000 })));
    expect(body.messages.at(-1)).toEqual({ role: 'assistant', content: pieces.join('') });
    expect(body.max_tokens).toBe(2000);
    // The finish, kept unparsed like the rest, still refuses a continuation once read.
    tap.push(enc.encode(ev({ id: 'chatcmpl-A', object: 'chat.completion.chunk', created: 100, model: 'm', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })));
    expect(a.refusal()).toBe('answer_finished');
  });

  it('an answer at its max_tokens is not continued', () => {
    const a = new OpenAIAnswer('chat', { ...BODY, max_tokens: 2 });
    stream(a, [chunk({ content: 'a' }), chunk({ content: 'b' })]);
    expect(a.refusal()).toBe('max_tokens_reached');
  });

  it("splices: the first answer's id, created, model and fingerprint, no role chunk, usage as one replica's", () => {
    const a = new OpenAIAnswer('chat', BODY);
    stream(a, [chunk({ role: 'assistant', content: '' }), chunk({ content: 'Hel' }), chunk({ content: 'lo' })]);
    const splice = a.splice();
    const cont = (delta: Record<string, unknown>, extra: Record<string, unknown> = {}) => ev({ id: 'chatcmpl-B', object: 'chat.completion.chunk', created: 200, model: 'm2', choices: [{ index: 0, delta, logprobs: null, finish_reason: null }], ...extra });
    const usage = ev({ id: 'chatcmpl-B', object: 'chat.completion.chunk', created: 200, model: 'm2', choices: [], usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15, prompt_tokens_details: { cached_tokens: 11 } } });
    const raw = cont({ role: 'assistant', content: '' }) + cont({ content: ' wor' }) + cont({ content: 'ld' }, { choices: [{ index: 0, delta: { content: 'ld' }, logprobs: null, finish_reason: 'stop' }] }) + usage + 'data: [DONE]\n\n';
    // Cut anywhere: the splice frames events across chunks.
    const out = dec.decode(splice(enc.encode(raw.slice(0, 37)))) + dec.decode(splice(enc.encode(raw.slice(37)))) + dec.decode(splice(null));
    const events = out.split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)));
    expect(events).toHaveLength(3);
    for (const e of events) expect(e).toMatchObject({ id: 'chatcmpl-A', created: 100, model: 'm', system_fingerprint: 'fp-A' });
    expect(events.map((e) => e.choices[0]?.delta?.role)).toEqual([undefined, undefined, undefined]);
    expect(events.map((e) => e.choices[0]?.delta?.content ?? '').join('')).toBe(' world');
    // prompt: the continuation's 12 less the 2 tokens delivered; completion: 2 + 3.
    expect(events[2].usage).toEqual({ prompt_tokens: 10, completion_tokens: 5, total_tokens: 15, prompt_tokens_details: { cached_tokens: 10 } });
    expect(out.endsWith('data: [DONE]\n\n')).toBe(true);
  });
});

describe("the mock continues its own greedy answer", () => {
  it('a prompt ending in the first k tokens of its answer goes on from token k; any other starts at 0', () => {
    const prompt = renderChatPrompt({ messages: [{ role: 'user', content: 'tell me' }] });
    const seed = promptSeed(prompt);
    const answer = [0, 1, 2, 3].map((i) => outputToken(seed, i)).join('');
    expect(outputStart(prompt)).toEqual({ seed, index: 0 });
    const continued = renderChatPrompt({ messages: [{ role: 'user', content: 'tell me' }, { role: 'assistant', content: answer }] }, true);
    expect(continued).toBe(prompt + answer);
    expect(outputStart(continued)).toEqual({ seed, index: 4 });
    // Not its own answer: a sequence of its own.
    expect(outputStart(prompt + 'zzz ').index).toBe(0);
  });
});
