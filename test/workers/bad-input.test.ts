// Bad input of every kind gets the right 4xx in the OpenAI error shape, never a 500, and never
// reaches an origin (the fake origin logs every request it sees, by request id).

import { afterAll, describe, expect, it } from 'vitest';
import { ADMIN_TOKEN, MAX_BODY_BYTES } from '../fixtures/workers/test-env';
import { admin, call, chatBody, expectError, KEYS, originRequests } from '../helpers/workers';
import type { PoolSnapshot } from '../../src/coordinator/pool-coordinator';

// Every request in this file carries an id with this prefix; none may show up at the origin.
const PREFIX = `bad-${crypto.randomUUID().slice(0, 8)}`;
let n = 0;
const nextId = () => `${PREFIX}-${++n}`;

const enc = new TextEncoder();
const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);

interface Case {
  name: string;
  status: number;
  code: string;
  path?: string;
  method?: string;
  /** string bodies are sent as application/json unless `contentType` says otherwise. */
  body?: string | Uint8Array | (() => ReadableStream<Uint8Array>);
  contentType?: string | null;
  key?: string | null;
  param?: string;
}

const chat = (over: Record<string, unknown>) => JSON.stringify({ ...chatBody(), ...over });
const without = (field: string, base: Record<string, unknown> = chatBody()) => {
  const copy = { ...base };
  delete copy[field];
  return JSON.stringify(copy);
};
const completion = (over: Record<string, unknown>) => JSON.stringify({ model: 'chat-model', prompt: 'hello', ...over });

const completionCases: Case[] = [
  { name: 'non-JSON body', status: 400, code: 'invalid_json', body: '{"model": "chat-model", messages: oops' },
  { name: 'empty body', status: 400, code: 'invalid_json', body: '' },
  { name: 'whitespace-only body', status: 400, code: 'invalid_json', body: ' \n\t ' },
  { name: 'JSON array body', status: 400, code: 'invalid_json', body: JSON.stringify([chatBody()]) },
  { name: 'JSON null body', status: 400, code: 'invalid_json', body: 'null' },
  { name: 'JSON string body', status: 400, code: 'invalid_json', body: '"hello"' },
  { name: 'trailing garbage after the object', status: 400, code: 'invalid_json', body: chat({}) + '{}' },
  { name: 'wrong content type (text/plain)', status: 415, code: 'unsupported_media_type', body: chat({}), contentType: 'text/plain' },
  { name: 'no content type', status: 415, code: 'unsupported_media_type', body: enc.encode(chat({})), contentType: null },
  { name: 'look-alike content type', status: 415, code: 'unsupported_media_type', body: chat({}), contentType: 'application/jsonp' },
  { name: 'form content type', status: 415, code: 'unsupported_media_type', body: 'model=chat-model', contentType: 'application/x-www-form-urlencoded' },
  { name: 'body over the limit (Content-Length)', status: 413, code: 'body_too_large', body: chat({ pad: 'x'.repeat(MAX_BODY_BYTES) }) },
  {
    name: 'body over the limit (streamed, no Content-Length)',
    status: 413,
    code: 'body_too_large',
    body: () =>
      new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(enc.encode('{"model":"chat-model","pad":"'));
          for (let i = 0; i < 8; i++) c.enqueue(enc.encode('y'.repeat(4096)));
          c.enqueue(enc.encode('"}'));
          c.close();
        },
      }),
  },
  { name: 'invalid UTF-8 bytes', status: 400, code: 'invalid_encoding', body: new Uint8Array([...enc.encode('{"model":"chat-model","messages":[{"role":"user","content":"'), 0xff, 0xfe, ...enc.encode('"}]}')]) },
  { name: 'UTF-8 encoded surrogate', status: 400, code: 'invalid_encoding', body: new Uint8Array([...enc.encode('{"model":"'), 0xed, 0xa0, 0x80, ...enc.encode('"}')]) },
  { name: 'overlong UTF-8 encoding', status: 400, code: 'invalid_encoding', body: new Uint8Array([...enc.encode('{"model":"'), 0xc0, 0xaf, ...enc.encode('"}')]) },
  { name: 'JSON nested deeper than 64', status: 400, code: 'invalid_json', body: chat({ extra: JSON.parse(nested(64)) }) },
  { name: 'JSON nested 100000 deep', status: 400, code: 'invalid_json', body: `{"model":"chat-model","x":${nested(100_000)}}`.slice(0, MAX_BODY_BYTES - 10) },
  { name: 'missing model', status: 400, code: 'invalid_request', param: 'model', body: without('model') },
  { name: 'model not a string', status: 400, code: 'invalid_request', param: 'model', body: chat({ model: 123 }) },
  { name: 'model an empty string', status: 400, code: 'invalid_request', param: 'model', body: chat({ model: '' }) },
  { name: 'missing messages', status: 400, code: 'invalid_request', param: 'messages', body: without('messages') },
  { name: 'messages not an array', status: 400, code: 'invalid_request', param: 'messages', body: chat({ messages: 'hello' }) },
  { name: 'empty messages', status: 400, code: 'invalid_request', param: 'messages', body: chat({ messages: [] }) },
  { name: 'message without role', status: 400, code: 'invalid_request', param: 'messages.0.role', body: chat({ messages: [{ content: 'hi' }] }) },
  { name: 'message not an object', status: 400, code: 'invalid_request', param: 'messages.0', body: chat({ messages: ['hi'] }) },
  { name: 'message content of the wrong type', status: 400, code: 'invalid_request', body: chat({ messages: [{ role: 'user', content: 42 }] }) },
  { name: 'stream not a boolean', status: 400, code: 'invalid_request', param: 'stream', body: chat({ stream: 'true' }) },
  { name: 'stream_options not an object', status: 400, code: 'invalid_request', param: 'stream_options', body: chat({ stream: true, stream_options: 'yes' }) },
  { name: 'negative max_tokens', status: 400, code: 'invalid_request', param: 'max_tokens', body: chat({ max_tokens: -1 }) },
  { name: 'tools not an array', status: 400, code: 'invalid_request', param: 'tools', body: chat({ tools: { type: 'function' } }) },
  { name: 'completions without prompt', status: 400, code: 'invalid_request', param: 'prompt', path: '/v1/completions', body: without('prompt', { model: 'chat-model', prompt: 'x' }) },
  { name: 'prompt a number', status: 400, code: 'invalid_request', param: 'prompt', path: '/v1/completions', body: completion({ prompt: 42 }) },
  { name: 'prompt an object', status: 400, code: 'invalid_request', param: 'prompt', path: '/v1/completions', body: completion({ prompt: { text: 'hi' } }) },
  { name: 'prompt an empty array', status: 400, code: 'invalid_request', param: 'prompt', path: '/v1/completions', body: completion({ prompt: [] }) },
  { name: 'prompt of fractional token ids', status: 400, code: 'invalid_request', param: 'prompt', path: '/v1/completions', body: completion({ prompt: [1.5, 2] }) },
  { name: 'completions without model', status: 400, code: 'invalid_request', param: 'model', path: '/v1/completions', body: JSON.stringify({ prompt: 'x' }) },
  { name: 'unknown model', status: 404, code: 'model_not_found', param: 'model', body: chat({ model: 'no-such-model' }) },
  { name: 'missing key', status: 401, code: 'missing_api_key', body: chat({}), key: null },
  { name: 'wrong key', status: 401, code: 'invalid_api_key', body: chat({}), key: 'sk-wrong-key' },
  { name: 'a pool the key may not pick', status: 403, code: 'pool_not_allowed', body: chat({}), key: KEYS.basic },
];

async function send(c: Case, id: string): Promise<Response> {
  const headers = new Headers({ 'x-request-id': id });
  const key = c.key === undefined ? KEYS.acme : c.key;
  if (key !== null) headers.set('authorization', `Bearer ${key}`);
  if (c.contentType !== null) headers.set('content-type', c.contentType ?? 'application/json');
  if (c.code === 'pool_not_allowed') headers.set('x-pool', 'chat');
  const body = typeof c.body === 'function' ? c.body() : c.body;
  return call(c.path ?? '/v1/chat/completions', { method: c.method ?? 'POST', headers, body });
}

describe('bad completion requests', () => {
  it('has at least 25 cases', () => {
    expect(completionCases.length).toBeGreaterThanOrEqual(25);
  });

  it.each(completionCases)('$name → $status $code', async (c) => {
    const id = nextId();
    const res = await send(c, id);
    expect(res.status).toBeLessThan(500);
    const e = await expectError(res, c.status, c.code);
    if (c.param !== undefined) expect(e.error.param).toBe(c.param);
    expect(await originRequests({ rid: id })).toEqual([]);
  });

  it('the same request, well-formed, does reach the origin (control)', async () => {
    const id = `ok-${PREFIX}`;
    // 63 levels inside the top-level object: exactly the limit of 64.
    const res = await send({ name: 'ok', status: 200, code: '', body: chat({ extra: JSON.parse(nested(63)) }) }, id);
    expect(res.status).toBe(200);
    await res.text();
    expect(await originRequests({ rid: id })).toHaveLength(1);
  });
});

describe('bad admin requests', () => {
  const put = (path: string, json: unknown, init: RequestInit = {}) => admin(path, { method: 'PUT', json, ...init });
  const replicaIds = async () => ((await (await admin('/pools/chat')).json()) as PoolSnapshot).replicas.map((r) => r.id);

  it('admin endpoints need the token', async () => {
    await expectError(await call('/admin/pools'), 401, 'admin_unauthorized');
    await expectError(await call('/admin/pools', { headers: { authorization: `Bearer ${ADMIN_TOKEN}x` } }), 401, 'admin_unauthorized');
    await expectError(await call('/admin/pools', { headers: { authorization: `Bearer ${KEYS.root}` } }), 401, 'admin_unauthorized');
    await expectError(await call('/admin/pools', { headers: { authorization: ADMIN_TOKEN } }), 401, 'admin_unauthorized');
    await expectError(
      await call('/admin/pools/chat/replicas/z', { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: 'https://z.origin.test' }) }),
      401,
      'admin_unauthorized',
    );
    await expectError(await call('/admin/tenants/t1/keys', { method: 'POST' }), 401, 'admin_unauthorized');
    // Cookies never open the admin API: not the raw token, not a malformed value, not a valid dashboard session.
    await expectError(await call('/admin/pools', { headers: { cookie: 'prefix_router_admin=wrong-token-0123456789' } }), 401, 'admin_unauthorized');
    await expectError(await call('/admin/pools', { headers: { cookie: 'prefix_router_admin=%E0%A4%A' } }), 401, 'admin_unauthorized');
    await expectError(await call('/admin/pools', { headers: { cookie: `prefix_router_admin=${encodeURIComponent(ADMIN_TOKEN)}` } }), 401, 'admin_unauthorized');
    const login = await call('/dashboard/login', { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: `token=${encodeURIComponent(ADMIN_TOKEN)}`, redirect: 'manual' });
    expect(login.status).toBe(303);
    const session = login.headers.get('set-cookie')!.split(';')[0]!;
    expect(session).toMatch(/^prefix_router_session=s2\.\d{13}\.[0-9a-f]{32}\.[0-9a-f]{64}$/);
    expect(session).not.toContain(ADMIN_TOKEN);
    expect((await call('/dashboard/data', { headers: { cookie: session } })).status).toBe(200);
    await expectError(await call('/dashboard/data', { headers: { cookie: session.replace(/.$/, (c) => (c === '0' ? '1' : '0')) } }), 401, 'admin_unauthorized');
    await expectError(await call('/admin/pools', { headers: { cookie: session } }), 401, 'admin_unauthorized');
    const wrong = await call('/dashboard/login', { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: 'token=wrong', redirect: 'manual' });
    expect(wrong.status).toBe(401);
    expect(wrong.headers.get('set-cookie')).toBeNull();
    expect(await replicaIds()).toEqual(['a', 'b', 'c']);
  });

  it('the admin token in the query string is refused, even next to a valid header', async () => {
    for (const q of [`token=${ADMIN_TOKEN}`, `access_token=${ADMIN_TOKEN}`, `api_key=x`]) {
      const e = await expectError(await admin(`/pools?${q}`), 400, 'token_in_query');
      expect(JSON.stringify(e)).not.toContain(ADMIN_TOKEN);
    }
    await expectError(await call(`/admin/pools?token=${ADMIN_TOKEN}`), 400, 'token_in_query');
  });

  it('path ids with tricks are refused', async () => {
    const long = 'r'.repeat(300);
    const cases: [string, string, number][] = [
      ['PUT', '/pools/chat/replicas/..', 404], // the URL parser resolves the dot segment
      ['PUT', '/pools/chat/replicas/%2E%2E', 404],
      ['PUT', '/pools/chat/replicas/a%2Fb', 400],
      ['PUT', '/pools/chat%2Fx/replicas/a', 400],
      ['PUT', '/pools/chat/replicas/%00', 400],
      ['PUT', '/pools/chat/replicas/-leading-dash', 400],
      ['PUT', `/pools/chat/replicas/${long}`, 400],
      ['PATCH', `/pools/chat/replicas/${long}`, 400],
      ['DELETE', `/pools/chat/replicas/${long}`, 400],
      ['DELETE', '/pools/chat/replicas/a%2F..%2Fb', 400],
      ['GET', `/pools/${long}`, 400],
      ['GET', '/pools/no-such-pool', 404],
      ['PUT', `/tenants/${'t'.repeat(600)}`, 400],
      ['POST', `/tenants/${'t'.repeat(600)}/keys`, 400],
      ['DELETE', `/tenants/t1/keys/${'k'.repeat(600)}`, 400],
      ['POST', '/tenants/a%2Fb/keys', 400],
      ['DELETE', '/pools/chat/replicas/%', 400],
      ['DELETE', '/pools/chat/replicas/%E0%A4%A', 400],
      ['GET', '/pools/%E0%A4%A', 400],
      ['PUT', '/tenants/__proto__', 400],
    ];
    for (const [method, path, status] of cases) {
      const body = method === 'PUT' || method === 'PATCH' ? { url: 'https://z.origin.test', pools: ['chat'] } : undefined;
      const res = await admin(path, { method, json: body });
      expect({ method, path: path.slice(0, 60), status: res.status }).toEqual({ method, path: path.slice(0, 60), status });
      const e = await expectError(res, status, status === 400 ? 'invalid_request' : expect.any(String));
      expect(e.error.message.length).toBeLessThan(300); // ids are not echoed back at length
    }
    expect(await replicaIds()).toEqual(['a', 'b', 'c']);
  });

  it('replica PUTs with unsafe or invalid fields are refused', async () => {
    const cases: [string, unknown][] = [
      ['private http', { url: 'http://10.0.0.1' }],
      ['private https', { url: 'https://10.0.0.1' }],
      ['metadata address', { url: 'http://169.254.169.254' }],
      ['metadata address over https', { url: 'https://169.254.169.254/latest' }],
      ['metadata host name', { url: 'https://metadata.google.internal' }],
      ['IPv4-mapped IPv6', { url: 'https://[::ffff:10.0.0.1]' }],
      ['link-local IPv6', { url: 'https://[fe80::1]' }],
      ['credentials in the URL', { url: 'https://user:pass@vllm.example.com' }],
      ['ftp', { url: 'ftp://vllm.example.com' }],
      ['plain http to a public host', { url: 'http://vllm.example.com' }],
      ['query string', { url: 'https://vllm.example.com/?key=secret' }],
      ['not a URL', { url: 'not a url' }],
      ['no URL', {}],
      ['weight 0', { url: 'https://z.origin.test', weight: 0 }],
      ['weight 300', { url: 'https://z.origin.test', weight: 300 }],
      ['fractional weight', { url: 'https://z.origin.test', weight: 1.5 }],
      ['unknown auth reference', { url: 'https://z.origin.test', auth: 'bearer:NO_SUCH_SECRET' }],
      ['malformed auth reference', { url: 'https://z.origin.test', auth: 'basic:ORIGIN_KEY' }],
      ['auth naming a lowercase secret', { url: 'https://z.origin.test', auth: 'bearer:origin_key' }],
      ['draining not a boolean', { url: 'https://z.origin.test', draining: 'yes' }],
    ];
    for (const [name, body] of cases) {
      const res = await put('/pools/chat/replicas/z', body);
      expect({ name, status: res.status }).toEqual({ name, status: 400 });
      const e = await expectError(res, 400, 'invalid_request');
      expect(e.error.message).not.toContain('origin-secret'); // no secret values in messages
    }
    await expectError(await put('/pools/no-such-pool/replicas/z', { url: 'https://z.origin.test' }), 404, 'pool_not_found');
    expect(await replicaIds()).toEqual(['a', 'b', 'c']);
  });

  it('admin bodies that are not JSON objects, and bad PATCHes, are refused', async () => {
    await expectError(await admin('/pools/chat/replicas/z', { method: 'PUT', body: '{"url":', headers: { 'content-type': 'application/json' } }), 400, 'invalid_json');
    await expectError(await admin('/pools/chat/replicas/z', { method: 'PUT', body: '[]', headers: { 'content-type': 'application/json' } }), 400, 'invalid_json');
    await expectError(await admin('/pools/chat/replicas/z', { method: 'PUT', body: '{"url":"https://z.origin.test"}', headers: { 'content-type': 'text/plain' } }), 415, 'unsupported_media_type');
    await expectError(await put('/pools/chat/replicas/z', { url: 'https://z.origin.test', pad: 'x'.repeat(70 * 1024) }), 413, 'body_too_large');
    await expectError(await admin('/pools/chat/replicas/a', { method: 'PATCH', json: { weight: 0 } }), 400, 'invalid_request');
    await expectError(await admin('/pools/chat/replicas/a', { method: 'PATCH', json: { url: 'https://evil.example.com' } }), 400, 'invalid_request');
    await expectError(await admin('/pools/chat/replicas/a', { method: 'PATCH', json: { draining: 'yes' } }), 400, 'invalid_request');
    await expectError(await admin('/pools/chat/replicas/nope', { method: 'PATCH', json: { draining: true } }), 404, 'not_found');
    await expectError(await admin('/pools/chat/replicas/nope', { method: 'DELETE' }), 404, 'not_found');
    const snap = (await (await admin('/pools/chat')).json()) as PoolSnapshot;
    expect(snap.replicas.map((r) => [r.id, r.weight, r.draining, r.url])).toEqual([
      ['a', 1, false, 'https://a.origin.test'],
      ['b', 1, false, 'https://b.origin.test'],
      ['c', 1, false, 'https://c.origin.test'],
    ]);
  });

  it('bad tenant records are refused', async () => {
    await expectError(await put('/tenants/t1', { pools: ['no-such-pool'] }), 400, 'invalid_request');
    await expectError(await put('/tenants/t1', { pools: [] }), 400, 'invalid_request');
    await expectError(await put('/tenants/t1', { pools: 'chat' }), 400, 'invalid_request');
    await expectError(await put('/tenants/t1', { pools: ['chat'], maxInFlight: 0 }), 400, 'invalid_request');
    await expectError(await admin('/tenants/never-created/keys', { method: 'POST' }), 404, 'not_found');
    await expectError(await admin('/tenants/t1/keys/knope', { method: 'DELETE' }), 404, 'not_found');
  });
});

afterAll(async () => {
  // Nothing from this file reached an origin, apart from the one well-formed control request.
  const seen = await originRequests({ ridPrefix: PREFIX });
  expect(seen.map((r) => `${r.host}${r.path}`)).toEqual([]);
});
