// `npm run deploy:check`'s decisions (scripts/lib/deploy-check.ts) on wrangler configurations:
// the demo (local), a production one, and what the edge refuses (#27 items 1 and 10). Plain Node.

import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { checkDeployConfig, VAR_LIMIT_BYTES, type WranglerView } from '../../../scripts/lib/deploy-check.js';

const kv = [{ binding: 'TENANTS', id: '3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b' }];
const prodPool = (replicas: object[]) => ({ name: 'chat', models: ['llama'], authRefs: ['bearer:VLLM_KEY', 'headers:ACCESS_EU'], replicas });
const prod = (over: Partial<WranglerView> = {}, config: Record<string, unknown> = {}): WranglerView => ({
  vars: { ROUTER_CONFIG: { pools: [prodPool([{ id: 'eu-1', url: 'https://vllm-eu-1.example.com', auth: 'headers:ACCESS_EU' }])], ...config } },
  workers_dev: false,
  routes: [{ pattern: 'llm.example.com', custom_domain: true }],
  kv_namespaces: kv,
  ...over,
});

describe('deploy:check', () => {
  it('a production configuration passes for the edge and lists the secrets it reads', () => {
    const r = checkDeployConfig(prod());
    expect(r.target).toBe('edge');
    expect(r.errors).toEqual([]);
    expect(r.warnings).toEqual([]);
    expect(r.secrets.required.sort()).toEqual(['ACCESS_EU', 'ADMIN_TOKEN', 'CACHE_SALT_KEY', 'VLLM_KEY']);
    expect(r.secrets.optional).toEqual(['METRICS_TOKEN', 'TENANT_KEYS']);
  });

  it('refuses a loopback, :8000, IP or http replica for the edge, naming each', () => {
    const r = checkDeployConfig(prod({ vars: { ROUTER_CONFIG: { pools: [prodPool([{ id: 'a', url: 'http://127.0.0.1:8000' }])] } } }));
    expect(r.errors.join('\n')).toMatch(/pools\.0\.replicas\.0\.url: is a loopback address/);
    for (const [url, needle] of [['https://vllm.example.com:8000', 'uses port 8000'], ['https://8.8.8.8', 'is an IP address'], ['http://vllm.example.com', 'must use https']]) {
      const bad = checkDeployConfig(prod({ vars: { ROUTER_CONFIG: { pools: [prodPool([{ id: 'a', url }])] } } }));
      expect(bad.errors.join('\n'), url).toContain(needle);
    }
  });

  it('the repository\'s demo (wrangler.toml, local = true) is valid for a local run, not deployable: --strict refuses it', () => {
    const toml = readFileSync(new URL('../../../wrangler.toml', import.meta.url), 'utf8');
    expect(toml).toMatch(/^local = true/m);
    const demo: WranglerView = { vars: { ROUTER_CONFIG: { local: true, pools: [{ name: 'chat', models: ['demo-model'], replicas: [{ id: 'r1', url: 'http://127.0.0.1:9001', auth: 'bearer:ORIGIN_API_KEY' }] }] } }, kv_namespaces: [{ binding: 'TENANTS', id: '00000000000000000000000000000000' }] };
    const r = checkDeployConfig(demo);
    expect(r.target).toBe('local');
    expect(r.errors).toEqual([]);
    expect(checkDeployConfig(demo, { strict: true }).errors.join('\n')).toMatch(/ROUTER_CONFIG\.local is true.*--strict refuses it/);
    // Without the marker the same demo is what the edge refuses.
    const unmarked = checkDeployConfig({ ...demo, vars: { ROUTER_CONFIG: { ...(demo.vars.ROUTER_CONFIG as object), local: false } } });
    expect(unmarked.errors.join('\n')).toMatch(/loopback address[\s\S]*placeholder/);
  });

  it('ROUTER_CONFIG over 5 KB as JSON is refused (a Workers variable\'s limit); near it, a warning', () => {
    const replicas = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `r${i}`, url: `https://vllm-${i}.gpu.example.com`, auth: 'bearer:VLLM_KEY' }));
    const sized = (n: number) => checkDeployConfig(prod({ vars: { ROUTER_CONFIG: { pools: [prodPool(replicas(n))] } } }));
    const big = sized(80);
    expect(big.configBytes).toBeGreaterThan(VAR_LIMIT_BYTES);
    expect(big.errors.join('\n')).toMatch(/ROUTER_CONFIG is \d+ bytes as JSON; a Workers variable holds at most 5120/);
    const near = [...Array(80).keys()].map((n) => sized(n)).find((r) => r.configBytes > VAR_LIMIT_BYTES * 0.8 && r.configBytes <= VAR_LIMIT_BYTES)!;
    expect(near.errors).toEqual([]);
    expect(near.warnings.join('\n')).toMatch(/of 5120 bytes/);
  });

  it('the placeholder KV id, a missing TENANTS binding and workers.dev exposure are reported', () => {
    expect(checkDeployConfig(prod({ kv_namespaces: [{ binding: 'TENANTS', id: '00000000000000000000000000000000' }] })).errors.join('\n')).toMatch(/placeholder/);
    expect(checkDeployConfig(prod({ kv_namespaces: [] })).errors.join('\n')).toMatch(/no TENANTS KV namespace/);
    const exposed = checkDeployConfig(prod({ workers_dev: undefined, routes: undefined }));
    expect(exposed.errors).toEqual([]);
    expect(exposed.warnings.join('\n')).toMatch(/workers_dev is not set .*\/admin and \/dashboard/);
    expect(exposed.warnings.join('\n')).toMatch(/no routes or custom domain/);
  });

  it('warns when nonStreamTimeoutMs is at or past the 120 s a proxied origin gets before Cloudflare answers 524', () => {
    expect(checkDeployConfig(prod()).warnings).toEqual([]);
    const r = checkDeployConfig(prod({}, { nonStreamTimeoutMs: 600_000 }));
    expect(r.errors).toEqual([]);
    expect(r.warnings.join('\n')).toMatch(/nonStreamTimeoutMs is 600000 ms: .*524 after 120 s/);
    expect(checkDeployConfig(prod({}, { nonStreamTimeoutMs: 119_000 })).warnings).toEqual([]);
  });
});
