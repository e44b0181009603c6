// The admin API's usage export for billing: time-bucketed usage per tenant and model as JSON or
// CSV, and a tenant's live limit state. Registered on the admin router (admin token required).
// I/O: RPCs to every UsageRegistry shard (all tenants, merged: quota/registry-shards.ts) and to a
// tenant's TenantMeter.
//
//   GET /admin/usage?from=&to=&bucket=hour|day[&tenant=][&format=json|csv]   every tenant (registry)
//   GET /admin/tenants/:id/usage?from=&to=&bucket=minute|hour|day[&format=]  one tenant (its meter)
//   GET /admin/tenants/:id/limits                                            limits and buckets now
//
// from/to: ISO 8601 or epoch ms; default the last 24 hours. Buckets are UTC-aligned and
// [start, end). The all-tenant export sees a request about REPORT_DELAY_MS (2 s) after its settle
// reached the meter (batched per isolate: up to SETTLE_WINDOW_MS, 250 ms, after it ended); a
// billing job pulling closed hours is not affected. Hourly rows older than `usageRetentionDays` are gone.

import type { Hono } from 'hono';
import { bucketsFor } from '../quota/limits.js';
import { registryStub, MINUTE_RETENTION_MS } from '../quota/tenant-meter.js';
import { BUCKET_MS, DAY_MS, usageCsv, usageJsonRow, type BucketName, type UsageRow } from '../quota/usage.js';
import { fail, type AppContext, type AppEnv } from './context.js';
import { meterFor } from './quota-admission.js';
import { lookupTenantById } from './tenants.js';

const MAX_RANGE_MS: Record<BucketName, number> = { minute: MINUTE_RETENTION_MS, hour: 400 * DAY_MS, day: 400 * DAY_MS };

interface RangeQuery {
  from: number;
  to: number;
  bucket: BucketName;
  format: 'json' | 'csv';
}

function parseTime(v: string | undefined, fallback: number): number | null {
  if (v === undefined || v === '') return fallback;
  if (/^\d{1,15}$/.test(v)) return Number(v);
  const t = Date.parse(v);
  return Number.isFinite(t) ? t : null;
}

function parseRange(c: AppContext, buckets: readonly BucketName[]): RangeQuery | Response {
  const now = Date.now();
  const bucket = (c.req.query('bucket') ?? 'hour') as BucketName;
  if (!buckets.includes(bucket)) return fail(c, 'invalid_request', `bucket must be one of ${buckets.join(', ')}`, { param: 'bucket' });
  const to = parseTime(c.req.query('to'), now);
  const from = parseTime(c.req.query('from'), (to ?? now) - DAY_MS);
  if (from === null) return fail(c, 'invalid_request', 'from must be an ISO 8601 time or epoch milliseconds', { param: 'from' });
  if (to === null) return fail(c, 'invalid_request', 'to must be an ISO 8601 time or epoch milliseconds', { param: 'to' });
  if (to <= from) return fail(c, 'invalid_request', 'to must be after from', { param: 'to' });
  if (to - from > MAX_RANGE_MS[bucket]) return fail(c, 'invalid_request', `At most ${MAX_RANGE_MS[bucket] / DAY_MS} days of ${bucket} buckets per request`, { param: 'from' });
  const format = c.req.query('format') ?? (/\btext\/csv\b/.test(c.req.header('accept') ?? '') ? 'csv' : 'json');
  if (format !== 'json' && format !== 'csv') return fail(c, 'invalid_request', 'format must be json or csv', { param: 'format' });
  return { from, to, bucket, format };
}

function answer(c: AppContext, q: RangeQuery, rows: UsageRow[]): Response {
  if (q.format === 'csv') {
    return new Response(usageCsv(rows), { headers: { 'content-type': 'text/csv; charset=utf-8', 'cache-control': 'no-store', 'content-disposition': `attachment; filename="usage-${q.bucket}.csv"` } });
  }
  return c.json({ object: 'list', bucket: q.bucket, from: new Date(q.from).toISOString(), to: new Date(q.to).toISOString(), data: rows.map(usageJsonRow) }, 200, { 'cache-control': 'no-store' });
}

export function registerUsageRoutes(admin: Hono<AppEnv>): void {
  admin.get('/usage', async (c) => {
    const q = parseRange(c, ['hour', 'day']);
    if (q instanceof Response) return q;
    const tenant = c.req.query('tenant');
    if (tenant !== undefined && !/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/.test(tenant)) return fail(c, 'invalid_request', 'Invalid tenant', { param: 'tenant' });
    const rows = await registryStub(c.env).usage({ from: q.from, to: q.to, bucketMs: BUCKET_MS[q.bucket], ...(tenant ? { tenant } : {}) });
    return answer(c, q, rows);
  });

  admin.get('/tenants/:id/usage', async (c) => {
    const q = parseRange(c, ['minute', 'hour', 'day']);
    if (q instanceof Response) return q;
    const rows = await meterFor(c.env, c.req.param('id')).usage({ from: q.from, to: q.to, bucketMs: BUCKET_MS[q.bucket] });
    return answer(c, q, rows);
  });

  admin.get('/tenants/:id/limits', async (c) => {
    const id = c.req.param('id');
    const tenant = await lookupTenantById(c.env, id);
    if (!tenant) return fail(c, 'not_found', `No tenant "${id}"`);
    const limits = tenant.limits ?? null;
    const meter = meterFor(c.env, id);
    const scopes = ['*', ...Object.keys(limits?.models ?? {})];
    const state = limits ? await Promise.all(scopes.map(async (model) => ({ scope: model, buckets: bucketsFor(limits, model).filter((b) => b.scope === model), state: await meter.state(limits, model) }))) : [];
    return c.json({ tenant: id, limits, state });
  });
}
