// `npm run bench:coordinator`: what one pool coordinator costs per request and so how many requests
// one Durable Object can serve. In one workerd process (Miniflare, the bundle of
// scripts/workers/coordinator-bench-entry.ts): sequential acquire + release pairs on the real
// PoolCoordinator (bounded-hash; with 64 leases held; prefix-aware with 32 prompt blocks), against
// the baseline measured in the same run, the same number of RPCs to an object that does nothing.
// Prints workerd CPU and wall time per pair, the ratio to the baseline and the pairs per second
// one core sustains. `-- --write` replaces its section of docs/benchmarks.md. Progress on stderr.
// Loopback only; bounded in count (ROUNDS × MODES × PAIRS calls) and time (a 3-minute deadline).

import { cpus, loadavg } from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { routerConfig, startRouter } from '../test/helpers/router.js';
import { startMockVllm } from './mock-vllm.js';
import { giveUpAfter, runMain, writeBenchSection } from './lib/bench-docs.js';
import { processCpuMs, startedWorkerd } from './lib/proc-stats.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SECTION = '## Coordinator RPCs (npm run bench:coordinator)';
const PAIRS = Number(process.env.BENCH_PAIRS ?? 10_000);
const WARM_PAIRS = 500;
const ROUNDS = 5;
const MODES: readonly { mode: BenchMode; label: string }[] = [
  { mode: 'noop', label: 'baseline: 2 RPCs to an object that does nothing' },
  { mode: 'pair', label: 'acquire + release, bounded-hash, 4 replicas' },
  { mode: 'pair-held', label: 'the same with 64 other leases held' },
  { mode: 'prefix-pair', label: 'acquire + release, prefix-aware, 32 prompt blocks' },
];

/** The entry's modes (scripts/workers/coordinator-bench-entry.ts). */
type BenchMode = 'noop' | 'pair' | 'pair-held' | 'prefix-pair';

const log = (msg: string) => process.stderr.write(`bench:coordinator ${msg}\n`);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  const write = process.argv.includes('--write');
  giveUpAfter(180_000, log);

  log('starting 4 mock replicas and the coordinator entry under Miniflare');
  const mocks = await Promise.all([1, 2, 3, 4].map((i) => startMockVllm({ id: `r${i}`, models: ['demo-model'] })));
  const config = routerConfig({
    replicas: mocks,
    poolOverrides: { healthIntervalMs: 5_000 },
    extraPools: [{ name: 'prefix', models: ['prefix-model'], strategy: 'prefix-aware:1.25:3', fallback: 'least-load', keys: ['header:x-session-id'], healthIntervalMs: 5_000, replicas: mocks.map((m) => ({ id: m.id, url: m.url, weight: 1, auth: 'bearer:ORIGIN_API_KEY' })) }],
  });
  const { value: router, pid } = await startedWorkerd(() => startRouter({ config, entry: resolve(ROOT, 'scripts/workers/coordinator-bench-entry.ts'), extraDurableObjects: { NOOP: 'NoopObject' } }));
  if (pid === undefined) throw new Error('cannot find the workerd process (Linux /proc needed)');
  const cpuMs = (): number => {
    const ms = processCpuMs(pid);
    if (ms === null) throw new Error('workerd went away');
    return ms;
  };

  const call = async (mode: BenchMode, n: number) => {
    const res = await fetch(`${router.url}/?mode=${mode}&n=${n}`);
    const body = (await res.json()) as { ok: number };
    // noop makes one RPC per call; the others two (acquire + release): compare per pair of RPCs.
    const pairs = mode === 'noop' ? body.ok / 2 : body.ok;
    if (body.ok !== n) throw new Error(`${mode}: ${body.ok} of ${n} calls succeeded`);
    return pairs;
  };
  const samples = new Map<BenchMode, { cpuUs: number; wallUs: number }[]>();
  try {
    for (const m of MODES) await call(m.mode, WARM_PAIRS * (m.mode === 'noop' ? 2 : 1));
    for (let round = 0; round < ROUNDS; round++) {
      // Interleaved, alternating order, so drift on a shared machine touches every mode alike.
      const order = round % 2 === 0 ? MODES : [...MODES].reverse();
      for (const m of order) {
        const cpu0 = cpuMs();
        const t0 = performance.now();
        const pairs = await call(m.mode, PAIRS * (m.mode === 'noop' ? 2 : 1));
        const wall = performance.now() - t0;
        const cpu = cpuMs() - cpu0;
        const s = { cpuUs: (cpu * 1000) / pairs, wallUs: (wall * 1000) / pairs };
        samples.set(m.mode, [...(samples.get(m.mode) ?? []), s]);
        log(`round ${round + 1}/${ROUNDS} ${m.mode}: ${s.cpuUs.toFixed(1)} µs CPU, ${s.wallUs.toFixed(1)} µs wall per pair`);
      }
    }
  } finally {
    await router.close();
    await Promise.all(mocks.map((m) => m.close()));
  }

  const base = median(samples.get('noop')!.map((s) => s.cpuUs));
  const rows = ['| calls | workerd CPU µs per pair (median of 5) | range | wall µs per pair | × baseline | pairs/s per core |', '| --- | ---: | --- | ---: | ---: | ---: |'];
  for (const m of MODES) {
    const xs = samples.get(m.mode)!;
    const cpu = median(xs.map((s) => s.cpuUs));
    const lo = Math.min(...xs.map((s) => s.cpuUs));
    const hi = Math.max(...xs.map((s) => s.cpuUs));
    rows.push(`| ${m.label} | ${cpu.toFixed(1)} | ${lo.toFixed(0)}-${hi.toFixed(0)} | ${median(xs.map((s) => s.wallUs)).toFixed(1)} | ${(cpu / base).toFixed(2)} | ${Math.round(1e6 / cpu).toLocaleString('en-US')} |`);
  }
  const when = new Date().toISOString().slice(0, 10);
  const out = [
    SECTION,
    '',
    '```',
    'npm run bench:coordinator',
    '```',
    '',
    `${when}; nproc ${cpus().length} (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Node ${process.version}, load average at start ${loadavg().map((x) => x.toFixed(1)).join(' ')}.`,
    `One workerd process (Miniflare) holding the Worker and the objects, as \`wrangler dev\` runs them. A Worker request makes ${PAIRS.toLocaleString('en-US')} sequential acquire + release pairs on the real PoolCoordinator (scripts/workers/coordinator-bench-entry.ts; routing keys spread over 256 sessions, each release carrying a full outcome for the stats), after ${WARM_PAIRS} to warm up; ${ROUNDS} interleaved rounds. The baseline is the same number of RPCs, with acquire's argument and a result of its shape, to an object that does nothing: what any Durable Object call costs here. CPU is the whole process's (/proc), so it holds both ends of every call.`,
    '',
    rows.join('\n'),
    '',
    `Reading: the pairs/s column is one core spent on nothing but lease RPCs, both ends; in production the Worker's end runs in other isolates, so one coordinator serves more than that. The router makes one pair per request (docs/scaling.md).`,
    '',
  ].join('\n');
  process.stdout.write(out + '\n');
  if (write) {
    writeBenchSection(SECTION, out);
    log('wrote docs/benchmarks.md');
  }
}

runMain(main, log);
