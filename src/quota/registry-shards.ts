// The UsageRegistry, sharded: a tenant's usage reports go to one of `usageShards` objects of the
// USAGE_REGISTRY binding (by a hash of the tenant), and the readers (the all-tenant export,
// /metrics, the dashboard) ask every shard and merge. I/O: RPCs to the registry shards.
//
// Why: one Durable Object serves about 1,000 requests/s
// (developers.cloudflare.com/durable-objects/reference/faq/#how-much-work-can-a-single-durable-object-do)
// and each active tenant's meter reports once per REPORT_DELAY_MS (2 s): ~2,000 active tenants per
// shard. Shard 0 keeps the unsharded object's name, so a deployment that raises usageShards keeps
// its history; merged readers sum a tenant found in two shards (after a raise) rather than lose it.

import { loadConfig } from '../config.js';
import type { UsageReport } from './tenant-meter.js';
import type { UsageRegistryImpl } from './usage-registry.js';
import { addUsage, emptyUsage, HOUR_MS, rebucket, type TenantTotals, type UsageCounters, type UsageRow } from './usage.js';

/** The name of shard `i` (0: the one registry of unsharded deployments). */
export function shardName(i: number): string {
  return i === 0 ? 'registry' : `registry-${i}`;
}

/** Which of `n` shards holds `tenant` (FNV-1a: stable across isolates and deploys). */
export function shardOf(tenant: string, n: number): number {
  if (n <= 1) return 0;
  let h = 0x811c9dc5;
  for (let i = 0; i < tenant.length; i++) h = Math.imul(h ^ tenant.charCodeAt(i), 0x01000193);
  return (h >>> 0) % n;
}

/** Shards configured (`usageShards`), 1 when the configuration cannot be read here. */
export function configuredShards(env: Env): number {
  try {
    return loadConfig(env.ROUTER_CONFIG).usageShards;
  } catch {
    return 1;
  }
}

export function shardStub(env: Env, i: number): DurableObjectStub<UsageRegistryImpl> {
  return env.USAGE_REGISTRY.get(env.USAGE_REGISTRY.idFromName(shardName(i))) as unknown as DurableObjectStub<UsageRegistryImpl>;
}

/** Totals of several shards as one list: a tenant in two shards has its counters summed and the newer state. */
export function mergeTotals(parts: readonly (readonly TenantTotals[])[]): TenantTotals[] {
  const byTenant = new Map<string, TenantTotals>();
  for (const part of parts) {
    for (const t of part) {
      const cur = byTenant.get(t.tenant);
      if (!cur) {
        byTenant.set(t.tenant, { ...t, models: Object.fromEntries(Object.entries(t.models).map(([m, u]) => [m, addUsage(emptyUsage(), u)])) });
        continue;
      }
      for (const [m, u] of Object.entries(t.models)) cur.models[m] = addUsage(cur.models[m] ?? emptyUsage(), u as UsageCounters);
      if (t.reportedAt > cur.reportedAt) Object.assign(cur, { state: t.state, reportedAt: t.reportedAt });
    }
  }
  return [...byTenant.values()];
}

export interface UsageRegistryClient {
  report(r: UsageReport): Promise<void>;
  totals(): Promise<TenantTotals[]>;
  usage(q: { from: number; to: number; bucketMs: number; tenant?: string }): Promise<UsageRow[]>;
}

/** The registry as one: reports to the tenant's shard, reads from every shard (one tenant's: its shard only). */
export function usageRegistry(env: Env, shards = configuredShards(env)): UsageRegistryClient {
  return {
    report: async (r) => {
      await shardStub(env, shardOf(r.tenant, shards)).report(r);
    },
    totals: async () => mergeTotals(await Promise.all(Array.from({ length: shards }, (_, i) => shardStub(env, i).totals()))),
    usage: async (q) => {
      // Every shard even for one tenant: after usageShards was raised its older rows are in another.
      const parts = await Promise.all(Array.from({ length: shards }, (_, i) => shardStub(env, i).usage(q)));
      return shards === 1 ? parts[0]! : rebucket(parts.flat(), Math.max(HOUR_MS, q.bucketMs));
    },
  };
}
