// A Responses `background: true` request answers before its tokens are spent: settling it keeps
// the whole reservation (http/quota-admission.ts `settle(..., { deferred })`) instead of the prompt estimate that
// an answer without usage otherwise gets, so background mode is no way around a token limit.
import { describe, expect, it } from 'vitest';
import { admit } from '../../../src/http/quota-admission';
import type { FinishedRequest } from '../../../src/proxy/forward';

const finished = (over: Partial<FinishedRequest> = {}): FinishedRequest => ({
  replica: 'r1', status: 200, ttftMs: 5, durationMs: 9, promptTokens: null, cachedTokens: null, completionTokens: null, retried: false, spilled: false, attempts: 1, ...over,
});

async function settledUse(deferred: boolean, over: Partial<FinishedRequest> = {}): Promise<{ used: number; charged: number }> {
  const settles: Array<{ used: number; charged: number }> = [];
  const meter = {
    admit: async () => ({ ok: true as const, state: { requests: null, tokens: null } }),
    settle: async (req: { used: number; charged: number }) => void settles.push(req),
  };
  const waits: Promise<unknown>[] = [];
  const adm = await admit(
    { env: {} as Env, tenant: { id: 'acme', limits: { tokensPerMinute: 100_000 } }, requestId: 'r', waitUntil: (p) => waits.push(p), meter: () => meter as never },
    { model: 'demo-model', body: { model: 'demo-model', input: 'x'.repeat(400), background: true, max_output_tokens: 500 } },
  );
  adm.settle(finished(over), { deferred });
  await Promise.all(waits);
  return settles[0]!;
}

describe('settling a background Responses request', () => {
  it('keeps the whole reservation when the answer (queued) came without usage', async () => {
    const s = await settledUse(true);
    expect(s.used).toBe(s.charged);
    expect(s.charged).toBeGreaterThanOrEqual(500);
  });

  it('an ordinary answer without usage is charged the prompt estimate only', async () => {
    const s = await settledUse(false);
    expect(s.used).toBeLessThan(s.charged);
  });

  it('a refused or failed background request is charged nothing, as any other', async () => {
    expect((await settledUse(true, { status: 400 })).used).toBe(0);
    expect((await settledUse(true, { replica: null, status: 503 })).used).toBe(0);
  });
});
