// Tenant quotas end to end: the router under Miniflare, two mock vLLM replicas, the official
// openai SDK. Requests- and tokens-per-minute limits at the boundary with OpenAI's headers, the
// SDK's own retries honouring retry-after-ms, settlement from the mock engine's usage, a stream
// cut by the client keeping its charge, and the billing export agreeing with the engines' usage
// fields to the token. Real clock: limits are chosen so refills between requests stay below one
// unit. Only 127.0.0.1; every wait bounded.

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_TENANTS, type RouterHandle, type TestTenant } from '../helpers/router.js';

const MODEL = 'demo-model';
const tenant = (name: string, limits: TestTenant['limits']): TestTenant => ({ key: `sk-e2e-${name}-${Math.random().toString(36).slice(2)}`, tenant: name, keyId: `e2e-${name}`, pools: ['*'], limits });
// One request refills every 6 s: far longer than the burst below takes even on a loaded machine.
const RPM = tenant('rpm', { requestsPerMinute: 10 });
const TPM = tenant('tpm', { tokensPerMinute: 600 }); // 10 tokens a second
const CUT = tenant('cut', { tokensPerMinute: 100_000 });
const METERED = tenant('metered', undefined);

let mocks: MockVllm[] = [];
let router: RouterHandle;
const originCompletions = () => mocks.reduce((s, m) => s + m.stats().completionRequestsTotal, 0);

beforeAll(async () => {
  // vLLM with --enable-prompt-tokens-details: the metering test compares cached tokens too.
  mocks = await startMocks(2, { decodeMsPerToken: 20, maxRunning: 64, profile: 'vllm-cache-report' });
  router = await startRouter({ config: routerConfig({ replicas: mocks.map((m) => ({ id: m.id, url: m.url })) }), tenants: [...TEST_TENANTS, RPM, TPM, CUT, METERED] });
});

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

const chat = (key: string, extra: Record<string, unknown> = {}, signal?: AbortSignal) =>
  fetch(`${router.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, ...extra }), ...(signal ? { signal } : {}) });

describe('requests per minute', () => {
  it('admits exactly 10 in a burst, then 429s with the headers; the SDK retries on retry-after-ms and succeeds', async () => {
    const before = originCompletions();
    // At once: the burst is over long before a request refills (one per 6 s).
    const burst = await Promise.all(Array.from({ length: 10 }, () => chat(RPM.key)));
    expect(burst.map((r) => r.status)).toEqual(Array(10).fill(200));
    for (const res of burst) {
      expect(res.headers.get('x-ratelimit-limit-requests')).toBe('10');
      expect(res.headers.get('x-ratelimit-reset-requests')).toMatch(/^(\d+ms|\d+(\.\d+)?s|\dm\d+(\.\d+)?s)$/);
      await res.text();
    }
    // Every admission took one request: each answer saw a different remaining count, 9 down to 0.
    expect(burst.map((r) => Number(r.headers.get('x-ratelimit-remaining-requests'))).sort((a, b) => a - b)).toEqual(Array.from({ length: 10 }, (_, i) => i));
    const over = await chat(RPM.key);
    expect(over.status).toBe(429);
    const wait = Number(over.headers.get('retry-after-ms'));
    expect(wait).toBeGreaterThan(0);
    expect(wait).toBeLessThanOrEqual(6000);
    expect(over.headers.get('retry-after')).toBe(String(Math.ceil(wait / 1000)));
    expect(over.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    expect(await over.json()).toMatchObject({ error: { type: 'requests', code: 'rate_limit_exceeded', param: null } });
    // (A burst on one key may also cost an early-connect request the pick cancelled: count from here.)
    const afterBurst = originCompletions();
    expect(afterBurst - before).toBeGreaterThanOrEqual(10);

    // The SDK without retries surfaces a RateLimitError carrying the headers.
    const noRetry = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: RPM.key, maxRetries: 0 });
    const err = await noRetry.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect((err as InstanceType<typeof OpenAI.RateLimitError>).headers.get('x-ratelimit-limit-requests')).toBe('10');
    expect((err as InstanceType<typeof OpenAI.RateLimitError>).type).toBe('requests');

    // With its default retries the SDK waits what retry-after-ms says and gets through.
    const statuses: number[] = [];
    const client = new OpenAI({
      baseURL: `${router.url}/v1`,
      apiKey: RPM.key,
      maxRetries: 3,
      fetch: async (url, init) => {
        const res = await fetch(url, init);
        statuses.push(res.status);
        return res;
      },
    });
    const started = Date.now();
    const done = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 });
    expect(done.choices[0]!.message.content).toBeTruthy();
    expect(statuses.at(-1)).toBe(200);
    expect(statuses.slice(0, -1).every((s) => s === 429)).toBe(true);
    expect(statuses.length).toBeGreaterThanOrEqual(2);
    expect(Date.now() - started).toBeGreaterThanOrEqual(Math.min(wait, 500));
    // The refused attempts never reached a replica: one more completion, the one that succeeded.
    expect(originCompletions() - afterBurst).toBe(1);
  }, 30_000);
});

describe('tokens per minute', () => {
  it('charges prompt estimate + max_tokens, refuses a request that does not fit with type "tokens", settles from usage after the stream', async () => {
    // ~2 tokens of prompt estimate + 500 of max_tokens: fits once in 600. It decodes for 10 s.
    const ac = new AbortController();
    const first = await chat(TPM.key, { max_tokens: 500, stream: true }, ac.signal);
    expect(first.status).toBe(200);
    expect(Number(first.headers.get('x-ratelimit-remaining-tokens'))).toBeLessThan(110);
    // While the first holds its reservation a second 500 does not fit.
    const second = await chat(TPM.key, { max_tokens: 500 });
    expect(second.status).toBe(429);
    const body = (await second.json()) as { error: { message: string } };
    expect(body).toMatchObject({ error: { type: 'tokens', code: 'rate_limit_exceeded' } });
    expect(body.error.message).toMatch(/on tokens per min \(TPM\): Limit 600, Used \d+, Requested 502\. Please try again in/);
    ac.abort();

    // Settlement: the mock's words end in a space, so stop: [' '] ends an answer after one token and
    // the bucket gets back what the engine did not use.
    const third = await chat(TPM.key, { max_tokens: 50, stop: [' '], stream: true, stream_options: { include_usage: true } });
    expect(third.status).toBe(200);
    const r3 = Number(third.headers.get('x-ratelimit-remaining-tokens'));
    const text = await third.text();
    const usage = JSON.parse(text.split('\n\n').find((e) => e.includes('"usage"'))!.slice(6)).usage as { completion_tokens: number };
    expect(usage.completion_tokens).toBe(1);
    // Fits only with the ~49 tokens given back (the refill alone needs 3 s for 30). The meter gives
    // them back in the same step that meters the answer's usage: wait for that, then ask once.
    const fourth = r3 + 30;
    await eventually(async () => expect((await tenantUsage('tpm'))[0]?.completion_tokens).toBeGreaterThanOrEqual(1), { timeoutMs: 15_000, intervalMs: 100 });
    const fits = await chat(TPM.key, { max_tokens: fourth - 2, stop: [' '] });
    expect(fits.status).toBe(200);
    await fits.text();
    // A charge above the limit is never retried by the SDK (x-should-retry: false).
    let calls = 0;
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TPM.key, maxRetries: 3, fetch: async (u, i) => (calls++, fetch(u, i)) });
    const big = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5000 }).catch((e: unknown) => e);
    expect(big).toBeInstanceOf(OpenAI.RateLimitError);
    expect(calls).toBe(1);
  }, 30_000);
});

interface UsageExportRow {
  tenant: string;
  model: string;
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  requests_without_usage: number;
  reserved_tokens: number;
}
const tenantUsage = async (id: string): Promise<UsageExportRow[]> => {
  const res = await router.adminFetch(`/admin/tenants/${id}/usage?bucket=day`);
  expect(res.status).toBe(200);
  return ((await res.json()) as { data: UsageExportRow[] }).data;
};

describe('settlement and metering', () => {
  it('a stream the client cuts is charged its reservation and metered as without usage', async () => {
    const ac = new AbortController();
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${CUT.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'Write a long story.' }], max_tokens: 400, stream: true }),
      signal: ac.signal,
    });
    expect(res.status).toBe(200);
    const charged = 100_000 - Number(res.headers.get('x-ratelimit-remaining-tokens'));
    const reader = res.body!.getReader();
    await reader.read();
    ac.abort();
    await reader.cancel().catch(() => {});
    const rows = await eventually(async () => {
      const r = await tenantUsage('cut');
      expect(r[0]?.requests).toBe(1);
      return r;
    }, { timeoutMs: 10_000, intervalMs: 100 });
    expect(rows).toEqual([expect.objectContaining({ tenant: 'cut', model: MODEL, requests: 1, requests_without_usage: 1, reserved_tokens: charged, prompt_tokens: 0, completion_tokens: 0 })]);
  }, 30_000);

  it('usage agrees with the engine\'s usage fields to the token: SDK streaming and non-streaming', async () => {
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: METERED.key, maxRetries: 0 });
    const system = 'You are a meticulous assistant for the metering test. '.repeat(30);
    const sum = { prompt: 0, cached: 0, completion: 0 };
    for (let i = 0; i < 4; i++) {
      const messages = [{ role: 'system' as const, content: system }, { role: 'user' as const, content: `question ${i}` }];
      if (i % 2 === 0) {
        const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 5 + i });
        sum.prompt += r.usage!.prompt_tokens;
        sum.cached += r.usage!.prompt_tokens_details?.cached_tokens ?? 0;
        sum.completion += r.usage!.completion_tokens;
      } else {
        const s = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 5 + i, stream: true, stream_options: { include_usage: true } });
        for await (const chunk of s) {
          if (chunk.usage) {
            sum.prompt += chunk.usage.prompt_tokens;
            sum.cached += chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
            sum.completion += chunk.usage.completion_tokens;
          }
        }
      }
    }
    expect(sum.cached).toBeGreaterThan(0);
    const rows = await eventually(async () => {
      const r = await tenantUsage('metered');
      expect(r[0]?.requests).toBe(4);
      return r;
    }, { timeoutMs: 10_000, intervalMs: 100 });
    expect(rows).toEqual([expect.objectContaining({ tenant: 'metered', model: MODEL, requests: 4, prompt_tokens: sum.prompt, cached_tokens: sum.cached, completion_tokens: sum.completion, requests_without_usage: 0 })]);
    // The trace log carries the same numbers per request, with tenant and model.
    const lines = router.traceLines().filter((l) => l.tenant === 'metered');
    expect(lines).toHaveLength(4);
    expect(lines.every((l) => l.model === MODEL)).toBe(true);
    expect(lines.reduce((s, l) => s + (l.promptTokens as number), 0)).toBe(sum.prompt);
    expect(lines.reduce((s, l) => s + (l.completionTokens as number), 0)).toBe(sum.completion);
    // ...and the all-tenant export, once the meter has reported to the registry (≈2 s).
    await eventually(async () => {
      const res = await router.adminFetch('/admin/usage?bucket=hour&format=csv&tenant=metered');
      const csv = (await res.text()).trim().split('\r\n');
      expect(csv.slice(1).map((l) => l.split(',').slice(2, 8).join(','))).toEqual([`metered,${MODEL},4,${sum.prompt},${sum.cached},${sum.completion}`]);
    }, { timeoutMs: 10_000, intervalMs: 250 });
  }, 30_000);
});
