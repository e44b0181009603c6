// UsageRegistry: `usageShards` Durable Objects for the deployment (quota/registry-shards.ts: a
// tenant's shard by hash, `idFromName("registry")` for the first). Every TenantMeter reports its
// usage to its tenant's shard a couple of seconds after it happens (batched per tenant, so a shard
// sees about one call per active tenant per REPORT_DELAY_MS, not one per request). It keeps hourly
// rows per (tenant, model) for the all-tenant billing export, `usageRetentionDays` long (an alarm
// deletes older ones), and running totals for /metrics and the dashboard. I/O: DO SQLite storage, alarms.

import { DurableObject } from 'cloudflare:workers';
import { loadConfig } from '../config.js';
import type { UsageReport } from './tenant-meter.js';
import { addUsage, emptyUsage, HOUR_MS, rebucket, type TenantTotals, type UsageCounters, type UsageRow } from './usage.js';

/** Hourly rows kept for the export when the configuration says nothing (`usageRetentionDays`). */
export const HOURLY_RETENTION_MS = 400 * 86_400_000;
/** How often the retention alarm runs while there are rows. */
export const PRUNE_INTERVAL_MS = HOUR_MS;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS hourly (tenant TEXT NOT NULL, model TEXT NOT NULL, hour INTEGER NOT NULL, json TEXT NOT NULL, PRIMARY KEY (hour, tenant, model));
CREATE TABLE IF NOT EXISTS totals (tenant TEXT NOT NULL, model TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (tenant, model));
CREATE TABLE IF NOT EXISTS state (tenant TEXT PRIMARY KEY, json TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS applied (tenant TEXT PRIMARY KEY, seq INTEGER NOT NULL);
`;

export class UsageRegistryImpl extends DurableObject<Env> {
  private readonly sql: SqlStorage;
  private alarmChecked = false;
  /** Reports skipped because their (tenant, seq) was applied already. */
  duplicateReports = 0;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(SCHEMA);
  }

  async report(r: UsageReport): Promise<void> {
    // A meter sends a report again until it is acknowledged: one whose answer was lost is here already.
    if (r.seq !== undefined) {
      const last = this.sql.exec<{ seq: number }>('SELECT seq FROM applied WHERE tenant = ?', r.tenant).toArray()[0]?.seq ?? 0;
      if (r.seq <= last) {
        this.duplicateReports++;
        return;
      }
      this.sql.exec('INSERT OR REPLACE INTO applied (tenant, seq) VALUES (?, ?)', r.tenant, r.seq);
    }
    for (const row of r.rows) {
      this.add('SELECT json FROM hourly WHERE hour = ? AND tenant = ? AND model = ?', 'INSERT OR REPLACE INTO hourly (json, hour, tenant, model) VALUES (?, ?, ?, ?)', [row.hour, r.tenant, row.model], row.usage);
      this.add('SELECT json FROM totals WHERE tenant = ? AND model = ?', 'INSERT OR REPLACE INTO totals (json, tenant, model) VALUES (?, ?, ?)', [r.tenant, row.model], row.usage);
    }
    if (r.state) this.sql.exec('INSERT OR REPLACE INTO state (tenant, json, at) VALUES (?, ?, ?)', r.tenant, JSON.stringify(r.state), r.at);
    else this.sql.exec('DELETE FROM state WHERE tenant = ?', r.tenant);
    // Retention runs from an alarm, not on the report path; one per object life is enough to check.
    if (!this.alarmChecked) {
      this.alarmChecked = true;
      if ((await this.ctx.storage.getAlarm()) === null) await this.ctx.storage.setAlarm(Date.now() + PRUNE_INTERVAL_MS);
    }
  }

  /** How long hourly rows are kept (`usageRetentionDays`). */
  retentionMs(): number {
    try {
      return loadConfig(this.env.ROUTER_CONFIG).usageRetentionDays * 86_400_000;
    } catch {
      return HOURLY_RETENTION_MS;
    }
  }

  /**
   * Delete hourly rows (and limit states) older than the retention; totals stay (one row per
   * tenant and model). Returns the rows deleted.
   */
  prune(now = Date.now()): number {
    const cutoff = now - this.retentionMs();
    const n = this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM hourly WHERE hour < ?', cutoff).one().n;
    this.sql.exec('DELETE FROM hourly WHERE hour < ?', cutoff);
    this.sql.exec('DELETE FROM state WHERE at < ?', cutoff);
    return n;
  }

  override async alarm(): Promise<void> {
    const deleted = this.prune();
    if (deleted > 0) console.log(JSON.stringify({ type: 'usage_rows_pruned', deleted, retentionDays: this.retentionMs() / 86_400_000 }));
    if (this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM hourly').one().n > 0) await this.ctx.storage.setAlarm(Date.now() + PRUNE_INTERVAL_MS);
    else this.alarmChecked = false; // the next report sets it again
  }

  /** Every tenant's totals per model since the registry started, with its last limit state. */
  totals(): TenantTotals[] {
    const byTenant = new Map<string, TenantTotals>();
    for (const r of this.sql.exec<{ tenant: string; model: string; json: string }>('SELECT tenant, model, json FROM totals')) {
      let t = byTenant.get(r.tenant);
      if (!t) byTenant.set(r.tenant, (t = { tenant: r.tenant, models: {}, state: null, reportedAt: 0 }));
      t.models[r.model] = JSON.parse(r.json) as UsageCounters;
    }
    for (const s of this.sql.exec<{ tenant: string; json: string; at: number }>('SELECT tenant, json, at FROM state')) {
      const t = byTenant.get(s.tenant);
      if (t) Object.assign(t, { state: JSON.parse(s.json), reportedAt: s.at });
    }
    return [...byTenant.values()];
  }

  /** Hourly (or coarser) rows of every tenant, or one, in [from, to). */
  usage(q: { from: number; to: number; bucketMs: number; tenant?: string }): UsageRow[] {
    const from = Math.floor(q.from / HOUR_MS) * HOUR_MS;
    const cur = q.tenant
      ? this.sql.exec<{ tenant: string; model: string; hour: number; json: string }>('SELECT tenant, model, hour, json FROM hourly WHERE hour >= ? AND hour < ? AND tenant = ?', from, q.to, q.tenant)
      : this.sql.exec<{ tenant: string; model: string; hour: number; json: string }>('SELECT tenant, model, hour, json FROM hourly WHERE hour >= ? AND hour < ?', from, q.to);
    const rows = cur.toArray().map((r) => ({ tenant: r.tenant, model: r.model, start: r.hour, bucketMs: HOUR_MS, ...(JSON.parse(r.json) as UsageCounters) }));
    return rebucket(rows, Math.max(HOUR_MS, q.bucketMs));
  }

  private add(select: string, upsert: string, key: unknown[], d: UsageCounters): void {
    const cur = this.sql.exec<{ json: string }>(select, ...key).toArray()[0];
    const u = addUsage(cur ? (JSON.parse(cur.json) as UsageCounters) : emptyUsage(), d);
    this.sql.exec(upsert, JSON.stringify(u), ...key);
  }
}
