// End to end: a pool of two mock replicas speaking SGLang's and llama.cpp server's /metrics
// (the mock's `sglang` and `llamacpp` flavors) behind the router under Miniflare; chat traffic
// with repeated prompts, then the coordinator's view of each replica shows the engine's own hit
// rate, and an embeddings call on the llama.cpp pool. Only 127.0.0.1; bounded waits.

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';
let mocks: MockVllm[] = [];
let router: RouterHandle;
let client: OpenAI;

interface ReplicaView {
  id: string;
  healthy: boolean;
  vllm: { generation: string; hitRate: number | null; waiting: number | null; running: number | null; scrapeError: string | null };
}

beforeAll(async () => {
  mocks = [
    await startMockVllm({ id: 'sg', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: [MODEL], metricsFlavor: 'sglang' }),
    await startMockVllm({ id: 'll', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: [MODEL], metricsFlavor: 'llamacpp' }),
  ];
  router = await startRouter({
    config: routerConfig({ replicas: mocks, strategy: 'least-load', keys: ['none'], poolOverrides: { scrapeIntervalMs: 300, hitRateWindowMs: 60_000 } }),
  });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

const replicas = async (): Promise<ReplicaView[]> => ((await (await router.adminFetch('/admin/pools/chat')).json()) as { replicas: ReplicaView[] }).replicas;

describe('SGLang and llama.cpp replicas', () => {
  it('the coordinator reads each engine\'s own metric names into the same view', async () => {
    await eventually(async () => expect((await replicas()).every((r) => r.healthy)).toBe(true), { timeoutMs: 15_000 });
    const prompt = `${'A long shared system prompt that fills several cache blocks. '.repeat(20)}`;
    for (let i = 0; i < 16; i++) {
      await client.chat.completions.create({ model: MODEL, max_tokens: 2, messages: [{ role: 'system', content: prompt }, { role: 'user', content: `question ${i % 2}` }] });
    }
    const views = await eventually(
      async () => {
        const v = await replicas();
        for (const r of v) {
          expect(r.vllm.scrapeError).toBeNull();
          expect(r.vllm.hitRate).toBeGreaterThan(0);
        }
        return v;
      },
      { timeoutMs: 15_000, intervalMs: 200 },
    );
    const byId = Object.fromEntries(views.map((r) => [r.id, r.vllm]));
    expect(byId.sg).toMatchObject({ generation: 'sglang-tokens', waiting: expect.any(Number), running: expect.any(Number) });
    expect(byId.ll).toMatchObject({ generation: 'llamacpp-tokens', waiting: expect.any(Number), running: expect.any(Number) });
    // Both replicas served the same repeated prompt: most of every later prompt was cached.
    expect(byId.sg!.hitRate!).toBeGreaterThan(0.5);
    expect(byId.ll!.hitRate!).toBeGreaterThan(0.5);
    const text = await (await router.adminFetch('/metrics')).text();
    expect(text).toMatch(/^prefix_router_vllm_prefix_cache_hit_ratio\{pool="chat",replica="sg"\} 0\.\d+$/m);
  });
});
