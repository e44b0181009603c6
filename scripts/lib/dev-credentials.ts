// The local demo's credentials. Written in the README on purpose: they only ever guard
// 127.0.0.1 processes started by `npm start`. Never use them anywhere else.
import { createHash } from 'node:crypto';

export const DEV_ADMIN_TOKEN = 'dev-admin-token-change-me';
export const DEV_ORIGIN_API_KEY = 'dev-origin-key';
/** Key of the tenants' vLLM cache_salt (HMAC); production: `openssl rand -base64 32 | wrangler secret put CACHE_SALT_KEY`. */
export const DEV_CACHE_SALT_KEY = 'dev-cache-salt-key-change-me-0123456789';
export const DEV_TENANTS = [
  { key: 'sk-demo-acme', tenant: 'acme', keyId: 'dev-acme', pools: ['*'], allowPoolHeader: true },
  // Limits so `npm start` shows the x-ratelimit-* headers and a 429 on a burst (docs/operations.md).
  { key: 'sk-demo-globex', tenant: 'globex', keyId: 'dev-globex', pools: ['chat'], allowPoolHeader: false, maxInFlight: 32, limits: { requestsPerMinute: 120, tokensPerMinute: 20_000 } },
] as const;

export function sha256Hex(s: string): string {
  return createHash('sha256').update(s).digest('hex');
}

/** The TENANT_KEYS secret for a list of tenants: only key hashes, never keys. */
export interface DevRateLimits {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
  models?: Record<string, { requestsPerMinute?: number; tokensPerMinute?: number }>;
}

export function tenantKeysSecret(tenants: readonly { key: string; tenant: string; keyId: string; pools: readonly string[]; allowPoolHeader?: boolean; maxInFlight?: number; limits?: DevRateLimits }[]): string {
  const out: { tenants: Record<string, object>; keys: Record<string, object> } = { tenants: {}, keys: {} };
  for (const t of tenants) {
    out.tenants[t.tenant] = { pools: [...t.pools], allowPoolHeader: t.allowPoolHeader ?? false, ...(t.maxInFlight ? { maxInFlight: t.maxInFlight } : {}), ...(t.limits ? { limits: t.limits } : {}) };
    out.keys[sha256Hex(t.key)] = { tenant: t.tenant, keyId: t.keyId };
  }
  return JSON.stringify(out);
}
