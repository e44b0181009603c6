// TenantMeter: one Durable Object per tenant (`idFromName(tenant)`). Decides every admission
// against the tenant's requests-per-minute and tokens-per-minute buckets (exact: all of a
// tenant's requests, from every isolate and location, are serialised here), settles each
// request's token charge from the engine's usage, and meters usage per model and minute for the
// billing export. An alarm forwards the usage to the UsageRegistry (/metrics, dashboard, the
// all-tenant export). I/O: DO SQLite storage, RPCs to the registry from the alarm.
//
// Nothing is written to storage on the request path: a write holds back every answer the object
// sends until it is durable (the output gate), which put a storage commit on each admission's
// round trip (bench:proxy, docs/benchmarks.md "Tenant quotas"). Bucket levels and usage live in
// memory and the alarm, at most FLUSH_MS after a change, writes them in one transaction. The price:
// an object that crashes (not one that is evicted, which happens only after it went idle and the
// alarm has run) loses at most FLUSH_MS of bucket takes and usage.

import { DurableObject } from 'cloudflare:workers';
import { bucketKey, bucketsFor, decideAdmission, grantAllowance, levelAt, stateOf, type Allowance, type Bucket, type LimitKind, type RateState, type TenantLimits } from './limits.js';
import { addUsage, emptyUsage, HOUR_MS, MINUTE_MS, rebucket, type UsageCounters, type UsageRow } from './usage.js';
import { usageRegistry, type UsageRegistryClient } from './registry-shards.js';

/** Usage and bucket levels are written, and usage reported to the registry, this long after a change (at most). */
export const REPORT_DELAY_MS = 2_000;
const FLUSH_MS = REPORT_DELAY_MS;
/** Minute rows kept in the tenant's own meter (the registry keeps hourly rows longer). */
export const MINUTE_RETENTION_MS = 8 * 86_400_000;
/**
 * How long a settle's id is remembered, so that a retried settle counts once: far longer than an
 * isolate keeps retrying one (quota/settle-outbox.ts: while the isolate lives, next to its tenant's
 * later settles). Ids are written with the usage they recorded, in the same transaction, so a
 * crash that loses the usage also forgets the id, and the retry counts it again, once.
 */
export const SETTLE_ID_RETENTION_MS = 6 * HOUR_MS;

export interface AdmitRequest {
  tenant: string;
  model: string;
  limits: TenantLimits;
  /** Tokens charged at admission (prompt estimate + completion budget). */
  tokens: number;
  /** Refusals this isolate answered itself since its last call (counted in the usage). */
  localRefusals?: { requests: number; tokens: number };
  /** Ask for an isolate allowance (limits.ts, Allowance) on top of this request. */
  wantAllowance?: boolean;
  /** An allowance (or what is left of one) this isolate gives back. */
  returned?: { requests: number; tokens: number };
}

export type AdmitResult =
  | { ok: true; state: RateState; at: number; allowance?: Allowance }
  | { ok: false; kind: LimitKind; scope: string; limit: number; available: number; requested: number; retryAfterMs: number | null; state: RateState; at: number };

export interface SettleRequest {
  /** Unique per request, drawn by the router (never a client's request id): a settle with an id already settled is skipped. */
  id?: string;
  /** Settles of this tenant that failed to land before, retried with this one (each counted once). */
  earlier?: SettleRequest[];
  tenant: string;
  model: string;
  /** The limits the request was admitted under (undefined: the tenant has none). */
  limits?: TenantLimits;
  /** Tokens reserved at admission. */
  charged: number;
  /** Tokens the request is finally charged: its usage, or an estimate when none came (http/quota-admission.ts). */
  used: number;
  /** Whether `charged` was taken from token buckets (the tenant had a token limit). */
  limited: boolean;
  /** The engine's usage, or null when it never arrived. */
  usage: { promptTokens: number; cachedTokens: number | null; completionTokens: number } | null;
  /** Refusals this isolate answered itself since its last call. */
  localRefusals?: { requests: number; tokens: number };
  /** Ask for an isolate allowance, for requests of about `charged` tokens. */
  wantAllowance?: boolean;
  returned?: { requests: number; tokens: number };
}

/** What a settle answers: an allowance when one was asked for and the buckets could grant it. */
export interface SettleResult {
  allowance?: Allowance;
  at: number;
}

export interface UsageQuery {
  from: number;
  to: number;
  bucketMs: number;
}

/** What the meter reports to the registry: usage deltas by (hour, model) and the limit state. */
export interface UsageReport {
  tenant: string;
  /**
   * This meter's report number: a report is frozen before it is sent and sent again, unchanged,
   * until the registry answers, which applies each (tenant, seq) once, so a report whose answer
   * was lost is not counted twice. Absent from meters older than it (applied as they come).
   */
  seq?: number;
  rows: { hour: number; model: string; usage: UsageCounters }[];
  state: RateState | null;
  at: number;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS buckets (key TEXT PRIMARY KEY, level REAL NOT NULL, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS usage (minute INTEGER NOT NULL, model TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (minute, model));
CREATE TABLE IF NOT EXISTS outbox (hour INTEGER NOT NULL, model TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (hour, model));
CREATE TABLE IF NOT EXISTS settled (id TEXT PRIMARY KEY, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sending (seq INTEGER PRIMARY KEY, json TEXT NOT NULL);
`;

export class TenantMeterImpl extends DurableObject<Env> {
  private readonly sql: SqlStorage;
  private readonly buckets = new Map<string, Bucket>();
  /** Bucket keys changed since the last flush. */
  private readonly dirtyBuckets = new Set<string>();
  /** Usage recorded since the last flush, by `${minute}\u0000${model}`. */
  private readonly pending = new Map<string, UsageCounters>();
  /** Settle ids applied since the last flush (older ones are in the `settled` table). */
  private readonly settledIds = new Map<string, number>();
  /** Settles skipped because their id had been settled (a retry of one that did land). */
  duplicateSettles = 0;
  private tenant: string | null;
  private lastLimits: TenantLimits | null = null;
  private reportScheduled = false;
  /** The clock; tests move it. */
  now: () => number = () => Date.now();

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(SCHEMA);
    for (const b of this.sql.exec<{ key: string; level: number; at: number }>('SELECT key, level, at FROM buckets')) this.buckets.set(b.key, { level: b.level, at: b.at });
    this.tenant = this.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'tenant'").toArray()[0]?.v ?? null;
    const limits = this.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'limits'").toArray()[0]?.v;
    this.lastLimits = limits ? (JSON.parse(limits) as TenantLimits) : null;
  }

  /** Admit a request (taking one request and its token charge from every bucket that applies) or refuse it. */
  admit(req: AdmitRequest): AdmitResult {
    const now = this.now();
    this.identify(req.tenant, req.limits);
    if (req.localRefusals) this.recordLocalRefusals(req.model, req.localRefusals, now);
    const refs = bucketsFor(req.limits, req.model);
    if (req.returned) this.giveBack(refs, req.returned, now);
    const d = decideAdmission(refs, (k) => this.buckets.get(k), req.tokens, now);
    if (!d.ok) {
      this.record(req.model, now, d.kind === 'requests' ? { limitedByRequests: 1 } : { limitedByTokens: 1 });
      return { ok: false, kind: d.kind, scope: d.scope, limit: d.limit, available: d.available, requested: d.requested, retryAfterMs: d.retryAfterMs, state: d.state, at: now };
    }
    for (const [k, level] of d.levels) this.setBucket(k, level, now);
    const allowance = req.wantAllowance ? this.grant(refs, req.tokens, now) : undefined;
    // The state before the grant: an allowance is this tenant's capacity still, held by one isolate.
    return { ok: true, state: d.state, at: now, ...(allowance ? { allowance } : {}) };
  }

  /** Take an allowance from the buckets, if they can spare one. */
  private grant(refs: ReturnType<typeof bucketsFor>, charge: number, now: number): Allowance | undefined {
    const levels = new Map(refs.map((r) => [bucketKey(r), levelAt(this.buckets.get(bucketKey(r)), r.limit, now)]));
    const a = grantAllowance(refs, levels, charge, now);
    if (!a) return undefined;
    for (const r of refs) {
      const take = r.kind === 'requests' ? a.requests : a.tokens;
      if (take !== null) this.setBucket(bucketKey(r), levels.get(bucketKey(r))! - take, now);
    }
    return a;
  }

  /** An allowance an isolate did not use goes back into the buckets. */
  private giveBack(refs: ReturnType<typeof bucketsFor>, back: { requests: number; tokens: number }, now: number): void {
    for (const r of refs) {
      const n = r.kind === 'requests' ? back.requests : back.tokens;
      if (!(n > 0)) continue;
      const k = bucketKey(r);
      this.setBucket(k, Math.min(r.limit, levelAt(this.buckets.get(k), r.limit, now) + n), now);
    }
  }

  /**
   * Settle a finished request: the token buckets get back what was reserved and are charged what
   * it used (the engine's usage, or the caller's estimate when none came); usage is metered.
   */
  settle(s: SettleRequest): SettleResult {
    const now = this.now();
    for (const e of s.earlier ?? []) if (e.tenant === s.tenant) this.settleOne({ ...e, wantAllowance: false }, now);
    return this.settleOne(s, now);
  }

  private alreadySettled(id: string): boolean {
    return this.settledIds.has(id) || this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM settled WHERE id = ?', id).one().n > 0;
  }

  private settleOne(s: SettleRequest, now: number): SettleResult {
    if (s.id !== undefined) {
      if (this.alreadySettled(s.id)) {
        this.duplicateSettles++;
        return { at: now };
      }
      this.settledIds.set(s.id, now);
      this.scheduleFlush();
    }
    this.identify(s.tenant, s.limits ?? null);
    if (s.localRefusals) this.recordLocalRefusals(s.model, s.localRefusals, now);
    const refs = s.limits ? bucketsFor(s.limits, s.model) : [];
    if (s.returned) this.giveBack(refs, s.returned, now);
    const used = s.used;
    if (s.limited && s.limits && used !== s.charged) {
      for (const r of bucketsFor(s.limits, s.model)) {
        if (r.kind !== 'tokens') continue;
        const k = bucketKey(r);
        const level = Math.min(r.limit, levelAt(this.buckets.get(k), r.limit, now) + s.charged - used);
        this.setBucket(k, level, now);
      }
    }
    const u: Partial<UsageCounters> = { requests: 1 };
    if (s.usage) {
      // A usage report without cached tokens is "unknown", not 0 cached: counted apart (usage.ts).
      const c = s.usage.cachedTokens;
      Object.assign(u, { promptTokens: s.usage.promptTokens, completionTokens: s.usage.completionTokens }, c !== null ? { cachedTokens: c, cacheReportedPromptTokens: s.usage.promptTokens } : { requestsWithoutCacheReport: 1 });
    } else if (used > 0) Object.assign(u, { requestsWithoutUsage: 1, reservedTokens: used });
    this.record(s.model, now, u);
    const allowance = s.wantAllowance && refs.length > 0 ? this.grant(refs, s.charged, now) : undefined;
    return allowance ? { allowance, at: now } : { at: now };
  }

  /** The limit state now, without taking anything (dashboard). */
  state(limits: TenantLimits, model = '*'): RateState {
    const now = this.now();
    const refs = bucketsFor(limits, model);
    return stateOf(refs, new Map(refs.map((r) => [bucketKey(r), levelAt(this.buckets.get(bucketKey(r)), r.limit, now)])));
  }

  /** This tenant's usage rows in [from, to), re-bucketed to `bucketMs` (a multiple of a minute). */
  usage(q: UsageQuery): UsageRow[] {
    this.flush();
    const rows = this.sql
      .exec<{ minute: number; model: string; json: string }>('SELECT minute, model, json FROM usage WHERE minute >= ? AND minute < ? ORDER BY minute, model', Math.floor(q.from / MINUTE_MS) * MINUTE_MS, q.to)
      .toArray()
      .map((r) => ({ tenant: this.tenant ?? '', model: r.model, start: r.minute, bucketMs: MINUTE_MS, ...(JSON.parse(r.json) as UsageCounters) }));
    return rebucket(rows, Math.max(MINUTE_MS, q.bucketMs));
  }

  /** (hour, model) rows not yet reported to the registry (in the outbox, or in a report not yet acknowledged). */
  unreported(): number {
    this.flush();
    const frozen = this.frozenReport();
    return this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM outbox').one().n + (frozen?.rows.length ?? 0);
  }

  private frozenReport(): { seq: number; rows: UsageReport['rows'] } | null {
    const row = this.sql.exec<{ seq: number; json: string }>('SELECT seq, json FROM sending ORDER BY seq LIMIT 1').toArray()[0];
    return row ? { seq: row.seq, rows: JSON.parse(row.json) as UsageReport['rows'] } : null;
  }

  /** Forward unreported usage to the registry; prune old minute rows. */
  override async alarm(): Promise<void> {
    this.reportScheduled = false;
    const now = this.now();
    this.flush();
    this.sql.exec('DELETE FROM usage WHERE minute < ?', now - MINUTE_RETENTION_MS);
    this.sql.exec('DELETE FROM settled WHERE at < ?', now - SETTLE_ID_RETENTION_MS);
    if (!this.tenant) return;
    // A report not yet acknowledged is sent again as it was; only then is the outbox frozen into the next.
    let frozen = this.frozenReport();
    if (!frozen) {
      const rows = this.sql.exec<{ hour: number; model: string; json: string }>('SELECT hour, model, json FROM outbox').toArray();
      if (rows.length === 0) return;
      const seq = Number(this.sql.exec<{ v: string }>("SELECT v FROM meta WHERE k = 'reportSeq'").toArray()[0]?.v ?? '0') + 1;
      const reportRows = rows.map((r) => ({ hour: r.hour, model: r.model, usage: JSON.parse(r.json) as UsageCounters }));
      this.ctx.storage.transactionSync(() => {
        this.sql.exec('INSERT INTO sending (seq, json) VALUES (?, ?)', seq, JSON.stringify(reportRows));
        this.sql.exec('DELETE FROM outbox');
        this.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('reportSeq', ?)", String(seq));
      });
      frozen = { seq, rows: reportRows };
    }
    const report: UsageReport = {
      tenant: this.tenant,
      seq: frozen.seq,
      rows: frozen.rows,
      state: this.lastLimits ? this.state(this.lastLimits) : null,
      at: now,
    };
    try {
      await registryStub(this.env).report(report);
    } catch (e) {
      // Kept frozen and sent again, unchanged, by the alarm (the registry applies a seq once).
      console.error(JSON.stringify({ type: 'usage_report_failed', tenant: this.tenant, seq: frozen.seq, message: e instanceof Error ? e.message : String(e) }));
      this.reportScheduled = true;
      await this.ctx.storage.setAlarm(Date.now() + REPORT_DELAY_MS * 5);
      return;
    }
    // Rows recorded while the report was in flight are in the outbox, for the next one.
    this.sql.exec('DELETE FROM sending WHERE seq = ?', frozen.seq);
    if (!this.reportScheduled && this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM outbox').one().n > 0) {
      this.reportScheduled = true;
      await this.ctx.storage.setAlarm(Date.now() + REPORT_DELAY_MS);
    }
  }

  private identify(tenant: string, limits: TenantLimits | null): void {
    if (this.tenant !== tenant) {
      this.tenant = tenant;
      this.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('tenant', ?)", tenant);
    }
    const json = limits ? JSON.stringify(limits) : null;
    if (json !== (this.lastLimits ? JSON.stringify(this.lastLimits) : null)) {
      this.lastLimits = limits;
      if (json) this.sql.exec("INSERT OR REPLACE INTO meta (k, v) VALUES ('limits', ?)", json);
      else this.sql.exec("DELETE FROM meta WHERE k = 'limits'");
    }
  }

  private setBucket(key: string, level: number, at: number): void {
    this.buckets.set(key, { level, at });
    this.dirtyBuckets.add(key);
    this.scheduleFlush();
  }

  private scheduleFlush(): void {
    if (this.reportScheduled) return;
    // After an eviction the flag is lost and the alarm is set again: at most one delay later.
    this.reportScheduled = true;
    void this.ctx.storage.setAlarm(Date.now() + FLUSH_MS);
  }

  /** Write what changed in memory (bucket levels, usage) to storage, in one transaction. */
  private flush(): void {
    if (this.dirtyBuckets.size === 0 && this.pending.size === 0 && this.settledIds.size === 0) return;
    this.ctx.storage.transactionSync(() => {
      for (const k of this.dirtyBuckets) {
        const b = this.buckets.get(k);
        if (b) this.sql.exec('INSERT OR REPLACE INTO buckets (key, level, at) VALUES (?, ?, ?)', k, b.level, b.at);
      }
      for (const [k, d] of this.pending) {
        const [minuteS, model] = k.split('\u0000') as [string, string];
        const minute = Number(minuteS);
        const hour = Math.floor(minute / HOUR_MS) * HOUR_MS;
        for (const [table, col, at] of [['usage', 'minute', minute], ['outbox', 'hour', hour]] as const) {
          const cur = this.sql.exec<{ json: string }>(`SELECT json FROM ${table} WHERE ${col} = ? AND model = ?`, at, model).toArray()[0];
          const u = addUsage(cur ? (JSON.parse(cur.json) as UsageCounters) : emptyUsage(), d);
          this.sql.exec(`INSERT OR REPLACE INTO ${table} (${col}, model, json) VALUES (?, ?, ?)`, at, model, JSON.stringify(u));
        }
      }
      for (const [id, at] of this.settledIds) this.sql.exec('INSERT OR REPLACE INTO settled (id, at) VALUES (?, ?)', id, at);
    });
    this.dirtyBuckets.clear();
    this.pending.clear();
    this.settledIds.clear();
  }

  private recordLocalRefusals(model: string, r: { requests: number; tokens: number }, now: number): void {
    if (r.requests > 0 || r.tokens > 0) this.record(model, now, { limitedByRequests: r.requests, limitedByTokens: r.tokens });
  }

  private record(model: string, now: number, d: Partial<UsageCounters>): void {
    const k = `${Math.floor(now / MINUTE_MS) * MINUTE_MS}\u0000${model}`;
    let u = this.pending.get(k);
    if (!u) this.pending.set(k, (u = emptyUsage()));
    addUsage(u, d);
    this.scheduleFlush();
  }
}

/** The UsageRegistry: reports go to the tenant's shard, readers merge every shard (quota/registry-shards.ts). */
export function registryStub(env: Env): UsageRegistryClient {
  return usageRegistry(env);
}
