// Review of #17 (stale engine pin, src/proxy/forward.ts): when vLLM refuses the router's own
// X-data-parallel-rank (the server came back with fewer engines before the next scrape) on an
// attempt that may not be retried (maxRetries 0, or the last attempt), the client gets that 400,
// but the replica must still be unpinned, so the next request is not refused the same way for
// the rest of the scrape interval. Router under Miniflare, mock vLLM, openai SDK; 127.0.0.1 only.

import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';

import { eventually, TEST_KEY } from '../helpers/router.js';
import { startShrinkRig, type ShrinkRig } from '../helpers/shrunk-dp.js';

const SYSTEM = 'You are the support assistant of a data-parallel test; answer briefly and precisely. '.repeat(10);
type Message = { role: 'system' | 'user' | 'assistant'; content: string };

describe('a stale engine pin on an attempt that may not be retried', () => {
  let rig: ShrinkRig | undefined;
  afterAll(async () => rig?.close());

  it('answers vLLM\'s 400 and unpins the replica: the next request goes unpinned and is served', async () => {
    rig = await startShrinkRig('shrink0', { overrides: { maxRetries: 0 } });
    const r = rig;
    const c = new OpenAI({ baseURL: `${r.router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
    const historyOf = (k: number): Message[] => [{ role: 'system', content: `${SYSTEM} (shrink0 ${k})` }, { role: 'user', content: 'hello' }];
    const { session, k } = await r.sessionOnEngine1(
      async (session, k) => void (await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: historyOf(k) }, { headers: { 'x-session-id': session } })),
      () => r.mock.stats().lastCompletionRequest!.headers['x-data-parallel-rank'],
    );
    await r.shrink();
    const history = [...historyOf(k), { role: 'user' as const, content: 'and after the restart?' }];
    const refused = await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: history }, { headers: { 'x-session-id': session } }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
    // The release said why: no engine is pinned there until the next scrape names them.
    await eventually(async () => expect((await r.replica()).engines).toBeUndefined(), { timeoutMs: 15_000, intervalMs: 50 });
    history.push({ role: 'user', content: 'once more' });
    const res = await c.chat.completions.create({ model: 'demo-model', max_tokens: 4, messages: history }, { headers: { 'x-session-id': session } });
    expect(res.choices[0]!.message.content).toBeTruthy();
    expect(r.mock.stats().lastCompletionRequest!.headers['x-data-parallel-rank']).toBeUndefined();
  });
});
