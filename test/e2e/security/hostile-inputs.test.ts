// Abuse suite, hostile inputs: the table in hostile-cases.ts (malformed and deep JSON, huge numbers
// and bodies, invalid UTF-8, header injection, oversized headers, stalled bodies, admin path and
// replica-URL tricks, misplaced credentials, wrong methods and paths) against the real router under
// Miniflare on loopback with three mock replicas. Every case: the listed 4xx, never a 5xx, nothing
// forwarded (the mocks' completion counter does not move), no pool changed by an admin case.
// Also what the runtime itself does with CR/LF and broken framing. Only 127.0.0.1; bounded waits.

import { createHmac } from 'node:crypto';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { TEST_ADMIN_TOKEN, TEST_CACHE_SALT_KEY, TEST_ORIGIN_API_KEY } from '../../helpers/router.js';
import { hostileCases, judge, type HostileCase } from './hostile-cases.js';
import { findLeaks, logsSettled, MODEL, secretValues, startRig, waitHealthy, type Rig } from '../../helpers/security-rig.js';

const BODY_TIMEOUT_MS = 1_500;

let rig: Rig;
let cases: HostileCase[];

beforeAll(async () => {
  // SPARE_ORIGIN_KEY exists but no pool declares it: an admin PUT naming it must be refused.
  rig = await startRig({ mocks: 3, overrides: { bodyTimeoutMs: BODY_TIMEOUT_MS }, secrets: { SPARE_ORIGIN_KEY: `spare-origin-${Date.now()}-0123456789` } });
  await waitHealthy(rig);
  cases = hostileCases({ acmeKey: rig.keyOf('acme'), globexKey: rig.keyOf('globex'), adminToken: TEST_ADMIN_TOKEN, originKey: TEST_ORIGIN_API_KEY, bodyTimeoutMs: BODY_TIMEOUT_MS, routerPort: rig.port });
});

afterAll(async () => {
  await rig?.close();
});

const ok = (key: string, extra: [string, string][] = [], body = `{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`) => ({
  headers: [['Authorization', `Bearer ${key}`], ['Content-Type', 'application/json'], ...extra] as [string, string][],
  body,
});

describe('hostile inputs', () => {
  it('the table has at least 60 cases, in every category', () => {
    const byCategory = new Map<string, number>();
    for (const c of cases) byCategory.set(c.category, (byCategory.get(c.category) ?? 0) + 1);
    console.info(`hostile cases: ${cases.length} — ${[...byCategory].map(([k, n]) => `${k} ${n}`).join(', ')}`);
    expect(cases.length).toBeGreaterThanOrEqual(60);
    expect(new Set(cases.map((c) => `${c.category} / ${c.name}`)).size).toBe(cases.length);
    expect(cases.filter((c) => c.expect.some((s) => s < 400 || s >= 500)).map((c) => c.name)).toEqual([]);
  });

  it('every fast case: the listed 4xx, nothing forwarded, admin cases leave every pool as it was', async () => {
    const problems: string[] = [];
    let ran = 0;
    for (const c of cases.filter((x) => !x.withinMs)) {
      const before = rig.completions();
      const replicasBefore = c.admin ? await rig.replicaSet() : null;
      const res = await rig.send(c.request, `${c.category} / ${c.name}`);
      problems.push(...judge(c, res));
      if (rig.completions() !== before) problems.push(`${c.category} / ${c.name}: forwarded to a replica`);
      if (replicasBefore) {
        const after = await rig.replicaSet();
        if (JSON.stringify(after) !== JSON.stringify(replicasBefore)) problems.push(`${c.category} / ${c.name}: replicas changed: ${after.join(' ')}`);
      }
      ran++;
    }
    expect(problems).toEqual([]);
    expect(ran).toBeGreaterThanOrEqual(60);
  });

  it(`stalled and trickling bodies: 408 within bodyTimeoutMs (${BODY_TIMEOUT_MS} ms), never a 500, nothing forwarded`, async () => {
    const slow = cases.filter((x) => x.withinMs);
    expect(slow.length).toBeGreaterThanOrEqual(5);
    const before = rig.completions();
    const replicasBefore = await rig.replicaSet();
    const answers = await Promise.all(slow.map((c) => rig.send(c.request, `${c.category} / ${c.name}`)));
    const problems = slow.flatMap((c, i) => judge(c, answers[i]!));
    expect(problems).toEqual([]);
    expect(rig.completions()).toBe(before);
    expect(await rig.replicaSet()).toEqual(replicasBefore);
  });

  it('controls: the same router serves the harmless versions (BOM + JSON, 64 levels, duplicate keys resolve to the validated value)', async () => {
    const key = rig.keyOf('acme');
    const serve = async (name: string, r: { headers: [string, string][]; body: string | Uint8Array }) => {
      const res = await rig.send(r, `control: ${name}`);
      expect(res.status, `${name}: ${res.body.slice(0, 200)}`).toBe(200);
      return rig.mocks.find((m) => m.id === res.headers['x-prefix-router-replica'])!.stats().lastCompletionRequest!;
    };
    await serve('plain', ok(key));
    await serve('UTF-8 BOM then JSON (the decoder drops the BOM)', { ...ok(key), body: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(ok(key).body)]) });
    await serve('64 levels', ok(key, [], `{"model":"${MODEL}","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"x":${'['.repeat(63)}1${']'.repeat(63)}}`));
    await serve('brackets inside strings do not count', ok(key, [], `{"model":"${MODEL}","max_tokens":1,"messages":[{"role":"user","content":"${'[{'.repeat(5000)}\\"]"}]}`));
    // Duplicate keys: JSON.parse keeps the last; the router forwards what it re-serialised, so the
    // origin sees exactly the value that was checked (a parser differential cannot pick another pool).
    const globex = rig.keyOf('globex');
    const seen = await serve('duplicate "model"', ok(globex, [], `{"model":"batch-model","model":"${MODEL}","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`));
    expect((seen.body as { model: string }).model).toBe(MODEL);
  });

  it('CR or LF alone inside a header value: the runtime splits the line (no 400), and the extra line never reaches the origin as a header', async () => {
    // workerd's HTTP parser ends a header line at a bare LF and at a bare CR, so `X-Session-Id:
    // abc<LF>X-Evil: 1` is two headers by the time the Worker sees it; the router cannot tell it from
    // a client that sent two lines. Obs-fold is unfolded to spaces; whitespace before the colon is
    // accepted. What must hold: no injected header reaches the origin, and no CR/LF in a value does.
    const key = rig.keyOf('acme');
    const variants: [string, [string, string][]][] = [
      ['bare LF', [['X-Session-Id', 'lf-abc\nX-Evil: 1']]],
      ['bare CR', [['X-Session-Id', 'cr-abc\rX-Evil: 1']]],
      ['obs-fold', [['X-Session-Id', 'fold-abc\r\n X-Evil: 1']]],
      ['LF in traceparent', [['X-Session-Id', 'auth-lf'], ['Traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\nX-Evil: 1']]],
      ['space before the colon', [['X-Session-Id ', 'space-abc'], ['X-Evil ', '1']]],
    ];
    const outcomes: string[] = [];
    for (const [name, extra] of variants) {
      const before = rig.completions();
      const res = await rig.send(ok(key, extra), `CR/LF: ${name}`);
      outcomes.push(`${name} → ${res.status}`);
      expect([200, 400], name).toContain(res.status);
      if (res.status !== 200) {
        expect(rig.completions(), name).toBe(before);
        continue;
      }
      const seen = rig.mocks.find((m) => m.id === res.headers['x-prefix-router-replica'])!.stats().lastCompletionRequest!;
      expect(seen.headers['x-evil'], name).toBeUndefined();
      for (const [h, v] of Object.entries(seen.headers)) expect(String(v), `${name}: upstream header ${h}`).not.toMatch(/[\r\n\0]/);
      expect(seen.headers.authorization, name).toBe(`Bearer ${TEST_ORIGIN_API_KEY}`);
    }
    console.info(`runtime answers to CR/LF tricks: ${outcomes.join('; ')}`);
  });

  it('percent-encoded CR/LF in x-session-id is just a string: it reaches the origin only as its per-tenant HMAC, one header', async () => {
    const value = 'pct%0d%0aX-Evil:%201%0aSet-Cookie:%20a=b';
    const res = await rig.fetchText('/v1/chat/completions', { method: 'POST', ...{ headers: { authorization: `Bearer ${rig.keyOf('acme')}`, 'content-type': 'application/json', 'x-session-id': value } }, body: ok('').body });
    expect(res.status).toBe(200);
    const seen = rig.mocks.find((m) => m.id === res.headers.get('x-prefix-router-replica'))!.stats().lastCompletionRequest!;
    // Issue #26 item 4: the raw session id never goes upstream.
    expect(seen.headers['x-session-id']).toBe(createHmac('sha256', TEST_CACHE_SALT_KEY).update(`session\u0000acme\u0000${value}`).digest('base64url'));
    expect(seen.headers['x-evil']).toBeUndefined();
    expect(seen.headers['set-cookie']).toBeUndefined();
    expect(res.headers.get('set-cookie')).toBeNull();
  });

  it('framing the runtime refuses before the Worker runs: nothing forwarded, and no 5xx is the router\'s', async () => {
    // Measured on workerd 1.20260426: an invalid Content-Length (`abc`, `-1`, `+81`, two different
    // values), a Transfer-Encoding other than chunked, or an absolute-form target or a CONNECT make kj throw
    // ("Uncaught exception" in the log) and answer a plain-text 500 without calling the Worker; an
    // unknown method is a 501. Cloudflare's edge answers these with a 400 before any Worker runs.
    const key = rig.keyOf('acme');
    const body = ok(key).body;
    const framing: [string, Parameters<Rig['send']>[0]][] = [
      ['Content-Length: abc', { headers: [...ok(key).headers, ['Content-Length', 'abc']], body, contentLength: false }],
      ['Content-Length: -1', { headers: [...ok(key).headers, ['Content-Length', '-1']], body, contentLength: false }],
      ['Content-Length: +81', { headers: [...ok(key).headers, ['Content-Length', `+${body.length}`]], body, contentLength: false }],
      ['two different Content-Lengths', { headers: [...ok(key).headers, ['Content-Length', String(body.length)], ['Content-Length', String(body.length + 1)]], body, contentLength: false }],
      ['Transfer-Encoding: gzip, chunked', { headers: [...ok(key).headers, ['Transfer-Encoding', 'gzip, chunked']], body: '0\r\n\r\n' }],
      ['Transfer-Encoding: identity', { headers: [...ok(key).headers, ['Transfer-Encoding', 'identity']], body }],
      ['invalid chunk size', { headers: [...ok(key).headers, ['Transfer-Encoding', 'chunked']], body: 'zz\r\nabc\r\n0\r\n\r\n' }],
      ['absolute-form target', { ...ok(key), path: 'http://evil.example/v1/chat/completions' }],
      ['CONNECT', { method: 'CONNECT', path: '127.0.0.1:80', headers: ok(key).headers }],
      ['unknown method', { raw: 'HELLO / HTTP/1.1\r\nHost: x\r\n\r\n' }],
      ['not HTTP at all', { raw: '\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage-tls-hello\r\n\r\n' }],
    ];
    const before = rig.completions();
    const seen: string[] = [];
    for (const [name, r] of framing) {
      const res = await rig.send(r, `framing: ${name}`);
      seen.push(`${name} → ${res.status || 'closed'}`);
      if (res.status >= 500) {
        // Not the router's: its answers are JSON and carry x-request-id.
        expect(res.headers['x-request-id'], name).toBeUndefined();
        expect(res.headers['content-type'] ?? '', name).not.toContain('json');
      } else if (res.status !== 0) {
        expect(res.status, name).toBeGreaterThanOrEqual(400);
      }
    }
    console.info(`runtime answers to broken framing: ${seen.join('; ')}`);
    expect(rig.completions()).toBe(before);
  });

  it('no response and no log line of this file holds a secret', async () => {
    await logsSettled(rig);
    expect(rig.seen.length).toBeGreaterThan(cases.length);
    expect(findLeaks(rig, secretValues(rig))).toEqual([]);
  });
});
