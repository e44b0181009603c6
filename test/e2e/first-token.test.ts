// The first token is the commit point (issue #26): against the mock engine's faithful vLLM
// profile, which sends its 200 and headers before queueing and prefill and reports engine
// failures in-band, a replica that fails before its first token (connection error, 503, an
// in-band error event, no first token within firstTokenTimeoutMs after its headers) costs the
// client nothing: the stream comes clean from another replica, and the failing replica is charged
// a failure (its error and retry counts). The stale data-parallel rank in-band is in
// data-parallel.test.ts. Router under Miniflare, mock vLLM replicas; 127.0.0.1 only.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockFaults, MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const FIRST_TOKEN_MS = 1_500;
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  // The default profile: vLLM with its default flags.
  mocks = await startMocks(2, { decodeMsPerToken: 2 });
  expect(mocks[0]!.stats().profile).toBe('vllm');
  router = await startRouter({
    config: routerConfig({
      replicas: mocks,
      overrides: { firstTokenTimeoutMs: FIRST_TOKEN_MS, maxRetries: 2 },
      // The charged failures must not take a replica out between the cases.
      poolOverrides: { maxFails: 100 },
    }),
  });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

let seq = 0;
async function stream(session: string): Promise<{ status: number; replica: string | null; text: string; requestId: string; ms: number }> {
  const requestId = `ft-${++seq}-${session}`;
  const started = Date.now();
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', 'x-session-id': session, 'x-request-id': requestId },
    body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: 6, messages: [{ role: 'user', content: `hello from ${session}` }] }),
    signal: AbortSignal.timeout(20_000),
  });
  const text = await res.text();
  return { status: res.status, replica: res.headers.get('x-prefix-router-replica'), text, requestId, ms: Date.now() - started };
}

async function replicaStats(id: string): Promise<{ errors: number; retries: number; requests: number }> {
  const snap = (await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
  return snap.replicas.find((r) => r.id === id)!.stats as unknown as { errors: number; retries: number; requests: number };
}

const content = (text: string) =>
  text
    .split('\n')
    .filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)) as { choices?: { delta?: { content?: string } }[] })
    .map((e) => e.choices?.[0]?.delta?.content ?? '')
    .join('');

const CASES: { kind: string; faults: Partial<MockFaults>; clear: Partial<MockFaults>; injected: (m: MockVllm) => number }[] = [
  { kind: 'a connection error', faults: { dropConnection: true }, clear: { dropConnection: false }, injected: (m) => m.stats().droppedConnections },
  { kind: 'a 503', faults: { error500Rate: 1, errorStatus: 503 }, clear: { error500Rate: 0, errorStatus: 500 }, injected: (m) => m.stats().injectedErrors },
  { kind: 'an in-band error event after the 200', faults: { inBandErrorAfter: 0 }, clear: { inBandErrorAfter: null }, injected: (m) => m.stats().injectedInBandErrors },
  { kind: 'no first token within firstTokenTimeoutMs after the 200', faults: { stallAfterTokens: 0 }, clear: { stallAfterTokens: null }, injected: (m) => m.stats().byStatus['200'] ?? 0 },
];

describe('before the first token, a failing replica is invisible to the client', () => {
  for (const c of CASES) {
    it(`${c.kind}: a clean stream from the other replica, the failing one charged`, async () => {
      const session = `case-${c.kind.replace(/\W+/g, '-')}`;
      // The session's home replica (consistent hashing sends it there first).
      const probe = await stream(session);
      expect(probe.status).toBe(200);
      const home = mocks.find((m) => m.id === probe.replica)!;
      const other = mocks.find((m) => m !== home)!;
      await eventually(async () => expect((await replicaStats(home.id)).requests).toBeGreaterThan(0), { timeoutMs: 10_000 });
      const before = await replicaStats(home.id);
      const injectedBefore = c.injected(home);
      home.setFaults(c.faults);
      let got: Awaited<ReturnType<typeof stream>>;
      try {
        got = await stream(session);
      } finally {
        home.setFaults(c.clear);
      }
      // The client: a 200 from the other replica, content, [DONE], no error event.
      expect(got.status).toBe(200);
      expect(got.replica).toBe(other.id);
      expect(content(got.text).length).toBeGreaterThan(0);
      expect(got.text).toContain('data: [DONE]');
      expect(got.text).not.toContain('"error"');
      if (c.kind.startsWith('no first token')) expect(got.ms).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
      // The failing replica really was tried, and failed the way the case says.
      await eventually(() => expect(c.injected(home)).toBeGreaterThan(injectedBefore), { timeoutMs: 10_000 });
      // Charged like a 5xx: one more error and one more retry on the home replica.
      await eventually(
        async () => {
          const after = await replicaStats(home.id);
          expect(after.errors - before.errors).toBe(1);
          expect(after.retries - before.retries).toBe(1);
        },
        { timeoutMs: 10_000 },
      );
      // One trace line: two attempts, answered by the other replica, with a TTFT.
      await eventually(() => expect(router.traceLines().some((t) => t.requestId === got.requestId)).toBe(true), { timeoutMs: 10_000 });
      const trace = router.traceLines().find((t) => t.requestId === got.requestId)!;
      expect(trace).toMatchObject({ status: 200, attempts: 2, retried: true, replica: other.id });
      expect(typeof trace.ttftMs).toBe('number');
      // Nothing left open on the failing replica.
      await eventually(() => expect(home.stats().activeStreams).toBe(0), { timeoutMs: 10_000 });
    });
  }

  it('every replica failing before the first token: a 502 with Retry-After, never a 200 with an error inside', async () => {
    for (const m of mocks) m.setFaults({ inBandErrorAfter: 0 });
    let got: Awaited<ReturnType<typeof stream>>;
    try {
      got = await stream('all-fail');
    } finally {
      for (const m of mocks) m.setFaults({ inBandErrorAfter: null });
    }
    expect(got.status).toBe(502);
    const body = JSON.parse(got.text) as { error: { code: string; type: string } };
    expect(body.error.code).toBe('upstream_unavailable');
  });

});
