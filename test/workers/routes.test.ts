// The Worker's routes end to end inside workerd, against the fake vLLM origin: health, errors,
// tenant auth (secret and KV), /v1/models, streaming and non-streaming proxying, origin auth,
// session affinity, retries, upstream failures, pool selection with x-pool, and the tenant key.

import { env } from 'cloudflare:workers';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ORIGIN_KEY } from '../fixtures/workers/test-env';
import { admin, call, chatBody, clearKv, complete, expectError, isUsageOnlyEvent, KEYS, originRequests, poolSnapshot, rid, sha256Hex, sseEvents, until, type OriginRequest } from '../helpers/workers';
import type { PoolSnapshot } from '../../src/coordinator/pool-coordinator';

async function onlyRequest(id: string): Promise<OriginRequest> {
  const seen = await originRequests({ rid: id });
  expect(seen).toHaveLength(1);
  return seen[0]!;
}

describe('basic routes', () => {
  it('/healthz answers without auth', async () => {
    const res = await call('/healthz');
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: 'ok' });
  });

  it('unknown paths get a 404 in the OpenAI error shape', async () => {
    const e = await expectError(await call('/nope'), 404, 'not_found');
    expect(e.error.type).toBe('invalid_request_error');
    await expectError(await call('/v1/embeddingz', { headers: { authorization: `Bearer ${KEYS.acme}` } }), 404, 'not_found');
  });

  it('GET on a completion endpoint is 405', async () => {
    for (const path of ['/v1/chat/completions', '/v1/completions']) {
      await expectError(await call(path, { headers: { authorization: `Bearer ${KEYS.acme}` } }), 405, 'method_not_allowed');
    }
  });

  it('echoes a well-formed x-request-id and replaces a malformed one', async () => {
    const good = await call('/nope', { headers: { 'x-request-id': 'abc-123' } });
    expect(good.headers.get('x-request-id')).toBe('abc-123');
    const bad = await call('/nope', { headers: { 'x-request-id': 'has spaces and <html>' } });
    expect(bad.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('tenant auth', () => {
  beforeEach(clearKv);
  afterEach(clearKv);

  const models = (authorization?: string) => call('/v1/models', { headers: authorization === undefined ? {} : { authorization } });

  it('a missing key is 401 with WWW-Authenticate', async () => {
    const res = await models();
    expect(res.headers.get('www-authenticate')).toBe('Bearer');
    const e = await expectError(res, 401, 'missing_api_key');
    expect(e.error.type).toBe('authentication_error');
  });

  it('a malformed Authorization header is 401', async () => {
    for (const h of [`Basic ${btoa('u:p')}`, 'Bearer', 'Bearer ', `Bearer ${KEYS.acme} extra`, `bearer ${KEYS.acme}`, `Bearer ${'x'.repeat(600)}`]) {
      await expectError(await models(h), 401, 'invalid_api_key');
    }
  });

  it('a wrong key is 401', async () => {
    await expectError(await models('Bearer sk-not-a-real-key'), 401, 'invalid_api_key');
    await expectError(await models(`Bearer ${KEYS.acme}x`), 401, 'invalid_api_key');
  });

  it('a key from the TENANT_KEYS secret works', async () => {
    const res = await models(`Bearer ${KEYS.acme}`);
    expect(res.status).toBe(200);
  });

  it('a key stored (as its SHA-256) in the TENANTS KV namespace works', async () => {
    const key = `sk-kv-${crypto.randomUUID()}`;
    await expectError(await models(`Bearer ${key}`), 401, 'invalid_api_key');
    // The failed lookup above is cached per isolate; use a second key for the positive case.
    const key2 = `sk-kv-${crypto.randomUUID()}`;
    await env.TENANTS.put(`key:${await sha256Hex(key2)}`, JSON.stringify({ tenant: 'kvt', keyId: 'kvt-1' }));
    await env.TENANTS.put('tenant:kvt', JSON.stringify({ id: 'kvt', pools: ['private'] }));
    const res = await models(`Bearer ${key2}`);
    expect(res.status).toBe(200);
    const body = await res.json<{ data: { id: string }[] }>();
    expect(body.data.map((m) => m.id)).toEqual(['private-model']);
  });

  it('a KV key whose tenant record is missing or invalid is refused', async () => {
    const k1 = `sk-kv-${crypto.randomUUID()}`;
    await env.TENANTS.put(`key:${await sha256Hex(k1)}`, JSON.stringify({ tenant: 'ghost', keyId: 'g-1' }));
    await expectError(await models(`Bearer ${k1}`), 401, 'invalid_api_key');
    const k2 = `sk-kv-${crypto.randomUUID()}`;
    await env.TENANTS.put(`key:${await sha256Hex(k2)}`, JSON.stringify({ tenant: 'broken', keyId: 'b-1' }));
    await env.TENANTS.put('tenant:broken', JSON.stringify({ id: 'broken', pools: [] }));
    await expectError(await models(`Bearer ${k2}`), 401, 'invalid_api_key');
  });
});

describe('/v1/models', () => {
  type Model = { id: string; object: string; created: number; owned_by: string; prefix_router: { pools: string[] } };
  const list = async (key: string): Promise<Model[]> => {
    const res = await call('/v1/models', { headers: { authorization: `Bearer ${key}` } });
    expect(res.status).toBe(200);
    const body = await res.json<{ object: string; data: Model[] }>();
    expect(body.object).toBe('list');
    for (const m of body.data) expect(m).toMatchObject({ object: 'model', owned_by: 'prefix-router' });
    return body.data;
  };
  const retrieve = (key: string, id: string) => call(`/v1/models/${id}`, { headers: { authorization: `Bearer ${key}` } });

  it("lists each model of the tenant's pools once, the pools in an extension field", async () => {
    expect((await list(KEYS.basic)).map((m) => [m.id, m.prefix_router.pools])).toEqual([
      ['chat-model', ['chat']],
      ['tk-model', ['tenant-keyed']],
    ]);
    const acme = await list(KEYS.acme);
    const ids = acme.map((m) => m.id);
    expect(new Set(ids).size).toBe(ids.length);
    // chat-model is served by two pools acme may use: one entry naming both, in routing order.
    expect(acme.find((m) => m.id === 'chat-model')!.prefix_router.pools).toEqual(['chat', 'batch']);
    expect(ids).not.toContain('private-model');
    expect((await list(KEYS.root)).map((m) => m.id)).toContain('private-model');
  });

  it('GET /v1/models/{id} answers for a model the tenant may use, with the same entry as the list', async () => {
    const res = await retrieve(KEYS.acme, 'chat-model');
    expect(res.status).toBe(200);
    const m = await res.json<Model>();
    expect(m).toEqual((await list(KEYS.acme)).find((x) => x.id === 'chat-model'));
    // basic may use only one of chat-model's pools: the other is not named.
    expect((await (await retrieve(KEYS.basic, 'chat-model')).json<Model>()).prefix_router.pools).toEqual(['chat']);
  });

  it("a model only other tenants' pools serve is a 404 exactly like an unknown one", async () => {
    const hidden = await expectError(await retrieve(KEYS.acme, 'private-model'), 404, 'model_not_found');
    const unknown = await expectError(await retrieve(KEYS.acme, 'no-such-model'), 404, 'model_not_found');
    expect(hidden.error.message.replace('private-model', 'X')).toBe(unknown.error.message.replace('no-such-model', 'X'));
    expect(JSON.stringify(hidden)).not.toContain('private"');
    expect((await retrieve(KEYS.root, 'private-model')).status).toBe(200);
  });

  it('model ids with slashes (org/name) and percent-encoding, as the openai SDK sends them', async () => {
    await expectError(await retrieve(KEYS.acme, 'org/absent-model'), 404, 'model_not_found');
    await expectError(await retrieve(KEYS.acme, 'bad%zzencoding'), 404, 'model_not_found');
    expect((await retrieve(KEYS.acme, encodeURIComponent('chat-model'))).status).toBe(200);
  });

  it('needs a key, and only GET', async () => {
    await expectError(await call('/v1/models/chat-model'), 401, 'missing_api_key');
    await expectError(await call('/v1/models', { method: 'POST', headers: { authorization: `Bearer ${KEYS.acme}` } }), 405, 'method_not_allowed');
    await expectError(await call('/v1/models/chat-model', { method: 'DELETE', headers: { authorization: `Bearer ${KEYS.acme}` } }), 405, 'method_not_allowed');
  });
});

describe('proxying to the origin', () => {
  it('streams chat: SSE passes through, minus the usage chunk the client did not ask for', async () => {
    const id = rid('stream');
    const res = await complete(chatBody({ stream: true }), { requestId: id });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const replica = res.headers.get('x-prefix-router-replica');
    expect(['a', 'b', 'c']).toContain(replica);
    expect(res.headers.get('x-request-id')).toBe(id);
    const text = await res.text();

    const upstream = await onlyRequest(id);
    expect(upstream.host).toBe(`${replica}.origin.test`);
    expect(upstream.path).toBe('/v1/chat/completions');
    // The router asked for usage on the client's behalf...
    const sentBody = JSON.parse(upstream.body) as Record<string, unknown>;
    expect(sentBody.stream_options).toEqual({ include_usage: true });
    expect(sentBody.messages).toEqual(chatBody().messages);
    // ...and stripped exactly that chunk again.
    const sent = sseEvents(upstream.sent!);
    expect(sent.filter(isUsageOnlyEvent)).toHaveLength(1);
    expect(sseEvents(text)).toEqual(sent.filter((e) => !isUsageOnlyEvent(e)));
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  });

  it('streams chat with usage when the client asked for it, byte for byte', async () => {
    const id = rid('stream-usage');
    const res = await complete(chatBody({ stream: true, stream_options: { include_usage: true } }), { requestId: id });
    expect(res.status).toBe(200);
    const text = await res.text();
    const upstream = await onlyRequest(id);
    expect(text).toBe(upstream.sent);
    const usage = sseEvents(text).filter(isUsageOnlyEvent);
    expect(usage).toHaveLength(1);
    expect(JSON.parse(usage[0]!.slice(6)).usage.prompt_tokens_details.cached_tokens).toEqual(expect.any(Number));
  });

  it('an origin that sends a few bytes at a time: every byte arrives, in order, streaming and not', async () => {
    const id1 = rid('trickle-usage');
    const r1 = await complete({ ...chatBody({ stream: true, stream_options: { include_usage: true } }), model: 'trickle-model' }, { requestId: id1 });
    expect(r1.status).toBe(200);
    expect(await r1.text()).toBe((await onlyRequest(id1)).sent);

    const id2 = rid('trickle-strip');
    const r2 = await complete({ ...chatBody({ stream: true }), model: 'trickle-model' }, { requestId: id2 });
    const t2 = await r2.text();
    expect(sseEvents(t2)).toEqual(sseEvents((await onlyRequest(id2)).sent!).filter((e) => !isUsageOnlyEvent(e)));
    expect(t2.endsWith('data: [DONE]\n\n')).toBe(true);

    const id3 = rid('trickle-json');
    const r3 = await complete({ ...chatBody({ max_tokens: 3 }), model: 'trickle-model' }, { requestId: id3 });
    expect(await r3.text()).toBe((await onlyRequest(id3)).sent);
  });

  it('streams completions', async () => {
    const id = rid('stream-cmpl');
    const res = await complete({ model: 'chat-model', prompt: 'Once upon a time', stream: true }, { requestId: id, path: '/v1/completions' });
    expect(res.status).toBe(200);
    const text = await res.text();
    const upstream = await onlyRequest(id);
    expect(upstream.path).toBe('/v1/completions');
    expect(sseEvents(text)).toEqual(sseEvents(upstream.sent!).filter((e) => !isUsageOnlyEvent(e)));
  });

  it('non-streaming chat and completions return the origin JSON with usage, and the stats see the tokens', async () => {
    const id1 = rid('json-chat');
    const r1 = await complete(chatBody({ max_tokens: 3, some_unknown_field: { kept: true } }), { requestId: id1 });
    expect(r1.status).toBe(200);
    expect(r1.headers.get('content-type')).toMatch(/^application\/json/);
    const b1 = await r1.text();
    const up1 = await onlyRequest(id1);
    expect(b1).toBe(up1.sent);
    // The body went upstream unchanged (unknown fields kept, no stream_options added) but for the
    // router's own fields: the tenant's cache_salt and the router's request id, also in the header.
    const sentUp = JSON.parse(up1.body) as Record<string, unknown>;
    expect(sentUp).toEqual({ ...chatBody({ max_tokens: 3, some_unknown_field: { kept: true } }), cache_salt: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/), request_id: up1.headers['x-request-id'] });
    expect(up1.headers['x-request-id']).not.toBe(id1);
    expect(up1.headers['x-client-request-id']).toBe(id1);
    const j1 = JSON.parse(b1) as { object: string; choices: { message: { content: string } }[]; usage: { prompt_tokens: number } };
    expect(j1.object).toBe('chat.completion');
    expect(j1.choices[0]!.message.content).toBe(`Hello from ${r1.headers.get('x-prefix-router-replica')}`);

    const id2 = rid('json-cmpl');
    const r2 = await complete({ model: 'chat-model', prompt: ['a', 'b'] }, { requestId: id2, path: '/v1/completions' });
    expect(r2.status).toBe(200);
    const b2 = await r2.text();
    expect(b2).toBe((await onlyRequest(id2)).sent);
    expect(JSON.parse(b2)).toMatchObject({ object: 'text_completion', usage: { prompt_tokens: expect.any(Number) } });

    // The release (after the body was copied) reports usage to the coordinator.
    const replica = r1.headers.get('x-prefix-router-replica')!;
    const snap = await until(
      () => poolSnapshot('chat'),
      (s) => s.replicas.find((r) => r.id === replica)!.stats.promptTokens >= j1.usage.prompt_tokens,
    );
    expect(snap.replicas.find((r) => r.id === replica)!.stats.promptTokens).toBeGreaterThanOrEqual(j1.usage.prompt_tokens);
  });

  it("the origin gets the origin's bearer, never the client's key or other credentials", async () => {
    const id = rid('auth');
    const res = await complete(chatBody({ stream: true }), {
      requestId: id,
      headers: { cookie: 'session=secret-cookie', 'x-api-key': 'client-x-api-key', 'x-forwarded-for': '203.0.113.9', 'proxy-authorization': 'Basic Zm9vOmJhcg==', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' },
    });
    expect(res.status).toBe(200);
    await res.text();
    const up = await onlyRequest(id);
    expect(up.headers.authorization).toBe(`Bearer ${ORIGIN_KEY}`);
    const all = JSON.stringify(up.headers);
    expect(all).not.toContain(KEYS.acme);
    expect(all).not.toContain('secret-cookie');
    expect(all).not.toContain('client-x-api-key');
    expect(all).not.toContain('203.0.113.9');
    expect(up.headers['proxy-authorization']).toBeUndefined();
    expect(up.headers.traceparent).toBe('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
    expect(up.body).not.toContain(KEYS.acme);
  });
});

describe('client going away', () => {
  it('a client that cancels mid-stream frees the lease, counted as a client abort', async () => {
    const id = rid('abort');
    const before = await poolSnapshot('batch');
    const stat = (s: PoolSnapshot, id: string) => s.replicas.find((r) => r.id === id)!.stats;
    const res = await complete(chatBody({ stream: true }), { requestId: id, headers: { 'x-pool': 'batch' } });
    expect(res.status).toBe(200);
    const replica = res.headers.get('x-prefix-router-replica')!;
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(first.done).toBe(false);
    expect(new TextDecoder().decode(first.value)).toContain('"role":"assistant"');
    expect((await poolSnapshot('batch')).leases).toBe(1);
    await reader.cancel();
    const snap = await until(
      () => poolSnapshot('batch'),
      (s) => s.leases === 0 && stat(s, replica).requests === stat(before, replica).requests + 1,
    );
    expect(snap.leases).toBe(0);
    expect(snap.replicas.find((x) => x.id === replica)!.inFlight).toBe(0);
    expect(stat(snap, replica).requests - stat(before, replica).requests).toBe(1);
    expect(stat(snap, replica).clientAborts - stat(before, replica).clientAborts).toBe(1);
    expect(stat(snap, replica).errors).toBe(stat(before, replica).errors);
  });
});

describe('routing', () => {
  it('a session (x-session-id) sticks to one replica', async () => {
    const session = `sess-${crypto.randomUUID()}`;
    const seen = new Set<string>();
    for (let i = 0; i < 10; i++) {
      const res = await complete(chatBody({ messages: [{ role: 'user', content: `turn ${i}` }] }), { headers: { 'x-session-id': session } });
      expect(res.status).toBe(200);
      await res.text();
      seen.add(res.headers.get('x-prefix-router-replica')!);
    }
    expect(seen.size).toBe(1);

    // The key is what decides: different sessions do spread over the pool.
    const spread = new Set<string>();
    for (let i = 0; i < 24; i++) {
      const res = await complete(chatBody(), { headers: { 'x-session-id': `spread-${i}-${crypto.randomUUID()}` } });
      await res.text();
      spread.add(res.headers.get('x-prefix-router-replica')!);
    }
    expect(spread.size).toBeGreaterThan(1);
  });

  it("the tenant routing key comes from the API key, not from the client's headers", async () => {
    const picks = new Set<string>();
    const spoofs: Record<string, string>[] = [{}];
    for (let i = 0; i < 8; i++) spoofs.push({ 'x-tenant-id': `spoof-${i}`, 'x-session-id': `spoof-session-${i}`, 'x-tenant': `t${i}` });
    for (const headers of spoofs) {
      const res = await complete({ model: 'tk-model', messages: [{ role: 'user', content: `q ${JSON.stringify(headers)}` }] }, { headers });
      expect(res.status).toBe(200);
      await res.text();
      picks.add(res.headers.get('x-prefix-router-replica')!);
    }
    expect(picks.size).toBe(1);
    expect([...picks][0]).toMatch(/^tk[1-5]$/);
  });

  it('a replica answering 503 is retried on another one before the first byte', async () => {
    const id = rid('retry');
    const res = await complete({ model: 'retry-model', messages: [{ role: 'user', content: 'hi' }], stream: true }, { requestId: id });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-prefix-router-replica')).toBe('good');
    await res.text();
    const attempts = await originRequests({ rid: id });
    expect(attempts.map((a) => [a.host, a.status])).toEqual([
      ['fail503-retry.origin.test', 503],
      ['good.origin.test', 200],
    ]);
    const snap = await until(
      () => poolSnapshot('retry'),
      (s) => s.replicas.find((r) => r.id === 'good')!.stats.requests === 1,
    );
    const bad = snap.replicas.find((r) => r.id === 'bad')!;
    const good = snap.replicas.find((r) => r.id === 'good')!;
    expect(bad.stats).toMatchObject({ requests: 1, retries: 1, errors: 1, byStatus: { '503': 1 } });
    expect(good.stats).toMatchObject({ requests: 1, retries: 0, errors: 0, byStatus: { '200': 1 } });
  });

  it('an origin refusing the router\'s credentials (401) or answering without a body (204) is retried elsewhere and counted against it', async () => {
    const id = rid('refuses');
    const res = await complete({ model: 'origin-refuses-model', messages: [{ role: 'user', content: 'hi' }] }, { requestId: id });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-prefix-router-replica')).toBe('good');
    await res.text();
    expect((await originRequests({ rid: id })).map((a) => [a.host, a.status])).toEqual([
      ['status401-refuses.origin.test', 401],
      ['status204-refuses.origin.test', 204],
      ['good-refuses.origin.test', 200],
    ]);
    const snap = await until(
      () => poolSnapshot('origin-refuses'),
      (s) => s.replicas.find((r) => r.id === 'good')!.stats.requests === 1,
    );
    expect(snap.replicas.find((r) => r.id === 'r401')!.stats).toMatchObject({ requests: 1, retries: 1, errors: 1, byStatus: { '401': 1 } });
    expect(snap.replicas.find((r) => r.id === 'r204')!.stats).toMatchObject({ requests: 1, retries: 1, errors: 1, byStatus: { '204': 1 } });
  });

  it('a replica that cannot be reached is retried on another one, and counted as an error', async () => {
    const id = rid('retry-conn');
    const res = await complete({ model: 'retry-conn-model', messages: [{ role: 'user', content: 'hi' }] }, { requestId: id });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-prefix-router-replica')).toBe('good');
    await res.text();
    expect((await originRequests({ rid: id })).map((a) => [a.host, a.status ?? null])).toEqual([
      ['refuse-1.origin.test', null],
      ['good-conn.origin.test', 200],
    ]);
    const snap = await until(
      () => poolSnapshot('retry-conn'),
      (s) => s.replicas.find((r) => r.id === 'good')!.stats.requests === 1,
    );
    expect(snap.replicas.find((r) => r.id === 'refused')!.stats).toMatchObject({ requests: 1, retries: 1, errors: 1, byStatus: { '0': 1 } });
  });

  it('all replicas failing → 502 with Retry-After', async () => {
    const id = rid('dead');
    const res = await complete({ model: 'dead-model', messages: [{ role: 'user', content: 'hi' }] }, { requestId: id });
    expect(res.headers.get('retry-after')).toBe('2');
    const e = await expectError(res, 502, 'upstream_unavailable');
    expect(e.error.type).toBe('server_error');
    const attempts = await originRequests({ rid: id });
    expect(attempts.map((a) => a.host).sort()).toEqual(['fail503-d1.origin.test', 'fail503-d2.origin.test']);
    // The origin's own error body is not passed through.
    expect(JSON.stringify(e)).not.toContain('ServiceUnavailable');
  });

  it('no healthy replica → 503 with Retry-After, and nothing reaches an origin', async () => {
    const id = rid('empty');
    const res = await complete({ model: 'empty-model', messages: [{ role: 'user', content: 'hi' }] }, { requestId: id });
    expect(res.headers.get('retry-after')).toBe('2');
    await expectError(res, 503, 'no_healthy_replica');
    expect(await originRequests({ rid: id })).toEqual([]);
  });
});

describe('pool selection with x-pool', () => {
  it('a tenant allowed to may pick a pool', async () => {
    const id = rid('xpool');
    const res = await complete(chatBody(), { requestId: id, headers: { 'x-pool': 'batch' } });
    expect(res.status).toBe(200);
    expect(['batch-a', 'batch-b']).toContain(res.headers.get('x-prefix-router-replica'));
    await res.text();
    expect((await onlyRequest(id)).host).toMatch(/^batch-[ab]\.origin\.test$/);
    // Without the header the model's first pool serves it.
    const plain = await complete(chatBody());
    expect(['a', 'b', 'c']).toContain(plain.headers.get('x-prefix-router-replica'));
    await plain.text();
  });

  it('a tenant without allowPoolHeader gets 403', async () => {
    const id = rid('xpool-denied');
    const e = await expectError(await complete(chatBody(), { key: KEYS.basic, requestId: id, headers: { 'x-pool': 'chat' } }), 403, 'pool_not_allowed');
    expect(e.error.param).toBe('x-pool');
    expect(await originRequests({ rid: id })).toEqual([]);
  });

  it('a tenant not allowed to use the pool it names gets 403; an unknown pool 404', async () => {
    await expectError(await complete(chatBody(), { key: KEYS.picky, headers: { 'x-pool': 'batch' } }), 403, 'pool_not_allowed');
    await expectError(await complete(chatBody(), { key: KEYS.picky, headers: { 'x-pool': 'no-such-pool' } }), 404, 'pool_not_found');
    // A pool that does not serve the model.
    await expectError(await complete(chatBody(), { key: KEYS.acme, headers: { 'x-pool': 'dead' } }), 404, 'model_not_found');
  });

  it("a model only served by another tenant's pool looks like an unknown model", async () => {
    const unknown = await expectError(await complete({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }, { key: KEYS.basic }), 404, 'model_not_found');
    const hidden = await expectError(await complete({ model: 'private-model', messages: [{ role: 'user', content: 'x' }] }, { key: KEYS.basic }), 404, 'model_not_found');
    expect(hidden.error.message.replace('private-model', 'X')).toBe(unknown.error.message.replace('no-such-model', 'X'));
    // The tenant allowed to gets it.
    const ok = await complete({ model: 'private-model', messages: [{ role: 'user', content: 'x' }] }, { key: KEYS.root });
    expect(ok.status).toBe(200);
    expect(ok.headers.get('x-prefix-router-replica')).toBe('p');
    await ok.text();
  });
});
