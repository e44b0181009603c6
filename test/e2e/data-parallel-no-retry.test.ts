// Review of #17 (stale engine pin, src/proxy/forward.ts): when vLLM refuses the router's own
// X-data-parallel-rank (the server came back with fewer engines before the next scrape) on an
// attempt that may not be retried (maxRetries 0, or the last attempt), the client gets that 400,
// but the replica must still be unpinned, so the next request is not refused the same way for
// the rest of the scrape interval. Router under Miniflare, mock vLLM, openai SDK; 127.0.0.1 only.

import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { eventually, routerConfig, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../helpers/router.js';

const SYSTEM = 'You are the support assistant of a data-parallel test; answer briefly and precisely. '.repeat(10);
type Message = { role: 'system' | 'user' | 'assistant'; content: string };

describe('a stale engine pin on an attempt that may not be retried', () => {
  let mock: MockVllm;
  let r: RouterHandle;
  afterAll(async () => {
    await r?.close();
    await mock?.close();
  });

  it('answers vLLM\'s 400 and unpins the replica: the next request goes unpinned and is served', async () => {
    mock = await startMockVllm({ id: 'shrink0', keepAlive: false, port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], dataParallelSize: 2 });
    r = await startRouter({
      config: routerConfig({
        replicas: [mock],
        strategy: 'prefix-aware',
        keys: ['header:x-session-id', 'prefix:4096'],
        overrides: { maxRetries: 0 },
        poolOverrides: { scrapeIntervalMs: 60_000, healthIntervalMs: 60_000 },
      }),
    });
    const c = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
    const engines = async () => ((await (await r.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot).replicas[0]!.engines;
    await eventually(async () => expect(await engines()).toHaveLength(2), { timeoutMs: 15_000, intervalMs: 100 });
    let session = '';
    let history: Message[] = [];
    for (let k = 0; k < 40 && session === ''; k++) {
      const h: Message[] = [{ role: 'system', content: `${SYSTEM} (shrink0 ${k})` }, { role: 'user', content: 'hello' }];
      await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: h }, { headers: { 'x-session-id': `shrink0-${k}` } });
      if (mock.stats().lastCompletionRequest!.headers['x-data-parallel-rank'] === '1') [session, history] = [`shrink0-${k}`, h];
    }
    expect(session).not.toBe('');
    const port = mock.port;
    await mock.close();
    mock = await startMockVllm({ id: 'shrink0', keepAlive: false, port, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'] });
    history.push({ role: 'user', content: 'and after the restart?' });
    const refused = await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: history }, { headers: { 'x-session-id': session } }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
    // The release said why: no engine is pinned there until the next scrape names them.
    await eventually(async () => expect(await engines()).toBeUndefined(), { timeoutMs: 15_000, intervalMs: 50 });
    history.push({ role: 'user', content: 'once more' });
    const res = await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: history }, { headers: { 'x-session-id': session } });
    expect(res.choices[0]!.message.content).toBeTruthy();
    expect(mock.stats().lastCompletionRequest!.headers['x-data-parallel-rank']).toBeUndefined();
  });
});
