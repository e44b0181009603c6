// Abuse suite, the tenant boundary (issue #15): routing keys, prompt blocks and cache salts are
// per tenant (unless a pool shares prefixes on purpose), a deployment without CACHE_SALT_KEY says
// so loudly instead of sharing caches, a tenant's cap counts the sequences it asks for, dashboard
// pages cannot be framed and their sessions die at logout, operator credentials cannot be guessed
// at speed, and a revoked key stops working everywhere within 5 s without a redeploy. Router under
// Miniflare on loopback with mock vLLM replicas; bounded waits.

import { randomBytes } from 'node:crypto';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { eventually, routerConfig, startRouter, TEST_ADMIN_TOKEN, TEST_TENANTS, type TestTenant } from '../../helpers/router.js';
import { startHostileOrigin, type HostileOrigin } from '../../helpers/hostile-origin.js';
import { findLeaks, logsSettled, MODEL, POOL, secretValues, startRig, traceLineOf, waitHealthy, type Rig } from '../../helpers/security-rig.js';

const rnd = () => randomBytes(9).toString('base64url');
const LIMIT = 2;
const AUTH_FAILURES = 5;
const TENANTS: TestTenant[] = [
  ...TEST_TENANTS,
  { key: `sk-e2e-initech-${rnd()}`, tenant: 'initech', keyId: 'e2e-initech', pools: ['*'] },
  { key: `sk-e2e-limited-${rnd()}`, tenant: 'limited', keyId: 'e2e-limited', pools: [POOL, 'slow'], maxInFlight: LIMIT },
  { key: `sk-e2e-revokee-${rnd()}`, tenant: 'revokee', keyId: 'e2e-revokee', pools: [POOL] },
];
const MODELS = ['demo-model', 'pfx-model', 'shared-model'];

let rig: Rig;
let zoo: HostileOrigin;

beforeAll(async () => {
  // The mock serves n=1 only: the sequence cap is shown against the hostile origin's slow answers.
  zoo = await startHostileOrigin({ port: 9 });
  rig = await startRig({
    mocks: 3,
    tenants: TENANTS,
    mockOptions: { decodeMsPerToken: 2, maxRunning: 64, models: MODELS },
    overrides: { authFailureLimit: AUTH_FAILURES, authFailureWindowMs: 60_000 },
    extraPools: [
      { name: 'pfx', models: ['pfx-model'], strategy: 'prefix-aware', keys: ['prefix:4096'], healthIntervalMs: 500, authRefs: ['bearer:ORIGIN_API_KEY'], replicas: [] },
      { name: 'slow', models: ['slow-model'], strategy: 'least-load', keys: ['none'], forwardHeaders: ['x-origin-mode', 'x-origin-delay-ms'], replicas: [{ id: 's1', url: `${zoo.url}/odd`, auth: 'bearer:ORIGIN_API_KEY' }] },
      { name: 'shared', models: ['shared-model'], strategy: 'prefix-aware', keys: ['prefix:4096'], cacheSalt: 'shared', healthIntervalMs: 500, authRefs: ['bearer:ORIGIN_API_KEY'], replicas: [] },
    ],
  });
  // Both prefix pools on the same three mocks (added here: the rig config knows their URLs only now).
  for (const pool of ['pfx', 'shared']) {
    for (const m of rig.mocks) {
      const res = await rig.router.adminFetch(`/admin/pools/${pool}/replicas/${m.id}`, { method: 'PUT', body: JSON.stringify({ url: m.url, auth: 'bearer:ORIGIN_API_KEY' }) });
      expect(res.status, await res.clone().text()).toBe(200);
    }
  }
  await waitHealthy(rig);
}, 60_000);

afterAll(async () => {
  await rig?.close();
  await zoo?.close();
});

function chat(tenant: string, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) {
  return rig.fetchText('/v1/chat/completions', {
    method: 'POST',
    headers: { authorization: `Bearer ${rig.keyOf(tenant)}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'hello' }], ...body }),
  }, `${tenant} ${JSON.stringify(headers).slice(0, 60)}`);
}

const form = { 'content-type': 'application/x-www-form-urlencoded' };
const login = (token: string) => rig.fetchText('/dashboard/login', { method: 'POST', headers: form, body: `token=${encodeURIComponent(token)}`, redirect: 'manual' }, 'login');

const seenBy = (replica: string | null) => rig.mocks.find((m) => m.id === replica)!.stats().lastCompletionRequest!;

describe('cross-tenant cache and routing isolation (item 2)', () => {
  it('two tenants sending the same x-session-id are two routing keys and two different session ids at the origin; one tenant\'s is stable; the raw value never reaches the origin', async () => {
    const hashes: Record<string, unknown[]> = {};
    const upstream: Record<string, unknown[]> = {};
    for (const t of ['acme', 'globex', 'acme', 'globex']) {
      const rid = `ns-${t}-${rnd()}`;
      const res = await chat(t, {}, { 'x-session-id': 'shared-session-1', 'x-request-id': rid });
      expect(res.status).toBe(200);
      (hashes[t] ??= []).push((await traceLineOf(rig, rid)).keyHash);
      // The newest vLLM reads X-Session-ID: it gets the per-tenant HMAC (issue #26 item 4).
      (upstream[t] ??= []).push(seenBy(res.headers.get('x-prefix-router-replica')).headers['x-session-id']);
    }
    expect(hashes.acme![0]).toBe(hashes.acme![1]);
    expect(hashes.globex![0]).toBe(hashes.globex![1]);
    expect(hashes.acme![0]).not.toBe(hashes.globex![0]);
    for (const v of [...upstream.acme!, ...upstream.globex!]) expect(v).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(upstream.acme![0]).toBe(upstream.acme![1]);
    expect(upstream.globex![0]).toBe(upstream.globex![1]);
    expect(upstream.acme![0]).not.toBe(upstream.globex![0]);
    for (const m of rig.mocks) expect(JSON.stringify(m.stats().lastCompletionRequest?.headers ?? {})).not.toContain('shared-session-1');
  });

  const longPrompt = `You are a support agent for a bank. ${'Policy paragraph with rules and exceptions. '.repeat(80)}`;
  const prefixRequest = async (tenant: string, model: string) => {
    const rid = `pfx-${tenant}-${rnd()}`;
    const res = await chat(tenant, { model, messages: [{ role: 'system', content: longPrompt }, { role: 'user', content: 'what is the policy?' }] }, { 'x-request-id': rid });
    expect(res.status, res.text.slice(0, 200)).toBe(200);
    const trace = await traceLineOf(rig, rid);
    return { trace, salt: (seenBy(res.headers.get('x-prefix-router-replica')).body as { cache_salt?: string }).cache_salt, blocks: trace.blocks as string[] };
  };

  it('prefix-aware: another tenant\'s blocks are never a match (different salts), the same tenant\'s are', async () => {
    const a1 = await prefixRequest('acme', 'pfx-model');
    const b1 = await prefixRequest('initech', 'pfx-model');
    const a2 = await prefixRequest('acme', 'pfx-model');
    expect(a1.blocks.length).toBeGreaterThan(4);
    expect(a2.blocks).toEqual(a1.blocks);
    expect(b1.blocks.filter((h) => a1.blocks.includes(h))).toEqual([]);
    // The index saw acme's prompt first: initech's identical prompt matched none of it, acme's second did.
    expect(b1.trace.matchedBlocks ?? 0).toBeLessThanOrEqual(0);
    expect(a2.trace.matchedBlocks).toBeGreaterThan(0);
    expect(a1.salt).toBe(a2.salt);
    expect(b1.salt).not.toBe(a1.salt);
  });

  it('a pool with cacheSalt "shared": one salt for its tenants, and their identical prompts share blocks', async () => {
    const a = await prefixRequest('acme', 'shared-model');
    const b = await prefixRequest('initech', 'shared-model');
    expect(b.blocks).toEqual(a.blocks);
    expect(a.salt).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(b.salt).toBe(a.salt);
    expect(b.trace.matchedBlocks).toBeGreaterThan(0);
    // Still not the salt of any tenant of a salted pool.
    expect(a.salt).not.toBe((await prefixRequest('acme', 'pfx-model')).salt);
  });

  it('without CACHE_SALT_KEY: /healthz says misconfigured, salted pools refuse with a logged reason, a cacheSalt "off" pool serves', async () => {
    const mock = rig.mocks[0]!;
    const config = routerConfig({ replicas: [mock], extraPools: [{ name: 'plain', models: ['pfx-model'], strategy: 'least-load', keys: ['none'], cacheSalt: 'off', replicas: [{ id: 'x1', url: mock.url, auth: 'bearer:ORIGIN_API_KEY' }] }] });
    const bare = await startRouter({ config, secrets: { CACHE_SALT_KEY: '' } });
    try {
      const health = await fetch(`${bare.url}/healthz`);
      expect(health.status).toBe(500);
      expect(await health.json()).toEqual({ status: 'misconfigured' });
      const key = TEST_TENANTS[0]!.key;
      const call = (model: string) => fetch(`${bare.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model, max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }) });
      const salted = await call(MODEL);
      expect(salted.status).toBe(500);
      expect(((await salted.json()) as { error: { code: string } }).error.code).toBe('misconfigured');
      expect(bare.logs.some((l) => l.includes('"config_error"') && l.includes('CACHE_SALT_KEY'))).toBe(true);
      const plain = await call('pfx-model');
      expect(plain.status).toBe(200);
      expect((mock.stats().lastCompletionRequest!.body as { cache_salt?: string }).cache_salt).toBeUndefined();
    } finally {
      await bare.close();
    }
  });
});

describe('a tenant\'s cap counts sequences (item 3)', () => {
  it(`n above the tenant's cap (${LIMIT}) is a 400 naming n; an open n=${LIMIT} stream fills the cap`, async () => {
    const before = rig.completions();
    const over = await chat('limited', { n: LIMIT + 1 });
    expect(over.status).toBe(400);
    expect(JSON.parse(over.text).error).toMatchObject({ param: 'n', code: 'invalid_request' });
    expect(rig.completions()).toBe(before);

    const slow = (n: number, delayMs = 300) =>
      chat('limited', { model: 'slow-model', n }, { 'x-origin-mode': 'slow', 'x-origin-delay-ms': String(delayMs) });
    // One request of n=2 holds both of the cap's slots while the origin works on it (5 s: long
    // enough that the second is refused while it is held, however slow the machine).
    const first = slow(LIMIT, 5_000);
    await eventually(async () => expect((await rig.poolSnapshot('slow')).leases).toBe(1), { timeoutMs: 15_000 });
    const second = await slow(1);
    expect(second.status).toBe(429);
    expect(JSON.parse(second.text).error.code).toBe('tenant_limit');
    expect((await first).status).toBe(200);
    expect((await slow(1)).status).toBe(200);
    const deadline = Date.now() + 15_000;
    for (;;) {
      const r = await chat('limited');
      if (r.status === 200) break;
      if (Date.now() > deadline) throw new Error(`cap not released: ${r.status}`);
      await new Promise((x) => setTimeout(x, 100));
    }
  }, 30_000);
});

describe('revocation (item 12)', () => {
  it('a revoked key is refused at once, without a redeploy, although it is still in TENANT_KEYS and in the isolate\'s cache; nothing of its next request reaches an origin, early connect included', async () => {
    // Two admitted requests on one routing key (the tenant): the isolate remembers its replica, so
    // the next request on that key would go out early, before the coordinator answers.
    expect((await chat('revokee')).status).toBe(200);
    expect((await chat('revokee')).status).toBe(200);
    const del = await rig.router.adminFetch('/admin/tenants/revokee/keys/e2e-revokee', { method: 'DELETE' });
    expect(del.status, await del.clone().text()).toBe(200);
    expect(await del.json()).toMatchObject({ tenant: 'revokee', keyId: 'e2e-revokee', revoked: true, pools: expect.arrayContaining([POOL, 'batch', 'pfx', 'shared']) });
    // The DELETE answers once every pool's coordinator refuses the key, so the very next request is
    // refused: counted in requests, not timed (a loaded machine stretches any clock window).
    const before = rig.completions();
    // At once, on the key the isolate would guess early.
    const immediate = await chat('revokee');
    expect(immediate.status, immediate.text).toBe(401);
    let firstRefusal = -1;
    for (let i = 0; i < 20; i++) {
      const r = await chat('revokee', {}, { 'x-session-id': `after-revoke-${i}` });
      if (r.status === 401) {
        if (firstRefusal < 0) firstRefusal = i;
        expect(JSON.parse(r.text).error.code).toBe('invalid_api_key');
      } else expect(firstRefusal, 'a refused key must stay refused').toBe(-1);
    }
    expect(firstRefusal).toBe(0);
    // A sentinel from another tenant: once it is answered, anything the refused ones sent would have
    // arrived. Only the sentinel reached an origin.
    expect((await chat('globex')).status).toBe(200);
    expect(rig.completions() - before, 'requests of the revoked key that reached an origin (+ the sentinel)').toBe(1);
  });
});

describe('dashboard (item 10)', () => {
  it('every dashboard page and answer has a CSP with frame-ancestors \'none\' (and X-Frame-Options, nosniff); the script runs by nonce only', async () => {
    const pages = [
      await rig.fetchText('/dashboard', {}, 'login page'),
      await login('wrong-token-xxxxxxxxxxxx'),
      await rig.fetchText('/dashboard', { headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` } }, 'dashboard'),
      await rig.fetchText('/dashboard/data', { headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` } }, 'dashboard data'),
    ];
    for (const p of pages) {
      const csp = p.headers.get('content-security-policy') ?? '';
      expect(csp, `${p.status}`).toContain("frame-ancestors 'none'");
      expect(csp).toContain("default-src 'none'");
      expect(csp).not.toMatch(/script-src[^;]*'unsafe-inline'/);
      expect(p.headers.get('x-frame-options')).toBe('DENY');
      expect(p.headers.get('x-content-type-options')).toBe('nosniff');
    }
    const dash = pages[2]!;
    const nonce = /script-src 'nonce-([^']+)'/.exec(dash.headers.get('content-security-policy')!)![1]!;
    expect(dash.text).toContain(`<script nonce="${nonce}">`);
    expect(dash.text).not.toMatch(/<script>/);
    const again = await rig.fetchText('/dashboard', { headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` } }, 'dashboard again');
    expect(again.headers.get('content-security-policy')).not.toContain(nonce);
  });

  it('logout revokes the session on the server: the same cookie, replayed, no longer opens the dashboard', async () => {
    const ok = await login(TEST_ADMIN_TOKEN);
    expect(ok.status).toBe(303);
    const cookie = (ok.headers.get('set-cookie') ?? '').split(';')[0]!;
    expect((await rig.fetchText('/dashboard/data', { headers: { cookie } }, 'data with session')).status).toBe(200);
    const out = await rig.fetchText('/dashboard/logout', { method: 'POST', headers: { cookie }, redirect: 'manual' }, 'logout');
    expect(out.status).toBe(303);
    expect((await rig.fetchText('/dashboard/data', { headers: { cookie } }, 'data after logout')).status).toBe(401);
    expect((await rig.fetchText('/dashboard', { headers: { cookie } }, 'page after logout')).text).toContain('action="/dashboard/login"');
    // Another session is unaffected.
    const other = (((await login(TEST_ADMIN_TOKEN)).headers.get('set-cookie') ?? '').split(';')[0])!;
    expect((await rig.fetchText('/dashboard/data', { headers: { cookie: other } }, 'other session')).status).toBe(200);
  });
});

describe('leaks', () => {
  it('no response and no log line of this file holds a secret', async () => {
    await logsSettled(rig, [POOL, 'batch', 'pfx', 'slow', 'shared']);
    expect(findLeaks(rig, secretValues(rig, [rig.router.secrets.CACHE_SALT_KEY!]))).toEqual([]);
  });
});

// Last: it spends this client's failure budget (the rig's admin calls come from the same address).
describe('operator credential guessing is rate-limited per client (item 10)', () => {
  it(`after ${AUTH_FAILURES} wrong admin tokens the client gets 429 with Retry-After, even with the right token; so does the login form`, async () => {
    const admin = (token: string) => rig.fetchText('/admin/pools', { headers: { authorization: `Bearer ${token}` } }, 'admin guess');
    // No credential at all costs nothing.
    for (let i = 0; i < AUTH_FAILURES + 2; i++) expect((await rig.fetchText('/admin/pools', {}, 'no credential')).status).toBe(401);
    expect((await admin(TEST_ADMIN_TOKEN)).status).toBe(200);
    const statuses: number[] = [];
    for (let i = 0; i < AUTH_FAILURES + 3; i++) statuses.push((await admin(`guess-${i}-${rnd()}`)).status);
    expect(statuses).toEqual([...Array(AUTH_FAILURES).fill(401), 429, 429, 429]);
    const right = await admin(TEST_ADMIN_TOKEN);
    expect(right.status).toBe(429);
    expect(Number(right.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(JSON.parse(right.text).error.code).toBe('auth_rate_limited');
    // /metrics and the dashboard's bearer share the admin budget.
    expect((await rig.fetchText('/metrics', { headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` } }, 'metrics when limited')).status).toBe(429);

    // The login form has its own budget (one wrong login was spent by the CSP test above).
    const logins: number[] = [];
    for (let i = 0; i < AUTH_FAILURES + 2; i++) logins.push((await login(`wrong-${i}-${rnd()}`)).status);
    const wrong = logins.filter((s) => s === 401).length;
    expect(logins).toEqual([...Array(wrong).fill(401), ...Array(logins.length - wrong).fill(429)]);
    expect(wrong).toBeGreaterThanOrEqual(AUTH_FAILURES - 1);
    expect(wrong).toBeLessThanOrEqual(AUTH_FAILURES);
    expect((await login(TEST_ADMIN_TOKEN)).status).toBe(429);
  });
});
