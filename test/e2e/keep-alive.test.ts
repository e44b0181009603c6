// SSE keep-alive comments (issue #26): vLLM started with --sse-keep-alive-interval writes
// `: keep-alive` whenever its stream is idle, while queued, in prefill, and when its engine is
// stuck (vllm/entrypoints/serve/utils/sse_keep_alive.py; the mock's sseKeepAliveMs). A comment is
// not content: it neither commits the answer nor moves firstTokenTimeoutMs, nor resets the idle
// clock (idleTimeoutMs) after the first token; it is forwarded as it came. Router under Miniflare,
// two mock vLLM replicas with keep-alives every 50 ms; 127.0.0.1 only.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockFaults, MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const KEEP_ALIVE_MS = 50;
const FIRST_TOKEN_MS = 1_500;
const IDLE_MS = 1_000;
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  mocks = await startMocks(2, { decodeMsPerToken: 2, sseKeepAliveMs: KEEP_ALIVE_MS });
  expect(mocks[0]!.stats().profile).toBe('vllm');
  router = await startRouter({
    config: routerConfig({
      replicas: mocks,
      overrides: { firstTokenTimeoutMs: FIRST_TOKEN_MS, idleTimeoutMs: IDLE_MS, maxRetries: 2 },
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
  const requestId = `ka-${++seq}-${session}`;
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

const content = (text: string) =>
  text
    .split('\n')
    .filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)) as { choices?: { delta?: { content?: string } }[] })
    .map((e) => e.choices?.[0]?.delta?.content ?? '')
    .join('');

async function errorsOf(id: string): Promise<number> {
  const snap = (await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
  return (snap.replicas.find((r) => r.id === id)!.stats as unknown as { errors: number }).errors;
}

const trace = async (requestId: string) => {
  await eventually(() => expect(router.traceLines().some((t) => t.requestId === requestId)).toBe(true), { timeoutMs: 10_000 });
  return router.traceLines().find((t) => t.requestId === requestId)!;
};

/** The session's home replica (a first request finds it), the fault set there for one request. */
async function onHome(session: string, faults: Partial<MockFaults>, clear: Partial<MockFaults>) {
  const probe = await stream(session);
  expect(probe.status).toBe(200);
  const home = mocks.find((m) => m.id === probe.replica)!;
  const other = mocks.find((m) => m !== home)!;
  const keepAlivesBefore = home.stats().keepAlivesSent;
  const errorsBefore = await errorsOf(home.id);
  home.setFaults(faults);
  try {
    return { got: await stream(session), home, other, keepAlivesBefore, errorsBefore };
  } finally {
    home.setFaults(clear);
  }
}

describe("vLLM's keep-alive comments are not content", () => {
  it('a slow prefill with comments before the first token: one attempt, TTFT at the first content, the comments forwarded', async () => {
    const { got, home, keepAlivesBefore } = await onHome('slow-prefill', { stallBeforeMs: 400 }, { stallBeforeMs: 0 });
    expect(got.status).toBe(200);
    expect(got.replica).toBe(home.id);
    expect(home.stats().keepAlivesSent).toBeGreaterThan(keepAlivesBefore);
    // Held until the first token, then written in order: comments first, then the answer.
    expect(got.text.startsWith(': keep-alive\n\n')).toBe(true);
    expect(content(got.text).length).toBeGreaterThan(0);
    expect(got.text).toContain('data: [DONE]');
    const t = await trace(got.requestId);
    expect(t).toMatchObject({ status: 200, attempts: 1 });
    // The first content came after the 400 ms prefill stall, not with the first comment (at 50 ms).
    expect(t.ttftMs as number).toBeGreaterThanOrEqual(400);
  });

  it('a replica that sends only comments after its 200: no first token by firstTokenTimeoutMs, retried elsewhere and charged', async () => {
    const { got, home, other, keepAlivesBefore, errorsBefore } = await onHome('comments-only', { stallAfterTokens: 0 }, { stallAfterTokens: null });
    expect(got.status).toBe(200);
    expect(got.replica).toBe(other.id);
    expect(got.ms).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
    // It kept talking the whole time: many more comments than the timeout's worth of silence allows.
    expect(home.stats().keepAlivesSent - keepAlivesBefore).toBeGreaterThanOrEqual(5);
    expect(content(got.text).length).toBeGreaterThan(0);
    expect(got.text).not.toContain('"error"');
    expect(await trace(got.requestId)).toMatchObject({ status: 200, attempts: 2, replica: other.id });
    await eventually(async () => expect((await errorsOf(home.id)) - errorsBefore).toBe(1), { timeoutMs: 10_000 });
  });

  it('an engine stuck after its first tokens, its API server still writing comments: idleTimeoutMs still fires, the answer is continued elsewhere', async () => {
    const { got, home, other, keepAlivesBefore } = await onHome('stuck-mid-stream', { stallAfterTokens: 2 }, { stallAfterTokens: null });
    expect(got.status).toBe(200);
    expect(got.text).toContain('data: [DONE]');
    expect(got.text).not.toContain('"error"');
    expect(home.stats().keepAlivesSent - keepAlivesBefore).toBeGreaterThanOrEqual(5);
    const t = await trace(got.requestId);
    expect(t).toMatchObject({ status: 200, continuations: 1, replica: other.id });
    expect(t.continuationGapMs as number).toBeGreaterThanOrEqual(IDLE_MS - 50);
    await eventually(() => expect(home.stats().activeStreams).toBe(0), { timeoutMs: 10_000 });
  });
});
