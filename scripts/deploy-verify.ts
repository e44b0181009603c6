// `npm run deploy:verify -- <URL> [--tenant-key-env NAME] [--model M] [--wait S] [--timeout S]`:
// after `wrangler deploy`, asks the deployed router whether it can serve (scripts/lib/deploy-verify.ts):
// /healthz, every pool's replicas through the admin API (health as the coordinators see it), and,
// with a tenant key in the environment, one streamed answer. ADMIN_TOKEN comes from the
// environment, never from an argument (shell history). Exit 0: all good; 1: a problem is printed.
// I/O: HTTP to the router.
import { verifyDeployment } from './lib/deploy-verify.js';

function usage(): never {
  console.error('usage: ADMIN_TOKEN=… npm run deploy:verify -- https://llm.example.com [--tenant-key-env PREFIX_ROUTER_TENANT_KEY] [--model M] [--wait 30] [--timeout 10]');
  process.exit(2);
}

async function main(): Promise<number> {
  const argv = process.argv.slice(2);
  let url: string | undefined;
  let keyEnv = 'PREFIX_ROUTER_TENANT_KEY';
  let model: string | undefined;
  let waitS = 30;
  let timeoutS = 10;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const value = () => argv[++i] ?? usage();
    if (a === '--tenant-key-env') keyEnv = value();
    else if (a === '--model') model = value();
    else if (a === '--wait') waitS = Number(value());
    else if (a === '--timeout') timeoutS = Number(value());
    else if (a === '--help' || a === '-h') usage();
    else if (!a.startsWith('-') && url === undefined) url = a;
    else usage();
  }
  if (!url || !/^https?:\/\//.test(url) || !(waitS >= 0) || !(timeoutS > 0)) usage();
  const adminToken = process.env.ADMIN_TOKEN;
  if (!adminToken) {
    console.error('deploy:verify: set ADMIN_TOKEN in the environment (the value you gave `wrangler secret put ADMIN_TOKEN`)');
    return 2;
  }
  const tenantKey = process.env[keyEnv];
  console.log(`deploy:verify ${url}${tenantKey ? '' : ` (no ${keyEnv} in the environment: no streamed request)`}`);
  const r = await verifyDeployment({ url, adminToken, ...(tenantKey ? { tenantKey } : {}), ...(model ? { model } : {}), waitMs: waitS * 1000, timeoutMs: timeoutS * 1000, log: (l) => console.log(`  ${l}`) });
  if (r.ok) {
    console.log(`deploy:verify: ok (${r.replicas.length} replicas healthy${r.stream ? ', a streamed answer came back' : ''})`);
    return 0;
  }
  console.error('deploy:verify: problems:');
  for (const p of r.problems) console.error(`  - ${p}`);
  return 1;
}

main().then(
  (code) => (process.exitCode = code),
  (e: unknown) => {
    console.error(`deploy:verify failed: ${(e as Error).message}`);
    process.exitCode = 1;
  },
);
