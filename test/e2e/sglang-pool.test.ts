// End to end: an SGLang pool (engine "sglang") in front of the mock's faithful `sglang` profile.
// SGLang's StreamOptions defaults include_usage to false (python/sglang/srt/entrypoints/openai/
// protocol.py), so a client that sends `stream_options: {}` asked for no usage: the router still
// asks for it (and records it) but strips the usage chunk, as SGLang itself would have sent none;
// on vLLM the same body means usage (data-parallel and first-token tests). Only 127.0.0.1.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../helpers/router.js';

let mock: MockVllm;
let router: RouterHandle;

beforeAll(async () => {
  mock = await startMockVllm({ id: 'sg', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], profile: 'sglang' });
  router = await startRouter({ config: routerConfig({ replicas: [mock], strategy: 'least-load', keys: ['none'], poolOverrides: { engine: 'sglang' } }) });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await mock?.close();
});

let seq = 0;
async function stream(extra: Record<string, unknown>): Promise<{ events: Record<string, unknown>[]; requestId: string }> {
  const requestId = `sg-${++seq}`;
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: 4, messages: [{ role: 'user', content: 'hello sglang' }], ...extra }),
    signal: AbortSignal.timeout(15_000),
  });
  expect(res.status).toBe(200);
  const events = (await res.text())
    .split('\n')
    .filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)) as Record<string, unknown>);
  return { events, requestId };
}

const trace = async (requestId: string) => {
  await eventually(() => expect(router.traceLines().some((t) => t.requestId === requestId)).toBe(true), { timeoutMs: 10_000 });
  return router.traceLines().find((t) => t.requestId === requestId)!;
};

describe('an SGLang pool and stream_options', () => {
  it('stream_options without include_usage: no usage chunk for the client (SGLang defaults it to false), usage recorded by the router', async () => {
    const { events, requestId } = await stream({ stream_options: {} });
    expect(events.length).toBeGreaterThan(0);
    expect(events.some((e) => 'usage' in e && e.usage !== null)).toBe(false);
    // The router asked SGLang for usage on its own behalf.
    expect((mock.stats().lastCompletionRequest!.body as { stream_options: unknown }).stream_options).toEqual({ include_usage: true });
    expect((await trace(requestId)).promptTokens).toBeGreaterThan(0);
  });

  it('include_usage true: the client gets the usage chunk', async () => {
    const { events } = await stream({ stream_options: { include_usage: true } });
    expect(events.some((e) => typeof e.usage === 'object' && e.usage !== null)).toBe(true);
  });
});
