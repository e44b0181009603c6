// Run the router under `wrangler dev` (wrangler's own local server; `npm start` runs Miniflare
// directly, see scripts/dev.ts) on free loopback ports with a temp
// --persist-to dir and the configuration passed as `--var ROUTER_CONFIG:<json>`; stop it by
// killing its process group (wrangler and its workerd). Not a test helper: only bench:soak uses it,
// to measure the runtime `npm start` replaced as its baseline; every test suite, the fault suite
// included, runs the Worker as `npm start` does, under Miniflare directly (test/helpers/router.ts).
// I/O: one child process group, a temp dir.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { killGroup } from './process-group.js';
import { freePort } from './free-port.js';


const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');


export interface WranglerDev {
  base: string;
  port: number;
  child: ChildProcess;
  /** Everything wrangler and the Worker printed (stdout and stderr), in arrival order. */
  output(): string;
  /** `{"type":"request",…}` trace lines printed so far, parsed. */
  traceLines(): Record<string, unknown>[];
  close(): Promise<void>;
}

export interface WranglerDevOptions {
  /** `--var NAME:VALUE` pairs (ROUTER_CONFIG as JSON, secrets as plain strings). */
  vars: Record<string, string>;
  /** Bound on the wait for /healthz to answer 200 `{"status":"ok"}`. Default 60 s. */
  readyTimeoutMs?: number;
}

/** Start `wrangler dev` on 127.0.0.1 and resolve once /healthz answers 200 `{"status":"ok"}`. */
export async function startWranglerDev(o: WranglerDevOptions): Promise<WranglerDev> {
  const port = await freePort();
  const inspectorPort = await freePort();
  const persist = mkdtempSync(join(tmpdir(), 'wrangler-dev-state-'));
  const args = ['wrangler', 'dev', '--ip', '127.0.0.1', '--port', String(port), '--inspector-port', String(inspectorPort), '--persist-to', persist, '--log-level', 'log', '--show-interactive-dev-session=false'];
  // `--var NAME:VALUE` splits at the first colon, so a JSON value arrives whole.
  for (const [k, v] of Object.entries(o.vars)) args.push('--var', `${k}:${v}`);
  const child = spawn('npx', args, {
    cwd: ROOT,
    detached: true, // own process group, so close() stops workerd with it
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, WRANGLER_SEND_METRICS: 'false', CLOUDFLARE_CF_FETCH_ENABLED: 'false', CI: 'true', NO_COLOR: '1', FORCE_COLOR: '0' },
  });
  const chunks: string[] = [];
  let partial = '';
  const trace: Record<string, unknown>[] = [];
  const collect = (b: Buffer) => {
    const s = b.toString();
    chunks.push(s);
    if (chunks.length > 4000) chunks.splice(0, 2000);
    partial += s;
    const lines = partial.split('\n');
    partial = lines.pop() ?? '';
    for (const raw of lines) {
      const l = raw.trim();
      if (!l.startsWith('{"type":"request"')) continue;
      try {
        trace.push(JSON.parse(l) as Record<string, unknown>);
      } catch {
        /* a line cut by the terminal: ignore */
      }
    }
  };
  child.stdout!.on('data', collect);
  child.stderr!.on('data', collect);
  const base = `http://127.0.0.1:${port}`;
  const handle: WranglerDev = {
    base,
    port,
    child,
    output: () => chunks.join(''),
    traceLines: () => trace,
    async close() {
      await killGroup(child);
      rmSync(persist, { recursive: true, force: true });
    },
  };
  const deadline = Date.now() + (o.readyTimeoutMs ?? 60_000);
  for (;;) {
    if (child.exitCode !== null) {
      await handle.close();
      throw new Error(`wrangler dev exited with ${child.exitCode}:\n${handle.output().slice(-3000)}`);
    }
    try {
      const r = await fetch(`${base}/healthz`, { signal: AbortSignal.timeout(1_000) });
      if (r.status === 200 && ((await r.json()) as { status?: unknown }).status === 'ok') return handle;
      await r.body?.cancel().catch(() => {});
    } catch {
      /* not up yet */
    }
    if (Date.now() > deadline) {
      await handle.close();
      throw new Error(`wrangler dev did not answer /healthz within ${o.readyTimeoutMs ?? 60_000} ms:\n${handle.output().slice(-3000)}`);
    }
    await new Promise((r) => setTimeout(r, 300));
  }
}
