// Tenant authentication: the SHA-256 of the bearer key is looked up in the TENANT_KEYS secret
// (a handful of tenants) or the TENANTS KV namespace (thousands). Only hashes are stored.
// I/O: KV reads, cached per isolate for `tenantCacheMs` (which bounds how long a revoked key
// keeps working in one isolate, on top of KV's own propagation).

import { z } from 'zod';

import { keyRecordSchema, kvKeyName, kvTenantName, tenantRecordSchema, type TenantRecord } from './tenant-records.js';

export { keyRecordSchema, kvKeyName, kvTenantName, tenantLimitsSchema, tenantRecordSchema, type KeyRecord, type TenantRecord } from './tenant-records.js';

export interface Tenant extends TenantRecord {
  keyId: string;
}

const secretSchema = z.object({
  tenants: z.record(z.string(), tenantRecordSchema.omit({ id: true }).partial({ allowPoolHeader: true })),
  keys: z.record(z.string().regex(/^[0-9a-f]{64}$/), keyRecordSchema),
});

export async function sha256Hex(s: string): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(s));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** Compare two secrets in constant time (hash both so lengths never leak). */
export async function secretsEqual(a: string, b: string): Promise<boolean> {
  const enc = new TextEncoder();
  const [da, db] = await Promise.all([crypto.subtle.digest('SHA-256', enc.encode(a)), crypto.subtle.digest('SHA-256', enc.encode(b))]);
  return crypto.subtle.timingSafeEqual(da, db) && a.length > 0;
}

interface CacheEntry {
  tenant: Tenant | null;
  expires: number;
}

/**
 * A bounded LRU of lookups (Map insertion order: least recently used first). Known keys and
 * misses live in separate caches, so a stream of random wrong keys can only evict other misses,
 * never push a valid tenant's lookup back to KV.
 */
class LookupCache {
  private readonly map = new Map<string, CacheEntry>();
  constructor(private readonly max: number) {}
  get(hash: string, now: number): CacheEntry | undefined {
    const e = this.map.get(hash);
    if (!e) return undefined;
    this.map.delete(hash);
    if (e.expires <= now) return undefined;
    this.map.set(hash, e);
    return e;
  }
  set(hash: string, e: CacheEntry): void {
    this.map.delete(hash);
    if (this.map.size >= this.max) this.map.delete(this.map.keys().next().value!);
    this.map.set(hash, e);
  }
  clear(): void {
    this.map.clear();
  }
}
const known = new LookupCache(10_000);
const misses = new LookupCache(2_000);
let parsedSecret: { raw: string; value: z.infer<typeof secretSchema> | null } | undefined;

function secretTenants(raw: string | undefined): z.infer<typeof secretSchema> | null {
  if (!raw) return null;
  if (parsedSecret?.raw === raw) return parsedSecret.value;
  let value: z.infer<typeof secretSchema> | null = null;
  try {
    const res = secretSchema.safeParse(JSON.parse(raw));
    if (res.success) value = res.data;
    else console.error(JSON.stringify({ type: 'config_error', message: 'TENANT_KEYS does not match the expected shape', issues: res.error.issues.map((i) => i.path.join('.')) }));
  } catch {
    console.error(JSON.stringify({ type: 'config_error', message: 'TENANT_KEYS is not valid JSON' }));
  }
  parsedSecret = { raw, value };
  return value;
}

export interface TenantSources {
  TENANTS?: KVNamespace;
  TENANT_KEYS?: string;
}

/** Resolve a bearer key to its tenant, or null. Never logs or returns the key. */
export async function lookupTenant(env: TenantSources, apiKey: string, cacheMs: number, now = Date.now()): Promise<Tenant | null> {
  const hash = await sha256Hex(apiKey);
  const hit = known.get(hash, now) ?? misses.get(hash, now);
  if (hit) return hit.tenant;
  const tenant = await lookupUncached(env, hash);
  if (cacheMs > 0) (tenant ? known : misses).set(hash, { tenant, expires: now + cacheMs });
  return tenant;
}

/** Forget cached lookups (the admin API calls this after a revocation in this isolate). */
export function clearTenantCache(): void {
  known.clear();
  misses.clear();
}

async function lookupUncached(env: TenantSources, hash: string): Promise<Tenant | null> {
  const fromSecret = secretTenants(env.TENANT_KEYS);
  const k = fromSecret?.keys[hash];
  if (k) {
    const t = fromSecret!.tenants[k.tenant];
    return t ? { id: k.tenant, allowPoolHeader: false, ...t, keyId: k.keyId } : null;
  }
  if (!env.TENANTS) return null;
  const keyRaw = await env.TENANTS.get(kvKeyName(hash), 'json');
  const key = keyRecordSchema.safeParse(keyRaw);
  if (!key.success) return null;
  const tRaw = await env.TENANTS.get(kvTenantName(key.data.tenant), 'json');
  const t = tenantRecordSchema.safeParse(tRaw);
  if (!t.success) return null;
  return { ...t.data, keyId: key.data.keyId };
}

/** Whether TENANT_KEYS holds the key `keyId` of `tenant` (admin revocation of a secret-held key). */
export function secretKeyExists(env: TenantSources, tenant: string, keyId: string): boolean {
  const s = secretTenants(env.TENANT_KEYS);
  return !!s && Object.values(s.keys).some((k) => k.tenant === tenant && k.keyId === keyId);
}

/** A tenant's record by id (TENANT_KEYS first, then KV), uncached: for the admin API. */
export async function lookupTenantById(env: TenantSources, id: string): Promise<TenantRecord | null> {
  const t = secretTenants(env.TENANT_KEYS)?.tenants[id];
  if (t) return { id, allowPoolHeader: false, ...t };
  if (!env.TENANTS) return null;
  const rec = tenantRecordSchema.safeParse(await env.TENANTS.get(kvTenantName(id), 'json'));
  return rec.success ? rec.data : null;
}

export function tenantMayUse(t: TenantRecord, pool: string): boolean {
  return t.pools.includes('*') || t.pools.includes(pool);
}

// ---- revocation -----------------------------------------------------------------------------
// The admin API's revoke call pushes `tenant/keyId` to every pool's coordinator, which refuses
// the key in acquire from then on (coordinator/revocations.ts, persisted). An isolate that hears
// "revoked" from a coordinator remembers it here, so it neither serves the key from its lookup
// cache nor sends it anywhere again (early connect would otherwise reach an origin before the
// acquire answers).

const revokedHere = new Set<string>();
const MAX_REVOKED_HERE = 10_000;

/** `tenant/keyId`, the id coordinators hold revocations by. */
export const revocationId = (tenant: string, keyId: string) => `${tenant}/${keyId}`;

export function isKeyRevokedHere(t: Tenant): boolean {
  return revokedHere.size > 0 && revokedHere.has(revocationId(t.id, t.keyId));
}

/** A coordinator said this key is revoked: refuse it in this isolate from now on. */
export function noteKeyRevoked(t: { id: string; keyId: string }): void {
  if (revokedHere.size >= MAX_REVOKED_HERE) revokedHere.clear();
  revokedHere.add(revocationId(t.id, t.keyId));
  clearTenantCache();
}
