// The dashboard's tenant view: the top tenants by tokens with their limit use, prefix-cache hit
// rate and 429s, from the UsageRegistry's totals. Pure.

import { advanceState } from '../quota/limits.js';
import { totalTokens, usageHitRate, type TenantTotals } from '../quota/usage.js';

export const DASHBOARD_TENANTS = 15;

export interface TenantViewRow {
  tenant: string;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  totalTokens: number;
  /** cached / prompt tokens over the requests whose engine reported cached tokens; null when none did. */
  hitRate: number | null;
  /** Requests with usage but no cached-token figure: left out of `hitRate` (unknown, not 0). */
  requestsWithoutCacheReport: number;
  rateLimited: number;
  /** Share of the tenant-wide limit in use now, null without that limit. */
  requestsUse: number | null;
  tokensUse: number | null;
  requestsPerMinute: number | null;
  tokensPerMinute: number | null;
}

export function tenantView(all: readonly TenantTotals[], now: number, n = DASHBOARD_TENANTS): TenantViewRow[] {
  return [...all]
    .sort((a, b) => totalTokens(b) - totalTokens(a) || (a.tenant < b.tenant ? -1 : 1))
    .slice(0, n)
    .map((t) => {
      const u = Object.values(t.models);
      const sum = (f: (x: (typeof u)[number]) => number) => u.reduce((s, x) => s + f(x), 0);
      const prompt = sum((x) => x.promptTokens);
      const s = t.state ? advanceState(t.state, now - t.reportedAt) : null;
      const use = (k: 'requests' | 'tokens') => (s?.[k] ? Math.round((1 - s[k]!.remaining / s[k]!.limit) * 1000) / 1000 : null);
      return {
        tenant: t.tenant,
        requests: sum((x) => x.requests),
        promptTokens: prompt,
        completionTokens: sum((x) => x.completionTokens),
        totalTokens: totalTokens(t),
        hitRate: usageHitRate({ cachedTokens: sum((x) => x.cachedTokens), cacheReportedPromptTokens: sum((x) => x.cacheReportedPromptTokens ?? 0) }),
        requestsWithoutCacheReport: sum((x) => x.requestsWithoutCacheReport ?? 0),
        rateLimited: sum((x) => x.limitedByRequests + x.limitedByTokens),
        requestsUse: use('requests'),
        tokensUse: use('tokens'),
        requestsPerMinute: s?.requests?.limit ?? null,
        tokensPerMinute: s?.tokens?.limit ?? null,
      };
    });
}
