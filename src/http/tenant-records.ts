// Tenant and key records as the TENANTS KV namespace and TENANT_KEYS hold them: the schemas and
// the KV names, shared by the Worker (tenants.ts) and `npm run deploy:check`. Pure: zod only.

import { z } from 'zod';

const perMinute = z.number().int().min(1).max(1_000_000_000);
const rateLimitsSchema = z.object({ requestsPerMinute: perMinute.optional(), tokensPerMinute: perMinute.optional() }).strict();
/** Requests and tokens per minute, tenant-wide and per model (src/quota/limits.ts). */
export const tenantLimitsSchema = rateLimitsSchema.extend({ models: z.record(z.string().min(1).max(256), rateLimitsSchema).optional() }).strict();

/** A priority band's name, as the pools' flowControl.bands spell them (config.ts). */
const BAND_NAME = /^[a-z0-9][a-z0-9_-]{0,31}$/;

export const tenantRecordSchema = z.object({
  id: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/),
  /** Pools the tenant may use; ["*"] for all. */
  pools: z.array(z.string().min(1)).min(1),
  /** Cap on this tenant's requests in flight per pool. */
  maxInFlight: z.number().int().min(1).optional(),
  /** May choose a pool with the `x-pool` header (among its allowed pools). */
  allowPoolHeader: z.boolean().default(false),
  /** Requests-per-minute and tokens-per-minute limits (none: unlimited, still metered). */
  limits: tenantLimitsSchema.optional(),
  /** Flow control (docs/operations.md, "Flow control"): its fair-share weight in a saturated pool; unset: 1. */
  weight: z.number().int().min(1).max(1000).optional(),
  /** The priority band of its requests (a band of the pool's flowControl); unset: the pool's defaultBand. */
  priority: z.string().regex(BAND_NAME).optional(),
  /** Bands it may ask for with `x-prefix-router-priority`; unset: its own band and those below it. */
  priorities: z.array(z.string().regex(BAND_NAME)).min(1).max(8).optional(),
});
export type TenantRecord = z.infer<typeof tenantRecordSchema>;

export const keyRecordSchema = z.object({ tenant: z.string().min(1), keyId: z.string().min(1), createdAt: z.number().optional() });
export type KeyRecord = z.infer<typeof keyRecordSchema>;

/** KV layout: `key:<sha256 hex of the API key>` → KeyRecord, `tenant:<id>` → TenantRecord. */
export const kvKeyName = (hashHex: string) => `key:${hashHex}`;
export const kvTenantName = (id: string) => `tenant:${id}`;
