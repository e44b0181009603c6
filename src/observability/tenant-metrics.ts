// Per-tenant usage and limit families for /metrics, from the UsageRegistry's totals. Pure.
// Label sets stay bounded: the top TOP_TENANTS tenants by total tokens get their own `tenant`
// label, all others are summed under tenant="_other" (which cannot be a tenant id); `model` is
// bounded by the pools' configured models.

import { advanceState } from '../quota/limits.js';
import { foldTopTenants, type TenantTotals } from '../quota/usage.js';
import { Writer } from './prometheus.js';

export const TOP_TENANTS = 20;

type Labels = Record<string, string>;

export function renderTenantMetrics(all: readonly TenantTotals[], now: number, top = TOP_TENANTS): string {
  const { top: head, other } = foldTopTenants(all, top);
  const tenants = other ? [...head, other] : head;
  const w = new Writer();
  const per = (f: (u: TenantTotals['models'][string]) => number): [Labels, number][] =>
    tenants.flatMap((t) => Object.entries(t.models).map(([model, u]) => [{ tenant: t.tenant, model }, f(u)] as [Labels, number]));
  w.family('prefix_router_tenant_requests_total', 'counter', `Requests answered per tenant and model (top ${top} tenants by tokens; the rest as tenant="_other").`, per((u) => u.requests));
  w.family('prefix_router_tenant_prompt_tokens_total', 'counter', 'Prompt tokens per tenant and model, from the engines\' usage.', per((u) => u.promptTokens));
  w.family('prefix_router_tenant_cached_tokens_total', 'counter', 'Prompt tokens served from the prefix cache per tenant and model, as the engines reported them (usage.prompt_tokens_details.cached_tokens, llama.cpp timings.cache_n); requests without the figure add nothing.', per((u) => u.cachedTokens));
  w.family('prefix_router_tenant_cache_reported_prompt_tokens_total', 'counter', 'Prompt tokens per tenant and model of the requests whose engine reported cached tokens: the hit rate is cached_tokens_total / this.', per((u) => u.cacheReportedPromptTokens ?? 0));
  w.family('prefix_router_tenant_requests_without_cache_report_total', 'counter', 'Requests per tenant and model whose usage had no cached-token figure (vLLM without --enable-prompt-tokens-details, SGLang without --enable-cache-report): left out of the hit rate.', per((u) => u.requestsWithoutCacheReport ?? 0));
  w.family('prefix_router_tenant_completion_tokens_total', 'counter', 'Completion tokens per tenant and model, from the engines\' usage.', per((u) => u.completionTokens));
  w.family('prefix_router_tenant_unmetered_requests_total', 'counter', 'Answered requests whose usage never arrived (a stream cut short); charged their reservation.', per((u) => u.requestsWithoutUsage));
  w.family('prefix_router_tenant_reserved_tokens_total', 'counter', 'Tokens charged for requests without usage (their admission reservation).', per((u) => u.reservedTokens));
  w.family(
    'prefix_router_tenant_rate_limited_total',
    'counter',
    'Requests refused with 429 by a requests-per-minute or tokens-per-minute limit.',
    tenants.flatMap((t) =>
      Object.entries(t.models).flatMap(([model, u]) => [
        [{ tenant: t.tenant, model, limit: 'requests' }, u.limitedByRequests] as [Labels, number],
        [{ tenant: t.tenant, model, limit: 'tokens' }, u.limitedByTokens] as [Labels, number],
      ]),
    ),
  );
  const limited = head.filter((t) => t.state !== null).map((t) => ({ t, s: advanceState(t.state!, now - t.reportedAt) }));
  w.family('prefix_router_tenant_limit_per_minute', 'gauge', 'The tenant-wide limit (top tenants with limits).', limited.flatMap(({ t, s }) => (['requests', 'tokens'] as const).filter((k) => s[k]).map((k) => [{ tenant: t.tenant, limit: k }, s[k]!.limit] as [Labels, number])));
  w.family(
    'prefix_router_tenant_limit_used_ratio',
    'gauge',
    'Share of the tenant-wide limit in use (1 - remaining/limit), from the meter\'s last report advanced to now.',
    limited.flatMap(({ t, s }) => (['requests', 'tokens'] as const).filter((k) => s[k]).map((k) => [{ tenant: t.tenant, limit: k }, Math.round((1 - s[k]!.remaining / s[k]!.limit) * 1e4) / 1e4] as [Labels, number])),
  );
  return w.text();
}
