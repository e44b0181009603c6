// The Worker without a ROUTER_CONFIG var runs the configuration bundled with it (#27 item 6):
// src/config.ts imports ../router.config.json, here swapped at bundle time for a 500-replica,
// 20-pool fleet (scripts/lib/deploy-check-fleet.ts), far past a variable's 5 KB. Under Miniflare
// with no ROUTER_CONFIG binding, the admin API lists the fleet; a pool's coordinator seeds its
// replicas from it. No request leaves the machine: outbound fetches (health checks of the fleet's
// hostnames) are answered 503 in process.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { build } from 'esbuild';
import { Miniflare, NoOpLog } from 'miniflare';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { fleetConfig } from '../../scripts/lib/deploy-check-fleet.js';
import { workerBuildOptions } from '../../scripts/lib/worker-bundle.js';
import { COMPATIBILITY_DATE, COMPATIBILITY_FLAGS, ROUTER_DURABLE_OBJECTS } from '../helpers/router.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const ADMIN = `bundled-admin-${crypto.randomUUID()}`;
let dir: string;
let mf: Miniflare;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'bundled-config-'));
  const file = join(dir, 'router.config.json');
  writeFileSync(file, JSON.stringify(fleetConfig({ pools: 20, replicasPerPool: 25 })));
  const r = await build({
    ...workerBuildOptions(join(ROOT, 'src/index.ts')),
    plugins: [{ name: 'fleet-config', setup: (b) => b.onResolve({ filter: /(^|\/)router\.config\.json$/ }, () => ({ path: file })) }],
  });
  const code = r.outputFiles[0]!.text;
  expect(code).toContain('vllm-p19-r024.gpu.example.com');
  mf = new Miniflare({
    modules: [{ type: 'ESModule', path: 'prefix-router.js', contents: code }],
    compatibilityDate: COMPATIBILITY_DATE,
    compatibilityFlags: COMPATIBILITY_FLAGS,
    durableObjects: ROUTER_DURABLE_OBJECTS,
    kvNamespaces: ['TENANTS'],
    // No ROUTER_CONFIG: the bundled module is the configuration. Secrets the fleet's auth refers to.
    bindings: { ADMIN_TOKEN: ADMIN, CACHE_SALT_KEY: `salt-${crypto.randomUUID()}-${crypto.randomUUID()}`, ...Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`ACCESS_${String(i).padStart(2, '0')}`, JSON.stringify({ 'CF-Access-Client-Id': 'id', 'CF-Access-Client-Secret': 'secret' })])) },
    outboundService: () => new Response('no network in tests', { status: 503 }),
    log: new NoOpLog(),
  });
}, 120_000);

afterAll(async () => {
  await mf?.dispose();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('router.config.json bundled, no ROUTER_CONFIG var', () => {
  it('the admin API lists the 20 bundled pools and a coordinator seeds its 25 replicas from them', async () => {
    const res = await mf.dispatchFetch('http://localhost/admin/pools', { headers: { authorization: `Bearer ${ADMIN}` } });
    expect(res.status).toBe(200);
    const { pools } = (await res.json()) as { pools: { name: string; replicas: number }[] };
    expect(pools).toHaveLength(20);
    expect(pools.reduce((n, p) => n + p.replicas, 0)).toBe(500);
    const one = await mf.dispatchFetch('http://localhost/admin/pools/pool-07', { headers: { authorization: `Bearer ${ADMIN}` } });
    const snap = (await one.json()) as { replicas: { id: string; url: string }[] };
    expect(snap.replicas).toHaveLength(25);
    expect(snap.replicas[3]).toMatchObject({ id: 'p07-r003', url: 'https://vllm-p07-r003.gpu.example.com' });
  }, 60_000);
});
