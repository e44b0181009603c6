// Scale events end to end: adding a replica through the admin API moves about 1/(N+1) of the
// sessions, all of them to the new replica; removing it moves exactly those back; a draining
// replica takes no new requests while a stream already on it runs to its end, and can then be
// removed with nothing cut off. Router under Miniflare, mock replicas on loopback.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../helpers/router.js';

const POOL = 'chat';
const SESSIONS = 300;
let mocks: MockVllm[] = [];
let extra: MockVllm;
let router: RouterHandle;

interface Snap {
  replicas: { id: string; healthy: boolean; inFlight: number; draining: boolean }[];
}
const snapshot = async (): Promise<Snap> => (await (await router.adminFetch(`/admin/pools/${POOL}`)).json()) as Snap;

async function chat(session: string, opts: { stream?: boolean; maxTokens?: number } = {}): Promise<{ replica: string; body: string }> {
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', 'x-session-id': session },
    body: JSON.stringify({ model: 'demo-model', stream: opts.stream ?? false, max_tokens: opts.maxTokens ?? 1, messages: [{ role: 'user', content: `hello from ${session}` }] }),
  });
  expect(res.status).toBe(200);
  return { replica: res.headers.get('x-prefix-router-replica')!, body: await res.text() };
}

/** Where each session lands now; sequential, so every pick sees an idle pool and takes the ring home. */
async function placements(): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (let s = 0; s < SESSIONS; s++) out.set(`scale-${s}`, (await chat(`scale-${s}`)).replica);
  return out;
}

beforeAll(async () => {
  mocks = await startMocks(4, { decodeMsPerToken: 1, maxRunning: 64 });
  extra = await startMockVllm({ id: 'r5', apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], decodeMsPerToken: 1, maxRunning: 64 });
  router = await startRouter({ config: routerConfig({ replicas: mocks }) });
  await eventually(async () => expect((await snapshot()).replicas.every((r) => r.healthy)).toBe(true), { timeoutMs: 15_000 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled([...mocks, extra].filter(Boolean).map((m) => m.close()));
});

describe('scale events through the admin API', () => {
  it('adding a replica moves about 1/(N+1) of the sessions, all to it; removing it moves exactly those back', async () => {
    const before = await placements();
    const put = await router.adminFetch(`/admin/pools/${POOL}/replicas/r5`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: extra.url, auth: 'bearer:ORIGIN_API_KEY' }) });
    expect(put.status).toBe(200);
    const after = await placements();
    const moved = [...before.keys()].filter((s) => before.get(s) !== after.get(s));
    const share = moved.length / SESSIONS;
    console.log(`added r5 to 4 replicas: ${moved.length}/${SESSIONS} sessions moved (${(share * 100).toFixed(1)}%, expected ${(100 / 5).toFixed(1)}%)`);
    // 300 sessions: the binomial spread around 1/5 is ±2.3 points; the ring's own variance adds some.
    expect(share).toBeGreaterThan(0.1);
    expect(share).toBeLessThan(0.3);
    for (const s of moved) expect(after.get(s)).toBe('r5');

    const del = await router.adminFetch(`/admin/pools/${POOL}/replicas/r5`, { method: 'DELETE' });
    expect(del.status).toBe(200);
    const back = await placements();
    for (const s of before.keys()) expect(back.get(s)).toBe(before.get(s));
  });

  it('a draining replica finishes its stream, takes nothing new, and is then removed with nothing cut off', async () => {
    // A session whose home is r1, and a slow stream on it.
    let session = '';
    for (let s = 0; s < 200 && !session; s++) if ((await chat(`drain-${s}`)).replica === 'r1') session = `drain-${s}`;
    expect(session).not.toBe('');
    // 40 tokens at 100 ms: a stream of about 4 s, so it is still running through the drain and
    // the checks below even when a loaded machine makes each admin call slow.
    mocks[0]!.setFaults({ slowFactor: 100 });
    const streaming = chat(session, { stream: true, maxTokens: 40 });
    await eventually(async () => expect((await snapshot()).replicas.find((r) => r.id === 'r1')!.inFlight).toBe(1), { timeoutMs: 15_000 });

    const patch = await router.adminFetch(`/admin/pools/${POOL}/replicas/r1`, { method: 'PATCH', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ draining: true }) });
    expect(patch.status).toBe(200);
    // New requests of the same session go elsewhere while the stream is still running on r1.
    const next = await chat(session);
    expect(next.replica).not.toBe('r1');
    expect((await snapshot()).replicas.find((r) => r.id === 'r1')!.inFlight).toBe(1);

    const done = await streaming;
    expect(done.replica).toBe('r1');
    expect(done.body).toContain('"finish_reason":"length"');
    expect(done.body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    mocks[0]!.setFaults({ slowFactor: 1 });
    await eventually(async () => expect((await snapshot()).replicas.find((r) => r.id === 'r1')!.inFlight).toBe(0), { timeoutMs: 15_000 });

    const del = await router.adminFetch(`/admin/pools/${POOL}/replicas/r1`, { method: 'DELETE' });
    expect(del.status).toBe(200);
    expect(((await del.json()) as { inFlight: number }).inFlight).toBe(0);
    expect((await snapshot()).replicas.map((r) => r.id)).toEqual(['r2', 'r3', 'r4']);
  });
});
