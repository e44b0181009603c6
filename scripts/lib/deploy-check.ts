// What `npm run deploy:check` decides about a wrangler configuration, apart from bundling it: the
// router configuration (the ROUTER_CONFIG var, else the bundled router.config.json) validated for
// where it will run (src/config.ts, target `edge` unless it says `local = true`), the Workers
// limits a configuration meets before any request (a variable's 5 KB: ROUTER_CONFIG and
// TENANT_KEYS), tenant records meant for KV, the KV namespace, how the Worker is exposed, and the
// secrets it will need. Pure: no I/O.

import { ConfigError, parseConfig, type ConfigSource, type RouterConfig } from '../../src/config.js';
import { keyRecordSchema, tenantRecordSchema } from '../../src/http/tenant-records.js';

/** The parts of wrangler's resolved configuration (`unstable_readConfig`) this check reads. */
export interface WranglerView {
  vars: Record<string, unknown>;
  workers_dev?: boolean | undefined;
  routes?: unknown[] | undefined;
  route?: unknown;
  kv_namespaces?: { binding: string; id?: string }[];
}

export interface DeployCheckInputs {
  /** CI before `wrangler deploy`: a `local` configuration is an error, not a note. */
  strict?: boolean;
  /** router.config.json's parsed content (undefined: no such file; null: the file says none). */
  bundled?: unknown;
  /** The TENANT_KEYS secret's JSON text about to be `wrangler secret put` (measured like a var). */
  tenantKeys?: string;
  /** A `wrangler kv bulk put` file's parsed content for the TENANTS namespace (validated). */
  tenantsKv?: unknown;
}

export interface DeployCheck {
  /** `edge`: validated as deployable; `local`: `ROUTER_CONFIG.local = true`, validated for a local run only. */
  target: 'edge' | 'local';
  errors: string[];
  warnings: string[];
  /** Secrets the Worker reads: required ones, then optional ones. */
  secrets: { required: string[]; optional: string[] };
  /** Where the configuration checked came from. */
  source: ConfigSource;
  /** Its size as JSON (capped at 5 KB for the var; the bundled module only by the Worker's size). */
  configBytes: number;
  /** Pools and replicas configured (the admin API may add more at run time). */
  pools: number;
  replicas: number;
  /** Tenants and keys found in TENANT_KEYS and the TENANTS KV file, when given. */
  tenants: { secretKeys: number; kvTenants: number; kvKeys: number };
}

/**
 * Each environment variable holds at most 5 KB (developers.cloudflare.com/workers/platform/limits/,
 * "Environment variables"; cloudflare-docs src/content/docs/workers/platform/limits.mdx). A
 * `[vars]` table is uploaded as its JSON text, so that is what is measured.
 */
export const VAR_LIMIT_BYTES = 5 * 1024;
const PLACEHOLDER_KV_ID = /^0+$/;

/**
 * Cloudflare's default Proxy Read Timeout: a proxied origin silent this long gets the client a 524
 * (developers.cloudflare.com/support/troubleshooting/http-status-codes/cloudflare-5xx-errors/error-524/).
 */
export const PROXY_READ_TIMEOUT_MS = 120_000;

export function checkDeployConfig(w: WranglerView, opts: DeployCheckInputs = {}): DeployCheck {
  const errors: string[] = [];
  const warnings: string[] = [];
  const fromVar = w.vars.ROUTER_CONFIG;
  const hasBundled = opts.bundled !== undefined && opts.bundled !== null;
  // The Worker reads the var when it is set and the bundled module only without it (src/config.ts loadConfig).
  const source: ConfigSource = fromVar === undefined && hasBundled ? 'router.config.json' : 'ROUTER_CONFIG';
  const raw = source === 'ROUTER_CONFIG' ? fromVar : opts.bundled;
  if (fromVar !== undefined && hasBundled) warnings.push('both ROUTER_CONFIG ([vars]) and router.config.json are set: the Worker uses ROUTER_CONFIG and ignores the file. Remove the [vars.ROUTER_CONFIG] tables to use the file (docs/deploy.md, "Configuration")');
  const rawObject = typeof raw === 'string' ? safeJson(raw) : raw;
  const local = isRecord(rawObject) && rawObject.local === true;
  const target = local ? 'local' : 'edge';
  const configText = typeof raw === 'string' ? raw : JSON.stringify(raw ?? null);
  const configBytes = byteLength(configText);

  let config: RouterConfig | undefined;
  if (raw === undefined) errors.push('no configuration: neither the ROUTER_CONFIG var nor a router.config.json next to the wrangler file (docs/deploy.md, "Configuration")');
  else {
    try {
      config = parseConfig(raw, { target, source });
    } catch (e) {
      if (!(e instanceof ConfigError)) throw e;
      errors.push(e.message);
    }
  }
  if (local && opts.strict) errors.push(`${source}.local is true: this configuration is for a local run (loopback replicas) and --strict refuses it. Replace the pools with your replicas and remove \`local\` (docs/deploy.md)`);
  if (source === 'ROUTER_CONFIG') {
    if (configBytes > VAR_LIMIT_BYTES) {
      errors.push(`ROUTER_CONFIG is ${configBytes} bytes as JSON; a Workers variable holds at most ${VAR_LIMIT_BYTES} (developers.cloudflare.com/workers/platform/limits/#environment-variables). Move it to router.config.json next to wrangler.toml (bundled with the Worker, no such cap) and remove the [vars.ROUTER_CONFIG] tables (docs/deploy.md, "Configuration")`);
    } else if (configBytes > VAR_LIMIT_BYTES * 0.8) {
      warnings.push(`ROUTER_CONFIG is ${configBytes} of ${VAR_LIMIT_BYTES} bytes a Workers variable may hold: a few more replicas will not fit; router.config.json has no such cap (docs/deploy.md, "Configuration")`);
    }
  } else if (configBytes > BUNDLED_CONFIG_WARN_BYTES) {
    warnings.push(`router.config.json is ${configBytes} bytes: it is part of the Worker's bundle (at most 10 MB compressed on the Paid plan, developers.cloudflare.com/workers/platform/limits/#worker-size) and parsed on each isolate's first request; Cloudflare suggests KV or R2 for configuration this large (same page)`);
  }

  const tenantCounts = { secretKeys: 0, kvTenants: 0, kvKeys: 0 };
  const secretText = opts.tenantKeys ?? (typeof w.vars.TENANT_KEYS === 'string' ? w.vars.TENANT_KEYS : w.vars.TENANT_KEYS !== undefined ? JSON.stringify(w.vars.TENANT_KEYS) : undefined);
  if (secretText !== undefined) {
    const bytes = byteLength(secretText);
    const parsed = safeJson(secretText);
    tenantCounts.secretKeys = isRecord(parsed) && isRecord(parsed.keys) ? Object.keys(parsed.keys).length : 0;
    if (bytes > VAR_LIMIT_BYTES) errors.push(`TENANT_KEYS is ${bytes} bytes (${tenantCounts.secretKeys} keys); a secret, like a variable, holds at most ${VAR_LIMIT_BYTES} (developers.cloudflare.com/workers/platform/limits/#environment-variables). Keep tenants and keys in the TENANTS KV namespace: the admin API (POST /admin/tenants/:id/keys) or \`wrangler kv bulk put --binding TENANTS <file>\` (docs/operations.md, "Tenants")`);
    else if (bytes > VAR_LIMIT_BYTES * 0.8) warnings.push(`TENANT_KEYS is ${bytes} of ${VAR_LIMIT_BYTES} bytes: a few more keys will not fit; use the TENANTS KV namespace`);
  }
  if (opts.tenantsKv !== undefined) checkTenantsKv(opts.tenantsKv, config, errors, tenantCounts);

  if (config && !local && config.nonStreamTimeoutMs >= PROXY_READ_TIMEOUT_MS) {
    warnings.push(`nonStreamTimeoutMs is ${config.nonStreamTimeoutMs} ms: through a Cloudflare Tunnel or Access hostname, Cloudflare answers 524 after ${PROXY_READ_TIMEOUT_MS / 1000} s without response headers (Proxy Read Timeout), and vLLM sends a non-streaming answer's headers only when it is done. Keep it under ${PROXY_READ_TIMEOUT_MS / 1000} s unless your origins are not proxied by Cloudflare or your zone's Proxy Read Timeout was raised (Enterprise); ask clients to stream long generations (docs/deploy.md)`);
  }

  const tenants = (w.kv_namespaces ?? []).find((k) => k.binding === 'TENANTS');
  if (!tenants) errors.push('no TENANTS KV namespace binding: `npx wrangler kv namespace create TENANTS` and add it under [[kv_namespaces]]');
  else if (!local && (!tenants.id || PLACEHOLDER_KV_ID.test(tenants.id))) errors.push(`the TENANTS KV namespace id is the placeholder "${tenants.id ?? ''}": \`npx wrangler kv namespace create TENANTS\` and put the id it prints in [[kv_namespaces]]`);

  const routed = (w.routes?.length ?? 0) > 0 || w.route !== undefined;
  if (!local && w.workers_dev !== false) {
    warnings.push(`workers_dev is ${w.workers_dev === undefined ? 'not set (on by default' + (routed ? '' : ', and no routes') + ')' : 'true'}: the router, /admin and /dashboard included, answers on <name>.<account>.workers.dev too, guarded only by ADMIN_TOKEN. Serve it on a custom domain and set workers_dev = false (docs/deploy.md, "Routes")`);
  }
  if (!local && !routed) warnings.push('no routes or custom domain: clients can reach the router only on workers.dev (docs/deploy.md, "Routes")');

  const replicas = config ? config.pools.reduce((n, p) => n + p.replicas.length, 0) : 0;
  return { target, errors, warnings, secrets: config ? secretsOf(config) : { required: ['ADMIN_TOKEN'], optional: ['METRICS_TOKEN', 'TENANT_KEYS'] }, source, configBytes, pools: config?.pools.length ?? 0, replicas, tenants: tenantCounts };
}

/** Above this a bundled configuration gets a note: it is parsed at every isolate start. */
export const BUNDLED_CONFIG_WARN_BYTES = 2 * 1024 * 1024;

/**
 * A `wrangler kv bulk put` file for TENANTS: `[{ "key": …, "value": "<JSON text>" }]` in the
 * Worker's layout (http/tenants.ts): `key:<sha256 hex>` → key record, `tenant:<id>` → tenant
 * record, `tenantkey:<id>:<keyId>` → the hash. Each record is checked with the Worker's own
 * schemas; a key whose tenant is missing, or a tenant allowed a pool the configuration lacks, is named.
 */
function checkTenantsKv(file: unknown, config: RouterConfig | undefined, errors: string[], counts: { kvTenants: number; kvKeys: number }): void {
  if (!Array.isArray(file)) {
    errors.push('the TENANTS KV file is not a JSON array of { "key", "value" } (the `wrangler kv bulk put` format)');
    return;
  }
  const problems: string[] = [];
  const tenantPools = new Map<string, string[]>();
  const keyTenants: { key: string; tenant: string }[] = [];
  file.forEach((entry: unknown, i) => {
    if (!isRecord(entry) || typeof entry.key !== 'string' || typeof entry.value !== 'string') return void problems.push(`[${i}]: not { "key": string, "value": string }`);
    const value = safeJson(entry.value);
    if (entry.key.startsWith('key:')) {
      if (!/^key:[0-9a-f]{64}$/.test(entry.key)) return void problems.push(`[${i}] ${entry.key}: a key's name is key:<sha256 hex of the API key>`);
      const r = keyRecordSchema.safeParse(value);
      if (!r.success) return void problems.push(`[${i}] ${entry.key}: not a key record (${r.error.issues.map((x) => x.path.join('.') || x.message).join(', ')})`);
      keyTenants.push({ key: entry.key, tenant: r.data.tenant });
      counts.kvKeys++;
    } else if (entry.key.startsWith('tenant:')) {
      const r = tenantRecordSchema.safeParse(value);
      if (!r.success) return void problems.push(`[${i}] ${entry.key}: not a tenant record (${r.error.issues.map((x) => x.path.join('.') || x.message).join(', ')})`);
      if (entry.key !== `tenant:${r.data.id}`) return void problems.push(`[${i}] ${entry.key}: its record's id is "${r.data.id}"`);
      tenantPools.set(r.data.id, r.data.pools);
      counts.kvTenants++;
    } else if (!entry.key.startsWith('tenantkey:')) problems.push(`[${i}] ${entry.key}: not a name the router reads (key:, tenant:, tenantkey:)`);
  });
  for (const k of keyTenants) if (!tenantPools.has(k.tenant)) problems.push(`${k.key}: its tenant "${k.tenant}" has no tenant:${k.tenant} record`);
  if (config) {
    for (const [id, pools] of tenantPools) for (const p of pools) if (p !== '*' && !config.poolByName.has(p)) problems.push(`tenant:${id}: pool "${p}" is not configured`);
  }
  if (problems.length > 0) errors.push(`the TENANTS KV file has ${problems.length} problem(s):\n  ${problems.slice(0, 20).join('\n  ')}${problems.length > 20 ? `\n  … and ${problems.length - 20} more` : ''}`);
}

function byteLength(s: string): number {
  return new TextEncoder().encode(s).length;
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
