// Abuse suite, hostile and odd origins (issue #15): the router never follows an origin's redirect
// (proxy, health checks, metric scrapes), keeps a replica URL's path, never passes an origin's
// content type or caching headers, answers an origin's error as OpenAI JSON without the origin's
// credentials, sends the engine its own request id and none of a tenant's engine control fields,
// forwards only the pool's extra headers, and long non-streaming requests or origin 500s do not
// take replicas out of rotation. Router under Miniflare on loopback, mock vLLM replicas and a
// hostile origin (hostile-origin.ts); bounded waits.

import { createHmac } from 'node:crypto';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../../tools/mock-engine/index.js';
import { TEST_CACHE_SALT_KEY, TEST_ORIGIN_API_KEY } from '../../helpers/router.js';
import { startHostileOrigin, type HostileOrigin } from '../../helpers/hostile-origin.js';
import { findLeaks, logsSettled, MODEL, POOL, rawHttp, secretValues, startRig, waitHealthy, type Rig } from '../../helpers/security-rig.js';

const FIRST_BYTE_MS = 1_500;
// Well above the long answers' ~2 s below, so a loaded machine does not turn them into 504s.
const NON_STREAM_MS = 6_000;
const auth = 'bearer:ORIGIN_API_KEY';

let rig: Rig;
let zoo: HostileOrigin;
/** The mock behind the zoo's /vllm-1 gateway prefix. */
let gateway: MockVllm;

beforeAll(async () => {
  gateway = await startMockVllm({ id: 'gw', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['redir-model', 'path-model'], decodeMsPerToken: 2 });
  zoo = await startHostileOrigin(gateway);
  rig = await startRig({
    mocks: 3,
    mockOptions: { decodeMsPerToken: 2, maxRunning: 64 },
    overrides: { firstByteTimeoutMs: FIRST_BYTE_MS, nonStreamTimeoutMs: NON_STREAM_MS },
    poolOverrides: { maxFails: 3, failWindowMs: 60_000, failTimeoutMs: 30_000 },
    extraPools: [
      { name: 'redir', models: ['redir-model'], strategy: 'round-robin', keys: ['none'], healthIntervalMs: 300, healthTimeoutMs: 300, scrapeIntervalMs: 300, fall: 1_000, maxFails: 1_000, replicas: [{ id: 'evil', url: `${zoo.url}/redirect`, auth }, { id: 'good', url: `${zoo.url}/vllm-1`, auth }] },
      { name: 'paths', models: ['path-model'], strategy: 'least-load', keys: ['none'], healthIntervalMs: 300, healthTimeoutMs: 300, scrapeIntervalMs: 300, replicas: [{ id: 'p1', url: `${zoo.url}/vllm-1`, auth }] },
      { name: 'odd', models: ['odd-model'], strategy: 'least-load', keys: ['none'], healthIntervalMs: 300, healthTimeoutMs: 300, maxFails: 3, failWindowMs: 60_000, failTimeoutMs: 30_000, forwardHeaders: ['x-origin-mode', 'X-Origin-Delay-Ms', 'x-work-hint'], replicas: [{ id: 'o1', url: `${zoo.url}/odd`, auth }] },
    ],
  });
  await waitHealthy(rig);
}, 60_000);

afterAll(async () => {
  await rig?.close();
  await zoo?.close();
  await gateway?.close();
});

const post = (model: string, body: Record<string, unknown> = {}, headers: Record<string, string> = {}, tenant = 'acme') =>
  rig.fetchText('/v1/chat/completions', {
    method: 'POST',
    headers: { authorization: `Bearer ${rig.keyOf(tenant)}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model, max_tokens: 3, messages: [{ role: 'user', content: 'hello there' }], ...body }),
  }, `${model} ${JSON.stringify(headers).slice(0, 60)}`);

async function snapshot(pool: string) {
  const res = await rig.router.adminFetch(`/admin/pools/${pool}`);
  return (await res.json()) as { replicas: { id: string; url: string; healthy: boolean; passiveDownUntil: number; lastCheckError: string | null; stats: { byStatus: Record<string, number> }; vllm: { scrapeError: string | null; lastScrapeAt: number } }[] };
}

async function until<T>(what: string, f: () => Promise<T | undefined | false>, ms = 15_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** What the odd origin received for the last completion. */
function lastDump(): { headers: Record<string, string>; body: Record<string, unknown> } {
  const s = [...zoo.seen].reverse().find((x) => x.path.startsWith('/odd/v1/'))!;
  return { headers: s.headers as Record<string, string>, body: JSON.parse(s.body) as Record<string, unknown> };
}

describe('origin redirects (item 1)', () => {
  it('a replica answering 307 to everything: no request reaches the redirect target, the request is served by another replica, health and scrape say "redirect"', async () => {
    for (let i = 0; i < 6; i++) {
      const res = await post('redir-model');
      expect(res.status, res.text.slice(0, 200)).toBe(200);
      expect(res.headers.get('x-prefix-router-replica')).toBe('good');
    }
    const snap = await until('health and scrape of evil', async () => {
      const s = await snapshot('redir');
      const evil = s.replicas.find((r) => r.id === 'evil')!;
      return evil.lastCheckError?.includes('redirect') && evil.vllm.scrapeError?.includes('redirect') ? s : undefined;
    });
    expect(snap.replicas.find((r) => r.id === 'evil')!.stats.byStatus['307']).toBeGreaterThan(0);
    // Not a proxy request, not a health check, not a scrape, not the origin's credentials.
    expect(zoo.canary.seen).toEqual([]);
    await until('an origin_redirect log line', async () => rig.router.logs.some((l) => l.includes('"origin_redirect"')));
  });
});

describe('replica URLs keep their path (item 7)', () => {
  it('a replica behind a path prefix (https://gw/vllm-1) is served, health-checked and scraped at that prefix', async () => {
    const res = await post('path-model');
    expect(res.status, res.text.slice(0, 200)).toBe(200);
    const snap = await until('paths healthy and scraped', async () => {
      const s = await snapshot('paths');
      const p = s.replicas[0]!;
      return p.healthy && p.lastCheckError === null && p.vllm.lastScrapeAt > 0 && p.vllm.scrapeError === null ? s : undefined;
    });
    expect(snap.replicas[0]!.url).toBe(`${zoo.url}/vllm-1`);
    const paths = zoo.seen.filter((s) => s.path.startsWith('/vllm-1/')).map((s) => s.path);
    for (const p of ['/vllm-1/v1/chat/completions', '/vllm-1/health', '/vllm-1/metrics']) expect(paths, p).toContain(p);
    expect(zoo.seen.some((s) => s.path === '/v1/chat/completions' || s.path === '/health')).toBe(false);
  });

  it('an admin PUT stores the normalised URL (case, default port, trailing slash)', async () => {
    const weird = `HTTP://127.0.0.1:${zoo.port}/vllm-1/`;
    const res = await rig.router.adminFetch('/admin/pools/paths/replicas/p2', { method: 'PUT', body: JSON.stringify({ url: weird, auth }) });
    expect(res.status, await res.clone().text()).toBe(200);
    expect(((await res.json()) as { url: string }).url).toBe(`http://127.0.0.1:${zoo.port}/vllm-1`);
    expect((await rig.router.adminFetch('/admin/pools/paths/replicas/p2', { method: 'DELETE' })).status).toBe(200);
  });
});

describe('what an origin sends back (item 8)', () => {
  it('a 200 text/html answer reaches the client as application/json with nosniff, no-store and none of the origin\'s headers', async () => {
    const res = await post('odd-model', {}, { 'x-origin-mode': 'html200' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.headers.get('set-cookie')).toBeNull();
  });

  it('a streaming answer is text/event-stream whatever the origin said', async () => {
    const res = await post('odd-model', { stream: true }, { 'x-origin-mode': 'sse-html' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
  });

  it('a non-JSON origin error becomes an OpenAI error with the origin\'s status', async () => {
    const res = await post('odd-model', {}, { 'x-origin-mode': 'html404' });
    expect(res.status).toBe(404);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(JSON.parse(res.text)).toMatchObject({ error: { code: 'upstream_error', type: 'invalid_request_error', message: expect.stringContaining('404') } });
    expect(res.text).not.toContain('<html>');
  });

  it('an origin error that echoes the request\'s Authorization does not hand the origin key to the tenant', async () => {
    const res = await post('odd-model', {}, { 'x-origin-mode': 'echo400' });
    expect(res.status).toBe(400);
    expect(res.text).not.toContain(TEST_ORIGIN_API_KEY);
    expect(res.text).toContain('[redacted]');
  });

  it("x-session-id reaches the origin only as the tenant's HMAC of it (as routing trims it), never raw (issue #26 item 4)", async () => {
    const expected = createHmac('sha256', TEST_CACHE_SALT_KEY).update(`session\u0000acme\u0000${'s'.repeat(256)}`).digest('base64url');
    await post('odd-model', {}, { 'x-session-id': `  ${'s'.repeat(400)}` });
    expect(lastDump().headers['x-session-id']).toBe(expected);
    await post('odd-model', {}, { 'x-session-id': 's'.repeat(256) });
    expect(lastDump().headers['x-session-id']).toBe(expected);
    // No session header, none upstream; a client's X-Vllm-Priority never goes (it would override the fenced body priority).
    await post('odd-model', {}, { 'x-vllm-priority': '-1000' });
    expect(lastDump().headers['x-session-id']).toBeUndefined();
    expect(lastDump().headers['x-vllm-priority']).toBeUndefined();
  });
});

describe('what reaches the engine (items 2, 3, 4, 11)', () => {
  it('engine control fields are removed, cache_salt and request_id are the router\'s; sampling fields pass', async () => {
    const res = await post('odd-model', { priority: -1000, kv_transfer_params: { do_remote_prefill: true, remote_host: '10.0.0.1' }, request_id: 'victim-request', cache_salt: 'globex-salt-guess', vllm_xargs: { x: 1 }, rid: 'sglang-id', id_slot: 3, data_parallel_rank: 1, logits_processors: ['os.system'], chat_template: '{{ 7*7 }}', temperature: 0.3, top_k: 5 }, { 'x-request-id': 'client-rid-1' });
    expect(res.status).toBe(200);
    const { headers, body } = lastDump();
    for (const f of ['priority', 'kv_transfer_params', 'vllm_xargs', 'rid', 'id_slot', 'data_parallel_rank', 'logits_processors', 'chat_template']) expect(body[f], f).toBeUndefined();
    expect(body.temperature).toBe(0.3);
    expect(body.top_k).toBe(5);
    expect(body.cache_salt).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(body.cache_salt).not.toBe('globex-salt-guess');
    // Request ids: the engine sees the router's, the client keeps its own (response, trace).
    expect(headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    expect(body.request_id).toBe(headers['x-request-id']);
    expect(res.headers.get('x-request-id')).toBe('client-rid-1');
    const trace = await until('trace line', async () => rig.router.traceLines().find((t) => t.requestId === 'client-rid-1'));
    expect(trace.upstreamRequestId).toBe(headers['x-request-id']);
  });

  it('two tenants get two stable salts; the same tenant always the same one', async () => {
    const salt = async (tenant: string) => {
      expect((await post('odd-model', {}, {}, tenant)).status).toBe(200);
      return lastDump().body.cache_salt as string;
    };
    // globex may not use the odd pool: compare acme with a tenant that may (acme twice, then via chat).
    const a1 = await salt('acme');
    const a2 = await salt('acme');
    expect(a1).toBe(a2);
    const chatSalts = new Map<string, string>();
    for (const t of ['acme', 'globex']) {
      const res = await rig.fetchText('/v1/chat/completions', { method: 'POST', headers: { authorization: `Bearer ${rig.keyOf(t)}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }) });
      expect(res.status).toBe(200);
      const seen = rig.mocks.find((m) => m.id === res.headers.get('x-prefix-router-replica'))!.stats().lastCompletionRequest!;
      chatSalts.set(t, (seen.body as { cache_salt: string }).cache_salt);
    }
    expect(chatSalts.get('acme')).toBe(a1);
    expect(chatSalts.get('globex')).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(chatSalts.get('globex')).not.toBe(a1);
  });

  it('the pool\'s forwardHeaders reach the origin; other application headers do not', async () => {
    await post('odd-model', {}, { 'x-work-hint': 'batch-7', 'x-other-hint': 'nope' });
    const { headers } = lastDump();
    expect(headers['x-work-hint']).toBe('batch-7');
    expect(headers['x-other-hint']).toBeUndefined();
    expect(headers.authorization).toBe(`Bearer ${TEST_ORIGIN_API_KEY}`);
  });
});

describe('headers named in Connection (item 9)', () => {
  it('the runtime strips Connection before the Worker: a header it names still goes (it is on the allowlist), hop-by-hop headers never do', async () => {
    const completions = () => zoo.seen.filter((x) => x.path.startsWith('/odd/v1/')).length;
    const before = completions();
    const res = await rawHttp(rig.port, {
      headers: [
        ['Authorization', `Bearer ${rig.keyOf('acme')}`],
        ['Content-Type', 'application/json'],
        ['Connection', 'keep-alive, x-session-id, x-work-hint'],
        ['X-Session-Id', 'named-in-connection'],
        ['X-Work-Hint', 'named-too'],
        ['Keep-Alive', 'timeout=5'],
        ['TE', 'trailers'],
        ['Upgrade', 'h2c'],
        ['Proxy-Connection', 'keep-alive'],
        ['Proxy-Authorization', 'Basic Zm9vOmJhcg=='],
      ],
      body: JSON.stringify({ model: 'odd-model', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status, res.raw.slice(0, 200)).toBe(200);
    expect(completions()).toBe(before + 1);
    const { headers } = lastDump();
    // What holds: the allowlist. What cannot: removing names listed in a Connection header the Worker never sees.
    expect(headers['x-session-id']).toBe(createHmac('sha256', TEST_CACHE_SALT_KEY).update('session\u0000acme\u0000named-in-connection').digest('base64url'));
    for (const h of ['keep-alive', 'te', 'upgrade', 'proxy-connection', 'proxy-authorization']) expect(headers[h], h).toBeUndefined();
    expect(String(headers.connection ?? '')).not.toMatch(/x-session-id|x-work-hint/i);
  });
});

describe('failures a tenant can cause do not take replicas out (item 5)', () => {
  it('12 long non-streaming requests from one tenant (longer than firstByteTimeoutMs) all succeed, and every replica stays healthy and serving', async () => {
    for (const m of rig.mocks) m.setFaults({ slowFactor: 10 }); // 100 tokens × 2 ms × 10 ≈ 2 s > FIRST_BYTE_MS
    try {
      const started = Date.now();
      const answers = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          rig.fetchText('/v1/chat/completions', {
            method: 'POST',
            headers: { authorization: `Bearer ${rig.keyOf('acme')}`, 'content-type': 'application/json', 'x-session-id': `long-${i}` },
            body: JSON.stringify({ model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: `long answer ${i}` }] }),
            signal: AbortSignal.timeout(20_000),
          }),
        ),
      );
      expect(answers.map((a) => a.status)).toEqual(Array(12).fill(200));
      expect(Date.now() - started).toBeGreaterThan(FIRST_BYTE_MS);
    } finally {
      for (const m of rig.mocks) m.setFaults({ slowFactor: 1 });
    }
    const snap = await snapshot(POOL);
    expect(snap.replicas.map((r) => [r.id, r.healthy, r.passiveDownUntil])).toEqual(rig.mocks.map((m) => [m.id, true, 0]));
    // Every replica still takes requests: keys spread over all three.
    const served = new Set<string>();
    for (let i = 0; i < 30 && served.size < 3; i++) {
      const r = await rig.fetchText('/v1/chat/completions', { method: 'POST', headers: { authorization: `Bearer ${rig.keyOf('acme')}`, 'content-type': 'application/json', 'x-session-id': `after-${i}` }, body: JSON.stringify({ model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }) });
      expect(r.status).toBe(200);
      served.add(r.headers.get('x-prefix-router-replica')!);
    }
    expect(served.size).toBe(3);
  }, 40_000);

  it('a non-streaming request over nonStreamTimeoutMs gets 504, and three of them leave the replica in rotation', async () => {
    for (let i = 0; i < 3; i++) {
      const res = await post('odd-model', {}, { 'x-origin-mode': 'slow', 'x-origin-delay-ms': String(NON_STREAM_MS + 2_000) });
      expect(res.status).toBe(504);
      expect(JSON.parse(res.text).error.message).toContain('nonStreamTimeoutMs');
    }
    const o1 = (await snapshot('odd')).replicas[0]!;
    expect([o1.healthy, o1.passiveDownUntil]).toEqual([true, 0]);
    expect((await post('odd-model')).status).toBe(200);
  }, 40_000);

  it('a 524 (Cloudflare\'s proxy read timeout in front of the origin) three times over leaves the replica in rotation', async () => {
    // The odd pool takes a replica out after 3 failures within its window: three 524s must not.
    for (let i = 0; i < 3; i++) {
      const res = await post('odd-model', {}, { 'x-origin-mode': 'cf524' });
      expect(res.status).toBe(524);
      expect(res.headers.get('content-type')).toBe('application/json');
    }
    // Releases reach the coordinator in the background: wait (bounded) until all three are counted.
    let o1 = (await snapshot('odd')).replicas[0]!;
    for (let i = 0; i < 50 && (o1.stats.byStatus['524'] ?? 0) < 3; i++) {
      await new Promise((r) => setTimeout(r, 100));
      o1 = (await snapshot('odd')).replicas[0]!;
    }
    expect(o1.stats.byStatus['524']).toBe(3);
    expect([o1.healthy, o1.passiveDownUntil]).toEqual([true, 0]);
    expect((await post('odd-model')).status).toBe(200);
  }, 40_000);

  it('an origin 500 is answered to the client as JSON, not retried on the other replicas', async () => {
    for (const m of rig.mocks) m.setFaults({ error500Rate: 1 });
    try {
      const before = rig.completions();
      const res = await rig.fetchText('/v1/chat/completions', { method: 'POST', headers: { authorization: `Bearer ${rig.keyOf('acme')}`, 'content-type': 'application/json', 'x-session-id': 'five-hundred' }, body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }) });
      expect(res.status).toBe(500);
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(typeof (JSON.parse(res.text) as { error?: { message?: unknown } }).error?.message).toBe('string');
      expect(rig.completions() - before).toBe(1);
    } finally {
      for (const m of rig.mocks) m.setFaults({ error500Rate: 0 });
    }
  });
});

describe('leaks', () => {
  it('no response and no log line of this file holds a secret', async () => {
    await logsSettled(rig, [POOL, 'batch', 'redir', 'paths', 'odd']);
    // The odd origin's `dump` answers (200) echo the headers it got, origin key included, on
    // purpose: a success body is streamed through unread (docs/operations.md, "Tenant isolation",
    // what an origin sends back). Error bodies are redacted (the echo400 case above).
    const dumps = rig.seen.filter((x) => x.text.startsWith('200\n') && x.text.includes('"headers":{'));
    expect(dumps.length).toBeGreaterThan(0);
    rig.seen.splice(0, rig.seen.length, ...rig.seen.filter((x) => !dumps.includes(x)));
    expect(findLeaks(rig, secretValues(rig, [rig.router.secrets.CACHE_SALT_KEY!]))).toEqual([]);
  });
});
