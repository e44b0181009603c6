// `npm run bench:coordinator`: what one pool coordinator costs per request and so how many requests
// one Durable Object can serve. In one workerd process (Miniflare, the bundle of
// scripts/workers/coordinator-bench-entry.ts): sequential acquire + release pairs on the real
// PoolCoordinator (bounded-hash at 4 replicas; with 64 leases held; prefix-aware with 32 prompt
// blocks; bounded-hash at 64 replicas with 128 leases held), against the baseline measured in the
// same run, the same number of RPCs to an object that does nothing; and the same pairs made by the
// object itself inside one RPC (what a pair costs the coordinator alone, without the RPCs).
// Prints workerd CPU and wall time per pair, the ratio to the baseline and the pairs per second
// one core sustains. `-- --write` replaces its section of docs/benchmarks.md. Progress on stderr.
// Loopback only; bounded in count (ROUNDS × MODES × PAIRS calls) and time (a 3-minute deadline, 8
// in before/after mode).
//
// Before/after mode: `BENCH_BASELINE_REF=<git ref> npm run bench:coordinator` extracts that
// commit's src/ (`git archive`) and binds its PoolCoordinator as a second class in the same
// workerd process, next to the current tree's, so every coordinator row is measured for both in
// interleaved rounds; each row then gets current ÷ baseline (the median of the rounds' paired
// ratios) and the goals below are printed MET or MISSED. `--write` records that run too.

import { execFileSync, execSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { routerConfig, startRouter } from '../test/helpers/router.js';
import { startMockVllm } from '../tools/mock-engine/index.js';
import { emitBenchReport, giveUpAfter, runMain } from './lib/bench-docs.js';
import { processCpuMs, startedWorkerd } from './lib/proc-stats.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const ENTRY = resolve(ROOT, 'scripts/workers/coordinator-bench-entry.ts');
const SECTION = '## Coordinator RPCs (npm run bench:coordinator)';
/** Before/after mode (see the top of this file): the git ref whose PoolCoordinator is the baseline. */
const BASELINE_REF = process.env.BENCH_BASELINE_REF;
const PAIRS = Number(process.env.BENCH_PAIRS ?? 10_000);
/** In-object pairs per call: more than over RPC, since /proc counts CPU in 10 ms ticks. */
const LOOP_PAIRS = Number(process.env.BENCH_LOOP_PAIRS ?? 1_000_000);
const WARM_PAIRS = 500;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? (BASELINE_REF ? 9 : 5));
const WIDE = 64;

/** The entry's modes (scripts/workers/coordinator-bench-entry.ts). */
type BenchMode = 'noop' | 'pair' | 'pair-held' | 'prefix-pair' | 'wide-pair' | 'loop' | 'wide-loop';

const MODES: readonly { mode: BenchMode; label: string; inObject?: boolean }[] = [
  { mode: 'noop', label: 'baseline: 2 RPCs to an object that does nothing' },
  { mode: 'pair', label: 'acquire + release, bounded-hash, 4 replicas' },
  { mode: 'pair-held', label: 'the same with 64 other leases held' },
  { mode: 'prefix-pair', label: 'acquire + release, prefix-aware, 32 prompt blocks' },
  { mode: 'wide-pair', label: `acquire + release, bounded-hash, ${WIDE} replicas, 128 other leases held` },
  { mode: 'loop', label: 'in the object (no RPC): acquire + release, bounded-hash, 4 replicas', inObject: true },
  { mode: 'wide-loop', label: `in the object (no RPC): acquire + release, bounded-hash, ${WIDE} replicas, 128 leases held`, inObject: true },
];

/**
 * Before/after goals, on current ÷ baseline CPU per pair in each one's best round (on a shared
 * machine interference only adds time, so the least disturbed round is the best estimate of a
 * pair's own cost; the median of the rounds' paired ratios is printed beside it): the
 * coordinator's own cost of a pair at 64 replicas (kept views and totals instead of a view per
 * replica and a walk for the load bound, issue #17) at least 10% lower, and at 4 replicas no higher
 * beyond noise. Judged in the object only: over RPC the coordinator's work is ~2 µs of a ~45 µs
 * pair, and the RPC rows' spread on a shared machine (±30%) is larger than all of it, so they
 * are shown with their ratios but not judged.
 */
const GOALS: readonly { text: string; applies: (mode: BenchMode) => boolean; max: number }[] = [
  { text: `in the object, ${WIDE} replicas: current ÷ baseline ≤ 0.90`, applies: (m) => m === 'wide-loop', max: 0.9 },
  { text: 'in the object, 4 replicas: current ÷ baseline ≤ 1.05 (no slower, 5% for noise)', applies: (m) => m === 'loop', max: 1.05 },
];

const log = (msg: string) => process.stderr.write(`bench:coordinator ${msg}\n`);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/**
 * Before/after mode: the baseline commit's src/ (and its router.config.json) in a temp dir (imports resolved through a symlink
 * to this checkout's node_modules), and an entry exporting this tree's bench entry plus that
 * commit's PoolCoordinator as BaselineCoordinator.
 */
function baselineEntry(ref: string, dir: string): { entry: string; sha: string } {
  const sha = execFileSync('git', ['rev-parse', '--verify', `${ref}^{commit}`], { cwd: ROOT, encoding: 'utf8' }).trim();
  mkdirSync(join(dir, 'base'), { recursive: true });
  // src/config.ts imports the bundled ../router.config.json (since #27): taken along when the commit has it.
  const paths = ['src', ...(execFileSync('git', ['ls-tree', '--name-only', sha, 'router.config.json'], { cwd: ROOT, encoding: 'utf8' }).trim() ? ['router.config.json'] : [])];
  execSync(`git archive ${sha} ${paths.join(' ')} | tar -x -C ${JSON.stringify(join(dir, 'base'))}`, { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'base', 'node_modules'), 'dir');
  const entry = join(dir, 'base', 'bench-entry.ts');
  writeFileSync(
    entry,
    [
      `export * from ${JSON.stringify(ENTRY)};`,
      `export { default } from ${JSON.stringify(ENTRY)};`,
      `import { loopInObject } from ${JSON.stringify(ENTRY)};`,
      `import { PoolCoordinatorImpl as BaselineImpl } from './src/coordinator/pool-coordinator.js';`,
      `export class BaselineCoordinator extends BaselineImpl { benchLoop(mode: string, n: number) { return loopInObject(this as never, mode, n); } }`,
      '',
    ].join('\n'),
  );
  return { entry, sha };
}

interface Sample {
  cpuUs: number;
  wallUs: number;
}

async function main(): Promise<void> {
  const write = process.argv.includes('--write');
  giveUpAfter(BASELINE_REF ? 480_000 : 180_000, log);
  const tmp = BASELINE_REF ? mkdtempSync(join(tmpdir(), 'bench-coordinator-')) : null;
  try {
    const base = BASELINE_REF ? baselineEntry(BASELINE_REF, tmp!) : null;
    if (base) log(`baseline ${BASELINE_REF} (${base.sha.slice(0, 12)}) extracted to ${tmp}`);
    const current = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'src', 'scripts/workers'], { cwd: ROOT, encoding: 'utf8' }).trim() !== '';

    log(`starting 4 mock replicas and the coordinator entry under Miniflare${base ? ' (current and baseline coordinators)' : ''}`);
    const mocks = await Promise.all([1, 2, 3, 4].map((i) => startMockVllm({ id: `r${i}`, models: ['demo-model'] })));
    const slow = { healthIntervalMs: 60_000, scrapeIntervalMs: 60_000 };
    const config = routerConfig({
      replicas: mocks,
      poolOverrides: { healthIntervalMs: 5_000 },
      extraPools: [
        { name: 'prefix', models: ['prefix-model'], strategy: 'prefix-aware:1.25:3', fallback: 'least-load', keys: ['header:x-session-id'], healthIntervalMs: 5_000, replicas: mocks.map((m) => ({ id: m.id, url: m.url, weight: 1, auth: 'bearer:ORIGIN_API_KEY' })) },
        // 64 replicas over the 4 mocks (ids apart, URLs shared); health and scrape rare, so their fetches stay out of the CPU counts.
        { name: 'wide', models: ['wide-model'], strategy: 'bounded-hash:1.25', fallback: 'least-load', keys: ['header:x-session-id'], ...slow, replicas: Array.from({ length: WIDE }, (_, i) => ({ id: `w${String(i).padStart(2, '0')}`, url: mocks[i % mocks.length]!.url, weight: 1, auth: 'bearer:ORIGIN_API_KEY' })) },
      ],
    });
    const { value: router, pid } = await startedWorkerd(() =>
      startRouter({ config, entry: base?.entry ?? ENTRY, extraDurableObjects: { NOOP: 'NoopObject', ...(base ? { BASELINE_COORDINATOR: 'BaselineCoordinator' } : {}) } }),
    );
    if (pid === undefined) throw new Error('cannot find the workerd process (Linux /proc needed)');
    const cpuMs = (): number => {
      const ms = processCpuMs(pid);
      if (ms === null) throw new Error('workerd went away');
      return ms;
    };

    const pairsOf = (m: (typeof MODES)[number]) => (m.inObject ? LOOP_PAIRS : PAIRS);
    const call = async (mode: BenchMode, n: number, baseline: boolean) => {
      const res = await fetch(`${router.url}/?mode=${mode}&n=${n}${baseline ? '&base=1' : ''}`);
      const body = (await res.json()) as { ok: number; error?: string };
      if (body.error) throw new Error(`${mode}: ${body.error}`);
      // noop makes one RPC per call; the others two (acquire + release): compare per pair of RPCs.
      const pairs = mode === 'noop' ? body.ok / 2 : body.ok;
      if (body.ok !== n) throw new Error(`${mode}${baseline ? ' (baseline)' : ''}: ${body.ok} of ${n} calls succeeded`);
      return pairs;
    };
    // Every measured target: a mode on the current coordinator and, in before/after mode, on the baseline's.
    const targets = MODES.flatMap((m) => [{ m, baseline: false }, ...(base && m.mode !== 'noop' ? [{ m, baseline: true }] : [])]);
    const keyOf = (t: { m: { mode: BenchMode }; baseline: boolean }) => `${t.m.mode}${t.baseline ? ':base' : ''}`;
    const samples = new Map<string, Sample[]>();
    try {
      for (const t of targets) await call(t.m.mode, (t.m.inObject ? 5 : 1) * WARM_PAIRS * (t.m.mode === 'noop' ? 2 : 1), t.baseline);
      for (let round = 0; round < ROUNDS; round++) {
        // Interleaved, alternating order (and current/baseline adjacent), so drift on a shared machine touches every target alike.
        const order = round % 2 === 0 ? targets : [...targets].reverse();
        for (const t of order) {
          const n = pairsOf(t.m) * (t.m.mode === 'noop' ? 2 : 1);
          const cpu0 = cpuMs();
          const t0 = performance.now();
          const pairs = await call(t.m.mode, n, t.baseline);
          const wall = performance.now() - t0;
          const cpu = cpuMs() - cpu0;
          const s = { cpuUs: (cpu * 1000) / pairs, wallUs: (wall * 1000) / pairs };
          samples.set(keyOf(t), [...(samples.get(keyOf(t)) ?? []), s]);
          log(`round ${round + 1}/${ROUNDS} ${keyOf(t)}: ${s.cpuUs.toFixed(1)} µs CPU, ${s.wallUs.toFixed(1)} µs wall per pair`);
        }
      }
    } finally {
      await router.close();
      await Promise.all(mocks.map((m) => m.close()));
    }

    const noop = median(samples.get('noop')!.map((s) => s.cpuUs));
    const head = base
      ? ['| calls | workerd CPU µs per pair (median) | range | baseline commit: CPU µs per pair (median) | range | current ÷ baseline, best rounds | current ÷ baseline, median of paired rounds | wall µs per pair | × RPC baseline | pairs/s per core |', '| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |']
      : [`| calls | workerd CPU µs per pair (median of ${ROUNDS}) | range | wall µs per pair | × baseline | pairs/s per core |`, '| --- | ---: | --- | ---: | ---: | ---: |'];
    const rows = [...head];
    const ratios = new Map<BenchMode, number>();
    const fmtRange = (xs: Sample[]) => {
      const lo = Math.min(...xs.map((s) => s.cpuUs));
      const hi = Math.max(...xs.map((s) => s.cpuUs));
      const d = hi < 10 ? 2 : 0;
      return `${lo.toFixed(d)}-${hi.toFixed(d)}`;
    };
    for (const m of MODES) {
      const xs = samples.get(m.mode)!;
      const cpu = median(xs.map((s) => s.cpuUs));
      const wall = median(xs.map((s) => s.wallUs)).toFixed(1);
      // In-object rows make one RPC per LOOP_PAIRS pairs: "× RPC baseline" still sets them against two RPCs.
      const perCore = Math.round(1e6 / cpu).toLocaleString('en-US');
      const d = cpu < 10 ? 2 : 1;
      if (!base) {
        rows.push(`| ${m.label} | ${cpu.toFixed(d)} | ${fmtRange(xs)} | ${wall} | ${(cpu / noop).toFixed(2)} | ${perCore} |`);
        continue;
      }
      const bs = samples.get(`${m.mode}:base`);
      if (!bs) {
        rows.push(`| ${m.label} | ${cpu.toFixed(d)} | ${fmtRange(xs)} | | | | | ${wall} | ${(cpu / noop).toFixed(2)} | ${perCore} |`);
        continue;
      }
      const best = Math.min(...xs.map((s) => s.cpuUs)) / Math.min(...bs.map((s) => s.cpuUs));
      const paired = median(xs.map((s, i) => s.cpuUs / bs[i]!.cpuUs));
      ratios.set(m.mode, best);
      rows.push(`| ${m.label} | ${cpu.toFixed(d)} | ${fmtRange(xs)} | ${median(bs.map((s) => s.cpuUs)).toFixed(d)} | ${fmtRange(bs)} | ${best.toFixed(2)} | ${paired.toFixed(2)} | ${wall} | ${(cpu / noop).toFixed(2)} | ${perCore} |`);
    }
    const goalLines = base
      ? GOALS.map((g) => {
          const hit = [...ratios].filter(([mode]) => g.applies(mode));
          const met = hit.length > 0 && hit.every(([, r]) => r <= g.max);
          const worst = hit.reduce((a, [, r]) => Math.max(a, r), 0);
          return `- ${met ? 'MET' : 'MISSED'}: ${g.text} (${hit.length === 1 ? '' : 'worst '}${worst.toFixed(2)})`;
        })
      : [];
    const when = new Date().toISOString().slice(0, 10);
    const command = base ? `BENCH_BASELINE_REF=${BASELINE_REF} npm run bench:coordinator` : 'npm run bench:coordinator';
    const out = [
      SECTION,
      '',
      '```',
      command,
      '```',
      '',
      `${when}; nproc ${cpus().length} (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Node ${process.version}, load average at start ${startLoad}.${base ? ` Current: ${current}${dirty ? ' + uncommitted changes' : ''}; baseline: ${BASELINE_REF} (${base.sha.slice(0, 7)}), its PoolCoordinator bound as a second class in the same process.` : ''}`,
      `One workerd process (Miniflare) holding the Worker and the objects, as \`wrangler dev\` runs them. A Worker request makes ${PAIRS.toLocaleString('en-US')} sequential acquire + release pairs on the real PoolCoordinator (scripts/workers/coordinator-bench-entry.ts; routing keys spread over 256 sessions, each release carrying a full outcome for the stats), after ${WARM_PAIRS} to warm up; the in-object rows are one RPC in which the object makes ${LOOP_PAIRS.toLocaleString('en-US')} pairs itself. ${ROUNDS} interleaved rounds${base ? ', each target measured on both coordinators back to back' : ''}. The RPC baseline is the same number of RPCs, with acquire's argument and a result of its shape, to an object that does nothing: what any Durable Object call costs here. CPU is the whole process's (/proc, 10 ms ticks), so it holds both ends of every call.`,
      '',
      rows.join('\n'),
      '',
      ...(base
        ? [
            "Goals (current ÷ baseline, CPU per pair in each one's best round; on a shared machine interference only adds time). Judged in the object: over RPC the coordinator's own work is about 2 µs of a pair, less than the RPC rows' round-to-round spread here, so their ratios are shown, not judged.",
            '',
            ...goalLines,
            '',
          ]
        : []),
      `Reading: the pairs/s column is one core spent on nothing but lease RPCs, both ends; in production the Worker's end runs in other isolates, so one coordinator serves more than that. A pair here is two RPCs; with lease protocol v2 the router makes about one coordinator RPC per request (a release rides on the isolate's next acquire, renewals go in one batched settle: bench:load; docs/scaling.md).`,
      '',
    ].join('\n');
    emitBenchReport(SECTION, out, goalLines, write, log);
  } finally {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }
}

const startLoad = loadavg()
  .map((x) => x.toFixed(1))
  .join(' ');
runMain(main, log);
