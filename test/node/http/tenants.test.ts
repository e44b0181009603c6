// Tenant lookups are cached per isolate in two bounded LRUs (known keys, misses): a flood of
// random wrong keys can evict only other misses, so valid tenants keep being served from cache.
import { createHash } from 'node:crypto';
import { beforeEach, describe, expect, it } from 'vitest';
import { clearTenantCache, lookupTenant } from '../../../src/http/tenants';

const sha = (s: string) => createHash('sha256').update(s).digest('hex');

function fakeKv(records: Record<string, unknown>) {
  let gets = 0;
  return {
    kv: { get: async (k: string) => { gets++; return records[k] ?? null; } } as unknown as KVNamespace,
    gets: () => gets,
  };
}

describe('tenant lookup cache', () => {
  beforeEach(() => clearTenantCache());

  it('a flood of wrong keys does not evict a valid tenant', async () => {
    const { kv, gets } = fakeKv({ [`key:${sha('sk-good')}`]: { tenant: 'acme', keyId: 'k1' }, 'tenant:acme': { id: 'acme', pools: ['*'] } });
    const env = { TENANTS: kv };
    const t0 = 1_000_000;
    expect((await lookupTenant(env, 'sk-good', 60_000, t0))?.id).toBe('acme');
    const afterFirst = gets();
    expect(afterFirst).toBe(2);
    for (let i = 0; i < 12_000; i++) expect(await lookupTenant(env, `sk-wrong-${i}`, 60_000, t0 + 1)).toBeNull();
    const before = gets();
    expect((await lookupTenant(env, 'sk-good', 60_000, t0 + 2))?.id).toBe('acme');
    expect(gets()).toBe(before); // served from cache
    // A repeated wrong key is a cached miss too.
    expect(await lookupTenant(env, 'sk-wrong-11999', 60_000, t0 + 3)).toBeNull();
    expect(gets()).toBe(before);
  });

  it('entries expire after cacheMs (a revoked key stops working)', async () => {
    const records: Record<string, unknown> = { [`key:${sha('sk-x')}`]: { tenant: 'acme', keyId: 'k1' }, 'tenant:acme': { id: 'acme', pools: ['*'] } };
    const { kv } = fakeKv(records);
    const env = { TENANTS: kv };
    expect(await lookupTenant(env, 'sk-x', 30_000, 0)).not.toBeNull();
    delete records[`key:${sha('sk-x')}`];
    expect(await lookupTenant(env, 'sk-x', 30_000, 29_999)).not.toBeNull();
    expect(await lookupTenant(env, 'sk-x', 30_000, 30_001)).toBeNull();
  });
});
