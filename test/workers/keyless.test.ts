// The keyless APIs (embeddings, rerank, score, tokenize, detokenize) end to end inside workerd,
// against the fake origin: authenticated, validated (every bad input a 4xx in OpenAI JSON that
// reaches no replica), leased and least-load (no prefix to keep, even in a prefix-aware pool),
// engine-aware (a path the pool's engine lacks is a 404), fenced engine fields, counted per API;
// and prompt_cache_key as a routing key.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { TenantMeter } from '../../src/index';
import { keylessPromptTokens } from '../../src/http/apis/keyless';
import { ADMIN_TOKEN } from '../fixtures/workers/test-env';
import { admin, call, complete, expectError, KEYS, originRequests, poolSnapshot, rid, until } from '../helpers/workers';

const post = (path: string, body: unknown, opts: { key?: string | null; requestId?: string; headers?: Record<string, string> } = {}) => {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...opts.headers };
  const key = opts.key === undefined ? KEYS.acme : opts.key;
  if (key !== null) headers.authorization = `Bearer ${key}`;
  if (opts.requestId) headers['x-request-id'] = opts.requestId;
  return call(path, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
};

const EMBED = 'embed-model';
const LLAMA = 'llama-embed';

describe('keyless APIs through the proxy', () => {
  it('embeddings: vLLM\'s answer passes through, the body reaches the origin without engine control fields', async () => {
    const id = rid('emb');
    const res = await post('/v1/embeddings', { model: EMBED, input: ['a', 'b'], priority: -100, request_id: 'other-tenants-id', encoding_format: 'float' }, { requestId: id });
    expect(res.status).toBe(200);
    expect(['emb1', 'emb2', 'emb3']).toContain(res.headers.get('x-prefix-router-replica'));
    const body = await res.json<{ object: string; data: { index: number; object: string; embedding: number[] }[]; usage: { prompt_tokens: number } }>();
    expect(body.object).toBe('list');
    expect(body.data.map((d) => [d.index, d.object])).toEqual([
      [0, 'embedding'],
      [1, 'embedding'],
    ]);
    const [seen] = await originRequests({ rid: id });
    expect(seen!.path).toBe('/v1/embeddings');
    const sent = JSON.parse(seen!.body) as Record<string, unknown>;
    expect(sent).toMatchObject({ model: EMBED, input: ['a', 'b'], encoding_format: 'float' });
    expect(sent.priority).toBeUndefined();
    // The router's own request id goes to the engine, never the client's.
    expect(sent.request_id).not.toBe('other-tenants-id');
    expect(seen!.headers.authorization).toMatch(/^Bearer /);
  });

  it.each([
    ['/v1/rerank', { model: EMBED, query: 'q', documents: ['d1', 'd2'], top_n: 1 }, '/v1/rerank'],
    ['/rerank', { model: EMBED, query: 'q', documents: ['d1'] }, '/rerank'],
    ['/v2/rerank', { model: EMBED, query: 'q', documents: ['d1'] }, '/v2/rerank'],
    ['/v1/score', { model: EMBED, text_1: 'a', text_2: ['b', 'c'] }, '/v1/score'],
    ['/v1/score', { model: EMBED, queries: 'a', documents: ['b'] }, '/v1/score'],
    ['/score', { model: EMBED, text_1: 'a', text_2: 'b' }, '/score'],
    ['/tokenize', { model: EMBED, prompt: 'hello' }, '/tokenize'],
    ['/tokenize', { model: EMBED, messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: true }, '/tokenize'],
    ['/detokenize', { model: EMBED, tokens: [1, 2, 3] }, '/detokenize'],
  ])('%s on a vLLM pool reaches the origin at %s', async (path, body, upstream) => {
    const id = rid('kl');
    const res = await post(path, body, { requestId: id });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    const [seen] = await originRequests({ rid: id });
    expect(seen!.path).toBe(upstream);
  });

  it('a llama.cpp pool: its own paths, and a 404 in OpenAI JSON for what its engine lacks (reaching no replica)', async () => {
    const ok = rid('ll');
    expect((await post('/v2/rerank', { model: LLAMA, query: 'q', documents: ['d'] }, { requestId: ok })).status).toBe(200);
    expect((await originRequests({ rid: ok }))[0]!.path).toBe('/v1/rerank');
    for (const [path, body] of [
      ['/v1/score', { model: LLAMA, text_1: 'a', text_2: 'b' }],
      ['/tokenize', { model: LLAMA, prompt: 'hi' }],
    ] as const) {
      const id = rid('ll-404');
      const e = await expectError(await post(path, body, { requestId: id }), 404, 'not_found');
      expect(e.error.message).toContain('llamacpp');
      expect(await originRequests({ rid: id })).toHaveLength(0);
    }
  });

  it('least-load, not the tenant\'s key: sequential embeddings from one tenant and session spread over the pool, chat does not', async () => {
    const replicas = new Set<string>();
    for (let i = 0; i < 24; i++) {
      const res = await post('/v1/embeddings', { model: EMBED, input: 'same text every time' }, { headers: { 'x-session-id': 'one-session' } });
      expect(res.status).toBe(200);
      replicas.add(res.headers.get('x-prefix-router-replica')!);
      await res.arrayBuffer();
    }
    // Ties among idle replicas go at random: 24 requests all on one of three is (1/3)^23.
    expect(replicas.size).toBeGreaterThan(1);
    const chat = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const res = await complete({ model: 'chat-model', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-session-id': 'one-session' } });
      chat.add(res.headers.get('x-prefix-router-replica')!);
      await res.arrayBuffer();
    }
    expect(chat.size).toBe(1);
  });

  it('leased and released, counted per API, and nothing enters the prefix index', async () => {
    const before = await poolSnapshot('embed');
    const count = (s: typeof before) => s.replicas.reduce((n, r) => n + ((r.stats as { byApi?: Record<string, number> }).byApi?.tokenize ?? 0), 0);
    for (let i = 0; i < 3; i++) await (await post('/tokenize', { model: EMBED, prompt: `p${i}` })).arrayBuffer();
    const after = await until(() => poolSnapshot('embed'), (s) => count(s) >= count(before) + 3);
    expect(count(after) - count(before)).toBe(3);
    expect(after.replicas.every((r) => r.inFlight === 0)).toBe(true);
    expect(after.prefixIndex?.entries ?? 0).toBe(0);
    const metrics = await (await call('/metrics', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).text();
    expect(metrics).toMatch(/^prefix_router_api_requests_total\{pool="embed",replica="emb\d",api="tokenize"\} \d+$/m);
  });

  it('authenticated like every API path, POST only', async () => {
    for (const path of ['/v1/embeddings', '/tokenize', '/detokenize', '/rerank', '/v2/rerank', '/v1/score', '/score']) {
      await expectError(await post(path, { model: EMBED, prompt: 'x' }, { key: null }), 401, 'missing_api_key');
      await expectError(await post(path, { model: EMBED, prompt: 'x' }, { key: 'sk-wrong' }), 401, 'invalid_api_key');
      await expectError(await call(path, { headers: { authorization: `Bearer ${KEYS.acme}` } }), 405, 'method_not_allowed');
    }
    // A tenant whose pools do not serve the model: the same 404 as an unknown model.
    await expectError(await post('/v1/embeddings', { model: EMBED, input: 'x' }, { key: KEYS.basic }), 404, 'model_not_found');
  });
});

describe('keyless request validation: a 400 in OpenAI JSON naming the field, nothing forwarded', () => {
  const cases: [string, string, Record<string, unknown>, string][] = [
    ['/v1/embeddings', 'no model', { input: 'x' }, 'model'],
    ['/v1/embeddings', 'model not a string', { model: 7, input: 'x' }, 'model'],
    ['/v1/embeddings', 'no input', { model: EMBED }, 'input'],
    ['/v1/embeddings', 'input and messages', { model: EMBED, input: 'x', messages: [{ role: 'user', content: 'y' }] }, 'messages'],
    ['/v1/embeddings', 'input an object', { model: EMBED, input: { a: 1 } }, 'input'],
    ['/v1/embeddings', 'empty input list', { model: EMBED, input: [] }, 'input'],
    ['/v1/embeddings', 'negative token id', { model: EMBED, input: [1, -2] }, 'input.1'],
    ['/v1/embeddings', 'mixed list', { model: EMBED, input: ['a', 1] }, 'input'],
    ['/v1/embeddings', 'too many inputs', { model: EMBED, input: Array.from({ length: 2049 }, () => 'a') }, 'input'],
    ['/v1/embeddings', 'dimensions 0', { model: EMBED, input: 'x', dimensions: 0 }, 'dimensions'],
    ['/v1/embeddings', 'dimensions a string', { model: EMBED, input: 'x', dimensions: '8' }, 'dimensions'],
    ['/v1/embeddings', 'truncate_prompt_tokens -2', { model: EMBED, input: 'x', truncate_prompt_tokens: -2 }, 'truncate_prompt_tokens'],
    ['/v1/embeddings', 'stream true', { model: EMBED, input: 'x', stream: true }, 'stream'],
    ['/v1/embeddings', 'cache_salt empty', { model: EMBED, input: 'x', cache_salt: '' }, 'cache_salt'],
    ['/v1/rerank', 'no query', { model: EMBED, documents: ['d'] }, 'query'],
    ['/v1/rerank', 'documents a string', { model: EMBED, query: 'q', documents: 'd' }, 'documents'],
    ['/v1/rerank', 'empty documents', { model: EMBED, query: 'q', documents: [] }, 'documents'],
    ['/v2/rerank', 'top_n negative', { model: EMBED, query: 'q', documents: ['d'], top_n: -1 }, 'top_n'],
    ['/rerank', 'top_n fractional', { model: EMBED, query: 'q', documents: ['d'], top_n: 1.5 }, 'top_n'],
    ['/v1/score', 'no pair', { model: EMBED, text_1: 'a' }, 'text_1'],
    ['/v1/score', 'two pairs', { model: EMBED, text_1: 'a', text_2: 'b', queries: 'c', documents: 'd' }, 'documents'],
    ['/v1/score', 'text_1 a number', { model: EMBED, text_1: 1, text_2: 'b' }, 'text_1'],
    ['/tokenize', 'no prompt', { model: EMBED }, 'prompt'],
    ['/tokenize', 'prompt a number', { model: EMBED, prompt: 5 }, 'prompt'],
    ['/tokenize', 'both generation flags', { model: EMBED, messages: [{ role: 'user', content: 'x' }], add_generation_prompt: true, continue_final_message: true }, 'continue_final_message'],
    ['/tokenize', 'empty messages', { model: EMBED, messages: [] }, 'messages'],
    ['/detokenize', 'no tokens', { model: EMBED }, 'tokens'],
    ['/detokenize', 'tokens strings', { model: EMBED, tokens: ['a'] }, 'tokens.0'],
    ['/detokenize', 'token fractional', { model: EMBED, tokens: [1.5] }, 'tokens.0'],
  ];
  it.each(cases)('%s: %s', async (path, _name, body, param) => {
    const id = rid('bad');
    const e = await expectError(await post(path, body, { requestId: id }), 400, 'invalid_request');
    expect(e.error.type).toBe('invalid_request_error');
    expect(e.error.param).toBe(param);
    expect(await originRequests({ rid: id })).toHaveLength(0);
  });

  it('malformed JSON, a non-object body and the wrong content type are 4xx too', async () => {
    await expectError(await post('/v1/embeddings', '{"model":'), 400, 'invalid_json');
    await expectError(await post('/tokenize', '[1,2]'), 400, 'invalid_json');
    await expectError(await post('/detokenize', '{"model":"embed-model","tokens":[1]}', { headers: { 'content-type': 'text/plain' } }), 415, 'unsupported_media_type');
  });
});

describe('prompt_cache_key', () => {
  const chat = (key: unknown, requestId?: string) => complete({ model: 'pck-model', prompt_cache_key: key, messages: [{ role: 'user', content: 'hi' }] }, { requestId });

  it('keys the pick: one key stays on one replica; many keys spread', async () => {
    const one = new Set<string>();
    for (let i = 0; i < 8; i++) {
      const res = await chat('conv-1');
      expect(res.status).toBe(200);
      one.add(res.headers.get('x-prefix-router-replica')!);
      await res.arrayBuffer();
    }
    expect(one.size).toBe(1);
    const many = new Set<string>();
    for (let i = 0; i < 24; i++) {
      const res = await chat(`conv-many-${i}`);
      many.add(res.headers.get('x-prefix-router-replica')!);
      await res.arrayBuffer();
    }
    expect(many.size).toBeGreaterThan(1);
  });

  it('is forwarded to the origin as sent', async () => {
    const id = rid('pck');
    await (await chat('conv-fwd', id)).arrayBuffer();
    expect(JSON.parse((await originRequests({ rid: id }))[0]!.body).prompt_cache_key).toBe('conv-fwd');
  });

  it.each([
    ['a number', 42],
    ['an empty string', ''],
    ['an object', { id: 'x' }],
    ['257 characters', 'k'.repeat(257)],
  ])('%s is a 400 naming prompt_cache_key, on Chat Completions and the Responses API', async (_n, value) => {
    const id = rid('pck-bad');
    const e = await expectError(await chat(value, id), 400, 'invalid_request');
    expect(e.error.param).toBe('prompt_cache_key');
    const rid2 = rid('pck-bad-resp');
    const r = await expectError(await post('/v1/responses', { model: 'pck-model', input: 'hi', prompt_cache_key: value }, { requestId: rid2 }), 400, expect.any(String));
    expect(r.error.param).toBe('prompt_cache_key');
    expect(await originRequests({ rid: id })).toHaveLength(0);
    expect(await originRequests({ rid: rid2 })).toHaveLength(0);
  });
});

describe('tenant quotas on the keyless APIs', () => {
  type Meter = DurableObjectStub<TenantMeter>;
  const meter = (tenant: string): Meter => env.TENANT_METER.get(env.TENANT_METER.idFromName(tenant)) as unknown as Meter;
  const setClock = (tenant: string, at: number) => runInDurableObject<TenantMeter, void>(meter(tenant), (m) => void (m.now = () => at));
  const tenantWith = async (limits: Record<string, number>) => {
    const id = `kq-${crypto.randomUUID().slice(0, 8)}`;
    expect((await admin(`/tenants/${id}`, { method: 'PUT', json: { pools: ['embed'], limits } })).status).toBe(200);
    const issued = await admin(`/tenants/${id}/keys`, { method: 'POST' });
    return { id, key: (await issued.json<{ key: string }>()).key };
  };

  it('requests per minute: the same admission as chat, a 429 that reaches no replica', async () => {
    const t = await tenantWith({ requestsPerMinute: 2 });
    await setClock(t.id, 1_000_000_000);
    for (let i = 0; i < 2; i++) expect((await post('/v1/embeddings', { model: EMBED, input: 'x' }, { key: t.key })).status).toBe(200);
    const id = rid('kq-over');
    const res = await post('/tokenize', { model: EMBED, prompt: 'x' }, { key: t.key, requestId: id });
    expect(res.status).toBe(429);
    expect((await res.json<{ error: { code: string } }>()).error.code).toBe('rate_limit_exceeded');
    expect(await originRequests({ rid: id })).toHaveLength(0);
  });

  it('tokens per minute: charged the prompt only (nothing is generated), not a completion budget', async () => {
    const t = await tenantWith({ tokensPerMinute: 1000 });
    await setClock(t.id, 1_000_000_000);
    // 40 characters ≈ 10 tokens; a chat request without max_tokens would reserve 1,024 more.
    const res = await post('/v1/embeddings', { model: EMBED, input: 'a'.repeat(40) }, { key: t.key });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-ratelimit-limit-tokens')).toBe('1000');
    expect(res.headers.get('x-ratelimit-remaining-tokens')).toBe('990');
  });
});

describe('keylessPromptTokens', () => {
  it('counts text at 4 characters a token, token ids as one, and the query once per document', () => {
    expect(keylessPromptTokens({ input: 'a'.repeat(40) })).toBe(10);
    expect(keylessPromptTokens({ input: [[1, 2, 3], [4]] })).toBe(4);
    expect(keylessPromptTokens({ tokens: [1, 2, 3] })).toBe(3);
    expect(keylessPromptTokens({ query: 'q'.repeat(8), documents: ['d'.repeat(8), 'd'.repeat(8), 'd'.repeat(8)] })).toBe(12);
    expect(keylessPromptTokens({ input: 'data:image/png;base64,AAAA' })).toBe(0);
  });
});
