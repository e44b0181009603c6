// `npm run bench:soak`: runs `npm start` as a user does (its own process group, PORT and
// MOCK_PORT moved to free ports) and holds 64 concurrent long streaming chat requests (1,500
// tokens each, every one replaced as it ends) through it for a minute. Measures every process of
// the group (npm, tsx, the Node host, workerd) after a warm-up and at the end: open descriptors,
// sockets, sockets in CLOSE-WAIT, RSS. Goals, printed MET or MISSED: descriptors and RSS flat
// (end against the start of the same run), no CLOSE-WAIT pile-up, every stream complete, and a
// SIGTERM to npm alone (a supervisor's stop) empties the whole group. `--wrangler-baseline` also
// runs the same load through `wrangler dev` for at most 20 s (what `npm start` ran before), to
// show the leak it replaced. `--write` puts the figures in docs/benchmarks.md.
// I/O: child process groups, loopback sockets, /proc. Bounded: streams, seconds, a hard time limit.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { unstable_getMiniflareWorkerOptions } from 'wrangler';

import { startWranglerDev } from './lib/wrangler-dev.js';
import { startMockVllm, type MockVllm } from '../tools/mock-engine/index.js';
import { giveUpAfter, runMain, writeBenchSection } from './lib/bench-docs.js';
import { DEV_ADMIN_TOKEN, DEV_CACHE_SALT_KEY, DEV_ORIGIN_API_KEY, DEV_TENANTS, tenantKeysSecret } from './lib/dev-credentials.js';
import { groupAlive, groupPids, killGroup } from './lib/process-group.js';
import { progress } from './lib/progress.js';
import { freePort } from './lib/free-port.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { values: args } = parseArgs({
  options: {
    streams: { type: 'string', default: '64' },
    seconds: { type: 'string', default: '60' },
    warmup: { type: 'string', default: '10' },
    tokens: { type: 'string', default: '1500' },
    'wrangler-baseline': { type: 'boolean', default: false },
    'no-heap-cap': { type: 'boolean', default: false },
    write: { type: 'boolean', default: false },
  },
});
const STREAMS = clamp(Number(args.streams), 1, 256);
const SECONDS = clamp(Number(args.seconds), 5, 600);
const WARMUP_S = clamp(Number(args.warmup), 2, 60);
const TOKENS = clamp(Number(args.tokens), 16, 8_000);
const BASELINE_S = 20;
/** The baseline is stopped early once its group holds this many descriptors. */
const BASELINE_FD_CAP = 8_000;
const SAMPLE_MS = 5_000;
// Flat, as judged: growth over the measured minute within these bounds (the start is taken after
// the warm-up, with all streams open, so connection pools and JIT are already in it).
const FD_SLACK = (start: number) => Math.max(16, Math.ceil(start * 0.1));
const RSS_SLACK_MB = (start: number) => Math.max(24, start * 0.15);
const CLOSE_WAIT_MAX = 16;
// npm start's Node processes run with V8's old space capped, so V8 collects instead of growing
// into free memory (uncapped, the host's RSS rose 100+ MB in one minute of garbage and fell back
// in another): growth left under the cap is retained memory, and a leak ends the run (the group
// dies) instead of hiding among garbage. --no-heap-cap measures it as started by hand.
const HEAP_CAP_MB = 256;

const log = (msg: string) => process.stderr.write(`bench:soak ${msg}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function clamp(n: number, lo: number, hi: number): number {
  if (!Number.isFinite(n)) throw new Error(`not a number: ${n}`);
  return Math.min(hi, Math.max(lo, Math.round(n)));
}

async function portFree(port: number): Promise<boolean> {
  return new Promise((res) => {
    const s = createServer();
    s.once('error', () => res(false));
    s.listen(port, '127.0.0.1', () => s.close(() => res(true)));
  });
}

/** A base port with base+1..base+4 free, for the four mocks. */
async function freeMockBase(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 20_000);
    const ok = await Promise.all([1, 2, 3, 4].map((i) => portFree(base + i)));
    if (ok.every(Boolean)) return base;
  }
  throw new Error('no four free consecutive ports for the mocks');
}

// ---- /proc -------------------------------------------------------------------------------------

interface ProcSample {
  pid: number;
  comm: string;
  fds: number;
  sockets: number;
  closeWait: number;
  rssMb: number;
}

/** Inodes of TCP sockets in CLOSE-WAIT (state 08), IPv4 and IPv6. */
function closeWaitInodes(): Set<string> {
  const out = new Set<string>();
  for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(f, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols[3] === '08' && cols[9]) out.add(cols[9]);
    }
  }
  return out;
}

/** `node scripts/dev.ts` rather than `node`: the command and what it runs. */
function processLabel(pid: number): string {
  const comm = readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
  if (comm.startsWith('npm')) return (argv.join(' ') || comm).split(' ').slice(0, 2).join(' '); // npm retitles itself `npm start`, `npm exec …`
  if (comm !== 'node') return comm;
  if (argv[1]?.endsWith('/tsx')) return 'node tsx (launcher)';
  const script = argv.slice(1).find((a) => /\.(ts|js|cjs|mjs)$/.test(a) && !/preflight|loader/.test(a));
  return script ? `node ${script.replace(`${ROOT}/`, '')}` : comm;
}

function sampleProcess(pid: number, cw: Set<string>): ProcSample | null {
  try {
    const comm = processLabel(pid);
    const rss = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    let fds = 0;
    let sockets = 0;
    let closeWait = 0;
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      fds++;
      let target = '';
      try {
        target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      const m = /^socket:\[(\d+)\]$/.exec(target);
      if (!m) continue;
      sockets++;
      if (cw.has(m[1]!)) closeWait++;
    }
    return { pid, comm, fds, sockets, closeWait, rssMb: rss ? Number(rss[1]) / 1024 : 0 };
  } catch {
    return null;
  }
}

function sampleGroup(pgid: number): ProcSample[] {
  const cw = closeWaitInodes();
  return groupPids(pgid)
    .map((p) => sampleProcess(p, cw))
    .filter((s): s is ProcSample => s !== null)
    .sort((a, b) => a.pid - b.pid);
}

const total = (s: ProcSample[], k: 'fds' | 'sockets' | 'closeWait' | 'rssMb') => s.reduce((a, p) => a + p[k], 0);

// ---- load --------------------------------------------------------------------------------------

interface LoadStats {
  started: number;
  completed: number;
  failed: number;
  tokens: number;
  lastError?: string;
}

/** `streams` loops, each one streaming request after another until `stop` aborts. */
function startLoad(base: string, streams: number, stop: AbortSignal): { stats: LoadStats; finished: Promise<void> } {
  const stats: LoadStats = { started: 0, completed: 0, failed: 0, tokens: 0 };
  const body = (i: number, n: number) =>
    JSON.stringify({
      model: 'demo-model',
      stream: true,
      max_tokens: TOKENS,
      messages: [
        { role: 'system', content: 'You are a patient assistant. '.repeat(20) },
        { role: 'user', content: `soak stream ${i}, request ${n}: tell a long story` },
      ],
    });
  const loop = async (i: number) => {
    for (let n = 0; !stop.aborted; n++) {
      stats.started++;
      try {
        const r = await fetch(`${base}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${DEV_TENANTS[0].key}`, 'content-type': 'application/json', 'x-session-id': `soak-${i}` },
          body: body(i, n),
          signal: stop,
        });
        if (r.status !== 200) throw new Error(`status ${r.status}: ${(await r.text()).slice(0, 200)}`);
        const reader = r.body!.getReader();
        const dec = new TextDecoder();
        let tail = '';
        let done = false;
        for (;;) {
          const { value, done: end } = await reader.read();
          if (end) break;
          const text = tail + dec.decode(value, { stream: true });
          const events = text.split('\n\n');
          tail = events.pop() ?? '';
          for (const e of events) {
            if (e === 'data: [DONE]') done = true;
            else if (e.startsWith('data: ') && e.includes('"delta"')) stats.tokens++;
          }
        }
        if (!done) throw new Error('stream ended without [DONE]');
        stats.completed++;
      } catch (e) {
        if (stop.aborted) return;
        stats.failed++;
        stats.lastError = (e as Error).message;
        await sleep(200);
      }
    }
  };
  return { stats, finished: Promise.all(Array.from({ length: streams }, (_, i) => loop(i))).then(() => {}) };
}

// ---- one run -----------------------------------------------------------------------------------

interface RunResult {
  name: string;
  seconds: number;
  /** Before the load, after the warm-up (the flat judge's start), at the end. */
  idle: ProcSample[];
  start: ProcSample[];
  end: ProcSample[];
  series: { t: number; fds: number; closeWait: number; rssMb: number }[];
  /** Seconds from the first request (warm-up included) to the end sample. */
  loadSeconds: number;
  load: LoadStats;
  stoppedEarly?: string;
}

async function soak(name: string, base: string, pgid: number, seconds: number, opts: { fdCap?: number } = {}): Promise<RunResult> {
  const stop = new AbortController();
  const p = progress({ label: `bench:soak ${name}` });
  const idle = sampleGroup(pgid);
  p.step(`idle: ${describe(idle)}`);
  const loadStart = Date.now();
  const { stats, finished } = startLoad(base, STREAMS, stop.signal);
  const series: RunResult['series'] = [];
  const point = (t: number, s: ProcSample[]) => series.push({ t, fds: total(s, 'fds'), closeWait: total(s, 'closeWait'), rssMb: total(s, 'rssMb') });
  const warmEnd = Date.now() + WARMUP_S * 1000;
  while (Date.now() < warmEnd) {
    p.update(`warming up: ${stats.completed} streams done, ${stats.failed} failed`);
    await sleep(500);
  }
  const start = sampleGroup(pgid);
  point(0, start);
  p.step(`start: ${describe(start)}`);
  const t0 = Date.now();
  let nextSample = t0 + SAMPLE_MS;
  let stoppedEarly: string | undefined;
  while (Date.now() - t0 < seconds * 1000) {
    await sleep(250);
    if (!groupAlive(pgid)) {
      stoppedEarly = 'the process group died';
      break;
    }
    if (Date.now() >= nextSample) {
      nextSample += SAMPLE_MS;
      const s = sampleGroup(pgid);
      point((Date.now() - t0) / 1000, s);
      p.step(`${((Date.now() - t0) / 1000).toFixed(0).padStart(3)} s: ${describe(s)}, ${stats.completed} streams done, ${stats.failed} failed`);
      if (opts.fdCap !== undefined && total(s, 'fds') > opts.fdCap) {
        stoppedEarly = `stopped at ${((Date.now() - t0) / 1000).toFixed(0)} s: over ${opts.fdCap} descriptors`;
        break;
      }
    } else {
      p.update(`${((Date.now() - t0) / 1000).toFixed(0)} s of ${seconds}: ${stats.completed} streams done, ${stats.failed} failed, ${stats.tokens} tokens`);
    }
  }
  const end = sampleGroup(pgid);
  const elapsed = (Date.now() - t0) / 1000;
  point(elapsed, end);
  p.done();
  stop.abort();
  await Promise.race([finished, sleep(5_000)]);
  return { name, seconds: elapsed, loadSeconds: (Date.now() - loadStart) / 1000, idle, start, end, series, load: { ...stats }, stoppedEarly };
}

function describe(s: ProcSample[]): string {
  return `${total(s, 'fds')} fds (${total(s, 'sockets')} sockets, ${total(s, 'closeWait')} CLOSE-WAIT), ${total(s, 'rssMb').toFixed(0)} MB RSS over ${s.length} processes`;
}

// ---- npm start ---------------------------------------------------------------------------------

async function startNpmStart(port: number, mockPort: number, stateDir: string): Promise<{ child: ChildProcess; output: () => string }> {
  const child = spawn('npm', ['start'], {
    cwd: ROOT,
    detached: true, // its own process group, as in a terminal or under a supervisor
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      PORT: String(port),
      MOCK_PORT: String(mockPort),
      INSPECTOR_PORT: '',
      STATE_DIR: stateDir,
      ...(args['no-heap-cap'] ? {} : { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --max-old-space-size=${HEAP_CAP_MB}`.trim() }),
    },
  });
  let tail = '';
  let ready = false;
  const keep = (b: Buffer) => {
    tail = (tail + b.toString()).slice(-20_000);
    if (!ready && tail.includes('prefix-router is up')) ready = true;
  };
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  const deadline = Date.now() + 90_000;
  while (!ready) {
    if (child.exitCode !== null) throw new Error(`npm start exited with ${child.exitCode}:\n${tail.slice(-3000)}`);
    if (Date.now() > deadline) {
      await killGroup(child);
      throw new Error(`npm start was not up within 90 s:\n${tail.slice(-3000)}`);
    }
    await sleep(200);
  }
  return { child, output: () => tail };
}

/** SIGTERM to npm alone, as a supervisor or `timeout` sends it; then how long until the group is empty. */
async function stopLikeASupervisor(child: ChildProcess): Promise<{ ms: number; clean: boolean; left: string[] }> {
  const pgid = child.pid!;
  const t0 = Date.now();
  child.kill('SIGTERM');
  while (groupAlive(pgid) && Date.now() - t0 < 8_000) await sleep(50);
  const ms = Date.now() - t0;
  if (!groupAlive(pgid)) return { ms, clean: true, left: [] };
  const left = groupPids(pgid).map((p) => {
    try {
      return `${p} ${readFileSync(`/proc/${p}/comm`, 'utf8').trim()}`;
    } catch {
      return String(p);
    }
  });
  await killGroup(child);
  return { ms, clean: false, left };
}

// ---- wrangler dev baseline -----------------------------------------------------------------------

async function wranglerBaseline(): Promise<RunResult> {
  const mockBase = await freeMockBase();
  const mocks: MockVllm[] = [];
  try {
    for (let i = 1; i <= 4; i++) mocks.push(await startMockVllm({ id: `r${i}`, port: mockBase + i, apiKey: DEV_ORIGIN_API_KEY, models: ['demo-model'] }));
    const { workerOptions } = unstable_getMiniflareWorkerOptions(join(ROOT, 'wrangler.toml'));
    const config = JSON.stringify((workerOptions.bindings as Record<string, unknown>).ROUTER_CONFIG).replace(/(http:\/\/127\.0\.0\.1:)900([1-4])\b/g, (_, h: string, n: string) => `${h}${mockBase + Number(n)}`);
    const dev = await startWranglerDev({
      vars: { ROUTER_CONFIG: config, ADMIN_TOKEN: DEV_ADMIN_TOKEN, ORIGIN_API_KEY: DEV_ORIGIN_API_KEY, CACHE_SALT_KEY: DEV_CACHE_SALT_KEY, TENANT_KEYS: tenantKeysSecret(DEV_TENANTS) },
    });
    try {
      return await soak('wrangler dev', dev.base, dev.child.pid!, BASELINE_S, { fdCap: BASELINE_FD_CAP });
    } finally {
      await dev.close();
    }
  } finally {
    await Promise.allSettled(mocks.map((m) => m.close()));
  }
}

// ---- report ------------------------------------------------------------------------------------

function table(r: RunResult): string {
  const rows = ['| process | descriptors idle · start → end | sockets | CLOSE-WAIT | RSS MB idle · start → end |', '|---|---:|---:|---:|---:|'];
  const idle = new Map(r.idle.map((s) => [s.pid, s]));
  const start = new Map(r.start.map((s) => [s.pid, s]));
  const cell = (k: 'fds' | 'sockets' | 'closeWait' | 'rssMb', i?: ProcSample, s?: ProcSample, e?: ProcSample) => {
    const f = (p?: ProcSample) => (p ? (k === 'rssMb' ? p[k].toFixed(0) : String(p[k])) : '–');
    return `${f(i)} · ${f(s)} → ${f(e)}`;
  };
  for (const e of r.end) {
    const i = idle.get(e.pid);
    const s = start.get(e.pid);
    rows.push(`| ${e.comm} | ${cell('fds', i, s, e)} | ${cell('sockets', i, s, e)} | ${cell('closeWait', i, s, e)} | ${cell('rssMb', i, s, e)} |`);
  }
  const sum = (k: 'fds' | 'sockets' | 'closeWait' | 'rssMb') => {
    const f = (xs: ProcSample[]) => (k === 'rssMb' ? total(xs, k).toFixed(0) : String(total(xs, k)));
    return `${f(r.idle)} · ${f(r.start)} → ${f(r.end)}`;
  };
  rows.push(`| **all ${r.end.length}** | ${sum('fds')} | ${sum('sockets')} | ${sum('closeWait')} | ${sum('rssMb')} |`);
  return rows.join('\n');
}

async function main(): Promise<void> {
  giveUpAfter((WARMUP_S + SECONDS + (args['wrangler-baseline'] ? WARMUP_S + BASELINE_S + 90 : 0) + 180) * 1000, log);
  log(`${STREAMS} concurrent streams of ${TOKENS} tokens, ${WARMUP_S} s warm-up then ${SECONDS} s measured, ${cpus().length} cores, ${args['no-heap-cap'] ? 'no heap cap' : `Node old space capped at ${HEAP_CAP_MB} MB`}`);

  const baseline = args['wrangler-baseline'] ? await wranglerBaseline() : undefined;

  const port = await freePort();
  const mockPort = await freeMockBase();
  // A state directory of its own: the demo's .wrangler/state holds replicas at 9001-9004.
  const stateDir = mkdtempSync(join(tmpdir(), 'bench-soak-state-'));
  const { child, output } = await startNpmStart(port, mockPort, stateDir).catch((e: unknown) => {
    rmSync(stateDir, { recursive: true, force: true });
    throw e;
  });
  let run: RunResult;
  try {
    run = await soak('npm start', `http://127.0.0.1:${port}`, child.pid!, SECONDS);
  } catch (e) {
    await killGroup(child);
    throw e;
  }
  const stop = await stopLikeASupervisor(child);
  rmSync(stateDir, { recursive: true, force: true });
  if (run.stoppedEarly) log(`npm start output:\n${output().slice(-3000)}`);

  const fd0 = total(run.start, 'fds');
  const fd1 = total(run.end, 'fds');
  const rss0 = total(run.start, 'rssMb');
  const rss1 = total(run.end, 'rssMb');
  const cw1 = total(run.end, 'closeWait');
  const goals = {
    descriptorsFlat: !run.stoppedEarly && fd1 - fd0 <= FD_SLACK(fd0),
    rssFlat: !run.stoppedEarly && rss1 - rss0 <= RSS_SLACK_MB(rss0),
    noCloseWait: cw1 <= CLOSE_WAIT_MAX,
    streamsComplete: run.load.failed === 0 && run.load.completed > 0,
    cleanStop: stop.clean,
  };
  const mark = (b: boolean) => (b ? 'MET' : 'MISSED');
  const lines = [
    `npm start${args['no-heap-cap'] ? '' : ` (Node old space capped at ${HEAP_CAP_MB} MB)`}, ${STREAMS} concurrent streams of ${TOKENS} tokens for ${run.seconds.toFixed(0)} s (after ${WARMUP_S} s warm-up): ` +
      `${run.load.completed} streams completed, ${run.load.failed} failed${run.load.lastError ? ` (last: ${run.load.lastError})` : ''}, ${run.load.tokens} tokens.`,
    '',
    table(run),
    '',
    `- Descriptors flat (growth ≤ ${FD_SLACK(fd0)}): ${fd0} → ${fd1} (${fd1 - fd0 >= 0 ? '+' : ''}${fd1 - fd0}, ×${(fd1 / fd0).toFixed(2)}): ${mark(goals.descriptorsFlat)}`,
    `- RSS flat (growth ≤ ${RSS_SLACK_MB(rss0).toFixed(0)} MB): ${rss0.toFixed(0)} → ${rss1.toFixed(0)} MB (×${(rss1 / rss0).toFixed(2)}): ${mark(goals.rssFlat)}`,
    `- CLOSE-WAIT at the end ≤ ${CLOSE_WAIT_MAX}: ${cw1}: ${mark(goals.noCloseWait)}`,
    `- Every stream complete: ${run.load.failed} failed of ${run.load.completed + run.load.failed}: ${mark(goals.streamsComplete)}`,
    `- SIGTERM to npm alone empties the process group: ${stop.clean ? `in ${stop.ms} ms` : `not within ${stop.ms} ms (left: ${stop.left.join(', ')}; killed)`}: ${mark(goals.cleanStop)}`,
    `- Descriptors over the run (s: total): ${run.series.map((p) => `${p.t.toFixed(0)}: ${p.fds}`).join(', ')}`,
    `- RSS over the run (s: MB): ${run.series.map((p) => `${p.t.toFixed(0)}: ${p.rssMb.toFixed(0)}`).join(', ')}`,
  ];
  if (baseline) {
    const perS = (r: RunResult, k: 'fds' | 'closeWait') => (total(r.end, k) - total(r.idle, k)) / r.loadSeconds;
    const sign = (n: number, d: number) => `${n >= 0 ? '+' : ''}${n.toFixed(d)}`;
    lines.push(
      '',
      `Baseline in the same run, \`wrangler dev\` (what \`npm start\` ran before), the same load for ${baseline.loadSeconds.toFixed(0)} s in all${baseline.stoppedEarly ? ` (${baseline.stoppedEarly})` : ''}: ` +
        `${baseline.load.completed} streams completed, ${baseline.load.failed} failed.`,
      '',
      table(baseline),
      '',
      `- From idle to the end of the load: wrangler dev ${sign(perS(baseline, 'fds'), 0)} descriptors/s (${sign(perS(baseline, 'closeWait'), 0)} CLOSE-WAIT/s), ` +
        `npm start ${sign(perS(run, 'fds'), 2)} descriptors/s (${sign(perS(run, 'closeWait'), 2)} CLOSE-WAIT/s).`,
    );
  }
  process.stdout.write(lines.join('\n') + '\n');
  if (args.write) {
    writeBenchSection(
      '## npm start soak',
      [
        '## npm start soak',
        '',
        `Command: \`npm run bench:soak -- ${args['wrangler-baseline'] ? '--wrangler-baseline ' : ''}${args['no-heap-cap'] ? '--no-heap-cap ' : ''}--write\` (${cpus().length} cores, shared; ${new Date().toISOString().slice(0, 10)}).`,
        '`npm start` in its own process group, every process of it measured from /proc after the warm-up and at the end.',
        '',
        ...lines,
      ].join('\n'),
      { keepReading: true },
    );
    log('wrote the "npm start soak" section of docs/benchmarks.md');
  }
  if (!Object.values(goals).every(Boolean)) throw new Error(`goals missed: ${Object.entries(goals).filter(([, v]) => !v).map(([k]) => k).join(', ')}`);
}

runMain(main, log);
