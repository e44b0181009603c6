// The pure quota math (src/quota/limits.ts, src/quota/usage.ts) on a virtual clock.
import { describe, expect, it } from 'vitest';
import { admissionCharge, bucketKey, bucketsFor, decideAdmission, estimatePromptTokens, formatResetDuration, rateLimitHeaders, type Bucket } from '../../../src/quota/limits.js';
import { addUsage, foldTopTenants, rebucket, usageCsv, usageHitRate, emptyUsage, type UsageCounters, type UsageRow } from '../../../src/quota/usage.js';

function run(limits: Parameters<typeof bucketsFor>[0]) {
  const store = new Map<string, Bucket>();
  return (tokens: number, now: number, model = 'm') => {
    const d = decideAdmission(bucketsFor(limits, model), (k) => store.get(k), tokens, now);
    if (d.ok) for (const [k, level] of d.levels) store.set(k, { level, at: now });
    return d;
  };
}

describe('token buckets', () => {
  it('admits exactly the limit in a burst, then refuses with the time one request takes to refill', () => {
    const admit = run({ requestsPerMinute: 120 });
    const t0 = 1_000_000;
    for (let i = 0; i < 120; i++) expect(admit(0, t0).ok).toBe(true);
    const d = admit(0, t0);
    expect(d.ok).toBe(false);
    if (d.ok) return;
    expect(d).toMatchObject({ kind: 'requests', scope: '*', limit: 120, available: 0, requested: 1, retryAfterMs: 500 });
    // Reset timing: 499 ms later still refused, at 500 ms one request fits, and only one.
    expect(admit(0, t0 + 499).ok).toBe(false);
    expect(admit(0, t0 + 500).ok).toBe(true);
    expect(admit(0, t0 + 500).ok).toBe(false);
  });

  it('charges tokens from every bucket that applies, all or none; per-model limits beside the tenant-wide one', () => {
    const admit = run({ tokensPerMinute: 1000, models: { m: { tokensPerMinute: 300 } } });
    expect(admit(300, 0)).toMatchObject({ ok: true, state: { tokens: { limit: 300, remaining: 0 } } });
    const refused = admit(1, 0);
    expect(refused).toMatchObject({ ok: false, kind: 'tokens', scope: 'm', limit: 300, retryAfterMs: 200 });
    // The tenant-wide bucket was charged only for the admitted request: another model gets the 700 left.
    expect(admit(700, 0, 'n')).toMatchObject({ ok: true, state: { tokens: { limit: 1000, remaining: 0 } } });
    expect(admit(1, 0, 'n')).toMatchObject({ ok: false, kind: 'tokens', scope: '*' });
  });

  it('a charge above the limit can never fit: no retry time', () => {
    const d = run({ tokensPerMinute: 100 })(101, 0);
    expect(d).toMatchObject({ ok: false, kind: 'tokens', retryAfterMs: null });
  });

  it('reports the tightest bucket of each kind and the time until it is full', () => {
    const admit = run({ requestsPerMinute: 60, tokensPerMinute: 6000 });
    const d = admit(3000, 0);
    expect(d.ok && d.state).toEqual({ requests: { limit: 60, remaining: 59, resetMs: 1000 }, tokens: { limit: 6000, remaining: 3000, resetMs: 30_000 } });
    expect(rateLimitHeaders(d.state)).toEqual([
      ['x-ratelimit-limit-requests', '60'],
      ['x-ratelimit-remaining-requests', '59'],
      ['x-ratelimit-reset-requests', '1s'],
      ['x-ratelimit-limit-tokens', '6000'],
      ['x-ratelimit-remaining-tokens', '3000'],
      ['x-ratelimit-reset-tokens', '30s'],
    ]);
    expect(bucketKey({ kind: 'tokens', scope: '*' })).toBe('tokens:*');
  });
});

describe('formats', () => {
  it('writes reset durations as OpenAI does (Go duration strings)', () => {
    expect([0, 12, 999, 1000, 1500, 17_287, 60_000, 360_000, 86_400, 3_723_400].map(formatResetDuration)).toEqual(['0s', '12ms', '999ms', '1s', '1.5s', '17.287s', '1m0s', '6m0s', '1m26.4s', '1h2m3.4s']);
  });

  it('estimates prompt tokens from text, not from image data', () => {
    const text = 'x'.repeat(400);
    expect(estimatePromptTokens({ messages: [{ role: 'user', content: text }] })).toBe(Math.ceil((4 + 400) / 4));
    expect(estimatePromptTokens({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,' + 'A'.repeat(100_000) } }] }] })).toBeLessThan(10);
    expect(estimatePromptTokens({ prompt: 'abcd'.repeat(10) })).toBe(10);
  });

  it('charges max_tokens when named, a capped default otherwise', () => {
    const refs = bucketsFor({ tokensPerMinute: 500 }, 'm');
    expect(admissionCharge(100, 50, refs)).toBe(150);
    expect(admissionCharge(100, 1000, refs)).toBe(1100); // too large, refused as such
    expect(admissionCharge(100, null, refs)).toBe(500);
    expect(admissionCharge(100, null, [])).toBe(1124);
  });
});

describe('usage', () => {
  const row = (tenant: string, start: number, prompt: number): UsageRow => ({ tenant, model: 'm', start, bucketMs: 60_000, ...emptyUsage(), requests: 1, promptTokens: prompt });

  it('re-buckets minute rows into hours and renders CSV', () => {
    const rows = rebucket([row('a', 0, 1), row('a', 60_000, 2), row('b', 3_600_000, 5)], 3_600_000);
    expect(rows.map((r) => [r.tenant, r.start, r.requests, r.promptTokens])).toEqual([
      ['a', 0, 2, 3],
      ['b', 3_600_000, 1, 5],
    ]);
    const csv = usageCsv(rows).split('\r\n');
    expect(csv[0]).toBe('bucket_start,bucket_end,tenant,model,requests,prompt_tokens,cached_tokens,completion_tokens,requests_without_usage,reserved_tokens,limited_by_requests,limited_by_tokens,cache_reported_prompt_tokens,requests_without_cache_report');
    expect(csv[1]).toBe('1970-01-01T00:00:00.000Z,1970-01-01T01:00:00.000Z,a,m,2,3,0,0,0,0,0,0,0,0');
  });

  it('a row stored before the cache-report fields existed adds as 0, and the hit rate counts only reported requests', () => {
    const old = { requests: 1, promptTokens: 100, cachedTokens: 40, completionTokens: 5, requestsWithoutUsage: 0, reservedTokens: 0, limitedByRequests: 0, limitedByTokens: 0 } as unknown as UsageCounters;
    const sum = addUsage(old, { requests: 1, promptTokens: 50, requestsWithoutCacheReport: 1 });
    expect(sum).toMatchObject({ requests: 2, promptTokens: 150, cachedTokens: 40, cacheReportedPromptTokens: 0, requestsWithoutCacheReport: 1 });
    expect(usageHitRate(sum)).toBeNull();
    expect(usageHitRate({ cachedTokens: 30, cacheReportedPromptTokens: 120 })).toBe(0.25);
  });

  it('folds all but the top N tenants into one "other" entry', () => {
    const t = (tenant: string, tokens: number) => ({ tenant, models: { m: { ...emptyUsage(), promptTokens: tokens } }, state: null, reportedAt: 0 });
    const { top, other } = foldTopTenants([t('a', 5), t('b', 50), t('c', 1), t('d', 7)], 2);
    expect(top.map((x) => x.tenant)).toEqual(['b', 'd']);
    expect(other).toMatchObject({ tenant: '_other', models: { m: { promptTokens: 6 } } });
  });
});

describe('settlement', () => {
  it('charges usage when it came, nothing for a failure, the estimate for a complete answer without usage, the reservation for a cut one', async () => {
    const { tokensUsed } = await import('../../../src/http/quota-admission.js');
    const ok = { replica: 'a', status: 200 } as const;
    expect(tokensUsed(ok, { promptTokens: 10, completionTokens: 5 }, 100, 8)).toBe(15);
    expect(tokensUsed({ replica: null, status: 503 }, null, 100, 8)).toBe(0);
    expect(tokensUsed({ replica: 'a', status: 400 }, null, 100, 8)).toBe(0);
    expect(tokensUsed(ok, null, 100, 8)).toBe(8);
    expect(tokensUsed({ ...ok, error: 'client_abort' }, null, 100, 8)).toBe(100);
  });
});

describe('isolate allowances', () => {
  it('grants 5 % of a limit while a quarter stays back, nothing for small limits or near the limit', async () => {
    const { grantAllowance } = await import('../../../src/quota/limits.js');
    const refs = bucketsFor({ requestsPerMinute: 1000, tokensPerMinute: 100_000 }, 'm');
    const levels = (r: number, t: number) => new Map([['requests:*', r], ['tokens:*', t]]);
    expect(grantAllowance(refs, levels(1000, 100_000), 100, 0)).toEqual({ requests: 50, tokens: 5000, until: 2000 });
    expect(grantAllowance(refs, levels(270, 100_000), 100, 0)).toEqual({ requests: 20, tokens: 5000, until: 2000 });
    expect(grantAllowance(refs, levels(254, 100_000), 100, 0)).toBeNull(); // 4 requests: not worth it
    expect(grantAllowance(refs, levels(1000, 25_100), 100, 0)).toBeNull(); // tokens for fewer than 2 requests
    expect(grantAllowance(bucketsFor({ requestsPerMinute: 60 }, 'm'), new Map(), 1, 0)).toBeNull(); // 3 per grant
    expect(grantAllowance(bucketsFor({ tokensPerMinute: 100_000 }, 'm'), new Map(), 10, 0)).toEqual({ requests: null, tokens: 5000, until: 2000 });
  });
});

describe('requestedMaxTokens: the budget the engine may obey, for every sequence', () => {
  it('takes the largest budget field present, so a 0 in one cannot let the other through uncharged', async () => {
    const { requestedMaxTokens } = await import('../../../src/quota/limits');
    expect(requestedMaxTokens({ max_completion_tokens: 0, max_tokens: 19_000 })).toBe(19_000);
    expect(requestedMaxTokens({ max_tokens: 100 })).toBe(100);
    expect(requestedMaxTokens({ max_output_tokens: 50 })).toBe(50);
    expect(requestedMaxTokens({})).toBeNull();
    expect(requestedMaxTokens({ max_tokens: -1 })).toBeNull();
  });
  it('multiplies by the sequences the request runs (n, best_of)', async () => {
    const { requestedMaxTokens } = await import('../../../src/quota/limits');
    expect(requestedMaxTokens({ max_tokens: 100, n: 3 })).toBe(300);
    expect(requestedMaxTokens({ max_tokens: 100, n: 2, best_of: 5 })).toBe(500);
  });
});
