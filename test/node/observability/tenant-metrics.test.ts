// /metrics tenant families and the dashboard's tenant view from registry totals (pure).
import { describe, expect, it } from 'vitest';
import { renderTenantMetrics } from '../../../src/observability/tenant-metrics.js';
import { tenantView } from '../../../src/observability/tenant-view.js';
import { emptyUsage, type TenantTotals } from '../../../src/quota/usage.js';
import { promtool, promtoolMissing } from '../../helpers/promtool.js';

const t = (tenant: string, prompt: number, extra: Partial<TenantTotals> = {}): TenantTotals => ({
  tenant,
  models: { m: { ...emptyUsage(), requests: 2, promptTokens: prompt, cachedTokens: prompt / 2, cacheReportedPromptTokens: prompt, completionTokens: 10, limitedByRequests: 1 } },
  state: null,
  reportedAt: 0,
  ...extra,
});

describe('tenant metrics', () => {
  it('labels the top N tenants and sums the rest as _other; limit gauges advance to now', () => {
    const state = { requests: { limit: 60, remaining: 30, resetMs: 30_000 } };
    const text = renderTenantMetrics([t('a', 100, { state, reportedAt: 1000 }), t('b', 10), t('c', 20)], 11_000, 2);
    expect(text).toContain('prefix_router_tenant_prompt_tokens_total{tenant="a",model="m"} 100');
    expect(text).toContain('prefix_router_tenant_prompt_tokens_total{tenant="c",model="m"} 20');
    expect(text).toContain('prefix_router_tenant_prompt_tokens_total{tenant="_other",model="m"} 10');
    expect(text).not.toContain('tenant="b"');
    expect(text).toContain('prefix_router_tenant_rate_limited_total{tenant="a",model="m",limit="requests"} 1');
    // 10 s after the report at 30/60 remaining, 10 more requests have refilled: 40/60 left.
    expect(text).toContain('prefix_router_tenant_limit_used_ratio{tenant="a",limit="requests"} 0.3333');
    expect(text).toContain('prefix_router_tenant_limit_per_minute{tenant="a",limit="requests"} 60');
    expect(text.match(/^# TYPE prefix_router_tenant_requests_total counter$/m)).not.toBeNull();
  });

  it('passes promtool check metrics', () => {
    const text = renderTenantMetrics([t('a', 100, { state: { tokens: { limit: 1000, remaining: 10, resetMs: 1 } }, reportedAt: 0 }), t('b "x"', 10)], 0, 1);
    const r = promtool(['check', 'metrics'], text);
    if (!r) return promtoolMissing('the tenant metrics lint');
    expect(r.output).toBe('');
    expect(r.status).toBe(0);
  });

  it('the dashboard view ranks by tokens with hit rate and limit use', () => {
    const rows = tenantView([t('a', 100), t('b', 400, { state: { tokens: { limit: 1000, remaining: 250, resetMs: 45_000 } }, reportedAt: 0 })], 0);
    expect(rows.map((r) => r.tenant)).toEqual(['b', 'a']);
    expect(rows[0]).toMatchObject({ totalTokens: 410, hitRate: 0.5, requestsWithoutCacheReport: 0, tokensUse: 0.75, tokensPerMinute: 1000, requestsUse: null, rateLimited: 1 });
  });

  it("a hit rate over the requests whose engine reported cached tokens only; the others counted, not read as 0% (issue #26 item 3)", () => {
    // 300 prompt tokens reported with 150 cached; 700 more from requests whose engine sent no figure.
    const models = { m: { ...emptyUsage(), requests: 5, promptTokens: 1000, cachedTokens: 150, cacheReportedPromptTokens: 300, requestsWithoutCacheReport: 3, completionTokens: 10 } };
    const [row] = tenantView([{ tenant: 'a', models, state: null, reportedAt: 0 }], 0);
    expect(row).toMatchObject({ hitRate: 0.5, requestsWithoutCacheReport: 3 });
    // No request reported it: unknown, not 0%.
    const none = { m: { ...emptyUsage(), requests: 2, promptTokens: 200, requestsWithoutCacheReport: 2 } };
    expect(tenantView([{ tenant: 'b', models: none, state: null, reportedAt: 0 }], 0)[0]).toMatchObject({ hitRate: null, requestsWithoutCacheReport: 2 });
    const text = renderTenantMetrics([{ tenant: 'a', models, state: null, reportedAt: 0 }], 0);
    expect(text).toContain('prefix_router_tenant_cache_reported_prompt_tokens_total{tenant="a",model="m"} 300');
    expect(text).toContain('prefix_router_tenant_requests_without_cache_report_total{tenant="a",model="m"} 3');
  });
});
