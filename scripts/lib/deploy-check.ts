// What `npm run deploy:check` decides about a wrangler configuration, apart from bundling it: the
// router configuration validated for where it will run (src/config.ts, target `edge` unless it says
// `local = true`), the Workers limits a configuration meets before any request (a variable's 5 KB),
// the KV namespace, how the Worker is exposed, and the secrets it will need. Pure: no I/O.

import { ConfigError, parseConfig, type RouterConfig } from '../../src/config.js';

/** The parts of wrangler's resolved configuration (`unstable_readConfig`) this check reads. */
export interface WranglerView {
  vars: Record<string, unknown>;
  workers_dev?: boolean | undefined;
  routes?: unknown[] | undefined;
  route?: unknown;
  kv_namespaces?: { binding: string; id?: string }[];
}

export interface DeployCheck {
  /** `edge`: validated as deployable; `local`: `ROUTER_CONFIG.local = true`, validated for a local run only. */
  target: 'edge' | 'local';
  errors: string[];
  warnings: string[];
  /** Secrets the Worker reads: required ones, then optional ones. */
  secrets: { required: string[]; optional: string[] };
  /** ROUTER_CONFIG's size as the JSON wrangler uploads. */
  configBytes: number;
}

/**
 * Each environment variable holds at most 5 KB (developers.cloudflare.com/workers/platform/limits/,
 * "Environment variables"; cloudflare-docs src/content/docs/workers/platform/limits.mdx). A
 * `[vars]` table is uploaded as its JSON text, so that is what is measured.
 */
export const VAR_LIMIT_BYTES = 5 * 1024;
const PLACEHOLDER_KV_ID = /^0+$/;

export function checkDeployConfig(w: WranglerView, opts: { strict?: boolean } = {}): DeployCheck {
  const errors: string[] = [];
  const warnings: string[] = [];
  const raw = w.vars.ROUTER_CONFIG;
  const rawObject = typeof raw === 'string' ? safeJson(raw) : raw;
  const local = isRecord(rawObject) && rawObject.local === true;
  const target = local ? 'local' : 'edge';
  const configText = typeof raw === 'string' ? raw : JSON.stringify(raw ?? null);
  const configBytes = new TextEncoder().encode(configText).length;

  let config: RouterConfig | undefined;
  try {
    config = parseConfig(raw, { target });
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    errors.push(e.message);
  }
  if (local && opts.strict) errors.push('ROUTER_CONFIG.local is true: this configuration is for a local run (loopback replicas) and --strict refuses it. Replace the pools with your replicas and remove `local` (docs/deploy.md)');
  if (configBytes > VAR_LIMIT_BYTES) {
    errors.push(`ROUTER_CONFIG is ${configBytes} bytes as JSON; a Workers variable holds at most ${VAR_LIMIT_BYTES} (developers.cloudflare.com/workers/platform/limits/#environment-variables). wrangler.toml's comments are not part of it; defaults left unset save bytes. A larger configuration is not supported yet (docs/deploy.md, "Known limits today")`);
  } else if (configBytes > VAR_LIMIT_BYTES * 0.8) {
    warnings.push(`ROUTER_CONFIG is ${configBytes} of ${VAR_LIMIT_BYTES} bytes a Workers variable may hold: a few more replicas will not fit (docs/deploy.md, "Known limits today")`);
  }

  const tenants = (w.kv_namespaces ?? []).find((k) => k.binding === 'TENANTS');
  if (!tenants) errors.push('no TENANTS KV namespace binding: `npx wrangler kv namespace create TENANTS` and add it under [[kv_namespaces]]');
  else if (!local && (!tenants.id || PLACEHOLDER_KV_ID.test(tenants.id))) errors.push(`the TENANTS KV namespace id is the placeholder "${tenants.id ?? ''}": \`npx wrangler kv namespace create TENANTS\` and put the id it prints in [[kv_namespaces]]`);

  const routed = (w.routes?.length ?? 0) > 0 || w.route !== undefined;
  if (!local && w.workers_dev !== false) {
    warnings.push(`workers_dev is ${w.workers_dev === undefined ? 'not set (on by default' + (routed ? '' : ', and no routes') + ')' : 'true'}: the router, /admin and /dashboard included, answers on <name>.<account>.workers.dev too, guarded only by ADMIN_TOKEN. Serve it on a custom domain and set workers_dev = false (docs/deploy.md, "Routes")`);
  }
  if (!local && !routed) warnings.push('no routes or custom domain: clients can reach the router only on workers.dev (docs/deploy.md, "Routes")');

  return { target, errors, warnings, secrets: config ? secretsOf(config) : { required: ['ADMIN_TOKEN'], optional: ['METRICS_TOKEN', 'TENANT_KEYS'] }, configBytes };
}

/**
 * Strings only the test entry's fault hooks carry (test/fixtures/router-entry): the admin routes,
 * the coordinator's fault RPC and its fields, the header standing in for request.cf. None may be
 * in a production bundle (deploy:check scans wrangler's dry-run output; test/node/config/bundle-hooks).
 */
export const TEST_ONLY_MARKERS = ['test-fault', 'test-leases', 'testFault', 'testHooks', 'x-prefix-router-test-cf', 'dropReleases', 'outageMs'] as const;

/** The test-only markers found in a bundle's code. */
export function testOnlyMarkersIn(code: string): string[] {
  return TEST_ONLY_MARKERS.filter((m) => code.includes(m));
}

/** Secret names the Worker reads for this configuration (src/env.d.ts, http/cache-salt.ts, src/origin). */
export function secretsOf(config: RouterConfig): { required: string[]; optional: string[] } {
  const required = new Set<string>(['ADMIN_TOKEN']);
  if (config.pools.some((p) => p.cacheSalt === 'tenant')) required.add('CACHE_SALT_KEY');
  for (const p of config.pools) {
    for (const ref of [...p.allowedAuthRefs, ...p.replicas.map((r) => r.auth)]) {
      const i = ref.indexOf(':');
      if (i > 0) required.add(ref.slice(i + 1));
    }
  }
  return { required: [...required], optional: ['METRICS_TOKEN', 'TENANT_KEYS'] };
}

function safeJson(s: string): unknown {
  try {
    return JSON.parse(s);
  } catch {
    return undefined;
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
