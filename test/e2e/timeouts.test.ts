// Timeouts end to end, against the mock's faithful vLLM profile: a replica that sends its 200 and
// headers (vLLM does so before queueing) and then no first token within firstTokenTimeoutMs gets
// the client a 504 in the OpenAI error shape, never the 200 (the only replica here, so no other to
// retry on); a replica that goes silent mid-stream ends the
// stream with a final SSE error event that the openai SDK raises; a stream still running at
// maxStreamMs is cut the same way, before its lease's deadline; all release their leases.

import OpenAI, { APIError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

// Far above what a healthy stream needs between bytes even on a loaded 2-core machine, so only the
// injected stalls (or the deliberately long stream) trip them.
const FIRST_TOKEN_MS = 2_000;
const IDLE_MS = 2_000;
const MAX_STREAM_MS = 5_000;
let mocks: MockVllm[] = [];
let router: RouterHandle;

const inFlight = async () => ((await (await router.adminFetch('/admin/pools/chat')).json()) as { replicas: { inFlight: number }[] }).replicas.reduce((s, r) => s + r.inFlight, 0);

/** Stream a chat through the openai SDK; the chunks it yielded and what it threw (null: nothing). */
async function streamUntilError(maxTokens: number, session: string): Promise<{ chunks: number; error: unknown }> {
  const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
  const stream = await client.chat.completions.create({ model: 'demo-model', stream: true, max_tokens: maxTokens, messages: [{ role: 'user', content: 'hello' }] }, { headers: { 'x-session-id': session } });
  let chunks = 0;
  try {
    for await (const _ of stream) chunks++;
  } catch (error) {
    return { chunks, error };
  }
  return { chunks, error: null };
}

beforeAll(async () => {
  mocks = await startMocks(1, { decodeMsPerToken: 5 });
  router = await startRouter({
    config: routerConfig({ replicas: mocks, overrides: { firstTokenTimeoutMs: FIRST_TOKEN_MS, idleTimeoutMs: IDLE_MS, maxStreamMs: MAX_STREAM_MS }, poolOverrides: { maxFails: 100 } }),
  });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

describe('timeouts', () => {
  it('headers but no first token within firstTokenTimeoutMs: 504 with Retry-After (no other replica to retry on), lease released', async () => {
    mocks[0]!.setFaults({ stallBeforeForever: true });
    const before = mocks[0]!.stats().completionRequestsTotal;
    const started = Date.now();
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', 'x-session-id': 'slow-1' },
      body: JSON.stringify({ model: 'demo-model', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    });
    const elapsed = Date.now() - started;
    expect(res.status).toBe(504);
    expect(res.headers.get('retry-after')).toMatch(/^\d+$/);
    const body = (await res.json()) as { error: { code: string; type: string; message: string } };
    expect(body.error.code).toBe('upstream_timeout');
    expect(body.error.type).toBe('server_error');
    expect(elapsed).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
    // The replica follows vLLM, whose 200 and headers went out before the stall: the router held them back.
    expect(mocks[0]!.stats().profile).toBe('vllm');
    expect(mocks[0]!.stats().completionRequestsTotal - before).toBe(1);
    mocks[0]!.setFaults({ stallBeforeForever: false });
    await eventually(async () => expect(await inFlight()).toBe(0), { timeoutMs: 15_000 });
  });

  it('silence mid-stream over idleTimeoutMs: a final SSE error event the openai SDK raises', async () => {
    mocks[0]!.setFaults({ stallMidStream: 3 });
    const { chunks, error } = await streamUntilError(50, 'stall-1');
    expect(chunks).toBeGreaterThan(0);
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).code).toBe('upstream_timeout');
    mocks[0]!.setFaults({ stallMidStream: null });
    await eventually(async () => expect(await inFlight()).toBe(0), { timeoutMs: 15_000 });
    // The router asked the replica to stop: no stream is left open on it.
    await eventually(() => expect(mocks[0]!.stats().activeStreams).toBe(0), { timeoutMs: 15_000 });
  });

  it('a stream still running at maxStreamMs ends with an SSE error event, its lease released (not expired)', async () => {
    const started = Date.now();
    const { chunks, error } = await streamUntilError(2_000, 'long-1');
    const elapsed = Date.now() - started;
    expect(chunks).toBeGreaterThan(10);
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).code).toBe('stream_too_long');
    expect(elapsed).toBeGreaterThanOrEqual(MAX_STREAM_MS - 100);
    // Cut, not finished: 2,000 tokens at 5 ms each take twice maxStreamMs (no upper bound on the
    // time: a loaded machine may be slow to deliver the cut; the error code says which timer cut it).
    expect(chunks).toBeLessThan(2_000);
    await eventually(async () => expect(await inFlight()).toBe(0), { timeoutMs: 15_000 });
    const snap = (await (await router.adminFetch('/admin/pools/chat')).json()) as { expiredLeases: number; replicas: { healthy: boolean }[] };
    expect(snap.expiredLeases).toBe(0);
    expect(snap.replicas.every((r) => r.healthy)).toBe(true);
    await eventually(() => expect(mocks[0]!.stats().activeStreams).toBe(0), { timeoutMs: 15_000 });
  });
});
