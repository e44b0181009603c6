// The sharded UsageRegistry in workerd (src/quota/registry-shards.ts, src/quota/usage-registry.ts):
// reports land in their tenant's shard only, readers (totals, the all-tenant export) merge every
// shard, and hourly rows older than the retention are deleted by the shard's alarm.

import { env } from 'cloudflare:workers';
import { runDurableObjectAlarm, runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { UsageRegistry } from '../../src/index';
import { shardOf, shardStub, usageRegistry } from '../../src/quota/registry-shards';
import { emptyUsage } from '../../src/quota/usage';
import type { UsageReport } from '../../src/quota/tenant-meter';

const HOUR = 3_600_000;
const report = (tenant: string, hour: number, requests: number, seq = 1): UsageReport => ({ tenant, seq, rows: [{ hour, model: 'm', usage: { ...emptyUsage(), requests, promptTokens: requests * 10 } }], state: null, at: Date.now() });

describe('usage registry shards', () => {
  it('each report lands in its tenant\'s shard; totals and the export merge all shards', async () => {
    const shards = 4;
    const run = crypto.randomUUID().slice(0, 8);
    const tenants = Array.from({ length: 12 }, (_, i) => `sh-${run}-${i}`);
    const reg = usageRegistry(env, shards);
    const hour = Math.floor(Date.now() / HOUR) * HOUR;
    await Promise.all(tenants.map((t, i) => reg.report(report(t, hour, i + 1))));
    // Each shard holds exactly its tenants.
    for (let s = 0; s < shards; s++) {
      const held = (await shardStub(env, s).totals()).map((t) => t.tenant).filter((t) => t.startsWith(`sh-${run}`)).sort();
      expect(held).toEqual(tenants.filter((t) => shardOf(t, shards) === s).sort());
    }
    expect(new Set(tenants.map((t) => shardOf(t, shards))).size).toBeGreaterThan(1);
    const totals = (await reg.totals()).filter((t) => t.tenant.startsWith(`sh-${run}`));
    expect(totals).toHaveLength(12);
    expect(totals.reduce((n, t) => n + t.models.m!.requests, 0)).toBe(78);
    const rows = (await reg.usage({ from: hour, to: hour + HOUR, bucketMs: HOUR })).filter((r) => r.tenant.startsWith(`sh-${run}`));
    expect(rows.reduce((n, r) => n + r.promptTokens, 0)).toBe(780);
    // One tenant's export asks every shard (its rows may predate a raise of usageShards).
    const one = await reg.usage({ from: hour, to: hour + HOUR, bucketMs: HOUR, tenant: tenants[4]! });
    expect(one).toEqual([expect.objectContaining({ tenant: tenants[4], requests: 5 })]);
  });

  it('a tenant found in two shards (usageShards raised) is summed, not lost', async () => {
    const t = `raise-${crypto.randomUUID().slice(0, 8)}`;
    const hour = Math.floor(Date.now() / HOUR) * HOUR;
    await usageRegistry(env, 1).report(report(t, hour, 2));
    let shards = 2;
    while (shardOf(t, shards) === 0) shards++;
    await usageRegistry(env, shards).report(report(t, hour, 3));
    const total = (await usageRegistry(env, shards).totals()).find((x) => x.tenant === t)!;
    expect(total.models.m!.requests).toBe(5);
  });

  it('hourly rows older than the retention are deleted by the alarm; totals and recent rows stay', async () => {
    const t = `ret-${crypto.randomUUID().slice(0, 8)}`;
    const stub = env.USAGE_REGISTRY.get(env.USAGE_REGISTRY.idFromName(`retention-${t}`)) as unknown as DurableObjectStub<UsageRegistry>;
    const now = Date.now();
    const retention = await runInDurableObject<UsageRegistry, number>(stub, (r) => r.retentionMs());
    const old = Math.floor((now - retention - 2 * HOUR) / HOUR) * HOUR;
    const recent = Math.floor(now / HOUR) * HOUR;
    await stub.report(report(t, old, 1, 1));
    await stub.report(report(t, recent, 1, 2));
    // The first report set the retention alarm.
    expect(await runInDurableObject(stub, (_r, state) => state.storage.getAlarm())).not.toBeNull();
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    const rows = await stub.usage({ from: 0, to: now + HOUR, bucketMs: HOUR });
    expect(rows.map((r) => r.start)).toEqual([recent]);
    const totals = (await stub.totals()).find((x) => x.tenant === t)!;
    expect(totals.models.m!.requests).toBe(2);
    // Rows remain: the alarm is set again for the next pass.
    expect(await runInDurableObject(stub, (_r, state) => state.storage.getAlarm())).not.toBeNull();
  });
});
