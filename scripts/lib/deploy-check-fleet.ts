// A large fleet for `npm run deploy:check` (#27 item 6): `pools` pools of `replicasPerPool` replicas
// on public hostnames behind Access headers, and `tenants` tenants with one key each as a
// `wrangler kv bulk put` file for the TENANTS namespace (http/tenant-records.ts layout). Plain data;
// the keys themselves are drawn by the caller and only their SHA-256 is kept. Pure: no I/O.

import { kvKeyName, kvTenantName, type KeyRecord, type TenantRecord } from '../../src/http/tenant-records.js';

export interface FleetShape {
  pools: number;
  replicasPerPool: number;
}

const pad = (n: number, w: number) => String(n).padStart(w, '0');

/** A router configuration for the edge: every replica https on 443, one Access service token per pool. */
export function fleetConfig(shape: FleetShape): Record<string, unknown> {
  const pools = [];
  for (let p = 0; p < shape.pools; p++) {
    const name = `pool-${pad(p, 2)}`;
    const auth = `headers:ACCESS_${pad(p, 2)}`;
    const replicas = [];
    for (let r = 0; r < shape.replicasPerPool; r++) replicas.push({ id: `p${pad(p, 2)}-r${pad(r, 3)}`, url: `https://vllm-p${pad(p, 2)}-r${pad(r, 3)}.gpu.example.com`, auth });
    pools.push({ name, models: [`model-${pad(p, 2)}`], replicas });
  }
  return { pools };
}

export interface KvEntry {
  key: string;
  value: string;
}

/**
 * TENANTS records for `keyHashes.length` tenants, tenant i holding key hash i and allowed pool
 * i mod `pools` (the layout the admin API writes: key, tenant, tenantkey).
 */
export function fleetTenantsKv(keyHashes: readonly string[], pools: number, now: number): KvEntry[] {
  const out: KvEntry[] = [];
  keyHashes.forEach((hash, i) => {
    const id = `tenant-${pad(i, 4)}`;
    const keyId = `k${pad(i, 4)}`;
    const tenant: TenantRecord = { id, pools: [`pool-${pad(i % pools, 2)}`], maxInFlight: 64, allowPoolHeader: false, limits: { requestsPerMinute: 600, tokensPerMinute: 1_000_000 } };
    const key: KeyRecord = { tenant: id, keyId, createdAt: now };
    out.push({ key: kvTenantName(id), value: JSON.stringify(tenant) });
    out.push({ key: kvKeyName(hash), value: JSON.stringify(key) });
    out.push({ key: `tenantkey:${id}:${keyId}`, value: hash });
  });
  return out;
}

/** The same keys as one TENANT_KEYS document (to show it does not fit a secret). */
export function fleetTenantKeysSecret(keyHashes: readonly string[], pools: number): string {
  const tenants: Record<string, unknown> = {};
  const keys: Record<string, unknown> = {};
  keyHashes.forEach((hash, i) => {
    const id = `tenant-${pad(i, 4)}`;
    tenants[id] = { pools: [`pool-${pad(i % pools, 2)}`] };
    keys[hash] = { tenant: id, keyId: `k${pad(i, 4)}` };
  });
  return JSON.stringify({ tenants, keys });
}

/**
 * The project's wrangler.toml with its router configuration moved out: the [vars.ROUTER_CONFIG]
 * tables dropped (they are the file's last section), a real-looking KV namespace id, a custom
 * domain and workers.dev off, as a production file would have.
 */
export function fleetWranglerToml(projectToml: string, kvId: string): string {
  const cut = projectToml.search(/^\[vars\.ROUTER_CONFIG\]/m);
  if (cut < 0) throw new Error('wrangler.toml has no [vars.ROUTER_CONFIG] table to move out');
  const head = projectToml.slice(0, cut).replace(/^id = "0+"$/m, `id = "${kvId}"`);
  // Top-level keys go before the first table.
  const firstTable = head.search(/^\[/m);
  return `${head.slice(0, firstTable)}workers_dev = false\nroutes = [{ pattern = "llm.example.com", custom_domain = true }]\n\n${head.slice(firstTable)}`;
}
