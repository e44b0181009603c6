// End to end: the OpenAI Responses API through the router under Miniflare to four mock vLLM
// replicas that, like vLLM, keep stored responses in their own memory only. Driven by the
// official openai SDK (responses.create streaming and not, previous_response_id follow-ups,
// retrieve, cancel) and by the AI SDK (`ai` + `@ai-sdk/openai`, which speaks the Responses API).
// The pool is round-robin without keys, so every follow-up that reached the right replica got
// there by the router's pin, not by luck. Only 127.0.0.1; every wait bounded.

import { createOpenAI } from '@ai-sdk/openai';
import { streamText } from 'ai';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, TEST_TENANTS, TEST_TIMINGS, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';
const GLOBEX_KEY = TEST_TENANTS.find((t) => t.tenant === 'globex')!.key;

let mocks: MockVllm[] = [];
let router: RouterHandle;
let client: OpenAI;

interface ReplicaSnap {
  id: string;
  inFlight: number;
  healthy: boolean;
  stats: { requests: number; cachedTokens: number; promptTokens: number; ttft: { count: number } };
}

async function replicas(): Promise<ReplicaSnap[]> {
  const res = await router.adminFetch('/admin/pools/chat');
  expect(res.status).toBe(200);
  return ((await res.json()) as { replicas: ReplicaSnap[] }).replicas;
}

beforeAll(async () => {
  // vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1: these tests follow up, retrieve and cancel stored responses.
  mocks = await startMocks(4, { decodeMsPerToken: 2, maxRunning: 64, responsesStore: true });
  router = await startRouter({ config: routerConfig({ replicas: mocks, strategy: 'round-robin', keys: ['none'] }) });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.all(mocks.map((m) => m.close()));
});

describe('Responses API through the router (openai SDK)', () => {
  it('non-streaming create, then follow-ups with previous_response_id across 8 conversations on 4 replicas', async () => {
    const conversations = Array.from({ length: 8 }, (_, i) => ({ topic: `conversation ${i}: ${'context '.repeat(40)}`, replica: '', last: '' }));
    for (let turn = 0; turn < 4; turn++) {
      // Interleaved, as concurrent agents would be: round-robin would scatter each conversation.
      await Promise.all(
        conversations.map(async (c, i) => {
          const { data, response } = await client.responses
            .create({
              model: MODEL,
              instructions: 'You are a terse assistant.',
              input: turn === 0 ? c.topic : `turn ${turn} of conversation ${i}`,
              max_output_tokens: 8,
              ...(turn > 0 ? { previous_response_id: c.last } : {}),
            })
            .withResponse();
          // max_output_tokens reached: vLLM reports such a response as incomplete.
          expect(data.status).toBe('incomplete');
          expect(data.output_text.length).toBeGreaterThan(0);
          expect(data.id).toMatch(/^resp_[0-9a-f]{32}$/);
          const replica = response.headers.get('x-prefix-router-replica')!;
          if (turn === 0) c.replica = replica;
          else {
            expect(replica, `conversation ${i} turn ${turn}`).toBe(c.replica);
            expect(data.previous_response_id).toBe(c.last);
            // The replica holds the conversation so far: its prefix cache hits.
            expect(data.usage!.input_tokens_details.cached_tokens).toBeGreaterThan(0);
          }
          c.last = data.id;
        }),
      );
    }
    // Round-robin placed the 8 first turns on all 4 replicas, two each.
    const placed = new Map<string, number>();
    for (const c of conversations) placed.set(c.replica, (placed.get(c.replica) ?? 0) + 1);
    expect([...placed.values()]).toEqual([2, 2, 2, 2]);
    // Each replica stored exactly its own conversations' responses (4 turns × 2).
    expect(mocks.map((m) => m.stats().completionRequestsTotal)).toEqual([8, 8, 8, 8]);
    await eventually(async () => {
      const snap = await replicas();
      for (const r of snap) {
        expect(r.inFlight).toBe(0);
        expect(r.stats.cachedTokens).toBeGreaterThan(0); // usage read from the Responses body
      }
    }, { timeoutMs: 15_000 });
  });

  it('streaming create: Responses SSE events through the tap, TTFT and usage measured, id usable for a follow-up', async () => {
    const before = (await replicas()).reduce((s, r) => s + r.stats.ttft.count, 0);
    const stream = await client.responses.create({ model: MODEL, input: 'stream me a few words', max_output_tokens: 6, stream: true });
    const types: string[] = [];
    let text = '';
    let id = '';
    let usage: OpenAI.Responses.ResponseUsage | undefined;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.created') id = ev.response.id;
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') usage = ev.response.usage;
    }
    expect(types[0]).toBe('response.created');
    expect(types).toContain('response.output_text.delta');
    expect(types.at(-1)).toMatch(/^response\.(completed|incomplete)$/);
    expect(text.length).toBeGreaterThan(0);
    expect(usage!.output_tokens).toBe(6);

    const next = await client.responses.create({ model: MODEL, input: 'and again', previous_response_id: id, max_output_tokens: 4 });
    expect(next.previous_response_id).toBe(id);
    expect(next.usage!.input_tokens_details.cached_tokens).toBeGreaterThan(0);
    await eventually(async () => {
      const after = (await replicas()).reduce((s, r) => s + r.stats.ttft.count, 0);
      expect(after).toBeGreaterThanOrEqual(before + 2);
    }, { timeoutMs: 15_000 });
  });

  it('retrieve by id reaches the replica that stored it; another tenant gets 404', async () => {
    const created = await client.responses.create({ model: MODEL, input: 'remember this', max_output_tokens: 4 });
    const tokens = async () => {
      const snap = await replicas();
      expect(snap.map((r) => r.inFlight)).toEqual([0, 0, 0, 0]);
      return snap.reduce((s, r) => s + r.stats.promptTokens, 0);
    };
    const before = await eventually(tokens, { timeoutMs: 15_000 });
    // Several retrieves: with round-robin, any one of them sent elsewhere would be a 404.
    for (let i = 0; i < 4; i++) {
      const got = await client.responses.retrieve(created.id);
      expect(got.id).toBe(created.id);
      expect(got.output_text).toBe(created.output_text);
    }
    // A retrieve carries the stored usage, which is not counted again.
    expect(await eventually(tokens, { timeoutMs: 15_000 })).toBe(before);
    const globex = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: GLOBEX_KEY, maxRetries: 0, timeout: 15_000 });
    const err = await globex.responses.retrieve(created.id).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).error).toMatchObject({ type: 'invalid_request_error', code: 'response_not_found' });
    // Nor may it continue another tenant's conversation.
    const follow = await globex.responses.create({ model: MODEL, input: 'x', previous_response_id: created.id }).catch((e: unknown) => e);
    expect(follow).toBeInstanceOf(OpenAI.NotFoundError);
    const unknown = await client.responses.retrieve(`resp_${'0'.repeat(32)}`).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('cancel a background response on its replica; the status then reads cancelled', async () => {
    const started = await client.responses.create({ model: MODEL, input: 'a long background job', background: true, max_output_tokens: 5000 });
    expect(['queued', 'in_progress']).toContain(started.status);
    const cancelled = await client.responses.cancel(started.id);
    expect(cancelled.status).toBe('cancelled');
    expect((await client.responses.retrieve(started.id)).status).toBe('cancelled');
    // A finished (synchronous) response cannot be cancelled: the engine's 400 comes through.
    const done = await client.responses.create({ model: MODEL, input: 'quick', max_output_tokens: 2 });
    const err = await client.responses.cancel(done.id).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    await eventually(async () => expect(mocks.map((m) => m.stats().running)).toEqual([0, 0, 0, 0]), { timeoutMs: 15_000 });
  });

  it('a background response streamed again by retrieve (stream=true, starting_after) from its replica', async () => {
    const started = await client.responses.create({ model: MODEL, input: 'stream me later', background: true, max_output_tokens: 30 });
    const stream = await client.responses.retrieve(started.id, { stream: true, starting_after: 1 });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of stream) events.push(ev);
    expect(events[0]!.sequence_number).toBe(2); // after response.created (0) and response.in_progress (1)
    expect(events.filter((e) => e.type === 'response.output_text.delta').length).toBe(30);
    expect(events.at(-1)!.type).toMatch(/^response\.(completed|incomplete)$/);
  });

  it('a background response polled by retrieve until done', async () => {
    const started = await client.responses.create({ model: MODEL, input: 'poll me', background: true, max_output_tokens: 20 });
    const done = await eventually(
      async () => {
        const r = await client.responses.retrieve(started.id);
        expect(r.status).toBe('incomplete'); // finished at max_output_tokens
        return r;
      },
      { timeoutMs: 10_000, intervalMs: 50 },
    );
    expect(done.usage!.output_tokens).toBe(20);
  });
});

describe('a framework client: the AI SDK (ai + @ai-sdk/openai) streaming the Responses API', () => {
  it('streamText through the router', async () => {
    const provider = createOpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY });
    const result = streamText({ model: provider.responses(MODEL), prompt: 'Say something short.', maxOutputTokens: 5 });
    let text = '';
    for await (const part of result.textStream) text += part;
    expect(text.length).toBeGreaterThan(0);
    const usage = await result.usage;
    expect(usage.outputTokens).toBe(5);
  });
});

describe('when the replica that stored a response is gone or down', () => {
  it('down: 409 with Retry-After, never another replica; removed: 404', async () => {
    const created = await client.responses.create({ model: MODEL, input: 'pinned', max_output_tokens: 2 });
    const home = mocks.find((m) => m.stats().lastRequest?.path === '/v1/responses' && (m.stats().lastRequest?.body as { request_id?: string }).request_id === created.id)!;
    expect(home).toBeDefined();
    const servedBefore = mocks.map((m) => m.stats().completionRequestsTotal);

    home.setFaults({ failHealth: true });
    await eventually(async () => expect((await replicas()).find((r) => r.id === home.id)!.healthy).toBe(false), { timeoutMs: 10 * TEST_TIMINGS.healthIntervalMs + 5_000 });
    const down = await client.responses.create({ model: MODEL, input: 'more', previous_response_id: created.id }).catch((e: unknown) => e);
    expect(down).toBeInstanceOf(OpenAI.ConflictError);
    expect((down as InstanceType<typeof OpenAI.ConflictError>).headers.get('retry-after')).not.toBeNull();
    expect(mocks.map((m) => m.stats().completionRequestsTotal)).toEqual(servedBefore);
    home.setFaults({ failHealth: false });
    await eventually(async () => expect((await replicas()).find((r) => r.id === home.id)!.healthy).toBe(true), { timeoutMs: 10 * TEST_TIMINGS.healthIntervalMs + 5_000 });

    const removed = await router.adminFetch(`/admin/pools/chat/replicas/${home.id}`, { method: 'DELETE' });
    expect(removed.status).toBe(200);
    const gone = await client.responses.retrieve(created.id).catch((e: unknown) => e);
    expect(gone).toBeInstanceOf(OpenAI.NotFoundError);
    expect((gone as Error).message).toMatch(/left the pool/);
    expect(mocks.map((m) => m.stats().completionRequestsTotal)).toEqual(servedBefore);
  }, 60_000);
});
