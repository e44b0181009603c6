// Test and benchmark harness (Node side): bundles src/index.ts with esbuild once per process, runs
// it under Miniflare on a real 127.0.0.1 port with test secrets and tenants, and starts mock vLLM
// replicas. I/O: the workerd process Miniflare spawns, loopback sockets.

import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Miniflare, NoOpLog } from 'miniflare';

import type { RouterConfigInput } from '../../src/config.js';
import type { TenantLimits } from '../../src/quota/limits.js';
import { tenantKeysSecret } from '../../scripts/lib/dev-credentials.js';
import { bundleWorker } from '../../scripts/lib/worker-bundle.js';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../tools/mock-engine/index.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

// The runtime of `npm start` and of production: wrangler.toml's compatibility date and flags, read
// from the file (not copied), so start, e2e, faults and benchmarks run one runtime.
const WRANGLER_TOML = readFileSync(join(ROOT, 'wrangler.toml'), 'utf8');
function tomlTopLevel(name: string): string {
  const m = new RegExp(`^${name}\\s*=\\s*(.+)$`, 'm').exec(WRANGLER_TOML);
  if (!m) throw new Error(`wrangler.toml has no top-level ${name}`);
  return m[1]!.replace(/\s+#.*$/, '').trim();
}
/** The router's Durable Object bindings (wrangler.toml's), as Miniflare takes them. */
export const ROUTER_DURABLE_OBJECTS = {
  POOL_COORDINATOR: { className: 'PoolCoordinator', useSQLite: true },
  TENANT_METER: { className: 'TenantMeter', useSQLite: true },
  USAGE_REGISTRY: { className: 'UsageRegistry', useSQLite: true },
  ROUTER_GUARD: { className: 'RouterGuard', useSQLite: true },
} as const;

export const COMPATIBILITY_DATE: string = JSON.parse(tomlTopLevel('compatibility_date')) as string;
export const COMPATIBILITY_FLAGS: string[] = JSON.parse(tomlTopLevel('compatibility_flags')) as string[];

// Fresh per process, so a test that greps the logs for them cannot pass by accident.
const rnd = () => randomBytes(9).toString('base64url');
export const TEST_ADMIN_TOKEN = `e2e-admin-${rnd()}`;
export const TEST_ORIGIN_API_KEY = `e2e-origin-${rnd()}`;
/** The key of the tenants' vLLM cache_salt (http/cache-salt.ts). */
export const TEST_CACHE_SALT_KEY = `e2e-cache-salt-${rnd()}-${rnd()}`;

export interface TestTenant {
  key: string;
  tenant: string;
  keyId: string;
  pools: string[];
  allowPoolHeader?: boolean;
  maxInFlight?: number;
  /** Requests/tokens per minute (src/quota/limits.ts). */
  limits?: TenantLimits;
}

/** `acme` may use every pool and choose one with x-pool; `globex` only `chat`. */
export const TEST_TENANTS: readonly TestTenant[] = [
  { key: `sk-e2e-acme-${rnd()}`, tenant: 'acme', keyId: 'e2e-acme', pools: ['*'], allowPoolHeader: true },
  { key: `sk-e2e-globex-${rnd()}`, tenant: 'globex', keyId: 'e2e-globex', pools: ['chat'], allowPoolHeader: false },
];
export const TEST_KEY = TEST_TENANTS[0]!.key;

// ---- bundle -----------------------------------------------------------------------------------

const bundles = new Map<string, Promise<string>>();
/**
 * The Worker entry the helpers bundle: src/index.ts, or PREFIX_ROUTER_ENTRY (another checkout's,
 * e.g. to show that a test fails on an older commit). It must export every Durable Object class
 * startRouter binds.
 */
const DEFAULT_ENTRY = process.env.PREFIX_ROUTER_ENTRY ? resolve(process.env.PREFIX_ROUTER_ENTRY) : join(ROOT, 'src/index.ts');
/** The test entry: src/index.ts plus the fault hooks (test/fixtures/router-entry), for `hooks: true`. */
export const HOOKS_ENTRY = join(ROOT, 'test/fixtures/router-entry/index.ts');

/**
 * Bundle the Worker entry (default src/index.ts) once per process; resolves to the ES module's
 * code. It is handed to Miniflare in memory, so nothing is left in a temp dir when a test
 * worker is killed.
 */
export function bundleRouter(entry = DEFAULT_ENTRY): Promise<string> {
  let p = bundles.get(entry);
  if (!p) {
    p = bundleWorker(entry);
    bundles.set(entry, p);
  }
  return p;
}

// ---- router -----------------------------------------------------------------------------------

export interface StartRouterOptions {
  /** ROUTER_CONFIG: an object (as wrangler.toml's table arrives) or a JSON string. */
  config: RouterConfigInput | string;
  /** Extra or overriding secrets; ADMIN_TOKEN and ORIGIN_API_KEY default to the TEST_ ones. */
  secrets?: Record<string, string>;
  /** Loopback port; 0 or unset picks a free one. */
  port?: number;
  /** Tenants for TENANT_KEYS (default TEST_TENANTS); ignored when secrets.TENANT_KEYS is given. */
  tenants?: readonly TestTenant[];
  /** Also print the worker's console output on stderr (debugging). */
  echoLogs?: boolean;
  /**
   * Keep none of the worker's console output (`logs` stays empty). For benchmarks: the process that
   * measures should not also collect the router's trace lines (about 0.15 ms of TTFT p50 at 16
   * clients in bench:proxy). The Worker still writes them.
   */
  discardLogs?: boolean;
  /** Worker entry to bundle instead of src/index.ts (profiling a variant). */
  entry?: string;
  /**
   * Bundle the test entry (HOOKS_ENTRY) instead of src/index.ts: the fault hooks (admin test-fault
   * and test-leases, the x-prefix-router-test-cf header) the production bundle does not have.
   */
  hooks?: boolean;
  /** Open the V8 inspector on this loopback port (CPU profiles of the Worker). */
  inspectorPort?: number;
  /** More Durable Object bindings (binding → class exported by `entry`), for benchmark entries. */
  extraDurableObjects?: Record<string, string>;
}

export interface RouterHandle {
  /** `http://127.0.0.1:<port>` (no trailing slash). */
  url: string;
  port: number;
  mf: Miniflare;
  /** Every console line the worker and the Durable Object wrote, in order. */
  logs: string[];
  /** `logs` as one text (for failure messages and leak checks). */
  output(): string;
  /** The secret bindings in effect (for leak checks). */
  secrets: Record<string, string>;
  tenants: readonly TestTenant[];
  /** fetch() with the admin token. */
  adminFetch(path: string, init?: RequestInit): Promise<Response>;
  /** `logs` lines that parse as JSON objects with `type: "request"`. */
  traceLines(): Record<string, unknown>[];
  close(): Promise<void>;
}

export async function startRouter(opts: StartRouterOptions): Promise<RouterHandle> {
  if (opts.hooks && opts.entry) throw new Error('startRouter: `hooks` and `entry` both name the entry');
  const code = await bundleRouter(opts.hooks ? HOOKS_ENTRY : opts.entry);
  const tenants = opts.tenants ?? TEST_TENANTS;
  const secrets: Record<string, string> = {
    ADMIN_TOKEN: TEST_ADMIN_TOKEN,
    ORIGIN_API_KEY: TEST_ORIGIN_API_KEY,
    CACHE_SALT_KEY: TEST_CACHE_SALT_KEY,
    TENANT_KEYS: tenantKeysSecret(tenants),
    ...opts.secrets,
  };
  const logs: string[] = [];
  const mf = new Miniflare({
    modules: [{ type: 'ESModule', path: 'prefix-router.js', contents: code }],
    compatibilityDate: COMPATIBILITY_DATE,
    compatibilityFlags: COMPATIBILITY_FLAGS,
    durableObjects: {
      ...ROUTER_DURABLE_OBJECTS,
      ...Object.fromEntries(Object.entries(opts.extraDurableObjects ?? {}).map(([binding, className]) => [binding, { className, useSQLite: true }])),
    },
    kvNamespaces: ['TENANTS'],
    bindings: { ROUTER_CONFIG: markedLocal(opts.config) as never, ...secrets },
    host: '127.0.0.1',
    port: opts.port ?? 0,
    ...(opts.inspectorPort !== undefined ? { inspectorPort: opts.inspectorPort } : {}),
    log: new NoOpLog(),
    handleStructuredLogs: opts.discardLogs ? () => {} : ({ message }: { message: string }) => {
      for (const line of message.split('\n')) {
        if (line === '') continue;
        logs.push(line);
        if (opts.echoLogs) process.stderr.write(`[router] ${line}\n`);
      }
    },
  });
  let url: URL;
  try {
    url = await mf.ready;
  } catch (e) {
    await mf.dispose().catch(() => {});
    throw e;
  }
  const base = `http://127.0.0.1:${url.port}`;
  let closing: Promise<void> | undefined;
  return {
    url: base,
    port: Number(url.port),
    mf,
    logs,
    output: () => logs.join('\n'),
    secrets,
    tenants,
    adminFetch(path, init = {}) {
      const headers = new Headers(init.headers);
      headers.set('authorization', `Bearer ${secrets.ADMIN_TOKEN}`);
      if (init.body !== undefined && !headers.has('content-type')) headers.set('content-type', 'application/json');
      return fetch(base + path, { ...init, headers });
    },
    traceLines() {
      const out: Record<string, unknown>[] = [];
      for (const l of logs) {
        if (!l.startsWith('{')) continue;
        try {
          const v = JSON.parse(l) as unknown;
          if (v && typeof v === 'object' && (v as { type?: unknown }).type === 'request') out.push(v as Record<string, unknown>);
        } catch {
          // not a JSON line
        }
      }
      return out;
    },
    close() {
      closing ??= mf.dispose();
      return closing;
    },
  };
}

// ---- mocks and config -------------------------------------------------------------------------

/** Start `n` mock replicas `r1..rn` on free loopback ports, guarded by TEST_ORIGIN_API_KEY. */
export async function startMocks(n: number, opts: MockVllmOptions = {}): Promise<MockVllm[]> {
  const out: MockVllm[] = [];
  try {
    for (let i = 1; i <= n; i++) out.push(await startMockVllm({ apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], ...opts, id: opts.id ? `${opts.id}${i}` : `r${i}`, port: 0 }));
  } catch (e) {
    await Promise.allSettled(out.map((m) => m.close()));
    throw e;
  }
  return out;
}

export interface RouterConfigOptions {
  replicas: readonly { id: string; url: string }[];
  pool?: string;
  models?: string[];
  strategy?: string;
  fallback?: string;
  keys?: string[];
  /** Pool fields (health, fall/rise, passive failures...) over the test defaults. */
  poolOverrides?: Record<string, unknown>;
  /** Top-level fields (timeouts, retries...) over the test defaults. */
  overrides?: Record<string, unknown>;
  /** More pools, added as given. */
  extraPools?: Record<string, unknown>[];
}

/** Test defaults: health every 500 ms, fall/rise 2, stall window 1.5 s, passive exclusion 1 s, short timeouts. */
export const TEST_TIMINGS = {
  healthIntervalMs: 500,
  healthTimeoutMs: 300,
  clientStallMs: 1_500,
  firstByteTimeoutMs: 5_000,
  idleTimeoutMs: 5_000,
  maxStreamMs: 60_000,
  failTimeoutMs: 1_000,
} as const;

export function routerConfig(o: RouterConfigOptions): RouterConfigInput {
  return {
    maxRetries: 2,
    firstByteTimeoutMs: TEST_TIMINGS.firstByteTimeoutMs,
    idleTimeoutMs: TEST_TIMINGS.idleTimeoutMs,
    clientStallMs: TEST_TIMINGS.clientStallMs,
    maxStreamMs: TEST_TIMINGS.maxStreamMs,
    tenantCacheMs: 30_000,
    replicaHeader: true,
    traceLog: true,
    ...o.overrides,
    pools: [
      {
        name: o.pool ?? 'chat',
        models: o.models ?? ['demo-model'],
        strategy: o.strategy ?? 'bounded-hash:1.25',
        fallback: o.fallback ?? 'least-load',
        keys: o.keys ?? ['header:x-session-id', 'tenant'],
        healthIntervalMs: TEST_TIMINGS.healthIntervalMs,
        healthTimeoutMs: TEST_TIMINGS.healthTimeoutMs,
        fall: 2,
        rise: 2,
        // A replica excluded after failing real requests comes back within a second, not ten.
        failTimeoutMs: TEST_TIMINGS.failTimeoutMs,
        ...o.poolOverrides,
        replicas: o.replicas.map((r) => ({ id: r.id, url: r.url, weight: 1, auth: 'bearer:ORIGIN_API_KEY' })),
      },
      ...((o.extraPools ?? []) as RouterConfigInput['pools']),
    ],
  } as RouterConfigInput;
}

/** Poll `check` until it returns without throwing; bounded in time and attempts. */
export async function eventually<T>(check: () => T | Promise<T>, opts: { timeoutMs?: number; intervalMs?: number } = {}): Promise<T> {
  // 15 s by default: a bound for a hang, not a speed check (a loaded 2-core machine is slow).
  const deadline = Date.now() + (opts.timeoutMs ?? 15_000);
  const interval = opts.intervalMs ?? 50;
  for (let attempt = 0; ; attempt++) {
    try {
      return await check();
    } catch (err) {
      if (Date.now() > deadline || attempt > 10_000) throw err;
      await new Promise((r) => setTimeout(r, interval));
    }
  }
}

/**
 * The router under test runs on loopback with mock replicas: its configuration says `local` (the
 * coordinators refuse loopback replicas added through the admin API otherwise), unless the test
 * set `local` itself.
 */
function markedLocal(config: RouterConfigInput | string): RouterConfigInput | string {
  if (typeof config === 'string') {
    const parsed = JSON.parse(config) as Record<string, unknown>;
    return 'local' in parsed ? config : JSON.stringify({ ...parsed, local: true });
  }
  return 'local' in config ? config : { ...config, local: true };
}
