// `npm run deploy:check [-- --config <wrangler file>] [--env <name>] [--strict]`: what a deploy of
// this wrangler configuration would meet on Cloudflare that Miniflare lets through. Validates
// ROUTER_CONFIG for the edge (scripts/lib/deploy-check.ts: origins the edge can reach, a
// variable's 5 KB, the KV namespace, workers.dev exposure), lists the secrets the Worker will read,
// then bundles with `wrangler deploy --dry-run` and checks that bundle holds none of the test entry's
// fault hooks (TEST_ONLY_MARKERS). A configuration with `local = true` (the demo in
// wrangler.toml) is checked for a local run and reported as not deployable; `--strict` (for CI
// before `wrangler deploy`) refuses it. Exit 0: deployable (or local without --strict); 1: not.
// I/O: reads the wrangler configuration, runs wrangler, writes dist/.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { unstable_readConfig } from 'wrangler';

import { checkDeployConfig, TEST_ONLY_MARKERS, testOnlyMarkersIn } from './lib/deploy-check.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

function parseArgs(argv: string[]): { config: string; env?: string; strict: boolean } {
  const out: { config: string; env?: string; strict: boolean } = { config: join(ROOT, 'wrangler.toml'), strict: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      return v;
    };
    if (a === '--config' || a === '-c') out.config = resolve(value());
    else if (a === '--env' || a === '-e') out.env = value();
    else if (a === '--strict') out.strict = true;
    else if (a === '--help' || a === '-h') {
      console.log('usage: npm run deploy:check -- [--config wrangler.toml] [--env <name>] [--strict]');
      process.exit(0);
    } else throw new Error(`unknown argument ${a} (--help)`);
  }
  return out;
}

function main(): number {
  process.env.WRANGLER_SEND_METRICS = 'false';
  process.env.CLOUDFLARE_CF_FETCH_ENABLED = 'false';
  const args = parseArgs(process.argv.slice(2));
  const w = unstable_readConfig({ config: args.config, ...(args.env ? { env: args.env } : {}) }, { hideWarnings: true });
  const r = checkDeployConfig(w, { strict: args.strict });
  const where = `${args.config}${args.env ? ` (env ${args.env})` : ''}`;
  console.log(`deploy:check ${where}: ROUTER_CONFIG ${r.configBytes} bytes, validated for ${r.target === 'edge' ? 'the edge' : 'a LOCAL run (ROUTER_CONFIG.local = true)'}`);
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
