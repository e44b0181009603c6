// End to end (#17 item 2): the router under Miniflare in front of a mock vLLM server with two
// data-parallel engines (mock --data-parallel-size 2: a prefix cache per engine, engine="<rank>"
// series, X-data-parallel-rank honoured) and a single-engine one, driven by the openai SDK. Two
// sessions' turns each stay on one engine with the rank header sent and hit that engine's cache;
// a client's own rank header never reaches an origin; a single-engine replica gets none; a
// restart (every engine's counters reset) clears both engines' slots. Only 127.0.0.1; bounded waits.

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, TEST_TIMINGS, type RouterHandle } from '../helpers/router.js';
import { startShrinkRig, type ShrinkRig } from '../helpers/shrunk-dp.js';

const auth = 'bearer:ORIGIN_API_KEY';
let dp: MockVllm;
let single: MockVllm;
let router: RouterHandle;
let client: OpenAI;

beforeAll(async () => {
  // vLLM with --enable-prompt-tokens-details: these tests read each turn's cached tokens per engine.
  dp = await startMockVllm({ id: 'dp', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], dataParallelSize: 2, profile: 'vllm-cache-report' });
  single = await startMockVllm({ id: 'one', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['single-model'], profile: 'vllm-cache-report' });
  const pool = { strategy: 'prefix-aware', keys: ['header:x-session-id', 'prefix:4096'], scrapeIntervalMs: 200 };
  router = await startRouter({
    config: routerConfig({
      replicas: [dp],
      ...pool,
      poolOverrides: { scrapeIntervalMs: pool.scrapeIntervalMs },
      extraPools: [{ name: 'single', models: ['single-model'], ...pool, healthIntervalMs: TEST_TIMINGS.healthIntervalMs, replicas: [{ id: single.id, url: single.url, auth }] }],
    }),
  });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
  // The scrape has named both engines: the replica is pinned per engine.
  await eventually(async () => expect((await snapshot('chat')).replicas[0]!.engines).toHaveLength(2), { timeoutMs: 15_000, intervalMs: 100 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled([dp?.close(), single?.close()]);
});

const snapshot = async (pool: string): Promise<PoolSnapshot> => (await (await router.adminFetch(`/admin/pools/${pool}`)).json()) as PoolSnapshot;
const SYSTEM = 'You are the support assistant of a data-parallel test; answer briefly and precisely. '.repeat(10);
type Message = { role: 'system' | 'user' | 'assistant'; content: string };

/** One turn of a session; the rank header the mock received, and the cached tokens it reported. */
async function turn(session: string, history: Message[], question: string, model = 'demo-model', headers: Record<string, string> = {}): Promise<{ rank: string | undefined; cached: number }> {
  history.push({ role: 'user', content: question });
  const res = await client.chat.completions.create({ model, max_tokens: 8, messages: history }, { headers: { 'x-session-id': session, ...headers } });
  history.push({ role: 'assistant', content: res.choices[0]!.message.content ?? '' });
  const seen = (model === 'demo-model' ? dp : single).stats().lastCompletionRequest!.headers['x-data-parallel-rank'];
  return { rank: typeof seen === 'string' ? seen : undefined, cached: res.usage?.prompt_tokens_details?.cached_tokens ?? 0 };
}

describe('data-parallel engines', () => {
  it("each session's turns stay on one engine, with the rank header sent, and hit that engine's cache", async () => {
    const sessions = { alpha: [{ role: 'system', content: `${SYSTEM} (alpha)` }] as Message[], beta: [{ role: 'system', content: `${SYSTEM} (beta)` }] as Message[] };
    const ranks: Record<string, string[]> = { alpha: [], beta: [] };
    for (let t = 0; t < 4; t++) {
      for (const name of ['alpha', 'beta'] as const) {
        const r = await turn(`dp-${name}`, sessions[name], `question ${t} of ${name}: how do engines share a cache?`);
        expect(r.rank, `${name} turn ${t}`).toMatch(/^[01]$/);
        ranks[name]!.push(r.rank!);
        if (t > 0) expect(r.cached, `${name} turn ${t} hits its engine's cache`).toBeGreaterThan(0);
      }
    }
    for (const name of ['alpha', 'beta']) expect(new Set(ranks[name]).size, `${name}: ${ranks[name]}`).toBe(1);
    // The mock's own counts agree: every request went to the engine its session was pinned to.
    const perEngine = dp.stats().engines!.map((e) => e.requests);
    const expected = [0, 0];
    for (const name of ['alpha', 'beta']) expected[Number(ranks[name]![0])]! += 4;
    expect(perEngine).toEqual(expected);
    // The coordinator's view: each engine's slot holds what was routed to it.
    const engines = (await snapshot('chat')).replicas[0]!.engines!;
    for (const e of engines) expect(e.indexEntries > 0).toBe(expected[e.rank]! > 0);
    const text = await (await router.adminFetch('/metrics')).text();
    for (const e of ['0', '1']) expect(text).toMatch(new RegExp(`^prefix_router_prefix_index_engine_entries\\{pool="chat",replica="dp",engine="${e}"\\} \\d+$`, 'm'));
  });

  it("a client's rank header never reaches an origin: the router's pin wins, a single-engine replica gets none", async () => {
    const history: Message[] = [{ role: 'system', content: `${SYSTEM} (gamma)` }];
    const first = await turn('dp-gamma', history, 'first question of gamma');
    const forged = String(1 - Number(first.rank));
    const second = await turn('dp-gamma', history, 'second question of gamma', 'demo-model', { 'X-Data-Parallel-Rank': forged });
    expect(second.rank).toBe(first.rank);
    expect(second.cached).toBeGreaterThan(0);
    // One engine: no rank header at all. Had the client's "1" passed, vLLM would have refused it (400).
    const solo: Message[] = [{ role: 'system', content: `${SYSTEM} (solo)` }];
    expect((await turn('solo', solo, 'a question', 'single-model', { 'x-data-parallel-rank': '1' })).rank).toBeUndefined();
    expect((await turn('solo', solo, 'another question', 'single-model')).rank).toBeUndefined();
    expect((await snapshot('single')).replicas[0]!.engines).toBeUndefined();
  });

  it('a Responses request is not pinned (vLLM ignores the rank there), and its early connect to the session\'s replica is a hit', async () => {
    const history: Message[] = [{ role: 'system', content: `${SYSTEM} (delta)` }];
    expect((await turn('dp-delta', history, 'a chat turn first')).rank).toMatch(/^[01]$/);
    const r = await client.responses.create({ model: 'demo-model', input: `${SYSTEM} (delta) and now the Responses API`, max_output_tokens: 4 }, { headers: { 'x-session-id': 'dp-delta' } });
    expect(r.id).toMatch(/^resp_/);
    const line = await eventually(() => {
      const l = router.traceLines().find((t) => t.api === 'responses' && t.status === 200);
      expect(l).toBeDefined();
      return l!;
    });
    // The remembered pick went without the chat turn's rank, so the coordinator's unpinned lease confirmed it.
    expect(line.earlyConnect).toBe('hit');
  });

  it('a restart (every engine counter reset) clears both engine slots', async () => {
    await eventually(async () => expect((await snapshot('chat')).replicas[0]!.engines!.some((e) => e.indexEntries > 0)).toBe(true));
    dp.reset();
    await eventually(async () => expect((await snapshot('chat')).replicas[0]!.engines!.map((e) => e.indexEntries)).toEqual([0, 0]), { timeoutMs: 10_000, intervalMs: 100 });
  });
});

describe('a server restarted with fewer engines before the next scrape', () => {
  let rig: ShrinkRig | undefined;
  afterAll(async () => rig?.close());

  /** A rig whose chat session is pinned to engine 1, the server then back with one engine. */
  async function shrunkChat(tag: string): Promise<{ rig: ShrinkRig; c: OpenAI; session: string; history: Message[] }> {
    rig = await startShrinkRig(tag);
    const r = rig;
    const c = new OpenAI({ baseURL: `${r.router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
    const historyOf = (k: number): Message[] => [{ role: 'system', content: `${SYSTEM} (${tag} ${k})` }, { role: 'user', content: 'hello' }];
    const { session, k } = await r.sessionOnEngine1(
      async (session, k) => void (await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: historyOf(k) }, { headers: { 'x-session-id': session } })),
      () => r.mock.stats().lastCompletionRequest!.headers['x-data-parallel-rank'],
    );
    await r.shrink();
    return { rig: r, c, session, history: [...historyOf(k), { role: 'user', content: 'and after the restart?' }] };
  }

  it("vLLM's refusal of a stale rank is retried unpinned, never the client's error, and the replica is unpinned", async () => {
    const { rig: r, c, session, history } = await shrunkChat('shrink');
    const res = await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: history }, { headers: { 'x-session-id': session } });
    expect(res.choices[0]!.message.content).toBeTruthy();
    const s = r.mock.stats();
    // The pinned attempt was refused (400), the unpinned retry served.
    expect(s.byStatus['400']).toBe(1);
    expect(s.byStatus['200']).toBe(1);
    expect(s.lastCompletionRequest!.headers['x-data-parallel-rank']).toBeUndefined();
    expect((await r.replica()).engines).toBeUndefined();
    expect(r.router.traceLines().at(-1)).toMatchObject({ status: 200, attempts: 2 });
  });

  it('on a stream (vLLM refuses the rank in-band, after its 200) the refusal is retried unpinned before the first token: a clean stream, the replica unpinned and not charged', async () => {
    await rig?.close();
    const { rig: r, c, session, history } = await shrunkChat('shrink-s');
    const errorsBefore = (await r.replica()).stats.errors;
    const stream = await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, stream: true, messages: history }, { headers: { 'x-session-id': session } });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    // Both attempts were 200s: the pinned one carried vLLM's in-band refusal, the unpinned one the answer.
    await eventually(() => expect(r.mock.stats().byStatus).toEqual({ '200': 2 }), { timeoutMs: 10_000 });
    expect(r.mock.stats().lastCompletionRequest!.headers['x-data-parallel-rank']).toBeUndefined();
    await eventually(async () => expect((await r.replica()).engines).toBeUndefined(), { timeoutMs: 15_000, intervalMs: 50 });
    await eventually(() => expect(r.router.traceLines().at(-1)).toMatchObject({ status: 200, attempts: 2 }), { timeoutMs: 10_000 });
    // The router's own stale pin, not the replica's failure.
    expect((await r.replica()).stats.errors).toBe(errorsBefore);
  });
});

describe("a server restarted with fewer engines, on the Messages API (vLLM's Anthropic endpoint)", () => {
  const rigs: ShrinkRig[] = [];
  afterAll(async () => {
    for (const r of rigs) await r.close();
  });

  // The session's own words first: a shared first block would send every session to the engine that holds it.
  const systemOf = (tag: string, k: number) => `(${tag} ${k}) ${SYSTEM}`;

  /** A rig whose Messages session is pinned to engine 1, the server then back with one engine. */
  async function shrunk(tag: string): Promise<{ mock: MockVllm; r: RouterHandle; c: Anthropic; session: string; system: string; history: Anthropic.MessageParam[]; snap: () => Promise<PoolSnapshot['replicas'][number]> }> {
    // vLLM's /v1/messages ignores cache_salt: the pool opts in to a shared cache for Messages.
    const rig = await startShrinkRig(tag, { poolOverrides: { messagesSharedCache: true } });
    rigs.push(rig);
    const c = new Anthropic({ baseURL: rig.router.url, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
    const history: Anthropic.MessageParam[] = [{ role: 'user', content: 'hello' }];
    const { session, k } = await rig.sessionOnEngine1(
      async (session, k) => void (await c.messages.create({ model: 'demo-model', max_tokens: 4, system: systemOf(tag, k), messages: history }, { headers: { 'x-session-id': session } })),
      () => rig.mock.stats().lastPostByPath['/v1/messages']?.headers['x-data-parallel-rank'],
    );
    await rig.shrink();
    history.push({ role: 'assistant', content: 'hi' }, { role: 'user', content: 'and after the restart?' });
    return { mock: rig.mock, r: rig.router, c, session, system: systemOf(tag, k), history, snap: rig.replica };
  }

  it("a stream: vLLM's converter error event (a 200) is retried unpinned before the first token; a clean answer, the replica unpinned and not charged", async () => {
    const { mock, r, c, session, system, history, snap } = await shrunk('shrink-m');
    const errorsBefore = (await snap()).stats.errors;
    const stream = c.messages.stream({ model: 'demo-model', max_tokens: 4, system, messages: history }, { headers: { 'x-session-id': session } });
    let text = '';
    for await (const ev of stream) if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    expect(text.length).toBeGreaterThan(0);
    // Both attempts were 200s: the pinned one carried the converter's error event, the unpinned one the answer.
    await eventually(() => expect(mock.stats().byStatus).toEqual({ '200': 2 }), { timeoutMs: 10_000 });
    expect(mock.stats().lastPostByPath['/v1/messages']!.headers['x-data-parallel-rank']).toBeUndefined();
    await eventually(async () => expect((await snap()).engines).toBeUndefined(), { timeoutMs: 15_000, intervalMs: 50 });
    await eventually(() => expect(r.traceLines().at(-1)).toMatchObject({ status: 200, attempts: 2 }), { timeoutMs: 10_000 });
    expect((await snap()).stats.errors).toBe(errorsBefore);
  });

  it("not streamed: vLLM's 500 internal_error naming the rank is retried unpinned, not the client's error, not charged", async () => {
    const { mock, r, c, session, system, history, snap } = await shrunk('shrink-n');
    const errorsBefore = (await snap()).stats.errors;
    const res = await c.messages.create({ model: 'demo-model', max_tokens: 4, system, messages: history }, { headers: { 'x-session-id': session } });
    expect(res.content[0]).toMatchObject({ type: 'text' });
    expect(mock.stats().byStatus).toEqual({ '500': 1, '200': 1 });
    expect(mock.stats().lastPostByPath['/v1/messages']!.headers['x-data-parallel-rank']).toBeUndefined();
    await eventually(async () => expect((await snap()).engines).toBeUndefined(), { timeoutMs: 15_000, intervalMs: 50 });
    await eventually(() => expect(r.traceLines().at(-1)).toMatchObject({ status: 200, attempts: 2 }), { timeoutMs: 10_000 });
    expect((await snap()).stats.errors).toBe(errorsBefore);
  });
});
