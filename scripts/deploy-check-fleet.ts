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

import { fleetConfig, fleetTenantKeysSecret, fleetTenantsKv, fleetWranglerToml } from './lib/deploy-check-fleet.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

function parseArgs(argv: string[]): { out: string; pools: number; replicasPerPool: number; tenants: number } {
  const out = { out: '', pools: 20, replicasPerPool: 25, tenants: 1000 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      return v;
    };
    const count = () => {
      const n = Number(value());
      if (!Number.isInteger(n) || n < 1 || n > 100_000) throw new Error(`${a} must be a whole number from 1 to 100000`);
      return n;
    };
    if (a === '--out') out.out = resolve(value());
    else if (a === '--pools') out.pools = count();
    else if (a === '--replicas-per-pool') out.replicasPerPool = count();
    else if (a === '--tenants') out.tenants = count();
    else throw new Error(`unknown argument ${a}`);
  }
  if (!out.out) throw new Error('usage: npx tsx scripts/deploy-check-fleet.ts --out <dir> [--pools 20] [--replicas-per-pool 25] [--tenants 1000]');
  if (out.out === ROOT || ROOT.startsWith(out.out + '/')) throw new Error('--out must not be the project or one of its parents');
  return out;
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
