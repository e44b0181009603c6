// `npm run deploy:check [-- --config <wrangler file>] [--env <name>] [--strict]
// [--tenant-keys <TENANT_KEYS json file>] [--tenants-kv <wrangler kv bulk file>]`: what a deploy of
// this wrangler configuration would meet on Cloudflare that Miniflare lets through. Validates the
// router configuration (the ROUTER_CONFIG var, else router.config.json next to the wrangler file,
// which src/config.ts bundles) for the edge (scripts/lib/deploy-check.ts: origins the edge can
// reach, a variable's 5 KB for ROUTER_CONFIG and TENANT_KEYS, tenant records meant for KV, the KV
// namespace, workers.dev exposure), lists the secrets the Worker will read, then bundles with
// `wrangler deploy --dry-run` and checks that bundle holds none of the test entry's fault hooks
// (TEST_ONLY_MARKERS). A configuration with `local = true` (the demo in wrangler.toml) is checked
// for a local run and reported as not deployable; `--strict` (for CI before `wrangler deploy`)
// refuses it. Exit 0: deployable (or local without --strict); 1: not.
// scripts/deploy-check-fleet.ts writes a 500-replica project to try it on.
// I/O: reads the wrangler configuration and the files named, runs wrangler, writes dist/ beside
// the wrangler file.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs as parseCli } from 'node:util';

import { unstable_readConfig } from 'wrangler';

import { checkDeployConfig, TEST_ONLY_MARKERS, testOnlyMarkersIn } from './lib/deploy-check.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

interface Args {
  config: string;
  env?: string;
  strict: boolean;
  tenantKeys?: string;
  tenantsKv?: string;
}

const USAGE = 'usage: npm run deploy:check -- [--config wrangler.toml] [--env <name>] [--strict] [--tenant-keys tenant-keys.json] [--tenants-kv tenants.kv.json]';

function parseArgs(argv: string[]): Args {
  const { values } = parseCli({
    args: argv,
    strict: true,
    allowPositionals: false,
    options: {
      config: { type: 'string', short: 'c' },
      env: { type: 'string', short: 'e' },
      strict: { type: 'boolean' },
      'tenant-keys': { type: 'string' },
      'tenants-kv': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  return {
    config: values.config ? resolve(values.config) : join(ROOT, 'wrangler.toml'),
    strict: values.strict ?? false,
    ...(values.env ? { env: values.env } : {}),
    ...(values['tenant-keys'] ? { tenantKeys: resolve(values['tenant-keys']) } : {}),
    ...(values['tenants-kv'] ? { tenantsKv: resolve(values['tenants-kv']) } : {}),
  };
}

function main(): number {
  process.env.WRANGLER_SEND_METRICS = 'false';
  process.env.CLOUDFLARE_CF_FETCH_ENABLED = 'false';
  const args = parseArgs(process.argv.slice(2));
  const w = unstable_readConfig({ config: args.config, ...(args.env ? { env: args.env } : {}) }, { hideWarnings: true });
  // The module src/config.ts imports as '../router.config.json': next to wrangler.toml in this layout.
  const bundledPath = join(dirname(args.config), 'router.config.json');
  const bundled = existsSync(bundledPath) ? (JSON.parse(readFileSync(bundledPath, 'utf8')) as unknown) : undefined;
  const r = checkDeployConfig(w, {
    strict: args.strict,
    bundled,
    ...(args.tenantKeys ? { tenantKeys: readFileSync(args.tenantKeys, 'utf8').trim() } : {}),
    ...(args.tenantsKv ? { tenantsKv: JSON.parse(readFileSync(args.tenantsKv, 'utf8')) as unknown } : {}),
  });
  const where = `${args.config}${args.env ? ` (env ${args.env})` : ''}`;
  console.log(`deploy:check ${where}: ${r.source === 'router.config.json' ? bundledPath : 'ROUTER_CONFIG'} ${r.configBytes} bytes, ${r.pools} pools, ${r.replicas} replicas, validated for ${r.target === 'edge' ? 'the edge' : `a LOCAL run (${r.source}.local = true)`}`);
  if (args.tenantKeys || w.vars.TENANT_KEYS !== undefined) console.log(`  TENANT_KEYS: ${r.tenants.secretKeys} keys`);
  if (args.tenantsKv) console.log(`  TENANTS KV file ${args.tenantsKv}: ${r.tenants.kvTenants} tenants, ${r.tenants.kvKeys} keys`);
  for (const warning of r.warnings) console.log(`  warning: ${warning}`);
  for (const error of r.errors) console.error(`  error: ${error.replace(/\n/g, '\n    ')}`);
  console.log(`  secrets it reads (wrangler secret put NAME${args.env ? ` --env ${args.env}` : ''}): ${r.secrets.required.join(', ')}; optional: ${r.secrets.optional.join(', ')}`);
  if (r.errors.length > 0) {
    console.error('deploy:check: not deployable (fix the errors above; docs/deploy.md)');
    return 1;
  }
  const wrangler = join(ROOT, 'node_modules', '.bin', 'wrangler');
  const bundle = spawnSync(wrangler, ['deploy', '--dry-run', '--outdir=dist', '--config', args.config, ...(args.env ? ['--env', args.env] : [])], { cwd: ROOT, stdio: 'inherit', env: process.env, timeout: 300_000 });
  if (bundle.status !== 0) {
    console.error(`deploy:check: wrangler deploy --dry-run failed (${bundle.error?.message ?? `exit ${bundle.status}`})`);
    return 1;
  }
  const dist = join(ROOT, 'dist');
  const modules = readdirSync(dist).filter((f) => f.endsWith('.js') || f.endsWith('.mjs'));
  const found = [...new Set(modules.flatMap((f) => testOnlyMarkersIn(readFileSync(join(dist, f), 'utf8'))))];
  if (modules.length === 0 || found.length > 0) {
    console.error(modules.length === 0 ? 'deploy:check: the dry run wrote no module to dist/' : `deploy:check: the bundle holds test-only code (${found.join(', ')}): src/ must not import test/fixtures/router-entry`);
    return 1;
  }
  console.log(`  bundle: ${modules.map((f) => `dist/${f}`).join(', ')}; none of the ${TEST_ONLY_MARKERS.length} test-only markers in it`);
  if (r.target === 'local') {
    console.log('deploy:check: LOCAL configuration: valid for npm start and bundled, NOT deployable (its replicas are on 127.0.0.1). For production: docs/deploy.md; in CI use --strict.');
  } else console.log('deploy:check: deployable');
  return 0;
}

try {
  process.exitCode = main();
} catch (e) {
  console.error(`deploy:check failed: ${(e as Error).message}`);
  process.exitCode = 1;
}
