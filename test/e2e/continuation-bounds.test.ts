// Never break a stream (issue #28), the overall bound: `maxStreamMs` bounds a continued stream as
// it bounds any: a continuation whose replica sends no first token before the stream's deadline
// is given up at the deadline (not after firstTokenTimeoutMs), and the stream ends with the
// error event saying so. Router under Miniflare, two mock vLLM replicas; the openai SDK. 127.0.0.1 only.

import OpenAI, { APIError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { startContinuationRig, type ContinuationRig } from '../helpers/continuation-rig.js';
import { eventually, TEST_KEY, type RouterHandle } from '../helpers/router.js';

let rig: ContinuationRig;
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  // A first token may take 30 s; the whole stream may take 2 s.
  rig = await startContinuationRig(2, { overrides: { idleTimeoutMs: 500, maxStreamMs: 2_000, firstTokenTimeoutMs: 30_000, firstByteTimeoutMs: 30_000, maxContinuations: 2 }, poolOverrides: { maxFails: 100 } });
  ({ mocks, router } = rig);
}, 60_000);

afterAll(async () => rig?.close());

describe('maxStreamMs bounds a continued stream', () => {
  it('the continuation waits for its first token only until the stream deadline, then the stream ends naming max_duration', async () => {
    const session = 'bounded-continuation';
    const requestId = 'bounded-continuation-1';
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 25_000, defaultHeaders: { 'x-session-id': session } });
    const ask = (id: string) => client.chat.completions.create({ model: 'demo-model', stream: true, max_tokens: 24, messages: [{ role: 'user', content: 'tell me a long story' }] }, { headers: { 'x-request-id': id } }).withResponse();
    const probe = await ask('bounded-continuation-probe');
    const homeId = probe.response.headers.get('x-prefix-router-replica');
    for await (const _ of probe.data);
    const home = mocks.find((m) => m.id === homeId)!;
    const other = mocks.find((m) => m.id !== homeId)!;
    // The home replica stalls after five tokens (a break after idleTimeoutMs); the other never sends a first token.
    home.setFaults({ stallAfterTokens: 5 });
    other.setFaults({ stallAfterTokens: 0 });
    let text = '';
    let error: APIError | null = null;
    try {
      const { data } = await ask(requestId);
      for await (const ch of data) text += ch.choices[0]?.delta.content ?? '';
    } catch (e) {
      if (!(e instanceof APIError)) throw e;
      error = e;
    } finally {
      home.setFaults({ stallAfterTokens: null });
      other.setFaults({ stallAfterTokens: null });
    }
    expect(text.length).toBeGreaterThan(0);
    expect(error).not.toBeNull();
    expect(error!.message).toContain('not continued on another replica: max_duration');
    await eventually(() => expect(router.traceLines().some((t) => t.requestId === requestId)).toBe(true), { timeoutMs: 10_000 });
    const t = router.traceLines().find((x) => x.requestId === requestId)!;
    expect(t).toMatchObject({ notContinued: "max_duration" });
  }, 30_000);
});
