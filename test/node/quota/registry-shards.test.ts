// The sharded UsageRegistry's pure parts (src/quota/registry-shards.ts): a tenant's shard is stable
// and tenants spread over the shards; readers' merge sums a tenant found in two shards (after
// usageShards was raised) and keeps its newer limit state.

import { describe, expect, it } from 'vitest';
import { mergeTotals, shardName, shardOf } from '../../../src/quota/registry-shards';
import { emptyUsage, type TenantTotals } from '../../../src/quota/usage';

describe('registry shards', () => {
  it('one shard is the unsharded registry; tenants spread evenly over several', () => {
    expect(shardName(0)).toBe('registry');
    expect(shardOf('acme', 1)).toBe(0);
    const counts = new Array(8).fill(0);
    for (let i = 0; i < 8_000; i++) counts[shardOf(`tenant-${i}`, 8)]++;
    for (const c of counts) expect(c).toBeGreaterThan(800);
    expect(shardOf('acme', 8)).toBe(shardOf('acme', 8));
  });

  it('merged totals sum a tenant found in two shards and keep its newer state', () => {
    const t = (tenant: string, requests: number, at: number): TenantTotals => ({ tenant, models: { m: { ...emptyUsage(), requests, promptTokens: requests * 10 } }, state: { requests: { limit: 10, remaining: at } } as unknown as TenantTotals['state'], reportedAt: at });
    const merged = mergeTotals([[t('a', 2, 5), t('b', 1, 1)], [t('a', 3, 9)]]);
    const a = merged.find((x) => x.tenant === 'a')!;
    expect(a.models.m!.requests).toBe(5);
    expect(a.models.m!.promptTokens).toBe(50);
    expect(a.reportedAt).toBe(9);
    expect(merged).toHaveLength(2);
  });
});
