// Abuse suite, tenant isolation: a tenant cannot become another tenant or reach another tenant's
// pool through headers (x-pool, x-tenant-id, x-api-key, forwarded, cookie...), and none of those
// headers reach the origin; a flood of wrong keys is 401 after 401; a tenant over its in-flight
// limit gets 429 with Retry-After while other tenants are still served, and everything is released
// afterwards. Router under Miniflare on loopback, three mock replicas with slow decode.

import { randomBytes } from 'node:crypto';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { FORWARDED_REQUEST_HEADERS } from '../../../src/proxy/upstream-request.js';
import { TEST_ADMIN_TOKEN, TEST_ORIGIN_API_KEY, TEST_TENANTS, type TestTenant } from '../../helpers/router.js';
import { findLeaks, logsSettled, MODEL, OTHER_MODEL, OTHER_POOL, POOL, secretValues, startRig, traceLineOf, waitHealthy, type Rig } from '../../helpers/security-rig.js';

const rnd = () => randomBytes(9).toString('base64url');
const LIMIT = 2;
const TENANTS: TestTenant[] = [
  ...TEST_TENANTS,
  // May choose a pool with x-pool, but only among its own (chat).
  { key: `sk-e2e-initech-${rnd()}`, tenant: 'initech', keyId: 'e2e-initech', pools: [POOL], allowPoolHeader: true },
  { key: `sk-e2e-limited-${rnd()}`, tenant: 'limited', keyId: 'e2e-limited', pools: [POOL], maxInFlight: LIMIT },
];
const DECODE_MS = 25;

let rig: Rig;

beforeAll(async () => {
  rig = await startRig({ mocks: 3, tenants: TENANTS, mockOptions: { decodeMsPerToken: DECODE_MS, maxRunning: 64 } });
  await waitHealthy(rig);
});

afterAll(async () => {
  await rig?.close();
});

const chatBody = (model = MODEL, maxTokens = 2, stream = false) => JSON.stringify({ model, max_tokens: maxTokens, stream, messages: [{ role: 'user', content: 'hello there' }] });

function post(tenant: string, headers: Record<string, string> = {}, body = chatBody(), where?: string) {
  return rig.fetchText('/v1/chat/completions', { method: 'POST', headers: { authorization: `Bearer ${rig.keyOf(tenant)}`, 'content-type': 'application/json', ...headers }, body }, where ?? `${tenant} ${JSON.stringify(headers).slice(0, 80)}`);
}

describe('a tenant cannot pick another tenant or its pool', () => {
  it('x-pool and model choices outside the tenant\'s pools: 403/404, nothing forwarded', async () => {
    const acmeKey = rig.keyOf('acme');
    const cases: [string, string, Record<string, string>, string, number][] = [
      ['x-pool from a tenant without the permission', 'globex', { 'x-pool': POOL }, MODEL, 403],
      ['x-pool naming the other pool, no permission', 'globex', { 'x-pool': OTHER_POOL }, OTHER_MODEL, 403],
      ['x-pool naming a pool the tenant may not use', 'initech', { 'x-pool': OTHER_POOL }, OTHER_MODEL, 403],
      ['x-pool naming a pool that does not serve the model', 'initech', { 'x-pool': OTHER_POOL }, MODEL, 404],
      ['x-pool naming no pool', 'initech', { 'x-pool': 'nope' }, MODEL, 404],
      ['x-pool with a path', 'initech', { 'x-pool': `../${OTHER_POOL}` }, MODEL, 404],
      ['x-pool in upper case', 'initech', { 'x-pool': OTHER_POOL.toUpperCase() }, OTHER_MODEL, 404],
      ['model of a pool the tenant may not use', 'globex', {}, OTHER_MODEL, 404],
      ['... with x-tenant-id: acme', 'globex', { 'x-tenant-id': 'acme' }, OTHER_MODEL, 404],
      ['... with x-tenant: acme', 'globex', { 'x-tenant': 'acme' }, OTHER_MODEL, 404],
      ['... with acme\'s key in x-api-key', 'globex', { 'x-api-key': acmeKey }, OTHER_MODEL, 404],
      ['... with acme\'s key in api-key', 'globex', { 'api-key': acmeKey }, OTHER_MODEL, 404],
      ['... with forwarded naming acme', 'globex', { forwarded: 'for=10.0.0.1;by=acme;host=acme', 'x-forwarded-user': 'acme' }, OTHER_MODEL, 404],
      ['... with a cookie holding acme\'s id and key', 'globex', { cookie: `tenant=acme; api_key=${acmeKey}` }, OTHER_MODEL, 404],
      ['... with acme\'s key in proxy-authorization', 'globex', { 'proxy-authorization': `Bearer ${acmeKey}` }, OTHER_MODEL, 404],
      ['x-pool plus x-tenant-id: acme', 'globex', { 'x-pool': OTHER_POOL, 'x-tenant-id': 'acme' }, OTHER_MODEL, 403],
    ];
    const before = rig.completions();
    const unknown = await post('globex', {}, chatBody('no-such-model'), 'unknown model');
    expect(unknown.status).toBe(404);
    const problems: string[] = [];
    for (const [name, tenant, headers, model, status] of cases) {
      const res = await post(tenant, headers, chatBody(model), name);
      if (res.status !== status) problems.push(`${name}: ${res.status} ${res.text.slice(0, 160)}`);
      // A pool the tenant may not use looks exactly like an unknown model: nothing about other tenants' pools leaks.
      if (status === 404 && !headers['x-pool'] && res.text.replace(model, 'M') !== unknown.text.replace('no-such-model', 'M')) problems.push(`${name}: differs from an unknown model: ${res.text}`);
    }
    expect(problems).toEqual([]);
    expect(rig.completions()).toBe(before);
  });

  it('headers claiming another tenant change neither the tenant nor the routing key, and none reaches the origin', async () => {
    const acmeKey = rig.keyOf('acme');
    const plain = await post('globex', {}, chatBody(), 'globex plain');
    expect(plain.status).toBe(200);
    const plainTrace = await traceLineOf(rig, plain.headers.get('x-request-id')!);
    const acme = await post('acme', {}, chatBody(), 'acme plain');
    const acmeTrace = await traceLineOf(rig, acme.headers.get('x-request-id')!);
    expect(acmeTrace.keyHash).not.toBe(plainTrace.keyHash);

    const spoof: Record<string, string> = {
      'x-tenant-id': 'acme',
      'x-tenant': 'acme',
      'x-api-key': acmeKey,
      'api-key': acmeKey,
      forwarded: 'for=10.0.0.1;by=acme',
      'x-forwarded-for': '10.0.0.1',
      'x-real-ip': '10.0.0.1',
      'x-forwarded-user': 'acme',
      'x-auth-request-user': 'acme',
      'cf-access-authenticated-user-email': 'admin@acme.example',
      'openai-organization': 'acme',
      'proxy-authorization': `Bearer ${acmeKey}`,
      cookie: `tenant=acme; api_key=${acmeKey}; prefix_router_session=s2.9999999999999.${'a'.repeat(32)}.${'0'.repeat(64)}`,
      'x-pool-override': OTHER_POOL,
    };
    // One request with everything at once, then one per header.
    const sets = [spoof, ...Object.entries(spoof).map(([k, v]) => ({ [k]: v }))];
    // What the runtime adds to an outbound fetch on its own, besides the allowlist and origin auth.
    const allowed = new Set([...FORWARDED_REQUEST_HEADERS, 'authorization', 'host', 'content-length', 'cf-worker', 'accept-encoding', 'connection', 'x-request-id', 'x-client-request-id']);
    for (const headers of sets) {
      const label = Object.keys(headers).length > 1 ? 'all spoof headers' : Object.keys(headers)[0]!;
      const res = await post('globex', headers, chatBody(), `spoof ${label}`);
      expect(res.status, label).toBe(200);
      const trace = await traceLineOf(rig, res.headers.get('x-request-id')!);
      expect(trace.tenant, label).toBe('globex');
      expect(trace.keyHash, label).toBe(plainTrace.keyHash);
      const seen = rig.mocks.find((m) => m.id === res.headers.get('x-prefix-router-replica'))!.stats().lastCompletionRequest!;
      const names = Object.keys(seen.headers);
      expect(names.filter((n) => !allowed.has(n)), label).toEqual([]);
      expect(seen.headers.authorization, label).toBe(`Bearer ${TEST_ORIGIN_API_KEY}`);
      const upstream = JSON.stringify(seen);
      for (const s of [acmeKey, rig.keyOf('globex'), TEST_ADMIN_TOKEN, '10.0.0.1', 'acme']) expect(upstream.includes(s), `${label}: origin saw ${s.slice(0, 12)}`).toBe(false);
    }
  });

  it('Host and X-Forwarded-Host aimed at the metadata address do not steer the upstream: only the pool\'s replicas are called', async () => {
    const before = rig.mocks.map((m) => m.stats().completionRequestsTotal);
    const res = await rig.send(
      { headers: [['Authorization', `Bearer ${rig.keyOf('globex')}`], ['Content-Type', 'application/json'], ['X-Forwarded-Host', '169.254.169.254']], body: chatBody() },
      'x-forwarded-host',
    );
    expect(res.status).toBe(200);
    const hostRes = await rig.send({ raw: `POST /v1/chat/completions HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\nAuthorization: Bearer ${rig.keyOf('globex')}\r\nContent-Type: application/json\r\nContent-Length: ${chatBody().length}\r\n\r\n${chatBody()}` }, 'host header');
    expect(hostRes.status).toBe(200);
    const after = rig.mocks.map((m) => m.stats().completionRequestsTotal);
    expect(after.reduce((a, b) => a + b, 0) - before.reduce((a, b) => a + b, 0)).toBe(2);
  });
});

describe('wrong keys', () => {
  it('200 wrong keys in a row: each a 401, never a 5xx, nothing forwarded; a right key still works', async () => {
    const acmeKey = rig.keyOf('acme');
    const shapes = (i: number): string => {
      switch (i % 8) {
        case 0: return `sk-wrong-${i}-${rnd()}`;
        case 1: {
          // The last character changed (never to itself: that would be the right key).
          const c = String.fromCharCode(48 + (i % 10));
          return acmeKey.slice(0, -1) + (acmeKey.endsWith(c) ? '_' + c : c);
        }
        case 2: return acmeKey + i;
        case 3: return 'x'.repeat(1 + (i % 512));
        case 4: return TEST_ORIGIN_API_KEY + i;
        case 5: return TEST_ADMIN_TOKEN.slice(0, 8 + (i % 8));
        case 6: return acmeKey.toUpperCase();
        default: return `Bearer ${acmeKey}`; // "Bearer Bearer <key>"
      }
    };
    const before = rig.completions();
    const statuses = new Map<number, number>();
    const batch = 20;
    for (let start = 0; start < 200; start += batch) {
      const res = await Promise.all(
        Array.from({ length: batch }, (_, j) =>
          rig.fetchText('/v1/chat/completions', { method: 'POST', headers: { authorization: `Bearer ${shapes(start + j)}`, 'content-type': 'application/json' }, body: chatBody() }, `wrong key ${start + j}`),
        ),
      );
      for (const r of res) {
        statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
        expect(r.headers.get('www-authenticate'), `${r.status} ${[...r.headers].join(' ')} ${r.text.slice(0, 200)}`).toBe('Bearer');
        expect(JSON.parse(r.text).error.code).toMatch(/^(invalid_api_key|missing_api_key)$/);
      }
    }
    expect([...statuses]).toEqual([[401, 200]]);
    expect(rig.completions()).toBe(before);
    expect((await post('acme')).status).toBe(200);
  });
});

describe('per-tenant in-flight limit', () => {
  it(`a tenant with maxInFlight ${LIMIT} running ${LIMIT + 3} slow streams gets exactly 3 × 429 with Retry-After; another tenant is still served; all released afterwards`, async () => {
    // ~5 s of decode each: the admitted streams still hold their slots through the refusals and the
    // snapshot below even when a loaded machine is slow to send and answer them.
    const maxTokens = 200;
    const before = rig.completions();
    const open = await Promise.all(
      Array.from({ length: LIMIT + 3 }, (_, i) =>
        fetch(`${rig.router.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${rig.keyOf('limited')}`, 'content-type': 'application/json', 'x-session-id': `limited-${i}` },
          body: chatBody(MODEL, maxTokens, true),
          signal: AbortSignal.timeout(30_000),
        }),
      ),
    );
    const ok = open.filter((r) => r.status === 200);
    const limited = open.filter((r) => r.status === 429);
    expect(open.map((r) => r.status).sort()).toEqual([...Array(LIMIT).fill(200), 429, 429, 429]);
    for (const r of limited) {
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      const body = (await r.json()) as { error: { code: string; type: string } };
      expect(body.error).toMatchObject({ code: 'tenant_limit', type: 'rate_limit_error' });
    }
    // Only the admitted streams reached a replica.
    expect(rig.completions() - before).toBe(LIMIT);

    // While the limited tenant holds its slots, others are served (one tenant cannot take the pool).
    const snapDuring = await rig.poolSnapshot();
    expect(snapDuring.replicas.reduce((s, r) => s + r.inFlight, 0)).toBe(LIMIT);
    const others = await Promise.all([post('acme'), post('globex'), post('initech'), post('acme', { 'x-session-id': 'other-1' })]);
    expect(others.map((r) => r.status)).toEqual([200, 200, 200, 200]);

    // The admitted streams run to the end.
    const texts = await Promise.all(ok.map((r) => r.text()));
    for (const t of texts) expect(t).toContain('data: [DONE]');

    const deadline = Date.now() + 15_000;
    for (;;) {
      const snap = await rig.poolSnapshot();
      if (snap.leases === 0 && snap.replicas.every((r) => r.inFlight === 0)) break;
      if (Date.now() > deadline) throw new Error(`not released: ${JSON.stringify(snap.replicas.map((r) => [r.id, r.inFlight]))}, leases ${snap.leases}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    // The tenant's own count is back to 0 too: it gets its full allowance again.
    const again = await Promise.all(Array.from({ length: LIMIT }, () => post('limited', {}, chatBody(MODEL, 2))));
    expect(again.map((r) => r.status)).toEqual(Array(LIMIT).fill(200));

    const traces = rig.router.traceLines().filter((t) => t.tenant === 'limited');
    expect(traces.filter((t) => t.status === 429 && t.error === 'tenant_limit').length).toBe(3);
  });
});

describe('leaks', () => {
  it('no response and no log line of this file holds a secret', async () => {
    await logsSettled(rig);
    expect(findLeaks(rig, secretValues(rig))).toEqual([]);
  });
});
