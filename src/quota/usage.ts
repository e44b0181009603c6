// Usage metering records: what a tenant used per model and time bucket, the billing export's
// JSON and CSV, and the top-N-plus-"other" folding that keeps /metrics label sets bounded.
// Pure: plain data in and out.

import type { RateState } from './limits.js';

export const MINUTE_MS = 60_000;
export const HOUR_MS = 3_600_000;
export const DAY_MS = 86_400_000;

/** Counters of one (tenant, model, time bucket). Token counts are the engines' usage fields. */
export interface UsageCounters {
  /** Requests admitted and answered (any status). */
  requests: number;
  /** Prompt tokens of every usage report. */
  promptTokens: number;
  /** Cached prompt tokens as the engines reported them (a request without a figure adds nothing). */
  cachedTokens: number;
  /** Prompt tokens of the requests whose engine reported cached tokens: the hit rate's denominator. */
  cacheReportedPromptTokens: number;
  /**
   * Requests with usage but no cached-token figure (vLLM without --enable-prompt-tokens-details,
   * SGLang without --enable-cache-report): their hit rate is unknown, not 0.
   */
  requestsWithoutCacheReport: number;
  completionTokens: number;
  /** Answered requests whose usage never arrived (a stream cut short): charged their reservation. */
  requestsWithoutUsage: number;
  /** Tokens charged for those requests (their admission reservation), not in the usage columns. */
  reservedTokens: number;
  /** Requests refused with 429 by a requests-per-minute limit, and by a tokens-per-minute limit. */
  limitedByRequests: number;
  limitedByTokens: number;
}

export const USAGE_FIELDS = ['requests', 'promptTokens', 'cachedTokens', 'cacheReportedPromptTokens', 'requestsWithoutCacheReport', 'completionTokens', 'requestsWithoutUsage', 'reservedTokens', 'limitedByRequests', 'limitedByTokens'] as const satisfies readonly (keyof UsageCounters)[];

export function emptyUsage(): UsageCounters {
  return { requests: 0, promptTokens: 0, cachedTokens: 0, cacheReportedPromptTokens: 0, requestsWithoutCacheReport: 0, completionTokens: 0, requestsWithoutUsage: 0, reservedTokens: 0, limitedByRequests: 0, limitedByTokens: 0 };
}

/** Adds `d` into `into`; a field either lacks (a record stored before the field existed) counts as 0. */
export function addUsage(into: UsageCounters, d: Partial<UsageCounters>): UsageCounters {
  for (const f of USAGE_FIELDS) into[f] = (into[f] ?? 0) + (d[f] ?? 0);
  return into;
}

/** The cache hit rate of `u`: cached / prompt tokens over the requests whose engine reported it; null when none did. */
export function usageHitRate(u: Pick<UsageCounters, 'cachedTokens' | 'cacheReportedPromptTokens'>): number | null {
  const prompt = u.cacheReportedPromptTokens ?? 0;
  return prompt > 0 ? u.cachedTokens / prompt : null;
}

export interface UsageRow extends UsageCounters {
  tenant: string;
  model: string;
  /** Bucket start, epoch ms (UTC), and its length. */
  start: number;
  bucketMs: number;
}

export type BucketName = 'minute' | 'hour' | 'day';
export const BUCKET_MS: Record<BucketName, number> = { minute: MINUTE_MS, hour: HOUR_MS, day: DAY_MS };

/** Re-bucket rows to `bucketMs` (a multiple of theirs), summing; sorted by start, tenant, model. */
export function rebucket(rows: readonly UsageRow[], bucketMs: number): UsageRow[] {
  const map = new Map<string, UsageRow>();
  for (const r of rows) {
    const start = Math.floor(r.start / bucketMs) * bucketMs;
    const k = `${start}\u0000${r.tenant}\u0000${r.model}`;
    let o = map.get(k);
    if (!o) map.set(k, (o = { tenant: r.tenant, model: r.model, start, bucketMs, ...emptyUsage() }));
    addUsage(o, r);
  }
  return [...map.values()].sort((a, b) => a.start - b.start || cmp(a.tenant, b.tenant) || cmp(a.model, b.model));
}

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

const CSV_COLUMNS = ['bucket_start', 'bucket_end', 'tenant', 'model', 'requests', 'prompt_tokens', 'cached_tokens', 'completion_tokens', 'requests_without_usage', 'reserved_tokens', 'limited_by_requests', 'limited_by_tokens', 'cache_reported_prompt_tokens', 'requests_without_cache_report'] as const;

/** RFC 4180 CSV with a header row; times as ISO 8601 UTC. */
export function usageCsv(rows: readonly UsageRow[]): string {
  const q = (s: string) => (/[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s);
  const lines = [CSV_COLUMNS.join(',')];
  for (const r of rows) {
    lines.push(
      [new Date(r.start).toISOString(), new Date(r.start + r.bucketMs).toISOString(), q(r.tenant), q(r.model), r.requests, r.promptTokens, r.cachedTokens, r.completionTokens, r.requestsWithoutUsage, r.reservedTokens, r.limitedByRequests, r.limitedByTokens, r.cacheReportedPromptTokens ?? 0, r.requestsWithoutCacheReport ?? 0].join(','),
    );
  }
  return lines.join('\r\n') + '\r\n';
}

/** The JSON export's row shape (snake_case like OpenAI's usage API). */
export function usageJsonRow(r: UsageRow): Record<string, string | number> {
  return {
    bucket_start: new Date(r.start).toISOString(),
    bucket_end: new Date(r.start + r.bucketMs).toISOString(),
    tenant: r.tenant,
    model: r.model,
    requests: r.requests,
    prompt_tokens: r.promptTokens,
    cached_tokens: r.cachedTokens,
    completion_tokens: r.completionTokens,
    requests_without_usage: r.requestsWithoutUsage,
    reserved_tokens: r.reservedTokens,
    limited_by_requests: r.limitedByRequests,
    limited_by_tokens: r.limitedByTokens,
    // Appended last so existing CSV readers keep their columns (issue #26 item 3).
    cache_reported_prompt_tokens: r.cacheReportedPromptTokens ?? 0,
    requests_without_cache_report: r.requestsWithoutCacheReport ?? 0,
  };
}

/** A tenant's totals per model plus its limit use as last reported (dashboard, /metrics). */
export interface TenantTotals {
  tenant: string;
  models: Record<string, UsageCounters>;
  /** The tenant-wide limit state at the last report (advance it to now with advanceState). */
  state: RateState | null;
  reportedAt: number;
}

/** Cannot collide with a tenant id (those start with a letter or digit). */
export const OTHER_TENANT = '_other';

export function totalTokens(t: TenantTotals): number {
  let n = 0;
  for (const u of Object.values(t.models)) n += u.promptTokens + u.completionTokens + u.reservedTokens;
  return n;
}

/**
 * The `top` tenants by total tokens (ties by id), the rest folded into one "other" entry: what
 * /metrics exports, so its label set is at most (top + 1) × models. Membership follows
 * cumulative totals, which only grow, so it changes rarely; when a tenant enters the top N its
 * history leaves "other" (a rate() over "other" sees that as a counter reset).
 */
export function foldTopTenants(all: readonly TenantTotals[], top: number): { top: TenantTotals[]; other: TenantTotals | null } {
  const sorted = [...all].sort((a, b) => totalTokens(b) - totalTokens(a) || cmp(a.tenant, b.tenant));
  const head = sorted.slice(0, Math.max(0, top));
  const rest = sorted.slice(head.length);
  if (rest.length === 0) return { top: head, other: null };
  const models: Record<string, UsageCounters> = {};
  for (const t of rest) for (const [m, u] of Object.entries(t.models)) addUsage((models[m] ??= emptyUsage()), u);
  return { top: head, other: { tenant: OTHER_TENANT, models, state: null, reportedAt: Math.max(...rest.map((t) => t.reportedAt)) } };
}
