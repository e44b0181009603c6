// Abuse suite, secrets: replays every hostile case of hostile-cases.ts plus ordinary traffic, admin,
// metrics and dashboard calls, and checks that no response body, no response header and no worker
// log line ever holds an origin credential, a tenant key, the admin token or the metrics token.
// Replicas whose auth references a secret with an invalid header value (CR/LF, a bad header name,
// broken JSON) must fail without the secret showing up in the error, the snapshot or the logs.

import { randomBytes } from 'node:crypto';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../../tools/mock-engine/index.js';
import { TEST_ADMIN_TOKEN, TEST_ORIGIN_API_KEY } from '../../helpers/router.js';
import { hostileCases, judge } from './hostile-cases.js';
import { findLeaks, logsSettled, MODEL, POOL, secretValues, startRig, waitHealthy, type Rig } from '../../helpers/security-rig.js';

const rnd = () => randomBytes(9).toString('base64url');
const BODY_TIMEOUT_MS = 1_500;
const MARK = { bearer: `leak-bearer-${rnd()}`, value: `leak-value-${rnd()}`, name: `leak-name-${rnd()}`, json: `leak-json-${rnd()}`, metrics: `metrics-token-${rnd()}` };
const BAD_SECRETS = {
  // A bearer token with a header injection in it.
  BAD_BEARER: `${MARK.bearer}\r\nX-Evil: ${MARK.bearer}`,
  // A valid header carrying the real origin key next to one whose value has a line break inside it
  // (surrounding whitespace, like the newline `echo` leaves, is trimmed and would be harmless).
  BAD_HEADER_VALUE: JSON.stringify({ 'x-origin-key': TEST_ORIGIN_API_KEY, 'x-api-key': `${MARK.value}\r\nX-Evil: ${MARK.value}` }),
  BAD_HEADER_NAME: JSON.stringify({ [`x-key ${MARK.name}`]: 'v' }),
  BAD_JSON: `{"x-api-key": "${MARK.json}"`,
};
const BAD_MODEL = 'bad-auth-model';

let rig: Rig;
/** The bad-auth replicas' address: it must never receive anything. */
let spare: MockVllm;

beforeAll(async () => {
  spare = await startMockVllm({ id: 'spare', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: [BAD_MODEL] });
  rig = await startRig({
    mocks: 3,
    overrides: { bodyTimeoutMs: BODY_TIMEOUT_MS },
    secrets: { ...BAD_SECRETS, METRICS_TOKEN: MARK.metrics, SPARE_ORIGIN_KEY: `spare-origin-${rnd()}` },
    extraPools: [
      {
        name: 'badauth',
        models: [BAD_MODEL],
        strategy: 'least-load',
        fallback: 'round-robin',
        keys: ['none'],
        // Keep every replica in rotation so the proxy itself meets the bad secrets (not only the health checks).
        healthIntervalMs: 300,
        fall: 1_000,
        maxFails: 1_000,
        replicas: Object.keys(BAD_SECRETS).map((name, i) => ({ id: `bad${i + 1}`, url: spare.url, auth: `${name === 'BAD_BEARER' ? 'bearer' : 'headers'}:${name}` })),
      },
    ],
  });
  await waitHealthy(rig);
});

afterAll(async () => {
  await rig?.close();
  await spare?.close();
});

function allSecrets(): string[] {
  return secretValues(rig, [...Object.values(MARK), ...Object.values(BAD_SECRETS), rig.router.secrets.CACHE_SALT_KEY!, rig.router.secrets.SPARE_ORIGIN_KEY!]);
}

const chat = (key: string, model = MODEL, extra: Record<string, string> = {}, stream = false) =>
  rig.fetchText('/v1/chat/completions', {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...extra },
    body: JSON.stringify({ model, max_tokens: 4, stream, messages: [{ role: 'user', content: 'hello' }] }),
  }, `chat ${model}${stream ? ' stream' : ''}`);

describe('secrets', () => {
  it('replicas whose auth secret holds an invalid header value: a 502, and the secret shows up nowhere', async () => {
    for (let i = 0; i < 8; i++) {
      const res = await chat(rig.keyOf('acme'), BAD_MODEL);
      expect(res.status).toBe(502);
      expect(JSON.parse(res.text).error.code).toBe('upstream_unavailable');
    }
    // Nothing half-built went out: not a request, not a health check.
    expect(spare.stats().requestsTotal).toBe(0);
    // The operator is told which secret is wrong, by name (each request tries three of the four).
    const deadline = Date.now() + 15_000;
    for (;;) {
      const authLines = rig.router.logs.filter((l) => l.includes('"origin_auth"'));
      const named = Object.keys(BAD_SECRETS).filter((name) => authLines.some((l) => l.includes(`secret ${name} `)));
      if (named.length === Object.keys(BAD_SECRETS).length) break;
      if (Date.now() > deadline) throw new Error(`log lines name only ${named.join(', ')}:\n${authLines.join('\n')}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    // The health checks' view of them, through every operator surface.
    const until = Date.now() + 15_000;
    for (;;) {
      const snap = await rig.fetchText('/admin/pools/badauth', { headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` } }, 'badauth snapshot');
      expect(snap.status).toBe(200);
      const errors = (JSON.parse(snap.text) as { replicas: { lastCheckError: string | null }[] }).replicas.map((r) => r.lastCheckError);
      if (errors.every((e) => typeof e === 'string' && e.includes('secret BAD_'))) break;
      if (Date.now() > until) throw new Error(`health checks did not report the bad secrets: ${JSON.stringify(errors)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    await rig.fetchText('/metrics', { headers: { authorization: `Bearer ${MARK.metrics}` } }, 'metrics');
    await rig.fetchText('/dashboard/data', { headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}` } }, 'dashboard data');
    expect(findLeaks(rig, allSecrets())).toEqual([]);
  });

  it('the scanner itself finds a canary in an answer body, a header and a log line', async () => {
    const canary = `canary-${rnd()}`;
    // The 404 message quotes the path, and x-request-id is echoed and logged: harmless here, but it
    // proves the scan reads what it claims to read.
    await rig.fetchText(`/nope/${canary}`, {}, 'canary path');
    await chat(rig.keyOf('acme'), MODEL, { 'x-request-id': `${canary}-rid` });
    const deadline = Date.now() + 15_000;
    let leaks: string[] = [];
    while (Date.now() < deadline) {
      leaks = findLeaks(rig, [canary]);
      if (leaks.some((l) => l.startsWith('log line'))) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(leaks.some((l) => l.includes('canary path'))).toBe(true);
    expect(leaks.some((l) => l.startsWith('response to chat'))).toBe(true);
    expect(leaks.some((l) => l.startsWith('log line'))).toBe(true);
  });

  it('an admin cannot point a replica\'s auth at the router\'s own secrets', async () => {
    for (const name of ['ADMIN_TOKEN', 'METRICS_TOKEN', 'TENANT_KEYS']) {
      const res = await rig.fetchText(`/admin/pools/${POOL}/replicas/exfil`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${TEST_ADMIN_TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ url: spare.url, auth: `bearer:${name}` }),
      }, `exfil ${name}`);
      expect(res.status, name).toBe(400);
    }
    expect((await rig.replicaSet()).some((r) => r.includes('exfil'))).toBe(false);
  });

  it('the whole suite\'s traffic (every hostile case, ordinary and operator requests): no secret in any answer, header or log line', async () => {
    const acme = rig.keyOf('acme');
    const globex = rig.keyOf('globex');
    const cases = hostileCases({ acmeKey: acme, globexKey: globex, adminToken: TEST_ADMIN_TOKEN, originKey: TEST_ORIGIN_API_KEY, bodyTimeoutMs: BODY_TIMEOUT_MS, routerPort: rig.port });
    const problems: string[] = [];
    const before = rig.completions();
    const slow = cases.filter((c) => c.withinMs);
    const slowDone = Promise.all(slow.map(async (c) => problems.push(...judge(c, await rig.send(c.request, `${c.category} / ${c.name}`)))));
    for (const c of cases.filter((x) => !x.withinMs)) problems.push(...judge(c, await rig.send(c.request, `${c.category} / ${c.name}`)));
    await slowDone;
    expect(problems).toEqual([]);
    expect(rig.completions()).toBe(before);

    // Ordinary traffic and the operator surfaces, so their answers and log lines are scanned too.
    expect((await chat(acme)).status).toBe(200);
    expect((await chat(globex, MODEL, { 'x-session-id': 's-1' }, true)).status).toBe(200);
    expect((await chat(globex, MODEL, { 'x-api-key': acme, 'x-tenant-id': 'acme', cookie: `k=${acme}` })).status).toBe(200);
    expect((await rig.fetchText('/v1/completions', { method: 'POST', headers: { authorization: `Bearer ${acme}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'once', max_tokens: 2 }) })).status).toBe(200);
    expect((await rig.fetchText('/v1/models', { headers: { authorization: `Bearer ${globex}` } })).status).toBe(200);
    for (let i = 0; i < 20; i++) expect((await chat(`${acme.slice(0, -2)}${i}`)).status).toBe(401);
    const admin = { authorization: `Bearer ${TEST_ADMIN_TOKEN}` };
    for (const p of ['/admin/pools', `/admin/pools/${POOL}`, '/admin/pools/badauth', '/metrics', '/dashboard', '/dashboard/data', '/healthz']) {
      expect((await rig.fetchText(p, { headers: admin }, `GET ${p}`)).status, p).toBe(200);
    }
    expect((await rig.fetchText('/metrics', { headers: { authorization: `Bearer ${MARK.metrics}` } }, 'metrics token')).status).toBe(200);
    const form = { 'content-type': 'application/x-www-form-urlencoded' };
    expect((await rig.fetchText('/dashboard/login', { method: 'POST', headers: form, body: `token=${encodeURIComponent(TEST_ADMIN_TOKEN)}x`, redirect: 'manual' }, 'login wrong')).status).toBe(401);
    const login = await rig.fetchText('/dashboard/login', { method: 'POST', headers: form, body: `token=${encodeURIComponent(TEST_ADMIN_TOKEN)}`, redirect: 'manual' }, 'login right');
    expect(login.status).toBe(303);
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0]!;
    expect(cookie).toMatch(/^prefix_router_session=s2\./);
    expect((await rig.fetchText('/dashboard/data', { headers: { cookie } }, 'dashboard data (cookie)')).status).toBe(200);
    // Replicas with bad auth secrets, once more, through the proxy.
    expect((await chat(acme, BAD_MODEL)).status).toBe(502);
    expect(spare.stats().requestsTotal).toBe(0);

    await logsSettled(rig, [POOL, 'batch', 'badauth']);
    console.info(`scanned ${rig.seen.length} answers and ${rig.router.logs.length} log lines for ${allSecrets().length} secrets`);
    expect(rig.seen.length).toBeGreaterThan(cases.length + 30);
    expect(findLeaks(rig, allSecrets())).toEqual([]);
  });
});
