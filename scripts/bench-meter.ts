// `npm run bench:meter`: what metering costs one TenantMeter and one UsageRegistry shard, against
// Cloudflare's figure of about 1,000 requests/s per Durable Object
// (developers.cloudflare.com/durable-objects/reference/faq/#how-much-work-can-a-single-durable-object-do).
// In one workerd process (Miniflare, the bundle of scripts/workers/meter-bench-entry.ts): settles
// into one meter one call per request (as before batching) and in batched calls; one isolate's
// settles through the real SettleOutbox (its window) at 1,000/s, counting the meter calls they
// cost; usage reports into one registry shard from 2,000 tenants. Prints settles/s, calls/s and
// reports/s with workerd CPU per unit, MET/MISSED against the goals below. `-- --write` replaces
// its section of docs/benchmarks.md. Progress on stderr. Loopback only; bounded in count and time
// (a 4-minute deadline).

import { cpus, loadavg } from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { routerConfig, startRouter } from '../test/helpers/router.js';
import { startMockVllm } from '../tools/mock-engine/index.js';
import { emitBenchReport, giveUpAfter, runMain } from './lib/bench-docs.js';
import { processCpuMs, startedWorkerd } from './lib/proc-stats.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const ENTRY = resolve(ROOT, 'scripts/workers/meter-bench-entry.ts');
const SECTION = '## Metering (npm run bench:meter)';
/** Cloudflare's order of magnitude for one Durable Object (the page above). */
const PER_OBJECT_RPS = 1_000;
const CONC = 4;
const BATCH = 50;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const TENANTS = 2_000;

const log = (msg: string) => process.stderr.write(`bench:meter ${msg}\n`);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (x: number) => Math.round(x).toLocaleString('en-US');

interface Row {
  label: string;
  unit: string;
  perSec: number;
  callsPerSec: number;
  cpuUs: number;
}

async function main(): Promise<void> {
  const write = process.argv.includes('--write');
  giveUpAfter(240_000, log);
  log('starting a mock replica and the meter bench entry under Miniflare');
  const mock = await startMockVllm({ id: 'r1', models: ['bench-model'] });
  const { value: router, pid } = await startedWorkerd(() => startRouter({ config: routerConfig({ replicas: [mock] }), entry: ENTRY, discardLogs: true }));
  if (pid === undefined) throw new Error('cannot find the workerd process (Linux /proc needed)');
  const cpuMs = () => processCpuMs(pid) ?? Number.NaN;
  const get = async (qs: string): Promise<Record<string, number>> => {
    const res = await fetch(`${router.url}/?${qs}`);
    const body = (await res.json()) as Record<string, number> & { error?: string };
    if (body.error) throw new Error(`${qs}: ${body.error}`);
    return body;
  };
  /** One measured call: units done per wall second, calls per wall second, workerd CPU µs per unit. */
  const measure = async (qs: string, units: (b: Record<string, number>) => number, calls: (b: Record<string, number>) => number) => {
    const c0 = cpuMs();
    const t0 = performance.now();
    const b = await get(qs);
    const wall = (performance.now() - t0) / 1000;
    const cpu = cpuMs() - c0;
    return { perSec: units(b) / wall, callsPerSec: calls(b) / wall, cpuUs: (cpu * 1000) / units(b), body: b };
  };
  // The Worker's own constants (src/quota/*: Worker modules, not imported by a Node script).
  const { window: SETTLE_WINDOW_MS, batchMax: SETTLE_BATCH_MAX, reportDelay: REPORT_DELAY_MS } = (await get('mode=constants')) as { window: number; batchMax: number; reportDelay: number };
  const rows: Row[] = [];
  let outbox: { settles: number; ms: number; calls: number; delivered: number; failedCalls: number } | null = null;
  try {
    // Warm-up: every path once.
    await get('mode=settle&n=200&batch=1&conc=4&tenant=warm');
    await get(`mode=settle&n=2000&batch=${BATCH}&conc=4&tenant=warm`);
    await get('mode=report&n=200&tenants=50&conc=4&tenant=warm');
    const runs = {
      unbatched: [] as Row[],
      batched: [] as Row[],
      report: [] as Row[],
    };
    for (let round = 0; round < ROUNDS; round++) {
      const u = await measure(`mode=settle&n=4000&batch=1&conc=${CONC}&tenant=one-${round}`, (b) => b.settles!, (b) => b.calls!);
      runs.unbatched.push({ label: '', unit: 'settle', perSec: u.perSec, callsPerSec: u.callsPerSec, cpuUs: u.cpuUs });
      const bt = await measure(`mode=settle&n=40000&batch=${BATCH}&conc=${CONC}&tenant=batch-${round}`, (b) => b.settles!, (b) => b.calls!);
      runs.batched.push({ label: '', unit: 'settle', perSec: bt.perSec, callsPerSec: bt.callsPerSec, cpuUs: bt.cpuUs });
      const r = await measure(`mode=report&n=6000&tenants=${TENANTS}&conc=${CONC}&tenant=reg-${round}&shard=0`, (b) => b.calls!, (b) => b.calls!);
      runs.report.push({ label: '', unit: 'report', perSec: r.perSec, callsPerSec: r.callsPerSec, cpuUs: r.cpuUs });
      log(`round ${round + 1}/${ROUNDS}: per-request settles ${fmt(u.perSec)}/s, batched settles ${fmt(bt.perSec)}/s (${fmt(bt.callsPerSec)} calls/s), registry reports ${fmt(r.perSec)}/s`);
    }
    const med = (xs: Row[], label: string, unit: string): Row => ({ label, unit, perSec: median(xs.map((x) => x.perSec)), callsPerSec: median(xs.map((x) => x.callsPerSec)), cpuUs: median(xs.map((x) => x.cpuUs)) });
    rows.push(med(runs.unbatched, `one TenantMeter, one call per settle (before batching), ${CONC} calls at once`, 'settle'));
    rows.push(med(runs.batched, `one TenantMeter, ${BATCH} settles per call (an isolate's window), ${CONC} calls at once`, 'settle'));
    rows.push(med(runs.report, `one UsageRegistry shard, reports from ${fmt(TENANTS)} tenants' meters, ${CONC} at once`, 'report'));
    log('one isolate delivering 1,000 settles/s for 3 s through the SettleOutbox');
    outbox = (await get('mode=outbox&ms=3000&perTick=10&tenant=outbox')) as unknown as typeof outbox;
  } finally {
    await router.close();
    await mock.close();
  }

  const [unb, bat, rep] = rows as [Row, Row, Row];
  const ob = outbox!;
  const obCallsPerSec = ob.calls / (ob.ms / 1000);
  const obSettlesPerSec = ob.settles / (ob.ms / 1000);
  const shardTenants = Math.min(PER_OBJECT_RPS, rep.perSec) * (REPORT_DELAY_MS / 1000);
  const isolatesPerMeter = PER_OBJECT_RPS / (1000 / SETTLE_WINDOW_MS);
  const goals = [
    { text: `one isolate's settles cost its tenant's meter at most one call per ${SETTLE_WINDOW_MS} ms window (+1): ≤ ${1000 / SETTLE_WINDOW_MS + 1} calls/s at 1,000 settles/s`, met: obCallsPerSec <= 1000 / SETTLE_WINDOW_MS + 1 && ob.delivered === ob.settles && ob.failedCalls === 0, value: `${obCallsPerSec.toFixed(1)} calls/s for ${fmt(obSettlesPerSec)} settles/s; ${fmt(ob.delivered)} of ${fmt(ob.settles)} delivered` },
    { text: `batched, one meter absorbs ≥ 10 × ${fmt(PER_OBJECT_RPS)} settles/s here (the per-object figure bounds calls, not settles)`, met: bat.perSec >= 10 * PER_OBJECT_RPS, value: `${fmt(bat.perSec)} settles/s` },
    { text: `one registry shard applies ≥ ${fmt(PER_OBJECT_RPS)} reports/s here (the platform's per-object figure, not this code, bounds a shard: ${fmt(PER_OBJECT_RPS * (REPORT_DELAY_MS / 1000))} active tenants at one report per ${REPORT_DELAY_MS / 1000} s)`, met: rep.perSec >= PER_OBJECT_RPS, value: `${fmt(rep.perSec)} reports/s` },
  ];
  const goalLines = goals.map((g) => `- ${g.met ? 'MET' : 'MISSED'}: ${g.text} (${g.value})`);
  const when = new Date().toISOString().slice(0, 10);
  const out = [
    SECTION,
    '',
    '```',
    'npm run bench:meter',
    '```',
    '',
    `${when}; nproc ${cpus().length} (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Node ${process.version}, load average at start ${startLoad}. One workerd process (Miniflare) holding the Worker and the objects (scripts/workers/meter-bench-entry.ts); medians of ${ROUNDS} rounds. CPU is the whole process's (/proc, 10 ms ticks): both ends of every call. Per-object figure: about ${fmt(PER_OBJECT_RPS)} requests/s (developers.cloudflare.com/durable-objects/reference/faq/#how-much-work-can-a-single-durable-object-do).`,
    '',
    '| calls | per second (here) | calls/s | workerd CPU µs per unit | × the per-object figure |',
    '| --- | ---: | ---: | ---: | ---: |',
    ...rows.map((r) => `| ${r.label} | ${fmt(r.perSec)} ${r.unit}s | ${fmt(r.callsPerSec)} | ${r.cpuUs.toFixed(1)} | ${(r.callsPerSec / PER_OBJECT_RPS).toFixed(2)} |`),
    `| one isolate at ${fmt(obSettlesPerSec)} settles/s through the SettleOutbox (window ${SETTLE_WINDOW_MS} ms, batch ≤ ${SETTLE_BATCH_MAX}) for ${(ob.ms / 1000).toFixed(1)} s | ${fmt(obSettlesPerSec)} settles | ${obCallsPerSec.toFixed(1)} | | ${(obCallsPerSec / PER_OBJECT_RPS).toFixed(3)} |`,
    '',
    'Goals:',
    '',
    ...goalLines,
    '',
    `Reading: on the edge a TenantMeter is bounded by calls, not settles: one call per isolate per ${SETTLE_WINDOW_MS} ms window (or per ${SETTLE_BATCH_MAX} settles) puts about ${fmt(isolatesPerMeter)} isolates sending a tenant's traffic at once within the per-object figure, at any request rate up to what one meter applies (the batched row: ${fmt(bat.perSec)} settles/s here). Admissions are still a call each unless served from an isolate allowance (limits.ts). A registry shard takes one report per active tenant per ${REPORT_DELAY_MS / 1000} s: about ${fmt(shardTenants)} active tenants per shard; \`usageShards\` N serves N times that.`,
    '',
  ].join('\n');
  emitBenchReport(SECTION, out, goalLines, write, log);
}

const startLoad = loadavg()
  .map((x) => x.toFixed(1))
  .join(' ');
runMain(main, log);
