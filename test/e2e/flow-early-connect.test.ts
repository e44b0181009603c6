// Early connect under flow control (issue #29): a keyed request goes out to the replica its key was
// last leased on while its acquire is on its way (proxy/early-connect.ts). When that acquire waits
// in the coordinator's queue instead (the pool is at its bound), the early request is cancelled at
// once (the coordinator's `queued` callback), so it holds no engine slot and no place in the
// engine's own FIFO ahead of the leased requests while it waits: the engines' waiting queues stay
// empty, as flow control promises. Router under Miniflare, two mock vLLM replicas of one running
// sequence each; 127.0.0.1 only.

import { afterAll, beforeAll, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_TENANTS, type RouterHandle } from '../helpers/router.js';

const TENANT = TEST_TENANTS[0]!;

let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  mocks = await startMocks(2, { maxRunning: 1, prefillTokensPerSec: 50_000, decodeMsPerToken: 20 });
  router = await startRouter({
    config: routerConfig({
      replicas: mocks,
      strategy: 'bounded-hash:1.25',
      keys: ['header:x-session-id'],
      overrides: { firstTokenTimeoutMs: 20_000, idleTimeoutMs: 20_000 },
      poolOverrides: { maxInFlightPerReplica: 1, maxFails: 100, flowControl: { enabled: true, bands: [{ name: 'normal', maxQueueMs: 20_000, maxQueueLength: 32 }] } },
    }),
  });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

let seq = 0;
async function chat(session: string, maxTokens: number): Promise<{ status: number; requestId: string; text: string }> {
  const requestId = `early-${++seq}`;
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TENANT.key}`, 'content-type': 'application/json', 'x-session-id': session, 'x-request-id': requestId },
    body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: maxTokens, messages: [{ role: 'user', content: `${session}: hello` }] }),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: res.status, requestId, text: await res.text() };
}

it('an early-connect request whose acquire queues is cancelled at once: no engine queues it ahead of the leased requests', async () => {
  // The key's first request: leased, remembered (the next one of this isolate guesses its replica).
  const warm = await chat('early-key', 2);
  expect(warm.status).toBe(200);
  await Promise.all(mocks.map((m) => m.reset()));
  // Both slots taken by long answers of other keys.
  const long = [chat('fill-a', 60), chat('fill-b', 60)];
  await eventually(async () => {
    const s = (await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
    expect(s.leases).toBe(2);
    for (const m of mocks) expect(m.stats().running).toBe(1);
  }, { intervalMs: 10 });
  // The remembered key again: its early request goes out while its acquire waits in the queue.
  const queued = chat('early-key', 2);
  await eventually(async () => {
    const s = (await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
    expect(s.queue?.depth.normal).toBe(1);
  }, { intervalMs: 10 });
  // Long enough for a cancel to reach the engine, short of the long answers' end (60 × 20 ms).
  await new Promise((r) => setTimeout(r, 200));
  const during = mocks.map((m) => m.stats());
  const served = await queued;
  await Promise.all(long);
  expect(served.status).toBe(200);
  expect(served.text).toContain('[DONE]');
  // The early request may have been in an engine's FIFO for the moment the acquire took to queue,
  // not after (left going, it waits there until a slot frees, ahead of the leased requests).
  for (const st of during) expect(st.waiting, st.id).toBe(0);
  const line = await eventually(() => {
    const l = router.traceLines().find((x) => x.requestId === served.requestId);
    expect(l).toBeDefined();
    return l!;
  });
  expect(line.queueMs).toBeGreaterThan(0);
  expect(line.earlyConnect).toBe('miss');
}, 60_000);
