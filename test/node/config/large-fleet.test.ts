// Configuration past a variable's 5 KB (#27 item 6): a 500-replica, 20-pool fleet lives in the
// bundled router.config.json (src/config.ts loadConfig reads it when the ROUTER_CONFIG var is
// absent) and passes deploy:check's decisions, while the same fleet as the var is refused; 1,000
// tenant keys pass as TENANTS KV records and are refused as a TENANT_KEYS secret (the same 5 KB).
// The fleet comes from scripts/lib/deploy-check-fleet.ts, as `scripts/deploy-check-fleet.ts`
// writes it for a real `npm run deploy:check`. Plain Node.

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../../src/config.js';
import { checkDeployConfig, VAR_LIMIT_BYTES, type WranglerView } from '../../../scripts/lib/deploy-check.js';
import { fleetConfig, fleetTenantKeysSecret, fleetTenantsKv, fleetWranglerToml } from '../../../scripts/lib/deploy-check-fleet.js';

const SHAPE = { pools: 20, replicasPerPool: 25 };
const hashes = Array.from({ length: 1000 }, (_, i) => createHash('sha256').update(`test-key-${i}`).digest('hex'));
const fleet = fleetConfig(SHAPE);
const kv = fleetTenantsKv(hashes, SHAPE.pools, 1_700_000_000_000);
const prod: WranglerView = { vars: {}, workers_dev: false, routes: [{ pattern: 'llm.example.com', custom_domain: true }], kv_namespaces: [{ binding: 'TENANTS', id: '3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b' }] };

describe('a fleet past 5 KB', () => {
  it('500 replicas in 20 pools and 1,000 tenant keys pass deploy:check from router.config.json and KV', () => {
    const r = checkDeployConfig(prod, { bundled: fleet, tenantsKv: kv, strict: true });
    expect(r.errors).toEqual([]);
    expect(r.warnings).toEqual([]);
    expect(r).toMatchObject({ source: 'router.config.json', target: 'edge', pools: 20, replicas: 500, tenants: { kvTenants: 1000, kvKeys: 1000, secretKeys: 0 } });
    expect(r.configBytes).toBeGreaterThan(8 * VAR_LIMIT_BYTES);
    expect(r.secrets.required).toContain('ACCESS_19');
  });

  it('the same fleet as the ROUTER_CONFIG var is refused, pointing at router.config.json', () => {
    const r = checkDeployConfig({ ...prod, vars: { ROUTER_CONFIG: fleet } });
    expect(r.source).toBe('ROUTER_CONFIG');
    expect(r.errors.join('\n')).toMatch(/ROUTER_CONFIG is \d+ bytes as JSON; a Workers variable holds at most 5120 .*router\.config\.json/);
  });

  it('the var wins over the file, with a warning that the file is unused', () => {
    const small = { pools: [{ name: 'chat', models: ['m'], replicas: [{ id: 'r1', url: 'https://vllm-1.example.com', auth: 'none' }] }] };
    const r = checkDeployConfig({ ...prod, vars: { ROUTER_CONFIG: small } }, { bundled: fleet });
    expect(r).toMatchObject({ source: 'ROUTER_CONFIG', pools: 1 });
    expect(r.warnings.join('\n')).toMatch(/both ROUTER_CONFIG .* and router\.config\.json are set: the Worker uses ROUTER_CONFIG/);
    // `null` in the file (as shipped): no bundled configuration, no warning.
    expect(checkDeployConfig({ ...prod, vars: { ROUTER_CONFIG: small } }, { bundled: null }).warnings).toEqual([]);
    expect(checkDeployConfig(prod, { bundled: null }).errors.join('\n')).toMatch(/no configuration: neither the ROUTER_CONFIG var nor a router\.config\.json/);
  });

  it('a bad field in router.config.json is named by the file', () => {
    const bad = fleetConfig({ pools: 2, replicasPerPool: 2 }) as { pools: { replicas: { url: string }[] }[] };
    bad.pools[1]!.replicas[0]!.url = 'https://vllm.example.com:8000';
    expect(checkDeployConfig(prod, { bundled: bad }).errors.join('\n')).toMatch(/router\.config\.json\.pools\.1\.replicas\.0\.url: uses port 8000/);
  });

  it('1,000 keys as TENANT_KEYS (secret or var) are measured and refused; a few dozen fit', () => {
    const secret = fleetTenantKeysSecret(hashes, SHAPE.pools);
    const r = checkDeployConfig(prod, { bundled: fleet, tenantKeys: secret });
    expect(r.tenants.secretKeys).toBe(1000);
    expect(r.errors.join('\n')).toMatch(/TENANT_KEYS is \d+ bytes \(1000 keys\); a secret, like a variable, holds at most 5120 .*TENANTS KV/);
    expect(checkDeployConfig({ ...prod, vars: { TENANT_KEYS: secret } }, { bundled: fleet }).errors.join('\n')).toMatch(/TENANT_KEYS is/);
    const few = checkDeployConfig(prod, { bundled: fleet, tenantKeys: fleetTenantKeysSecret(hashes.slice(0, 30), SHAPE.pools) });
    expect(few.errors).toEqual([]);
    expect(few.tenants.secretKeys).toBe(30);
  });

  it('TENANTS KV records are checked with the Worker\'s schemas: a bad record, a missing tenant, an unknown pool', () => {
    const broken = kv.map((e) => ({ ...e }));
    broken[0] = { key: broken[0]!.key, value: JSON.stringify({ id: 'tenant-0000', pools: [] }) };
    broken.splice(3, 1); // tenant-0001's tenant record
    broken.push({ key: 'tenant:odd', value: JSON.stringify({ id: 'odd', pools: ['pool-99'] }) });
    broken.push({ key: 'key:nothex', value: JSON.stringify({ tenant: 'odd', keyId: 'k' }) });
    const msg = checkDeployConfig(prod, { bundled: fleet, tenantsKv: broken }).errors.join('\n');
    expect(msg).toMatch(/tenant:tenant-0000: not a tenant record \(pools\)/);
    expect(msg).toMatch(/key:[0-9a-f]{64}: its tenant "tenant-0001" has no tenant:tenant-0001 record/);
    expect(msg).toMatch(/tenant:odd: pool "pool-99" is not configured/);
    expect(msg).toMatch(/key:nothex: a key's name is key:<sha256 hex/);
    expect(checkDeployConfig(prod, { bundled: fleet, tenantsKv: { not: 'an array' } }).errors.join('\n')).toMatch(/wrangler kv bulk put/);
  });

  it('the Worker reads the bundled configuration when the var is absent, and says so when neither is set', () => {
    const config = loadConfig(undefined, fleet);
    expect(config.pools).toHaveLength(20);
    expect(config.pools.reduce((n, p) => n + p.replicas.length, 0)).toBe(500);
    expect(loadConfig(undefined, fleet)).toBe(config); // parsed once per isolate
    expect(() => loadConfig(undefined, null)).toThrow(ConfigError);
    expect(() => loadConfig(undefined, null)).toThrow(/set the ROUTER_CONFIG var or put it in router\.config\.json/);
    // As shipped, the repository's router.config.json holds no configuration (the demo is the var).
    expect(JSON.parse(readFileSync(new URL('../../../router.config.json', import.meta.url), 'utf8'))).toBeNull();
  });

  it('the generated wrangler.toml is the project\'s without [vars.ROUTER_CONFIG], with a KV id and a custom domain', () => {
    const toml = fleetWranglerToml(readFileSync(new URL('../../../wrangler.toml', import.meta.url), 'utf8'), 'ab'.repeat(16));
    expect(toml).not.toMatch(/ROUTER_CONFIG\]/);
    expect(toml).toMatch(/^workers_dev = false$/m);
    expect(toml).toMatch(/^id = "abababababababababababababababab"$/m);
    expect(toml.indexOf('workers_dev')).toBeLessThan(toml.search(/^\[/m));
    expect(toml).toMatch(/new_sqlite_classes = \["RouterGuard"\]/);
  });
});
