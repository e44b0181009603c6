// `npm start`: four mock vLLM replicas (r1..r4 on 127.0.0.1:9001-9004) and the router under
// Miniflare on 127.0.0.1:8787, with the demo configuration, bindings and compatibility settings of
// wrangler.toml, the demo secrets, and Durable Object and KV state persisted in .wrangler/state
// (where `wrangler dev` and `wrangler kv key put --local` keep theirs). Edits under src/ reload
// the Worker in place. Not `wrangler dev`: its DevTools proxy sends every inspector message of
// the Worker to wrangler's Node process as a new loopback request, one per chunk of every
// streamed upstream response, and under a few concurrent streams that leaks thousands of sockets
// a second until it dies (docs/benchmarks.md, "npm start soak").
// Env: PORT (8787), MOCK_PORT (9000: the mocks listen on MOCK_PORT+1..+4), INSPECTOR_PORT (off;
// set it to attach Chrome DevTools), STATE_DIR (.wrangler/state). Ctrl-C, or a SIGTERM to npm
// alone (a supervisor's stop: the shell npm runs this under dies without passing it on, which this
// process notices within a second), stops everything, workerd included.
// I/O: loopback listeners, the workerd child process, STATE_DIR, /proc (the parent watch).
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import type { BuildContext } from 'esbuild';
import { Log, LogLevel, Miniflare, type MiniflareOptions } from 'miniflare';
import { unstable_getMiniflareWorkerOptions } from 'wrangler';

import { ConfigError, parseConfig } from '../src/config.js';
import { startMockVllm, type MockVllm } from '../tools/mock-engine/index.js';
import { DEV_ADMIN_TOKEN, DEV_CACHE_SALT_KEY, DEV_ORIGIN_API_KEY, DEV_TENANTS, tenantKeysSecret } from './lib/dev-credentials.js';
import { workerdPids } from './lib/proc-stats.js';
import { bundleWorker, watchWorker } from './lib/worker-bundle.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const PORT = intEnv('PORT', 8787);
const MOCK_PORT = intEnv('MOCK_PORT', 9000);
const INSPECTOR_PORT = process.env.INSPECTOR_PORT ? intEnv('INSPECTOR_PORT', 9229) : undefined;
/** wrangler's local state directory by default: the same Durable Object and KV data as `wrangler dev`. */
const STATE_DIR = resolve(ROOT, process.env.STATE_DIR || '.wrangler/state');
const PERSIST_ROOT = join(STATE_DIR, 'v3');

const mocks: MockVllm[] = [];
let mf: Miniflare | undefined;
let watcher: BuildContext | undefined;
let stopping = false;

function intEnv(name: string, dflt: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0 || n > 65_535) throw new Error(`${name}=${raw} is not a port number`);
  return n;
}

/**
 * Miniflare options from wrangler.toml (vars, Durable Objects, KV, compatibility date and flags)
 * plus the demo secrets. With MOCK_PORT moved, the demo replicas' URLs move with it.
 */
function routerOptions(code: string): MiniflareOptions {
  const { workerOptions: w } = unstable_getMiniflareWorkerOptions(join(ROOT, 'wrangler.toml'));
  const bindings: Record<string, unknown> = { ...(w.bindings ?? {}) };
  if (MOCK_PORT !== 9000) {
    // The configuration the Worker will read (the var, else the bundled router.config.json:
    // src/config.ts loadConfig), moved; passed as the var, which wins over the file.
    const source = bindings.ROUTER_CONFIG ?? bundledConfig();
    if (source !== null && source !== undefined) {
      const moved = JSON.stringify(source).replace(/(http:\/\/127\.0\.0\.1:)900([1-4])\b/g, (_, host: string, n: string) => `${host}${MOCK_PORT + Number(n)}`);
      bindings.ROUTER_CONFIG = JSON.parse(moved) as unknown;
    }
  }
  return {
    name: 'prefix-router', // names the Durable Object state directory as wrangler dev does
    modules: [{ type: 'ESModule', path: 'index.js', contents: code }],
    compatibilityDate: w.compatibilityDate,
    compatibilityFlags: w.compatibilityFlags,
    durableObjects: w.durableObjects,
    kvNamespaces: w.kvNamespaces,
    bindings: {
      ...bindings,
      ADMIN_TOKEN: DEV_ADMIN_TOKEN,
      ORIGIN_API_KEY: DEV_ORIGIN_API_KEY,
      CACHE_SALT_KEY: DEV_CACHE_SALT_KEY,
      TENANT_KEYS: tenantKeysSecret(DEV_TENANTS),
    } as MiniflareOptions['bindings'],
    defaultPersistRoot: PERSIST_ROOT,
    host: '127.0.0.1',
    port: PORT,
    ...(INSPECTOR_PORT !== undefined ? { inspectorPort: INSPECTOR_PORT } : {}),
    log: new Log(LogLevel.WARN),
    // The Worker's console lines (the per-request trace log), as wrangler dev printed them.
    handleStructuredLogs: ({ level, message }: { level: string; message: string }) => {
      (level === 'error' || level === 'warn' ? process.stderr : process.stdout).write(message.endsWith('\n') ? message : `${message}\n`);
    },
    cf: false, // no fetch of Cloudflare's request.cf data: a placeholder, offline
  } as MiniflareOptions;
}

/**
 * The configuration as the Worker will parse it, for a local run (loopback replicas pass; what the
 * edge cannot reach does not: src/config.ts). Otherwise the Worker would answer every request
 * 500 misconfigured; this says why before anything starts.
 */
function checkConfig(): void {
  const fromVar = (routerOptions('').bindings as Record<string, unknown>).ROUTER_CONFIG;
  const [value, where] = fromVar !== undefined ? [fromVar, "wrangler.toml's"] : [bundledConfig(), "router.config.json's"];
  try {
    if (value === null || value === undefined) throw new ConfigError('no configuration: set ROUTER_CONFIG in wrangler.toml or put it in router.config.json (docs/deploy.md)');
    parseConfig(value, { target: 'local' });
  } catch (e) {
    if (e instanceof ConfigError) throw new Error(`${where} ${e.message}`);
    throw e;
  }
}

/** router.config.json as the Worker bundles it (null: none; the ROUTER_CONFIG var is the config). */
function bundledConfig(): unknown {
  return JSON.parse(readFileSync(join(ROOT, 'router.config.json'), 'utf8')) as unknown;
}

async function main(): Promise<void> {
  // wrangler's config reader is called in-process: no telemetry, no request.cf download.
  process.env.WRANGLER_SEND_METRICS = 'false';
  process.env.CLOUDFLARE_CF_FETCH_ENABLED = 'false';
  checkConfig();
  for (let i = 1; i <= 4; i++) {
    // vLLM as the demo's figures need it, two real settings beyond the defaults:
    // --enable-prompt-tokens-details (per-request cached tokens: the demo's hit rates) and
    // VLLM_ENABLE_RESPONSES_API_STORE=1 (previous_response_id: the Responses follow-ups).
    const m = await startMockVllm({ id: `r${i}`, port: MOCK_PORT + i, apiKey: DEV_ORIGIN_API_KEY, models: ['demo-model'], profile: 'vllm-cache-report', responsesStore: true });
    mocks.push(m);
    console.log(`mock vLLM ${m.id} on ${m.url} (profile ${m.stats().profile}: --enable-prompt-tokens-details, Responses store on)`);
  }
  const entry = join(ROOT, 'src/index.ts');
  const code = await bundleWorker(entry);
  mf = new Miniflare(routerOptions(code));
  await mf.ready;
  printTryIt();
  // Live reload: each successful rebuild replaces the Worker; persisted state survives it.
  let first = true;
  watcher = await watchWorker(
    entry,
    async (next) => {
      if (first) return void (first = false); // the watcher's initial build is the code already running
      const t0 = Date.now();
      try {
        await mf?.setOptions(routerOptions(next));
        console.log(`reloaded the Worker (${Date.now() - t0} ms)`);
      } catch (e) {
        console.error(`reload failed, the previous Worker keeps running: ${(e as Error).message}`);
      }
    },
    (messages) => console.error(`build failed, the previous Worker keeps running:\n  ${messages.join('\n  ')}`),
  );
}

function printTryIt(): void {
  const base = `http://127.0.0.1:${PORT}`;
  console.log(`
prefix-router is up on ${base} (tenant key sk-demo-acme, admin token ${DEV_ADMIN_TOKEN})
The Worker runs under Miniflare; edits under src/ reload it${INSPECTOR_PORT !== undefined ? `; DevTools on 127.0.0.1:${INSPECTOR_PORT}` : ''}.
Pools and replicas persist in ${STATE_DIR.startsWith(ROOT) ? STATE_DIR.slice(ROOT.length + 1) : STATE_DIR} (admin API changes survive a restart); delete it to
start again from wrangler.toml.

Try it:
  curl -sN ${base}/v1/chat/completions \\
    -H 'authorization: Bearer sk-demo-acme' -H 'content-type: application/json' -H 'x-session-id: demo-1' \\
    -d '{"model":"demo-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

  // openai SDK (npm i openai)
  import OpenAI from 'openai';
  const client = new OpenAI({ baseURL: '${base}/v1', apiKey: 'sk-demo-acme' });
  const r = await client.chat.completions.create(
    { model: 'demo-model', messages: [{ role: 'user', content: 'Hello' }] },
    { headers: { 'x-session-id': 'demo-1' } });

  curl -s ${base}/v1/embeddings -H 'authorization: Bearer sk-demo-acme' -H 'content-type: application/json' \\
    -d '{"model":"demo-model","input":["a text to embed"],"encoding_format":"float"}'   # also /v1/rerank, /v1/score, /tokenize, /detokenize

  # Rate limits: sk-demo-globex may send 120 requests/min and 20,000 tokens/min. The headers on
  # every answer, then a burst of 130: about 120 × 200, the rest 429 with retry-after.
  curl -si ${base}/v1/chat/completions -H 'authorization: Bearer sk-demo-globex' -H 'content-type: application/json' \\
    -d '{"model":"demo-model","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}' | grep -iE '^(HTTP|x-ratelimit|retry-after)'
  for i in $(seq 130); do curl -s -o /dev/null -w '%{http_code}\\n' ${base}/v1/chat/completions \\
    -H 'authorization: Bearer sk-demo-globex' -H 'content-type: application/json' \\
    -d '{"model":"demo-model","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}'; done | sort | uniq -c

  npm run demo:traffic                   # round-robin vs bounded-hash, per-replica hit rate and TTFT
  curl -s ${base}/admin/pools/chat -H 'authorization: Bearer ${DEV_ADMIN_TOKEN}'
Ctrl-C stops everything.
`);
}

/** SIGKILL to any workerd this process started that is still there (the last resort of a stop). */
function killOwnWorkerd(): void {
  for (const pid of workerdPids()) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}

async function shutdown(code = 0): Promise<void> {
  if (stopping) return;
  stopping = true;
  const hard = setTimeout(() => {
    killOwnWorkerd();
    process.exit(code);
  }, 5_000);
  hard.unref();
  await Promise.allSettled([watcher?.dispose(), mf?.dispose(), ...mocks.map((m) => m.close())]);
  killOwnWorkerd();
  process.exit(code);
}

/**
 * Our launchers (tsx, the shell npm runs scripts in, npm) up to three levels: when one of them is
 * gone we have been orphaned by a stop that did not reach us, so we stop too.
 */
function launchers(): number[] {
  const out: number[] = [];
  for (let pid = process.ppid; out.length < 3 && pid > 1; ) {
    out.push(pid);
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      pid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    } catch {
      break; // not Linux: watch the parent alone
    }
  }
  return out;
}

function watchLaunchers(): void {
  const watched = launchers();
  const alive = (pid: number) => {
    try {
      process.kill(pid, 0);
      return true;
    } catch (e) {
      return (e as NodeJS.ErrnoException).code === 'EPERM';
    }
  };
  setInterval(() => {
    const gone = watched.find((p) => !alive(p));
    if (gone !== undefined) {
      console.error(`npm start: launcher process ${gone} is gone; stopping`);
      void shutdown(0);
    }
  }, 1_000).unref();
}

watchLaunchers();
process.on('SIGINT', () => void shutdown(0));
process.on('SIGTERM', () => void shutdown(0));
process.on('SIGHUP', () => void shutdown(0));
process.on('exit', killOwnWorkerd);
main().catch((e: unknown) => {
  const err = e as NodeJS.ErrnoException;
  const hint = err.code === 'EADDRINUSE' ? ` (another npm start? set PORT / MOCK_PORT to move it)` : '';
  console.error(`npm start failed: ${err.message}${hint}`);
  void shutdown(1);
});
