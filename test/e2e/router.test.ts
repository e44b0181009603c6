// End to end: the router under Miniflare on a loopback port, three mock vLLM replicas as real
// servers, driven by the official openai SDK, raw sockets and fetch. Covers streaming and
// non-streaming chat, session affinity with prefix-cache hits, a replica dying and coming back,
// client disconnects (RST, FIN, SDK abort) releasing their leases, a bad-input corpus that never
// reaches a replica, and the trace log (valid JSON, no secrets). Only 127.0.0.1; every wait bounded.

import { connect, type Socket } from 'node:net';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import {
  eventually,
  routerConfig,
  startMocks,
  startRouter,
  TEST_ADMIN_TOKEN,
  TEST_KEY,
  TEST_ORIGIN_API_KEY,
  TEST_TENANTS,
  type RouterHandle,
} from '../helpers/router.js';

const MODEL = 'demo-model';
const POOL = 'chat';
// vLLM with --enable-prompt-tokens-details: these tests read per-request cached tokens, which
// vLLM reports only with that flag (tools/mock-engine/profiles.ts).
const MOCK_OPTS = { decodeMsPerToken: 5, maxRunning: 64, profile: 'vllm-cache-report' } as const;
const GLOBEX_KEY = TEST_TENANTS.find((t) => t.tenant === 'globex')!.key;

let mocks: MockVllm[] = [];
let router: RouterHandle;
let client: OpenAI;

interface ReplicaSnap {
  id: string;
  healthy: boolean;
  activeUp: boolean;
  inFlight: number;
  stats: { clientAborts: number };
}
interface PoolSnap {
  leases: number;
  replicas: ReplicaSnap[];
}

async function poolSnapshot(): Promise<PoolSnap> {
  const res = await router.adminFetch(`/admin/pools/${POOL}`);
  expect(res.status).toBe(200);
  return (await res.json()) as PoolSnap;
}

function totalCompletionRequests(): number {
  return mocks.reduce((s, m) => s + m.stats().completionRequestsTotal + m.stats().keylessRequestsTotal, 0);
}

/** Poll until no replica has a request in flight and no mock has an open stream (bounded). */
async function expectAllReleased(timeoutMs = 20_000): Promise<void> {
  await eventually(
    async () => {
      const snap = await poolSnapshot();
      expect(snap.replicas.map((r) => [r.id, r.inFlight])).toEqual(snap.replicas.map((r) => [r.id, 0]));
      expect(snap.leases).toBe(0);
      expect(mocks.map((m) => [m.id, m.stats().activeStreams])).toEqual(mocks.map((m) => [m.id, 0]));
    },
    { timeoutMs, intervalMs: 100 },
  );
}

beforeAll(async () => {
  mocks = await startMocks(3, MOCK_OPTS);
  router = await startRouter({
    config: routerConfig({
      replicas: mocks,
      overrides: { maxBodyBytes: 64 * 1024 },
      // Health every 2 s (not 0.5 s): the first request after a replica is killed must still find
      // it healthy (fall = 2 failed checks) to show the retry, even when a loaded machine is slow
      // to send it. Exact would need a way to hold health checks, which the router does not have.
      poolOverrides: { healthIntervalMs: 2_000 },
      // A second pool with its own model, which the `globex` tenant may not use.
      extraPools: [{ name: 'batch', models: ['batch-model'], strategy: 'least-load', keys: ['none'], replicas: [{ id: 'b1', url: mocks[0]!.url, auth: 'bearer:ORIGIN_API_KEY' }] }],
    }),
  });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
  // The coordinator runs its first health round on first use; wait until every replica is up.
  await eventually(async () => expect((await poolSnapshot()).replicas.every((r) => r.healthy)).toBe(true), { timeoutMs: 20_000 });
});

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

describe('chat through the router', () => {
  it('non-streaming: content and usage arrive; the origin sees its own key, not the tenant key', async () => {
    const { data, response } = await client.chat.completions
      .create({ model: MODEL, max_tokens: 8, messages: [{ role: 'user', content: 'Say hello' }] }, { headers: { 'x-session-id': 'basic-1' } })
      .withResponse();
    expect(response.status).toBe(200);
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(data.usage!.prompt_tokens).toBeGreaterThan(0);
    expect(data.usage!.completion_tokens).toBe(8);
    const replica = response.headers.get('x-prefix-router-replica');
    expect(mocks.map((m) => m.id)).toContain(replica);
    const seen = mocks.find((m) => m.id === replica)!.stats().lastCompletionRequest!;
    expect(seen.headers.authorization).toBe(`Bearer ${TEST_ORIGIN_API_KEY}`);
    expect(JSON.stringify(seen.headers)).not.toContain(TEST_KEY);
  });

  it('streaming: content arrives in chunks; the usage chunk the router asked for is stripped', async () => {
    const stream = await client.chat.completions.create(
      { model: MODEL, stream: true, max_tokens: 8, messages: [{ role: 'user', content: 'Stream please' }] },
      { headers: { 'x-session-id': 'basic-2' } },
    );
    let text = '';
    let chunks = 0;
    let usageChunks = 0;
    for await (const chunk of stream) {
      chunks++;
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) usageChunks++;
    }
    expect(chunks).toBeGreaterThanOrEqual(8);
    expect(text.length).toBeGreaterThan(0);
    expect(usageChunks).toBe(0);
  });

  it('completions (legacy) streams too', async () => {
    const stream = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', stream: true, max_tokens: 4 });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    expect(text.length).toBeGreaterThan(0);
  });

  it('keeps every turn of a session on one replica, and later turns hit the prefix cache', async () => {
    const session = `affinity-${Date.now()}`;
    const system = `You are a careful assistant for run ${session}. ` + 'Follow the house rules closely. '.repeat(20);
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'system', content: system }];
    const replicas: string[] = [];
    const cached: number[] = [];
    for (let turn = 1; turn <= 8; turn++) {
      messages.push({ role: 'user', content: `Turn ${turn}: tell me more about item ${turn}.` });
      let answer = '';
      if (turn % 2 === 1) {
        const { data: stream, response } = await client.chat.completions
          .create({ model: MODEL, stream: true, stream_options: { include_usage: true }, max_tokens: 12, messages }, { headers: { 'x-session-id': session } })
          .withResponse();
        replicas.push(response.headers.get('x-prefix-router-replica') ?? 'none');
        let usage: OpenAI.CompletionUsage | undefined;
        for await (const chunk of stream) {
          answer += chunk.choices[0]?.delta?.content ?? '';
          if (chunk.usage) usage = chunk.usage;
        }
        expect(usage, `turn ${turn}: usage chunk asked for by the client`).toBeDefined();
        cached.push(usage!.prompt_tokens_details?.cached_tokens ?? 0);
      } else {
        const { data, response } = await client.chat.completions.create({ model: MODEL, max_tokens: 12, messages }, { headers: { 'x-session-id': session } }).withResponse();
        replicas.push(response.headers.get('x-prefix-router-replica') ?? 'none');
        answer = data.choices[0]!.message.content ?? '';
        cached.push(data.usage!.prompt_tokens_details?.cached_tokens ?? 0);
      }
      messages.push({ role: 'assistant', content: answer });
      // The next turn is picked with this one's lease released: one still held would count against
      // the load bound and could send it elsewhere when a loaded machine is slow to release.
      await eventually(async () => expect((await poolSnapshot()).leases).toBe(0), { timeoutMs: 15_000 });
    }
    expect(new Set(replicas).size, `replicas per turn: ${replicas.join(',')}`).toBe(1);
    expect(cached[0]).toBe(0);
    for (let i = 1; i < 8; i++) expect(cached[i], `turn ${i + 1} cached tokens (all: ${cached.join(',')})`).toBeGreaterThan(0);
    // Cache hits grow with the shared history.
    expect(cached[7]!).toBeGreaterThan(cached[1]!);
  });

  it('spreads different sessions over more than one replica', async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 12; i++) {
      const { response } = await client.chat.completions
        .create({ model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-session-id': `spread-${i}` } })
        .withResponse();
      seen.add(response.headers.get('x-prefix-router-replica') ?? 'none');
    }
    expect(seen.size).toBeGreaterThan(1);
  });
});

// ---- client disconnects -------------------------------------------------------------------------

/** A streaming request on a raw socket; resolves once a content delta has been received. */
function openRawStream(session: string): Promise<Socket> {
  const body = JSON.stringify({ model: MODEL, stream: true, max_tokens: 2000, messages: [{ role: 'user', content: `Long story for ${session}` }] });
  const head = [
    'POST /v1/chat/completions HTTP/1.1',
    `Host: 127.0.0.1:${router.port}`,
    `Authorization: Bearer ${TEST_KEY}`,
    'Content-Type: application/json',
    `Content-Length: ${Buffer.byteLength(body)}`,
    `X-Session-Id: ${session}`,
    '',
    '',
  ].join('\r\n');
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port: router.port });
    let received = '';
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no content within 20 s on ${session}: ${received.slice(0, 200)}`));
    }, 20_000);
    socket.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    socket.on('connect', () => socket.write(head + body));
    const onData = (buf: Buffer) => {
      received += buf.toString('latin1');
      if (!received.startsWith('HTTP/1.1 200')) {
        if (received.includes('\r\n\r\n')) {
          clearTimeout(timer);
          socket.destroy();
          reject(new Error(`unexpected response: ${received.slice(0, 300)}`));
        }
        return;
      }
      if (/"delta":\{"content":"[^"]/.test(received)) {
        clearTimeout(timer);
        socket.off('data', onData);
        // Keep reading (and discarding) so only the close itself is the disconnect.
        socket.on('data', () => {});
        resolve(socket);
      }
    };
    socket.on('data', onData);
  });
}

describe('client disconnects release the lease', () => {
  it('RST, FIN and SDK aborts mid-stream: in-flight returns to 0 on every replica and the mocks close their streams', async () => {
    await expectAllReleased();
    const abortedBefore = mocks.reduce((s, m) => s + m.stats().abortedByClient, 0);

    const rst = await Promise.all([0, 1, 2].map((i) => openRawStream(`rst-${i}`)));
    const fin = await Promise.all([0, 1, 2].map((i) => openRawStream(`fin-${i}`)));
    const sdk = [0, 1].map(async (i) => {
      const ac = new AbortController();
      const stream = await client.chat.completions.create(
        { model: MODEL, stream: true, max_tokens: 2000, messages: [{ role: 'user', content: `SDK story ${i}` }] },
        { headers: { 'x-session-id': `sdk-${i}` }, signal: ac.signal },
      );
      let started!: () => void;
      const firstContent = new Promise<void>((r) => (started = r));
      const done = (async () => {
        try {
          for await (const chunk of stream) if (chunk.choices[0]?.delta?.content) started();
        } catch (e) {
          if (!(e instanceof OpenAI.APIUserAbortError) && (e as Error).name !== 'AbortError') throw e;
        }
      })();
      await firstContent;
      return { ac, done };
    });
    const sdkStreams = await Promise.all(sdk);

    // All eight streams hold a lease now.
    await eventually(async () => expect((await poolSnapshot()).replicas.reduce((s, r) => s + r.inFlight, 0)).toBe(8), { timeoutMs: 20_000 });
    expect(mocks.reduce((s, m) => s + m.stats().activeStreams, 0)).toBe(8);

    const t0 = Date.now();
    for (const s of rst) s.resetAndDestroy();
    for (const s of fin) s.destroy();
    for (const s of sdkStreams) s.ac.abort();
    await Promise.all(sdkStreams.map((s) => s.done));

    // Bounded by expectAllReleased's wait, not timed: how long it took is reported, not asserted.
    await expectAllReleased();
    const releasedMs = Date.now() - t0;
    console.info(`8 aborted streams (3 RST, 3 FIN, 2 SDK) released within ${releasedMs} ms`);
    expect(mocks.reduce((s, m) => s + m.stats().abortedByClient, 0) - abortedBefore).toBe(8);
    // Recorded as client aborts (the coordinator's per-replica stats).
    const snap = await poolSnapshot();
    expect(snap.replicas.reduce((s, r) => s + r.stats.clientAborts, 0)).toBeGreaterThanOrEqual(8);
  });

  it('the router still serves normally afterwards', async () => {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'still there?' }] });
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0);
    await expectAllReleased();
  });
});

// ---- bad input ------------------------------------------------------------------------------------

interface BadCase {
  name: string;
  method?: string;
  path?: string;
  headers?: Record<string, string>;
  body?: string | Uint8Array;
  status?: number;
}

const chat = (b: unknown) => JSON.stringify(b);
const okMessages = [{ role: 'user', content: 'hi' }];
const deep = '{"model":"demo-model","messages":[{"role":"user","content":"x","extra":' + '['.repeat(100) + ']'.repeat(100) + '}]}';

const BAD: BadCase[] = [
  { name: 'no Authorization', headers: { authorization: '' }, body: chat({ model: MODEL, messages: okMessages }), status: 401 },
  { name: 'Basic auth', headers: { authorization: 'Basic dXNlcjpwYXNz' }, body: chat({ model: MODEL, messages: okMessages }), status: 401 },
  { name: 'unknown key', headers: { authorization: 'Bearer sk-not-a-real-key' }, body: chat({ model: MODEL, messages: okMessages }), status: 401 },
  { name: 'bearer with spaces', headers: { authorization: 'Bearer a b c' }, body: chat({ model: MODEL, messages: okMessages }), status: 401 },
  { name: 'origin key used as a tenant key', headers: { authorization: `Bearer ${TEST_ORIGIN_API_KEY}` }, body: chat({ model: MODEL, messages: okMessages }), status: 401 },
  { name: 'admin token used as a tenant key', headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` }, body: chat({ model: MODEL, messages: okMessages }), status: 401 },
  { name: 'text/plain', headers: { 'content-type': 'text/plain' }, body: chat({ model: MODEL, messages: okMessages }), status: 415 },
  { name: 'form content type', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: 'model=demo-model', status: 415 },
  { name: 'empty body', body: '', status: 400 },
  { name: 'truncated JSON', body: '{"model":"demo-model","messages":[', status: 400 },
  { name: 'JSON array', body: '[]', status: 400 },
  { name: 'JSON string', body: '"hello"', status: 400 },
  { name: 'JSON null', body: 'null', status: 400 },
  { name: 'invalid UTF-8', body: new Uint8Array([0x7b, 0x22, 0x6d, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), status: 400 },
  { name: 'nesting 100 deep', body: deep, status: 400 },
  { name: 'body over maxBodyBytes', body: chat({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(70 * 1024) }] }), status: 413 },
  { name: 'model missing', body: chat({ messages: okMessages }), status: 400 },
  { name: 'model a number', body: chat({ model: 7, messages: okMessages }), status: 400 },
  { name: 'model empty', body: chat({ model: '', messages: okMessages }), status: 400 },
  { name: 'unknown model', body: chat({ model: 'gpt-nonexistent', messages: okMessages }), status: 404 },
  { name: 'messages missing', body: chat({ model: MODEL }), status: 400 },
  { name: 'messages empty', body: chat({ model: MODEL, messages: [] }), status: 400 },
  { name: 'messages an object', body: chat({ model: MODEL, messages: { role: 'user' } }), status: 400 },
  { name: 'message without role', body: chat({ model: MODEL, messages: [{ content: 'hi' }] }), status: 400 },
  { name: 'message content a number', body: chat({ model: MODEL, messages: [{ role: 'user', content: 5 }] }), status: 400 },
  { name: 'stream a string', body: chat({ model: MODEL, messages: okMessages, stream: 'yes' }), status: 400 },
  { name: 'max_tokens negative', body: chat({ model: MODEL, messages: okMessages, max_tokens: -1 }), status: 400 },
  { name: 'max_tokens fractional', body: chat({ model: MODEL, messages: okMessages, max_tokens: 1.5 }), status: 400 },
  { name: 'stream_options a string', body: chat({ model: MODEL, messages: okMessages, stream: true, stream_options: 'x' }), status: 400 },
  { name: 'tools a string', body: chat({ model: MODEL, messages: okMessages, tools: 'x' }), status: 400 },
  { name: 'user too long', body: chat({ model: MODEL, messages: okMessages, user: 'u'.repeat(600) }), status: 400 },
  { name: 'completions without prompt', path: '/v1/completions', body: chat({ model: MODEL }), status: 400 },
  { name: 'completions prompt an object', path: '/v1/completions', body: chat({ model: MODEL, prompt: { a: 1 } }), status: 400 },
  { name: 'GET chat completions', method: 'GET', body: undefined, status: 405 },
  { name: 'PUT chat completions', method: 'PUT', body: chat({ model: MODEL, messages: okMessages }), status: 405 },
  { name: 'unknown path', path: '/v1/embeddingz', body: chat({ model: MODEL, input: 'x' }), status: 404 },
  { name: 'embeddings without input', path: '/v1/embeddings', body: chat({ model: MODEL }), status: 400 },
  { name: 'x-pool unknown', headers: { 'x-pool': 'nope' }, body: chat({ model: MODEL, messages: okMessages }), status: 404 },
  { name: 'x-pool not serving the model', headers: { 'x-pool': 'batch' }, body: chat({ model: MODEL, messages: okMessages }), status: 404 },
  { name: 'x-pool from a tenant that may not choose', headers: { authorization: `Bearer ${GLOBEX_KEY}`, 'x-pool': 'chat' }, body: chat({ model: MODEL, messages: okMessages }), status: 403 },
  { name: 'model of a pool the tenant may not use', headers: { authorization: `Bearer ${GLOBEX_KEY}` }, body: chat({ model: 'batch-model', messages: okMessages }), status: 404 },
  { name: 'admin without token', method: 'GET', path: '/admin/pools', headers: { authorization: '' }, body: undefined, status: 401 },
  { name: 'admin token in the query', method: 'GET', path: `/admin/pools?token=${TEST_ADMIN_TOKEN}`, headers: { authorization: '' }, body: undefined, status: 400 },
  { name: 'tenant key on the admin API', method: 'GET', path: '/admin/pools', body: undefined, status: 401 },
];

describe('bad input', () => {
  it(`a corpus of ${BAD.length} bad requests gets only 4xx with the OpenAI error shape, and never reaches a replica`, async () => {
    expect(BAD.length).toBeGreaterThanOrEqual(25);
    const before = totalCompletionRequests();
    const problems: string[] = [];
    for (const c of BAD) {
      const headers: Record<string, string> = { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', ...c.headers };
      for (const [k, v] of Object.entries(headers)) if (v === '') delete headers[k];
      const res = await fetch(router.url + (c.path ?? '/v1/chat/completions'), {
        method: c.method ?? 'POST',
        headers,
        body: c.body,
        signal: AbortSignal.timeout(20_000),
      });
      const text = await res.text();
      let body: { error?: { message?: unknown; type?: unknown; param?: unknown; code?: unknown } } = {};
      try {
        body = JSON.parse(text);
      } catch {
        // checked below
      }
      const e = body.error;
      const shapeOk = !!e && typeof e.message === 'string' && typeof e.type === 'string' && 'param' in e && typeof e.code === 'string';
      if (res.status < 400 || res.status >= 500 || (c.status !== undefined && res.status !== c.status) || !shapeOk || !(res.headers.get('content-type') ?? '').startsWith('application/json')) {
        problems.push(`${c.name}: ${res.status} ${text.slice(0, 160)}`);
      }
      // No secret is ever echoed back.
      for (const s of [TEST_KEY, GLOBEX_KEY, TEST_ORIGIN_API_KEY, TEST_ADMIN_TOKEN]) if (text.includes(s)) problems.push(`${c.name}: echoes a secret`);
    }
    expect(problems).toEqual([]);
    expect(totalCompletionRequests()).toBe(before);
  });
});

// ---- a replica dies and comes back ---------------------------------------------------------------------

describe('replica failure', () => {
  it('a killed replica: no client error (retried before the first byte), marked down by its health checks, rejoins after restart', async () => {
    const session = `failover-${Date.now()}`;
    const ask = (s: string) =>
      client.chat.completions.create({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: `failover ${s}` }] }, { headers: { 'x-session-id': s } }).withResponse();

    const first = await ask(session);
    const home = first.response.headers.get('x-prefix-router-replica')!;
    const victimIndex = mocks.findIndex((m) => m.id === home);
    const victim = mocks[victimIndex]!;
    const port = victim.port;

    await victim.close();
    const killedAt = Date.now();

    // The first request after the kill still goes to the home replica, fails to connect, and is
    // retried elsewhere before any byte reached the client.
    const after = await ask(session);
    expect(after.response.status).toBe(200);
    expect(after.response.headers.get('x-prefix-router-replica')).not.toBe(home);
    const requestId = after.response.headers.get('x-request-id')!;
    const trace = await eventually(() => {
      const t = router.traceLines().find((l) => l.requestId === requestId);
      expect(t).toBeDefined();
      return t!;
    }, { timeoutMs: 15_000 });
    expect(trace).toMatchObject({ status: 200, retried: true, attempts: 2 });

    // More sessions while it is down: none fail.
    for (let i = 0; i < 6; i++) {
      const r = await ask(`${session}-${i}`);
      expect(r.response.status).toBe(200);
      expect(r.response.headers.get('x-prefix-router-replica')).not.toBe(home);
    }

    // Active health checks take it out: fall = 2 checks, 2 s apart.
    await eventually(
      async () => {
        const r = (await poolSnapshot()).replicas.find((x) => x.id === home)!;
        expect(r.activeUp).toBe(false);
        expect(r.healthy).toBe(false);
      },
      { timeoutMs: 20_000, intervalMs: 25 },
    );
    // Normally two health intervals (fall = 2); reported, not asserted: a loaded machine delays alarms.
    const downAfterMs = Date.now() - killedAt;

    // Restart on the same port: `rise` good checks bring it back, and its sessions return to it.
    const revived = await startMockVllm({ ...MOCK_OPTS, id: home, port, apiKey: TEST_ORIGIN_API_KEY, models: [MODEL] });
    mocks[victimIndex] = revived;
    const revivedAt = Date.now();
    await eventually(
      async () => {
        const r = (await poolSnapshot()).replicas.find((x) => x.id === home)!;
        expect(r.healthy).toBe(true);
      },
      { timeoutMs: 20_000, intervalMs: 25 },
    );
    const upAfterMs = Date.now() - revivedAt;
    console.info(`replica ${home}: down ${downAfterMs} ms after the kill, healthy ${upAfterMs} ms after the restart`);
    const back = await ask(session);
    expect(back.response.headers.get('x-prefix-router-replica')).toBe(home);
    await expectAllReleased();
  });
});

// ---- trace log --------------------------------------------------------------------------------------------

const TRACE_FIELDS: Record<string, string[]> = {
  type: ['string'],
  ts: ['number'],
  requestId: ['string'],
  api: ['string'],
  pool: ['string'],
  tenant: ['string'],
  keyKind: ['string'],
  keyHash: ['string', 'null'],
  replica: ['string', 'null'],
  status: ['number'],
  promptTokens: ['number', 'null'],
  cachedTokens: ['number', 'null'],
  completionTokens: ['number', 'null'],
  ttftMs: ['number', 'null'],
  durationMs: ['number'],
  retried: ['boolean'],
  spilled: ['boolean'],
  attempts: ['number'],
};
const OPTIONAL_FIELDS: Record<string, string[]> = {
  error: ['string'],
  blocks: ['object'],
  earlyConnect: ['string'],
  matchedBlocks: ['number'],
  model: ['string'],
  upstreamRequestId: ['string'],
  failOpen: ['boolean'],
  api: ['string'],
};

describe('trace log', () => {
  it('one JSON line per request with the documented fields, and no secret anywhere in the logs', async () => {
    expect(router.logs.length).toBeGreaterThan(0);
    const secrets = [...TEST_TENANTS.map((t) => t.key), TEST_ORIGIN_API_KEY, TEST_ADMIN_TOKEN];
    for (const line of router.logs) for (const s of secrets) expect(line.includes(s), `a log line contains a secret: ${line.slice(0, 80)}`).toBe(false);

    const traces = router.traceLines();
    expect(traces.length).toBeGreaterThanOrEqual(30);
    for (const line of router.logs.filter((l) => l.startsWith('{'))) expect(() => JSON.parse(line)).not.toThrow();
    for (const t of traces) {
      for (const [field, types] of Object.entries(TRACE_FIELDS)) {
        const v = t[field];
        expect(types, `${field} in ${JSON.stringify(t)}`).toContain(v === null ? 'null' : typeof v);
      }
      for (const field of Object.keys(t)) expect(field in TRACE_FIELDS || field in OPTIONAL_FIELDS, `undocumented field ${field}`).toBe(true);
      for (const [field, types] of Object.entries(OPTIONAL_FIELDS)) if (field in t) expect(types, `${field} in ${JSON.stringify(t)}`).toContain(typeof t[field]);
      // The engine sees the router's id, never the client's (a client id could collide across tenants).
      if (t.upstreamRequestId !== undefined) expect(t.upstreamRequestId).not.toBe(t.requestId);
      expect(t.pool).toBe(POOL);
      expect(['acme', 'globex']).toContain(t.tenant);
      if (t.keyHash !== null) expect(t.keyHash).toMatch(/^[0-9a-f]{8}$/);
    }
    // Completed streams report TTFT and usage; client aborts are marked as such.
    expect(traces.some((t) => t.status === 200 && typeof t.ttftMs === 'number' && typeof t.cachedTokens === 'number' && (t.cachedTokens as number) > 0)).toBe(true);
    expect(traces.filter((t) => t.error === 'client_abort').length).toBeGreaterThanOrEqual(8);
  });
});
