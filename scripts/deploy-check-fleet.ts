// `npx tsx scripts/deploy-check-fleet.ts --out <dir> [--pools 20] [--replicas-per-pool 25] [--tenants 1000]`:
// writes a project with a fleet far past a variable's 5 KB for `npm run deploy:check` to pass on
// (#27 item 6): <dir>/wrangler.toml (this project's, its [vars.ROUTER_CONFIG] moved out),
// <dir>/router.config.json (the fleet), <dir>/tenants.kv.json (tenants and key hashes for
// `wrangler kv bulk put --binding TENANTS`), <dir>/tenant-keys.json (the same keys as a
// TENANT_KEYS document, which deploy:check refuses), and a copy of src/ beside them, since the
// Worker bundles the router.config.json next to its src/. The keys are random and not kept.
// I/O: writes <dir>.
import { createHash, randomBytes } from 'node:crypto';
import { cpSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs as parseCli } from 'node:util';

import { fleetConfig, fleetTenantKeysSecret, fleetTenantsKv, fleetWranglerToml } from './lib/deploy-check-fleet.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

const USAGE = 'usage: npx tsx scripts/deploy-check-fleet.ts --out <dir> [--pools 20] [--replicas-per-pool 25] [--tenants 1000]';

function parseArgs(argv: string[]): { out: string; pools: number; replicasPerPool: number; tenants: number } {
  const { values } = parseCli({ args: argv, strict: true, allowPositionals: false, options: { out: { type: 'string' }, pools: { type: 'string' }, 'replicas-per-pool': { type: 'string' }, tenants: { type: 'string' } } });
  const count = (name: string, v: string | undefined, fallback: number): number => {
    if (v === undefined) return fallback;
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1 || n > 100_000) throw new Error(`--${name} must be a whole number from 1 to 100000`);
    return n;
  };
  if (!values.out) throw new Error(USAGE);
  const out = resolve(values.out);
  if (out === ROOT || ROOT.startsWith(out + '/')) throw new Error('--out must not be the project or one of its parents');
  return { out, pools: count('pools', values.pools, 20), replicasPerPool: count('replicas-per-pool', values['replicas-per-pool'], 25), tenants: count('tenants', values.tenants, 1000) };
}

function main(): void {
  const args = parseArgs(process.argv.slice(2));
  rmSync(args.out, { recursive: true, force: true });
  mkdirSync(args.out, { recursive: true });
  const hashes = Array.from({ length: args.tenants }, () => createHash('sha256').update(`pr-${randomBytes(24).toString('base64url')}`).digest('hex'));
  const kvId = randomBytes(16).toString('hex');
  writeFileSync(join(args.out, 'wrangler.toml'), fleetWranglerToml(readFileSync(join(ROOT, 'wrangler.toml'), 'utf8'), kvId));
  writeFileSync(join(args.out, 'router.config.json'), JSON.stringify(fleetConfig(args), null, 1) + '\n');
  writeFileSync(join(args.out, 'tenants.kv.json'), JSON.stringify(fleetTenantsKv(hashes, args.pools, Date.now())) + '\n');
  writeFileSync(join(args.out, 'tenant-keys.json'), fleetTenantKeysSecret(hashes, args.pools) + '\n');
  cpSync(join(ROOT, 'src'), join(args.out, 'src'), { recursive: true });
  // The bundle resolves hono and zod from here.
  symlinkSync(join(ROOT, 'node_modules'), join(args.out, 'node_modules'));
  console.log(`wrote ${args.out}: ${args.pools} pools × ${args.replicasPerPool} replicas, ${args.tenants} tenants. Check it with:`);
  console.log(`  npm run deploy:check -- --config ${join(args.out, 'wrangler.toml')} --tenants-kv ${join(args.out, 'tenants.kv.json')}`);
  console.log(`  (add --tenant-keys ${join(args.out, 'tenant-keys.json')} to see the same keys refused as a TENANT_KEYS secret)`);
}

try {
  main();
} catch (e) {
  console.error(`deploy-check-fleet: ${(e as Error).message}`);
  process.exitCode = 1;
}
