// End-to-end checks of the mock vLLM replica over loopback: wire formats (with the official
// openai SDK as one client), prefix cache hits and LRU eviction, auth, /metrics, faults, the
// scheduler's running/waiting queue, and the CLI as a separate process.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';

import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { dataEvents } from '../helpers/sse.js';

import { DEFAULT_FAULTS, renderChatPrompt, startMockVllm, type MockStats, type MockVllm, type MockVllmOptions } from '../../tools/mock-engine/index.js';

const started: MockVllm[] = [];
/**
 * This file checks the mock's mechanics (prefix cache, data-parallel engines, scheduler, faults)
 * through the legacy profile, which reports every count (cached_tokens 0 included) and labels each
 * engine with its own blocks; what each engine profile changes on the wire, the default `vllm`
 * included, is mock-profiles.test.ts.
 */
async function start(options: MockVllmOptions = {}): Promise<MockVllm> {
  const m = await startMockVllm({ port: 0, profile: 'legacy', ...options });
  started.push(m);
  return m;
}
afterAll(async () => {
  await Promise.all(started.map((m) => m.close()));
});

function post(m: MockVllm, path: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
  return fetch(`${m.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
}

/** The `data:` payloads of an SSE body, in order. */
async function readSse(res: Response): Promise<string[]> {
  const text = await res.text();
  expect(text.endsWith('\n\n')).toBe(true);
  return dataEvents(text);
}

/** Poll `check` until it passes; bounded, fails with the last error. */
async function eventually(check: () => void | Promise<void>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    try {
      await check();
      return;
    } catch (err) {
      if (Date.now() > deadline || attempt > 1_000) throw err;
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}

async function mockStats(m: MockVllm): Promise<MockStats> {
  const res = await fetch(`${m.url}/_mock/stats`);
  expect(res.status).toBe(200);
  return (await res.json()) as MockStats;
}

/** Value of one Prometheus sample (by metric name and a label substring). */
function sample(text: string, name: string, labelPart = ''): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labelPart));
  if (!line) throw new Error(`no sample ${name} ${labelPart}`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

const SYSTEM = 'You are a careful assistant for the prefix-router test-suite. '.repeat(12);

describe('wire format', () => {
  let m: MockVllm;
  let client: OpenAI;
  beforeAll(async () => {
    m = await start({ id: 'fmt', models: ['demo-model', 'other-model'] });
    client = new OpenAI({ baseURL: `${m.url}/v1`, apiKey: 'unused' });
  });

  it('streams chat in vLLM chunk order, with the usage chunk only when asked (openai SDK)', async () => {
    const stream = await client.chat.completions.create({
      model: 'demo-model',
      messages: [{ role: 'user', content: 'Say something.' }],
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.length).toBe(1 + 5 + 1);
    const [first, ...rest] = chunks;
    expect(first!.choices[0]!.delta).toEqual({ role: 'assistant', content: '' });
    const contents = rest.slice(0, 5);
    for (const c of contents) {
      expect(c.object).toBe('chat.completion.chunk');
      expect(c.id).toMatch(/^chatcmpl-/);
      expect(c.id).toBe(first!.id);
      expect(c.model).toBe('demo-model');
      expect(typeof c.created).toBe('number');
      expect(c.choices[0]!.delta.content).toMatch(/^[a-z]{3} $/);
    }
    expect(contents.slice(0, 4).every((c) => c.choices[0]!.finish_reason === null)).toBe(true);
    expect(contents[4]!.choices[0]!.finish_reason).toBe('length');
    const usage = chunks[6]!;
    expect(usage.choices).toEqual([]);
    expect(usage.usage).toMatchObject({ completion_tokens: 5, prompt_tokens_details: { cached_tokens: 0 } });
    expect(usage.usage!.total_tokens).toBe(usage.usage!.prompt_tokens + 5);
    // The prompt as the mock's chat template renders it, 4 characters a token.
    const rendered = renderChatPrompt({ messages: [{ role: 'user', content: 'Say something.' }] });
    expect(usage.usage!.prompt_tokens).toBe(Math.ceil(rendered.length / 4));
  });

  it('ends a raw chat stream with [DONE] and sends no usage chunk unless asked', async () => {
    const res = await post(m, '/v1/chat/completions', {
      model: 'demo-model',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 3,
      stream: true,
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const events = await readSse(res);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as Record<string, unknown>);
    expect(chunks).toHaveLength(1 + 3);
    expect(chunks.every((c) => !('usage' in c))).toBe(true);
    const last = (chunks[3]!.choices as Array<Record<string, unknown>>)[0]!;
    expect(last).toMatchObject({ finish_reason: 'length', stop_reason: null });
  });

  it('streams completions as text chunks and stops on a stop string', async () => {
    // Learn the deterministic output first, then stop on its third word.
    const plain = (await (await post(m, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 6 })).json()) as {
      choices: Array<{ text: string }>;
    };
    const words = plain.choices[0]!.text.trim().split(' ');
    expect(words).toHaveLength(6);
    const stopWord = words[2]!;
    const expected = plain.choices[0]!.text.slice(0, plain.choices[0]!.text.indexOf(stopWord));

    const res = await post(m, '/v1/completions', {
      prompt: 'Once upon a time',
      max_tokens: 6,
      stop: [stopWord],
      stream: true,
      stream_options: { include_usage: true },
    });
    const events = await readSse(res);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as { id: string; object: string; choices: any[]; usage?: any });
    expect(chunks.every((c) => c.object === 'text_completion' && c.id.startsWith('cmpl-'))).toBe(true);
    const text = chunks.flatMap((c) => c.choices.map((ch: { text: string }) => ch.text)).join('');
    expect(text).toBe(expected);
    const finals = chunks.filter((c) => c.choices[0]?.finish_reason);
    expect(finals).toHaveLength(1);
    expect(finals[0]!.choices[0]).toMatchObject({ finish_reason: 'stop', stop_reason: stopWord });
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage.completion_tokens).toBe(3);
  });

  it('answers non-streaming chat with usage and cached_tokens (openai SDK)', async () => {
    const res = await client.chat.completions.create({
      model: 'other-model',
      messages: [
        { role: 'system', content: SYSTEM },
        { role: 'user', content: [{ type: 'text', text: 'Part one. ' }, { type: 'text', text: 'Part two.' }] },
      ],
      max_completion_tokens: 4,
    });
    expect(res.object).toBe('chat.completion');
    expect(res.id).toMatch(/^chatcmpl-/);
    expect(res.model).toBe('other-model');
    expect(res.choices[0]!.message.role).toBe('assistant');
    expect(res.choices[0]!.message.content!.split(' ').filter(Boolean)).toHaveLength(4);
    expect(res.choices[0]!.finish_reason).toBe('length');
    expect(res.usage).toMatchObject({ completion_tokens: 4, prompt_tokens_details: { cached_tokens: 0 } });
    const rendered = renderChatPrompt({
      messages: [
        { role: 'system', content: SYSTEM },
        { role: 'user', content: 'Part one. Part two.' },
      ],
    });
    expect(res.usage!.prompt_tokens).toBe(Math.ceil(rendered.length / 4));
  });

  it('validates input with vLLM-style errors and lists the models', async () => {
    const bad = await post(m, '/v1/chat/completions', '{not json');
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ error: { type: 'BadRequestError', code: 400 } });

    const missing = await post(m, '/v1/chat/completions', { model: 'demo-model' });
    expect(missing.status).toBe(400);
    expect(((await missing.json()) as { error: { message: string } }).error.message).toMatch(/messages/);

    const unknown = await post(m, '/v1/chat/completions', { model: 'nope', messages: [{ role: 'user', content: 'x' }] });
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toMatchObject({ error: { type: 'NotFoundError', code: 404 } });

    const models = await client.models.list();
    expect(models.data.map((d) => d.id)).toEqual(['demo-model', 'other-model']);

    const health = await fetch(`${m.url}/health`);
    expect(health.status).toBe(200);
    expect(await health.text()).toBe('');
  });
});

describe('prefix cache', () => {
  it('gives the second turn of a conversation cached_tokens = 16 x the full shared blocks', async () => {
    const m = await start({ id: 'cache' });
    const client = new OpenAI({ baseURL: `${m.url}/v1`, apiKey: 'unused' });
    const turn1 = [
      { role: 'system' as const, content: SYSTEM },
      { role: 'user' as const, content: 'What is a KV cache?' },
    ];
    const r1 = await client.chat.completions.create({ model: 'demo-model', messages: turn1, max_tokens: 20 });
    expect(r1.usage!.prompt_tokens_details!.cached_tokens).toBe(0);
    const reply = r1.choices[0]!.message.content!;

    const turn2 = [...turn1, { role: 'assistant' as const, content: reply }, { role: 'user' as const, content: 'And prefix caching?' }];
    const r2 = await client.chat.completions.create({ model: 'demo-model', messages: turn2, max_tokens: 20 });
    // Turn 1's prompt plus its output is, character for character, the start of turn 2's prompt;
    // every full 64-character block of it was cached during turn 1.
    const shared = renderChatPrompt({ messages: turn1 }) + reply;
    expect(renderChatPrompt({ messages: turn2 }).startsWith(shared)).toBe(true);
    const expected = 16 * Math.floor(shared.length / 64);
    expect(expected).toBeGreaterThan(0);
    expect(r2.usage!.prompt_tokens_details!.cached_tokens).toBe(expected);

    const s = m.stats();
    expect(s.prefixCache.hitsTokens).toBe(expected);
    expect(s.prefixCache.queriesTokens).toBe(r1.usage!.prompt_tokens + r2.usage!.prompt_tokens);
    expect(s.prefixCache.heldBlocks).toBe(0);
  });

  it('partitions the cache by cache_salt as vLLM does: another salt (or none) hits nothing, the same salt hits', async () => {
    const m = await start({ id: 'salted' });
    const client = new OpenAI({ baseURL: `${m.url}/v1`, apiKey: 'unused' });
    const messages = [
      { role: 'system' as const, content: SYSTEM },
      { role: 'user' as const, content: 'What is a KV cache?' },
    ];
    const ask = async (salt?: string) => {
      const r = await client.chat.completions.create({ model: 'demo-model', messages, max_tokens: 4, ...(salt ? { cache_salt: salt } : {}) } as never);
      return (r as OpenAI.ChatCompletion).usage!.prompt_tokens_details!.cached_tokens;
    };
    expect(await ask('tenant-a-salt')).toBe(0);
    // The same prompt under another tenant's salt, and unsalted: no block shared.
    expect(await ask('tenant-b-salt')).toBe(0);
    expect(await ask()).toBe(0);
    // The first salt again: its blocks are there.
    expect(await ask('tenant-a-salt')).toBeGreaterThan(0);
    // Completions and the Responses API read the salt too.
    const comp = async (salt: string) => ((await (await post(m, '/v1/completions', { model: 'demo-model', prompt: SYSTEM, max_tokens: 2, cache_salt: salt })).json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage.prompt_tokens_details.cached_tokens;
    expect(await comp('c-salt')).toBe(0);
    expect(await comp('d-salt')).toBe(0);
    expect(await comp('c-salt')).toBeGreaterThan(0);
    const resp = async (salt: string) => ((await (await post(m, '/v1/responses', { model: 'demo-model', input: SYSTEM, max_output_tokens: 2, store: false, cache_salt: salt })).json()) as { usage: { input_tokens_details: { cached_tokens: number } } }).usage.input_tokens_details.cached_tokens;
    expect(await resp('e-salt')).toBe(0);
    expect(await resp('f-salt')).toBe(0);
    expect(await resp('e-salt')).toBeGreaterThan(0);
  });

  it('refuses a cache_salt that is not a non-empty string with vLLM\'s 400', async () => {
    const m = await start({ id: 'bad-salt' });
    for (const salt of ['', 42, { a: 1 }]) {
      const res = await post(m, '/v1/chat/completions', { model: 'demo-model', messages: [{ role: 'user', content: 'hi' }], cache_salt: salt });
      expect(res.status, JSON.stringify(salt)).toBe(400);
      expect(((await res.json()) as { error: { message: string } }).error.message).toBe("Parameter 'cache_salt' must be a non-empty string if provided.");
    }
  });

  it('keepAlive false answers every request with Connection: close (no pooled socket outlives a restart)', async () => {
    const closing = await start({ id: 'no-keepalive', keepAlive: false });
    const kept = await start({ id: 'keepalive' });
    const res = await fetch(`${closing.url}/health`);
    expect(res.headers.get('connection')).toBe('close');
    expect((await fetch(`${kept.url}/health`)).headers.get('connection')).toBe('keep-alive');
  });

  it('recomputes the last token of a fully cached prompt, as vLLM does', async () => {
    const m = await start({ id: 'full-hit' });
    const prompt = 'x'.repeat(64 * 3); // exactly 48 tokens, 3 full blocks
    const ask = async () =>
      ((await (await post(m, '/v1/completions', { prompt, max_tokens: 1 })).json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage
        .prompt_tokens_details.cached_tokens;
    expect(await ask()).toBe(0);
    expect(await ask()).toBe(32); // at most prompt_len - 1 = 47 tokens, so 2 full blocks
  });

  it('evicts least recently used blocks when the cache is full', async () => {
    const m = await start({ id: 'lru', cacheBlocks: 4 });
    // 138 characters + 1 output token of 4 = 142: two full blocks each.
    const p = (c: string) => c.repeat(138);
    const cached = async (prompt: string) =>
      ((await (await post(m, '/v1/completions', { prompt, max_tokens: 1 })).json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage
        .prompt_tokens_details.cached_tokens;

    expect(await cached(p('a'))).toBe(0);
    expect(await cached(p('b'))).toBe(0); // cache full: a a b b
    expect(await cached(p('a'))).toBe(32); // touches a: b is now least recently used
    expect(await cached(p('c'))).toBe(0); // evicts b
    expect(await cached(p('a'))).toBe(32);
    expect(await cached(p('c'))).toBe(32);
    expect(await cached(p('b'))).toBe(0);
    const s = m.stats();
    expect(s.prefixCache.blocks).toBeLessThanOrEqual(4);
    expect(s.prefixCache.evictions).toBeGreaterThanOrEqual(4);
  });
});

describe('data-parallel mode', () => {
  const prompt = 'a data-parallel prompt of several full blocks. '.repeat(8);
  type Completion = { usage: { prompt_tokens_details: { cached_tokens: number } } };
  const complete = (m: MockVllm, rank: string) => post(m, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': rank }).then((x) => x.json() as Promise<Completion>);

  it('keeps a prefix cache per engine: the same prompt hits only on the engine that saw it', async () => {
    const m = await start({ id: 'dp', dataParallelSize: 2 });
    const r1 = await complete(m, '1');
    const again = await complete(m, ' 1 ');
    const other = await complete(m, '0');
    expect(r1.usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect(again.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
    expect(other.usage.prompt_tokens_details.cached_tokens).toBe(0);
    const s = m.stats();
    expect(s.engines!.map((e) => e.requests)).toEqual([1, 2]);
    expect(s.engines![0]!.prefixCache.hitsTokens).toBe(0);
    expect(s.engines![1]!.prefixCache.hitsTokens).toBe(again.usage.prompt_tokens_details.cached_tokens);
  });

  it('labels per-engine series engine="<rank>" in /metrics, one cache_config_info each', async () => {
    const m = await start({ id: 'dp-metrics', dataParallelSize: 2, cacheBlocks: 512 });
    await complete(m, '1');
    const text = await fetch(`${m.url}/metrics`).then((r) => r.text());
    expect(sample(text, 'vllm:prefix_cache_queries_total', 'engine="0"')).toBe(0);
    expect(sample(text, 'vllm:prefix_cache_queries_total', 'engine="1"')).toBeGreaterThan(0);
    expect(sample(text, 'vllm:kv_cache_usage_perc', 'engine="1"')).toBe(0);
    const configs = text.split('\n').filter((l) => l.startsWith('vllm:cache_config_info{'));
    expect(configs).toHaveLength(2);
    expect(configs.map((l) => /engine="(\d+)"/.exec(l)![1])).toEqual(['0', '1']);
    // The server's total on every engine's label, as vLLM writes it (vllm/v1/engine/utils.py).
    for (const l of configs) expect(l).toContain('num_gpu_blocks="1024"');
  });

  it('parses the rank as vLLM does: a bad value is ignored, one out of range is a 400 (one engine too)', async () => {
    const m = await start({ id: 'dp-rank', dataParallelSize: 2 });
    expect((await post(m, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': 'one' })).status).toBe(200);
    const out = await post(m, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': '2' });
    expect(out.status).toBe(400);
    expect(((await out.json()) as { error: { message: string } }).error.message).toBe('data_parallel_rank 2 is out of range [0, 2).');
    const single = await start({ id: 'dp-single' });
    expect((await post(single, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': '1' })).status).toBe(400);
    expect((await post(single, '/v1/completions', { prompt, max_tokens: 1 }, { 'x-data-parallel-rank': '0' })).status).toBe(200);
    // The default mock has no per-engine stats and one engine="0" series, as before.
    expect(single.stats().engines).toBeUndefined();
  });

  it('honours the rank on /v1/messages (vLLM serves it through its chat path), not on /v1/responses', async () => {
    const m = await start({ id: 'dp-apis', dataParallelSize: 2 });
    const messages = { model: 'demo-model', max_tokens: 2, messages: [{ role: 'user', content: prompt }] };
    for (let k = 0; k < 3; k++) expect((await post(m, '/v1/messages', messages, { 'x-data-parallel-rank': '1' })).status).toBe(200);
    expect(m.stats().engines!.map((e) => e.requests)).toEqual([0, 3]);
    const bad = await post(m, '/v1/messages', messages, { 'x-data-parallel-rank': '7' });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { message: string } }).error.message).toBe('data_parallel_rank 7 is out of range [0, 2).');
    // Responses: the balancer's engine (the idle engine 0 first), whatever the header says.
    expect((await post(m, '/v1/responses', { model: 'demo-model', input: prompt, max_output_tokens: 2 }, { 'x-data-parallel-rank': '1' })).status).toBe(200);
    expect(m.stats().engines!.map((e) => e.requests)).toEqual([1, 3]);
  });

  it('reset clears every engine (a server restart)', async () => {
    const m = await start({ id: 'dp-reset', dataParallelSize: 2 });
    for (const rank of ['0', '1']) await complete(m, rank);
    m.reset();
    for (const e of m.stats().engines!) expect([e.requests, e.prefixCache.blocks, e.prefixCache.queriesTokens]).toEqual([0, 0, 0]);
  });
});

describe('auth', () => {
  it('requires the bearer key on /v1/* only, with vLLM body', async () => {
    const m = await start({ id: 'auth', apiKey: 'sekret' });
    const body = { model: 'demo-model', messages: [{ role: 'user' as const, content: 'hi' }], max_tokens: 2 };

    const none = await post(m, '/v1/chat/completions', body);
    expect(none.status).toBe(401);
    expect(await none.json()).toEqual({ error: 'Unauthorized' });
    expect((await post(m, '/v1/chat/completions', body, { authorization: 'Bearer wrong' })).status).toBe(401);
    expect((await fetch(`${m.url}/v1/models`)).status).toBe(401);

    const wrong = new OpenAI({ baseURL: `${m.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await expect(wrong.chat.completions.create(body)).rejects.toMatchObject({ status: 401 });

    const right = new OpenAI({ baseURL: `${m.url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const ok = await right.chat.completions.create(body, { headers: { 'x-session-id': 'abc' } });
    expect(ok.choices[0]!.finish_reason).toBe('length');
    const last = m.stats().lastCompletionRequest!;
    expect(last.headers.authorization).toBe('Bearer sekret');
    expect(last.headers['x-session-id']).toBe('abc');
    expect(last.body).toMatchObject({ model: 'demo-model', max_tokens: 2 });

    expect((await fetch(`${m.url}/health`)).status).toBe(200);
    expect((await fetch(`${m.url}/metrics`)).status).toBe(200);
  });
});

describe('metrics', () => {
  it('exposes vLLM metric names with HELP/TYPE and moves the counters', async () => {
    const m = await start({ id: 'metrics', cacheBlocks: 300 });
    const scrape = async () => {
      const res = await fetch(`${m.url}/metrics`);
      expect(res.headers.get('content-type')).toMatch(/^text\/plain/);
      return res.text();
    };
    const before = await scrape();
    for (const [name, type] of [
      ['vllm:prefix_cache_queries_total', 'counter'],
      ['vllm:prefix_cache_hits_total', 'counter'],
      ['vllm:num_requests_running', 'gauge'],
      ['vllm:num_requests_waiting', 'gauge'],
      ['vllm:kv_cache_usage_perc', 'gauge'],
      ['vllm:cache_config_info', 'gauge'],
      ['vllm:time_to_first_token_seconds', 'histogram'],
      ['vllm:prompt_tokens_total', 'counter'],
      ['vllm:generation_tokens_total', 'counter'],
      ['vllm:request_success_total', 'counter'],
    ]) {
      expect(before).toContain(`# HELP ${name} `);
      expect(before).toContain(`# TYPE ${name} ${type}\n`);
    }
    expect(before).toMatch(/^vllm:cache_config_info\{[^}]*block_size="16"[^}]*enable_prefix_caching="True"[^}]*num_gpu_blocks="300"[^}]*\} 1\.0$/m);
    expect(before).toMatch(/^vllm:num_requests_running\{engine="0",model_name="demo-model"\} 0\.0$/m);
    expect(before).toContain('vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="demo-model"} 0.0');
    expect(before).toContain('le="2560.0"');
    expect(sample(before, 'vllm:prefix_cache_queries_total')).toBe(0);

    const prompt = 'y'.repeat(400);
    await post(m, '/v1/completions', { prompt, max_tokens: 3 }).then((r) => r.json());
    await post(m, '/v1/completions', { prompt, max_tokens: 3 }).then((r) => r.json());
    const after = await scrape();
    expect(sample(after, 'vllm:prefix_cache_queries_total')).toBe(200);
    expect(sample(after, 'vllm:prefix_cache_hits_total')).toBe(96); // 6 full blocks of 400 chars
    expect(sample(after, 'vllm:prompt_tokens_total')).toBe(200);
    expect(sample(after, 'vllm:generation_tokens_total')).toBe(6);
    expect(sample(after, 'vllm:request_success_total', 'finished_reason="length"')).toBe(2);
    expect(sample(after, 'vllm:time_to_first_token_seconds_count')).toBe(2);
    expect(sample(after, 'vllm:time_to_first_token_seconds_bucket', 'le="+Inf"')).toBe(2);
    expect(sample(after, 'vllm:kv_cache_usage_perc')).toBe(0);
  });

  it('can emit the older metric generations', async () => {
    const v0 = await start({ id: 'v0', metricsFlavor: 'v0' });
    const text = await (await fetch(`${v0.url}/metrics`)).text();
    expect(text).toContain('# TYPE vllm:gpu_prefix_cache_hit_rate gauge');
    expect(text).toContain('# TYPE vllm:gpu_cache_usage_perc gauge');
    expect(text).not.toContain('vllm:prefix_cache_hits_total');
    expect(text).not.toContain('engine=');
    const v1 = await start({ id: 'v1b', metricsFlavor: 'v1-blocks' });
    expect(await (await fetch(`${v1.url}/metrics`)).text()).toContain('# TYPE vllm:gpu_prefix_cache_hits_total counter');
  });
});

describe('faults and scheduling', () => {
  let m: MockVllm;
  beforeAll(async () => {
    m = await start({ id: 'faults' });
  });
  afterEach(async () => {
    await post(m, '/_mock/faults', DEFAULT_FAULTS); // every flag back to its default
  });
  const chat = { model: 'demo-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 };

  it('answers 500 with an error JSON at error500Rate 1, and fails health on request', async () => {
    expect((await post(m, '/_mock/faults', { error500Rate: 1 })).status).toBe(200);
    const res = await post(m, '/v1/chat/completions', chat);
    expect(res.status).toBe(500);
    expect(await res.json()).toMatchObject({ error: { type: 'InternalServerError', code: 500 } });
    expect(m.stats().injectedErrors).toBeGreaterThanOrEqual(1);

    m.setFaults({ error500Rate: 0, failHealth: true });
    expect((await fetch(`${m.url}/health`)).status).toBe(503);
    expect((await post(m, '/v1/chat/completions', chat)).status).toBe(200);
    m.setFaults({ failHealth: false });
    expect((await fetch(`${m.url}/health`)).status).toBe(200);

    expect((await post(m, '/_mock/faults', { nonsense: true })).status).toBe(400);
  });

  it('draws error500Rate from the seeded PRNG, so a seed replays the same outcomes', async () => {
    const outcomes = async (seed: number) => {
      const r = await start({ id: `seed-${seed}`, seed, faults: { error500Rate: 0.5 } });
      const statuses: number[] = [];
      for (let i = 0; i < 12; i++) statuses.push((await post(r, '/v1/completions', { prompt: 'p', max_tokens: 1 })).status);
      await r.close();
      return statuses;
    };
    const a = await outcomes(7);
    expect(await outcomes(7)).toEqual(a);
    expect(a).toContain(500);
    expect(a).toContain(200);
  });

  it('stalls mid-stream; a client abort frees the slot and is counted', async () => {
    await post(m, '/_mock/faults', { stallMidStream: 2 });
    const before = m.stats();
    const ac = new AbortController();
    const res = await post(m, '/v1/chat/completions', { ...chat, stream: true }, {}, ac.signal);
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let received = '';
    for (let i = 0; i < 50 && received.split('\n\n').length - 1 < 2; i++) {
      const { value, done } = await reader.read();
      if (done) break;
      received += new TextDecoder().decode(value);
    }
    expect(received.split('\n\n').length - 1).toBe(2);
    await eventually(() => {
      const s = m.stats();
      expect(s.running).toBe(1);
      expect(s.activeStreams).toBe(1);
    });
    ac.abort();
    await reader.cancel().catch(() => {});
    await eventually(() => {
      const s = m.stats();
      expect(s.running).toBe(0);
      expect(s.activeStreams).toBe(0);
      expect(s.abortedByClient).toBe(before.abortedByClient + 1);
      expect(s.finishedByReason.abort).toBe(before.finishedByReason.abort! + 1);
      expect(s.prefixCache.heldBlocks).toBe(0);
    });
    await post(m, '/_mock/faults', { stallMidStream: null });
    expect((await post(m, '/v1/chat/completions', chat)).status).toBe(200);
  });

  it('stalls before headers forever until the client leaves', async () => {
    m.setFaults({ stallBeforeForever: true });
    const before = m.stats().abortedByClient;
    const requestsBefore = m.stats().completionRequestsTotal;
    const ac = new AbortController();
    const pending = post(m, '/v1/chat/completions', chat, {}, ac.signal);
    // Counted in the same synchronous step that registers the request's close listener, so once
    // the count shows it, the abort below is seen whenever it lands (no settling time needed).
    await eventually(() => expect(m.stats().completionRequestsTotal).toBe(requestsBefore + 1));
    ac.abort();
    await expect(pending).rejects.toThrow();
    await eventually(() => expect(m.stats().abortedByClient).toBe(before + 1));
  });

  it('delays by stallBeforeMs and slows by slowFactor', async () => {
    m.setFaults({ stallBeforeMs: 150 });
    const t0 = Date.now();
    expect((await post(m, '/v1/chat/completions', chat)).status).toBe(200);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(140);
    m.setFaults({ stallBeforeMs: 0, slowFactor: 20 }); // 3 decode steps x 2 ms x 20 = 120 ms
    const t1 = Date.now();
    expect((await post(m, '/v1/chat/completions', chat)).status).toBe(200);
    expect(Date.now() - t1).toBeGreaterThanOrEqual(100);
  });

  it('drops the connection', async () => {
    m.setFaults({ dropConnection: true });
    await expect(post(m, '/v1/chat/completions', chat)).rejects.toThrow();
    await expect(fetch(`${m.url}/health`)).rejects.toThrow();
    expect(m.stats().droppedConnections).toBe(2);
    m.setFaults({ dropConnection: false });
    expect((await fetch(`${m.url}/health`)).status).toBe(200);
  });

  it('queues beyond max-running in FIFO order and reports running/waiting', async () => {
    const q = await start({ id: 'queue', maxRunning: 1, decodeMsPerToken: 20 });
    const order: number[] = [];
    const reqs = [0, 1, 2].map((i) =>
      post(q, '/v1/completions', { prompt: `request ${i}`, max_tokens: 10 }).then(async (r) => {
        expect(r.status).toBe(200);
        await r.json();
        order.push(i);
      }),
    );
    await eventually(async () => {
      const s = await mockStats(q);
      expect(s.running).toBe(1);
      expect(s.waiting).toBe(2);
    });
    const text = await (await fetch(`${q.url}/metrics`)).text();
    expect(sample(text, 'vllm:num_requests_running')).toBe(1);
    expect(sample(text, 'vllm:num_requests_waiting')).toBe(2);
    expect(sample(text, 'vllm:kv_cache_usage_perc')).toBeGreaterThan(0);
    await Promise.all(reqs);
    expect(order).toEqual([0, 1, 2]);
    const s = q.stats();
    expect(s.running + s.waiting).toBe(0);
    expect(s.peakWaiting).toBe(2);
    expect(s.completionRequestsTotal).toBe(3);
    expect(s.finishedByReason.length).toBe(3);
  });

  it('a queued stream gets its first token only after the one ahead of it finished (TTFT grows with queue position)', async () => {
    // max_num_seqs 1: each stream's first token must wait for the previous one's last (vLLM admits
    // from the FIFO waiting queue only when a running slot frees). Event order, not timings.
    const q = await start({ id: 'ttft-queue', maxRunning: 1, decodeMsPerToken: 5 });
    const events: string[] = [];
    const reqs = [0, 1, 2].map(async (i) => {
      const r = await post(q, '/v1/completions', { prompt: `queued stream ${i}`, max_tokens: 4, stream: true });
      expect(r.status).toBe(200);
      const reader = r.body!.getReader();
      const dec = new TextDecoder();
      let text = '';
      let first = true;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += dec.decode(value, { stream: true });
        if (first && /"text":"[^"]+"/.test(text)) {
          first = false;
          events.push(`first ${i}`);
        }
      }
      events.push(`end ${i}`);
    });
    // Which one is admitted first depends on arrival (the FIFO test above covers that order); here
    // the k-th first token (in the order they came) follows exactly k finished streams.
    await Promise.all(reqs);
    expect(events.filter((e) => e.startsWith('first')).length, events.join(', ')).toBe(3);
    let rank = 0;
    events.forEach((e, at) => {
      if (!e.startsWith('first')) return;
      expect(events.slice(0, at).filter((x) => x.startsWith('end')).length, events.join(', ')).toBe(rank++);
    });
  });

  it('reset clears the cache and counters', async () => {
    const r = await start({ id: 'reset' });
    const prompt = 'z'.repeat(300);
    await post(r, '/v1/completions', { prompt, max_tokens: 1 }).then((x) => x.json());
    expect(r.stats().prefixCache.blocks).toBeGreaterThan(0);
    expect((await post(r, '/_mock/reset', {})).status).toBe(200);
    const s = await mockStats(r);
    expect(s.prefixCache.blocks).toBe(0);
    expect(s.requestsTotal).toBe(0);
    expect(s.prefixCache.queriesTokens).toBe(0);
  });

  it('close() ends in-flight streams', async () => {
    const c = await startMockVllm({ port: 0, profile: 'legacy', id: 'closing', faults: { stallMidStream: 1 } });
    const res = await post(c, '/v1/chat/completions', { ...chat, stream: true });
    const body = res.text().catch((e: unknown) => e);
    await eventually(() => expect(c.stats().running).toBe(1));
    await c.close();
    await body; // resolves or rejects, but does not hang
    await expect(fetch(`${c.url}/health`)).rejects.toThrow();
  });
});

describe('CLI', () => {
  it('prints one line on start, serves, and exits cleanly on SIGTERM', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'tools/mock-engine/index.ts', '--port', '0', '--id', 'cli1', '--model', 'a,b'], {
      cwd: process.cwd(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    try {
      const lines = createInterface({ input: child.stdout! });
      const first = await Promise.race([
        once(lines, 'line').then(([l]) => l as string),
        new Promise<string>((_, reject) => setTimeout(() => reject(new Error('no start line')), 20_000)),
      ]);
      const match = /^mock-vllm cli1 listening on (http:\/\/127\.0\.0\.1:(\d+))$/.exec(first);
      expect(match).not.toBeNull();
      const models = (await (await fetch(`${match![1]}/v1/models`)).json()) as { data: Array<{ id: string }> };
      expect(models.data.map((d) => d.id)).toEqual(['a', 'b']);
      const exit = once(child, 'exit');
      child.kill('SIGTERM');
      const [code] = await exit;
      expect(code).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });

  it('documents every fault flag in --help', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'tools/mock-engine/index.ts', '--help'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const [code] = await once(child, 'exit');
    expect(code).toBe(0);
    for (const flag of ['--fail-health', '--error-500-rate', '--stall-before-ms', '--stall-before-forever', '--stall-mid-stream', '--slow-factor', '--drop-connection', '--in-band-error-after', '--drop-after-tokens', '--stall-after-tokens', '--profile', '--headers-first', '--responses-store', '--seed', '--api-key', '--cache-blocks', '--max-running', '--max-num-seqs']) {
      expect(out).toContain(flag);
    }
  });
});
