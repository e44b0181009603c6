// Flow control's preemption (issue #29, `flowControl.preempt`): with every slot taken by a tenant
// over its fair share, a request of a tenant below its share does not wait for one of those streams
// to end: the coordinator asks the Worker of the youngest of them, still in prefill (nothing sent to
// its client), to give its slot back; that Worker aborts it at the engine, queues it again, and its
// client still gets the whole answer, later. A request past its first token is never taken back.
// Router under Miniflare, two mock vLLM replicas of one running sequence each; 127.0.0.1 only.

import { afterAll, beforeAll, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_TENANTS, type RouterHandle } from '../helpers/router.js';
import { readChatStream } from '../helpers/sse.js';

const HEAVY = TEST_TENANTS[0]!; // acme
const LIGHT = TEST_TENANTS[1]!; // globex
/** ~1,200 prompt tokens at 1,000 tokens/s: 1.2 s of prefill (the window the light request must land in); 60 output tokens at 25 ms: 1.5 s of decode. */
const PROMPT = 'x'.repeat(4_800);
const MAX_TOKENS = 60;

let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  mocks = await startMocks(2, { maxRunning: 1, prefillTokensPerSec: 1_000, decodeMsPerToken: 25 });
  router = await startRouter({
    config: routerConfig({
      replicas: mocks,
      strategy: 'least-load',
      keys: ['none'],
      overrides: { firstTokenTimeoutMs: 20_000, idleTimeoutMs: 20_000 },
      poolOverrides: { maxInFlightPerReplica: 1, maxFails: 100, flowControl: { enabled: true, preempt: true, bands: [{ name: 'normal', maxQueueMs: 20_000, maxQueueLength: 32 }] } },
    }),
  });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

interface Streamed {
  status: number;
  tokens: number;
  done: boolean;
  firstTokenAt: number | null;
  endedAt: number;
  requestId: string;
}

let seq = 0;
async function stream(key: string, maxTokens = MAX_TOKENS): Promise<Streamed> {
  const requestId = `preempt-${++seq}`;
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: maxTokens, messages: [{ role: 'user', content: `${requestId} ${PROMPT}` }] }),
    signal: AbortSignal.timeout(30_000),
  });
  const read = await readChatStream(res.body!);
  return { status: res.status, tokens: read.tokens, done: read.done, firstTokenAt: read.firstTokenAt, endedAt: read.endedAt, requestId };
}

it('a light tenant takes the slot of the heavy tenant\'s youngest request in prefill; that request still gets its whole answer', async () => {
  // The heavy tenant has been sending alone: most of the recent admissions are its.
  await Promise.all([stream(HEAVY.key, 2), stream(HEAVY.key, 2)]);
  // Both slots taken by the heavy tenant's long answers, two more of its requests waiting.
  const heavy = [stream(HEAVY.key), stream(HEAVY.key), stream(HEAVY.key), stream(HEAVY.key)];
  // Two admitted (in prefill), two waiting: then the light tenant asks.
  await eventually(async () => {
    const s = (await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
    expect(s.leases).toBe(2);
    expect(s.queue?.depth.normal).toBe(2);
  }, { intervalMs: 10 });
  const light = await stream(LIGHT.key, 4);
  const heavies = await Promise.all(heavy);

  expect(light.status).toBe(200);
  expect(light.done).toBe(true);
  expect(light.tokens).toBe(4);
  // Without preemption the light request would wait for a heavy answer to end (1.2 s of prefill
  // and 1.5 s of decode): its first token came before any of them ended.
  expect(light.firstTokenAt).not.toBeNull();
  expect(light.firstTokenAt!).toBeLessThan(Math.min(...heavies.map((h) => h.endedAt)));
  // Every heavy request was answered in full: the preempted one too, later.
  for (const h of heavies) {
    expect(h.status, h.requestId).toBe(200);
    expect(h.done, h.requestId).toBe(true);
    expect(h.tokens, h.requestId).toBe(MAX_TOKENS);
  }

  // Each trace line is written once its stream is settled (after the client read its end).
  const lines = await eventually(() => {
    const all = router.traceLines();
    for (const r of [...heavies, light]) expect(all.some((l) => l.requestId === r.requestId), `trace line of ${r.requestId}`).toBe(true);
    return all;
  });
  const byId = (id: string) => lines.find((l) => l.requestId === id);
  const preempted = heavies.map((h) => byId(h.requestId)).filter((l) => (l?.preempted as number | undefined) !== undefined);
  expect(preempted.length, router.output()).toBe(1);
  expect(preempted[0]!.preempted).toBe(1);
  expect(preempted[0]!.status).toBe(200);
  expect(byId(light.requestId)?.preempted).toBeUndefined();

  const snap = (await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
  expect(snap.queue?.preempt).toBe(true);
  expect(snap.queue?.preempted).toBe(1);
  // A slot given back is not the replica's failure.
  for (const r of snap.replicas) expect((r.stats as unknown as { errors: number }).errors, r.id).toBe(0);
  const metrics = await (await router.adminFetch('/metrics')).text();
  expect(metrics).toContain('prefix_router_queue_preempted_total{pool="chat",result="given"} 1');
}, 60_000);
