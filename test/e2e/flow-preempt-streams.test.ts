// Flow control's preemption of streams past their first token (issue #29,
// `flowControl.preemptStreams`): with every slot taken by a tenant over its fair share, each of its
// streams already answering, a request of a tenant below its share does not wait for one of them to
// end: the youngest is paused (aborted at the engine, its slot given back) and its answer is
// continued once a slot is its tenant's again; its client gets the whole answer, with a pause.
// Without preemptStreams the same scenario preempts nothing (every heavy request is past its
// first token), so the light request waits for a heavy answer to end.
// Router under Miniflare, two mock vLLM replicas of one running sequence each; 127.0.0.1 only.

import { afterEach, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_TENANTS, type RouterHandle } from '../helpers/router.js';
import { readChatStream, type ReadChat } from '../helpers/sse.js';

const HEAVY = TEST_TENANTS[0]!; // acme
const LIGHT = TEST_TENANTS[1]!; // globex
/** A short prompt (its prefill is quick) and 80 output tokens at 25 ms: 2 s of decode per heavy answer. */
const MAX_TOKENS = 80;

let mocks: MockVllm[] = [];
let router: RouterHandle | undefined;

async function start(preemptStreams: boolean, hooks = false): Promise<RouterHandle> {
  mocks = await startMocks(2, { maxRunning: 1, prefillTokensPerSec: 20_000, decodeMsPerToken: 25 });
  router = await startRouter({
    hooks,
    config: routerConfig({
      replicas: mocks,
      strategy: 'least-load',
      keys: ['none'],
      overrides: { firstTokenTimeoutMs: 20_000, idleTimeoutMs: 20_000 },
      poolOverrides: { maxInFlightPerReplica: 1, maxFails: 100, flowControl: { enabled: true, preempt: true, preemptStreams, bands: [{ name: 'normal', maxQueueMs: 20_000, maxQueueLength: 32 }] } },
    }),
  });
  return router;
}

afterEach(async () => {
  await router?.close();
  router = undefined;
  await Promise.allSettled(mocks.map((m) => m.close()));
});

type Streamed = ReadChat & { status: number; requestId: string };

let seq = 0;
/** A chat stream read to its end; `onFirstToken` fires at its first content delta. */
async function stream(r: RouterHandle, key: string, maxTokens: number, onFirstToken?: () => void): Promise<Streamed> {
  const requestId = `pause-${++seq}`;
  const res = await fetch(`${r.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: maxTokens, messages: [{ role: 'user', content: `${requestId} tell me a story` }] }),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: res.status, requestId, ...(await readChatStream(res.body!, onFirstToken)) };
}

/** The heavy tenant alone first, then both slots held by its streams, each past its first token, `n - 2` more waiting. */
async function heavyStreams(r: RouterHandle, n: number): Promise<Promise<Streamed>[]> {
  await Promise.all([stream(r, HEAVY.key, 2), stream(r, HEAVY.key, 2)]);
  let answering = 0;
  const heavy = Array.from({ length: n }, () => stream(r, HEAVY.key, MAX_TOKENS, () => answering++));
  await eventually(async () => {
    const s = (await (await r.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
    expect(s.leases).toBe(2);
    expect(s.queue?.depth.normal ?? 0).toBe(n - 2);
    expect(answering).toBe(2);
  }, { intervalMs: 10 });
  return heavy;
}

/** Four heavy streams (two answering, two waiting); then the light tenant asks. */
async function scenario(r: RouterHandle): Promise<{ light: Streamed; heavies: Streamed[] }> {
  const heavy = await heavyStreams(r, 4);
  const light = await stream(r, LIGHT.key, 4);
  return { light, heavies: await Promise.all(heavy) };
}

/**
 * Every heavy answer whole, the paused one too (as long as an answer never paused: nothing lost or
 * repeated at the seam), and the trace lines of `heavies` and `others` once written.
 */
async function wholeAndTraced(r: RouterHandle, heavies: Streamed[], others: Streamed[] = []): Promise<Record<string, unknown>[]> {
  const reference = await stream(r, HEAVY.key, MAX_TOKENS);
  for (const h of heavies) {
    expect(h.status, h.requestId).toBe(200);
    expect(h.done, h.requestId).toBe(true);
    expect(h.text.length, h.requestId).toBe(reference.text.length);
  }
  return eventually(() => {
    const all = r.traceLines();
    for (const x of [...heavies, ...others]) expect(all.some((l) => l.requestId === x.requestId), `trace line of ${x.requestId}`).toBe(true);
    return all;
  });
}

it('pauses the heavy tenant\'s youngest stream for a light tenant\'s request, and continues it to the whole answer', async () => {
  const r = await start(true);
  const { light, heavies } = await scenario(r);

  expect(light.status).toBe(200);
  expect(light.done).toBe(true);
  expect(light.tokens).toBe(4);
  // Every heavy stream was already answering: the light request's first token came before any of them ended.
  expect(light.firstTokenAt!, r.output()).toBeLessThan(Math.min(...heavies.map((h) => h.endedAt)));
  const lines = await wholeAndTraced(r, heavies, [light]);
  const byId = (id: string) => lines.find((l) => l.requestId === id);
  const paused = heavies.map((h) => byId(h.requestId)).filter((l) => l?.preempted !== undefined);
  expect(paused.length, r.output()).toBe(1);
  expect(paused[0]!.preempted).toBe(1);
  expect(paused[0]!.continuations).toBe(1);
  expect(paused[0]!.status).toBe(200);
  expect(byId(light.requestId)?.preempted).toBeUndefined();

  const snap = (await (await r.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
  expect(snap.queue?.preempted).toBe(1);
  // A paused stream is not its replica's failure.
  for (const rep of snap.replicas) expect((rep.stats as unknown as { errors: number }).errors, rep.id).toBe(0);
  const metrics = await (await r.adminFetch('/metrics')).text();
  expect(metrics).toContain('prefix_router_queue_preempted_total{pool="chat",result="given"} 1');
  expect(metrics).toMatch(/prefix_router_continuations_total\{[^}]*outcome="paused"[^}]*\} 1/);
}, 60_000);

it('without preemptStreams, a stream past its first token keeps its slot: the light request waits for a heavy answer to end', async () => {
  const r = await start(false);
  const { light, heavies } = await scenario(r);
  expect(light.status).toBe(200);
  expect(light.firstTokenAt!).toBeGreaterThan(Math.min(...heavies.map((h) => h.endedAt)) - 50);
  const snap = (await (await r.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
  expect(snap.queue?.preempted ?? 0).toBe(0);
}, 60_000);

it('a paused stream waiting for its turn survives a coordinator restart: its place is lost, not its answer', async () => {
  const r = await start(true, true);
  const heavy = await heavyStreams(r, 2);
  // A longer light answer (40 × 25 ms): the paused heavy stream waits for its slot meanwhile.
  const light = stream(r, LIGHT.key, 40);
  await eventually(async () => {
    const s = (await (await r.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot;
    expect(s.queue?.preempted).toBe(1);
    expect(s.queue?.depth.normal).toBe(1);
    // Waiting longer than an acquire takes (acquireTimeoutMs, 250 ms): its Worker knows it was
    // queued when the call fails, not that the coordinator is unreachable (which fails open).
    expect(s.queue!.oldestWaitMs).toBeGreaterThan(400);
  }, { intervalMs: 10 });
  const fault = await r.adminFetch('/admin/pools/chat/test-fault', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ restart: true }) });
  expect(fault.status).toBe(200);
  const [l, ...heavies] = await Promise.all([light, ...heavy]);
  expect(l!.status).toBe(200);
  expect(l!.done).toBe(true);
  const lines = await wholeAndTraced(r, heavies);
  const paused = heavies.map((h) => lines.find((line) => line.requestId === h.requestId)).filter((line) => line?.preempted !== undefined);
  expect(paused.length, r.output()).toBe(1);
  expect(paused[0]!.continuations).toBe(1);
  expect(paused[0]!.notContinued).toBeUndefined();
}, 60_000);
