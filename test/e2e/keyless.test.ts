// End to end: the keyless APIs through the router under Miniflare on loopback, three mock vLLM
// replicas as real servers, the official openai SDK as the client for embeddings and models (its
// default base64 encoding included), fetch for rerank, score and a tokenize → detokenize round
// trip. Least-load spread, leases released, the trace log's api field. Only 127.0.0.1; bounded.

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'embed-model';
const CHAT_MODEL = 'chat-model';
let mocks: MockVllm[] = [];
let router: RouterHandle;
let client: OpenAI;

beforeAll(async () => {
  mocks = await startMocks(3, { models: [MODEL, CHAT_MODEL] });
  // The default strategy (prefix-aware) and key list: keyless requests must still go least-load.
  // A second pool on the same replicas, bounded-hash on the default keys, for prompt_cache_key.
  const chatPool = { name: 'chat', models: [CHAT_MODEL], strategy: 'bounded-hash:1.25', replicas: mocks.map((m) => ({ id: m.id, url: m.url, auth: 'bearer:ORIGIN_API_KEY' })) };
  router = await startRouter({ config: routerConfig({ replicas: mocks, pool: 'embed', models: [MODEL], strategy: 'prefix-aware', keys: ['header:x-session-id', 'body:prompt_cache_key', 'tenant', 'prefix:4096'], extraPools: [chatPool] }) });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
  await eventually(async () => {
    const res = await router.adminFetch('/admin/pools/embed');
    const snap = (await res.json()) as { replicas: { healthy: boolean }[] };
    expect(snap.replicas.every((r) => r.healthy)).toBe(true);
  }, { timeoutMs: 15_000 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

const api = (path: string, body: unknown) =>
  fetch(`${router.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });

const norm = (v: number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

describe('embeddings with the openai SDK', () => {
  it('the SDK\'s default (base64) and float encodings, decoded to the same unit vectors', async () => {
    const b64 = await client.embeddings.create({ model: MODEL, input: ['first text', 'second text'] });
    expect(b64.object).toBe('list');
    expect(b64.model).toBe(MODEL);
    expect(b64.data.map((d) => [d.index, d.object])).toEqual([
      [0, 'embedding'],
      [1, 'embedding'],
    ]);
    for (const d of b64.data) {
      expect(d.embedding).toHaveLength(32);
      expect(norm(d.embedding)).toBeCloseTo(1, 5);
    }
    expect(b64.usage.prompt_tokens).toBeGreaterThan(0);
    const float = await client.embeddings.create({ model: MODEL, input: 'first text', encoding_format: 'float' });
    float.data[0]!.embedding.forEach((x, i) => expect(x).toBeCloseTo(b64.data[0]!.embedding[i]!, 6));
    const small = await client.embeddings.create({ model: MODEL, input: 'first text', dimensions: 8, encoding_format: 'float' });
    expect(small.data[0]!.embedding).toHaveLength(8);
  });

  it('least-load across the replicas, every lease released', async () => {
    const before = mocks.map((m) => m.stats().keylessRequestsTotal);
    for (let i = 0; i < 18; i++) await client.embeddings.create({ model: MODEL, input: 'the same text, the same tenant' });
    const served = mocks.map((m, i) => m.stats().keylessRequestsTotal - before[i]!);
    expect(served.reduce((a, b) => a + b, 0)).toBe(18);
    expect(served.filter((n) => n > 0).length).toBeGreaterThan(1);
    await eventually(async () => {
      const snap = (await (await router.adminFetch('/admin/pools/embed')).json()) as { leases: number; replicas: { inFlight: number }[] };
      expect(snap.leases).toBe(0);
      expect(snap.replicas.every((r) => r.inFlight === 0)).toBe(true);
    }, { timeoutMs: 15_000 });
  });

  it('bad input is the SDK\'s BadRequestError, reaching no replica; an unknown model its NotFoundError', async () => {
    const before = mocks.reduce((s, m) => s + m.stats().keylessRequestsTotal, 0);
    const bad = await client.embeddings.create({ model: MODEL, input: [] }).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError);
    expect((bad as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('invalid_request');
    expect((bad as InstanceType<typeof OpenAI.BadRequestError>).param).toBe('input');
    const unknown = await client.embeddings.create({ model: 'no-such-model', input: 'x' }).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError);
    expect(mocks.reduce((s, m) => s + m.stats().keylessRequestsTotal, 0)).toBe(before);
  });

  it('the trace log names the API and a keyless pick', async () => {
    await client.embeddings.create({ model: MODEL, input: 'traced' });
    const line = await eventually(() => {
      const l = router.traceLines().filter((t) => t.api === 'embeddings').at(-1);
      expect(l).toBeDefined();
      return l!;
    }, { timeoutMs: 15_000 });
    expect(line).toMatchObject({ api: 'embeddings', pool: 'embed', keyKind: 'none', keyHash: null, status: 200 });
    expect(line.blocks).toBeUndefined();
  });
});

describe('the other keyless APIs', () => {
  it('rerank (and its /rerank, /v2/rerank aliases): best document first, top_n', async () => {
    for (const path of ['/v1/rerank', '/rerank', '/v2/rerank']) {
      const res = await api(path, { model: MODEL, query: 'red fox', documents: ['a blue whale', 'the red fox jumps', 'a fox'], top_n: 2 });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { model: string; results: { index: number; relevance_score: number; document: { text: string } }[]; usage: { total_tokens: number } };
      expect(body.results.map((r) => r.index)).toEqual([1, 2]);
      expect(body.results[0]!.document.text).toBe('the red fox jumps');
      expect(body.usage.total_tokens).toBeGreaterThan(0);
    }
  });

  it('score: one text against many', async () => {
    const res = await api('/v1/score', { model: MODEL, text_1: 'red fox', text_2: ['red fox', 'blue whale'] });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { object: string; data: { index: number; object: string; score: number }[] };
    expect(body.object).toBe('list');
    expect(body.data.map((d) => [d.index, d.object, d.score])).toEqual([
      [0, 'score', 1],
      [1, 'score', 0],
    ]);
  });

  it('tokenize then detokenize round-trips, whichever replica each lands on', async () => {
    const text = 'Hello, wörld';
    const tok = await api('/tokenize', { model: MODEL, prompt: text, add_special_tokens: false, return_token_strs: true });
    expect(tok.status).toBe(200);
    const t = (await tok.json()) as { count: number; max_model_len: number; tokens: number[]; token_strs: string[] };
    expect(t.count).toBe(t.tokens.length);
    expect(t.token_strs).toHaveLength(t.count);
    const de = await api('/detokenize', { model: MODEL, tokens: t.tokens });
    expect(await de.json()).toEqual({ prompt: text });
  });
});

describe('prompt_cache_key with the openai SDK', () => {
  it('one conversation id stays on one replica, others spread (the key is hashed with the tenant)', async () => {
    const replicaOf = async (key: string) => {
      const { response } = await client.chat.completions.create({ model: CHAT_MODEL, max_tokens: 2, prompt_cache_key: key, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
      return response.headers.get('x-prefix-router-replica')!;
    };
    const one = new Set<string>();
    for (let i = 0; i < 6; i++) one.add(await replicaOf('codex-conversation-1'));
    expect(one.size).toBe(1);
    const many = new Set<string>();
    for (let i = 0; i < 16; i++) many.add(await replicaOf(`codex-conversation-${i + 2}`));
    expect(many.size).toBeGreaterThan(1);
  });
});

describe('models with the openai SDK', () => {
  it('list and retrieve: one entry per model, the pools in the extension field', async () => {
    const list = await client.models.list();
    expect(list.data.map((m) => m.id)).toEqual([MODEL, CHAT_MODEL]);
    const m = await client.models.retrieve(MODEL);
    expect(m).toMatchObject({ id: MODEL, object: 'model', owned_by: 'prefix-router', prefix_router: { pools: ['embed'] } });
    await expect(client.models.retrieve('no-such-model')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });
});
