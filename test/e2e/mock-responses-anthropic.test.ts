// The mock replica's Responses and Anthropic Messages endpoints over loopback, with the official
// SDKs pointed straight at it: stored responses live per instance (a second instance answers 404
// for the first one's ids, as vLLM does), follow-ups hit the prefix cache of the instance that
// holds the conversation, background and cancel, Anthropic events, usage and error bodies.

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';

let a: MockVllm;
let b: MockVllm;
const openai = (m: MockVllm) => new OpenAI({ baseURL: `${m.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 10_000 });

beforeAll(async () => {
  // vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1: these tests store, retrieve, follow up and cancel.
  [a, b] = await Promise.all([startMockVllm({ port: 0, id: 'a', decodeMsPerToken: 1, responsesStore: true }), startMockVllm({ port: 0, id: 'b', decodeMsPerToken: 1, responsesStore: true })]);
});
afterAll(async () => {
  await Promise.all([a?.close(), b?.close()]);
});

describe('mock Responses API', () => {
  it('stores responses per instance: the other instance answers 404 for the id and for follow-ups', async () => {
    const first = await openai(a).responses.create({ model: 'demo-model', instructions: 'x '.repeat(200), input: 'hello', max_output_tokens: 4 });
    expect(first.id).toMatch(/^resp_/);
    expect((await openai(a).responses.retrieve(first.id)).output_text).toBe(first.output_text);
    const elsewhere = await openai(b).responses.retrieve(first.id).catch((e: unknown) => e);
    expect(elsewhere).toBeInstanceOf(OpenAI.NotFoundError);
    const followElsewhere = await openai(b).responses.create({ model: 'demo-model', input: 'more', previous_response_id: first.id }).catch((e: unknown) => e);
    expect(followElsewhere).toBeInstanceOf(OpenAI.NotFoundError);
    // On its own instance the follow-up continues the conversation and hits the cached prefix.
    const next = await openai(a).responses.create({ model: 'demo-model', input: 'more', previous_response_id: first.id, max_output_tokens: 4 });
    expect(next.previous_response_id).toBe(first.id);
    expect(next.usage!.input_tokens_details.cached_tokens).toBeGreaterThan(first.usage!.input_tokens_details.cached_tokens);
  });

  it('uses the request_id it is given as the response id (the router names responses this way)', async () => {
    const r = await openai(a).responses.create({ model: 'demo-model', input: 'x', max_output_tokens: 1, request_id: 'resp_0000000000000000000000000000abcd' } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    expect(r.id).toBe('resp_0000000000000000000000000000abcd');
  });

  it('streams the Responses event types in order with sequence numbers', async () => {
    const stream = await openai(a).responses.create({ model: 'demo-model', input: 'stream', max_output_tokens: 3, stream: true });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const e of stream) events.push(e);
    expect(events.map((e) => e.type)).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      // vLLM's responses_stream_generator ends with response.completed whatever the final status
      // (an incomplete one included); the legacy mock sent response.incomplete.
      'response.completed',
    ]);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
  });

  it('background: queued at once, cancellable while running; a finished one is not', async () => {
    const bg = await openai(a).responses.create({ model: 'demo-model', input: 'long', background: true, max_output_tokens: 5000 });
    expect(bg.status).toBe('queued');
    expect((await openai(a).responses.cancel(bg.id)).status).toBe('cancelled');
    const done = await openai(a).responses.create({ model: 'demo-model', input: 'short', max_output_tokens: 1 });
    expect(await openai(a).responses.cancel(done.id).catch((e: unknown) => e)).toBeInstanceOf(OpenAI.BadRequestError);
  });
});

describe('mock Anthropic Messages API', () => {
  const anthropic = (m: MockVllm) => new Anthropic({ baseURL: m.url, apiKey: 'unused', maxRetries: 0, timeout: 10_000 });

  it('non-streaming and streaming, usage with cache reads split out of input_tokens', async () => {
    const system = 'You are helpful. '.repeat(40);
    const one = await anthropic(a).messages.create({ model: 'demo-model', max_tokens: 3, system, messages: [{ role: 'user', content: 'hi' }] });
    expect(one.usage.cache_read_input_tokens).toBe(0);
    const two = await anthropic(a).messages.create({ model: 'demo-model', max_tokens: 3, system, messages: [{ role: 'user', content: 'hi again' }] });
    expect(two.usage.cache_read_input_tokens).toBeGreaterThan(0);
    expect(two.usage.input_tokens + two.usage.cache_read_input_tokens!).toBeGreaterThan(two.usage.cache_read_input_tokens!);
    const stream = await anthropic(a).messages.create({ model: 'demo-model', max_tokens: 2, messages: [{ role: 'user', content: 'x' }], stream: true });
    const types: string[] = [];
    for await (const e of stream) types.push(e.type);
    // (the SDK drops the `ping` event the mock sends after content_block_start, as Anthropic's API does)
    expect(types).toEqual(['message_start', 'content_block_start', 'content_block_delta', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  });

  it('count_tokens and Anthropic-shaped errors', async () => {
    const n = await anthropic(a).messages.countTokens({ model: 'demo-model', messages: [{ role: 'user', content: 'count me' }] });
    expect(n.input_tokens).toBeGreaterThan(0);
    const err = await anthropic(a).messages.create({ model: 'nope', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.NotFoundError);
    expect((err as InstanceType<typeof Anthropic.NotFoundError>).error).toMatchObject({ type: 'error', error: { type: 'not_found_error' } });
  });
});
