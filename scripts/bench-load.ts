// `npm run bench:load`: an open-loop ramp of short streaming chat requests through the router
// (Miniflare harness: the router in workerd, without wrangler dev's extra proxy layer) against
// four fast mock replicas, each rate also sent straight to the mocks as the baseline. Arrivals
// are on a fixed schedule whatever the answers do (open loop), stepping up until saturation:
// achieved < 90% of offered, error rate > 1%, or p99 TTFT overhead over the direct path > 100 ms.
// Reports per step: offered/achieved req/s, errors, TTFT p50/p99 (router and direct), the
// coordinator's leases and the RPCs it served per request (snapshot counter deltas: lease protocol v2
// batches releases and renewals, so that is not two per request), RSS of workerd and of Node.
// Table on stdout, progress on stderr, chart to docs/load.svg (`--svg FILE` elsewhere,
// `--no-svg` for none, `--json FILE` for the rows, `--replot FILE` to redraw from them). Only 127.0.0.1; every step bounded in requests and time.

import { readFileSync, writeFileSync } from 'node:fs';
import { Agent, request as httpRequest } from 'node:http';
import { cpus, loadavg } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { routerConfig, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../test/helpers/router.js';
import { startMockVllm, type MockVllm } from '../tools/mock-engine/index.js';
import { processCpuMs, processRssMb, workerdPids } from './lib/proc-stats.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

const { values: args } = parseArgs({
  options: {
    rates: { type: 'string', default: '50,100,200,400,600,800,1200' },
    'step-ms': { type: 'string', default: '5000' },
    svg: { type: 'string', default: join(ROOT, 'docs/load.svg') },
    'no-svg': { type: 'boolean', default: false },
    'keep-going': { type: 'boolean', default: false },
    /** Also write the rows as JSON to this file. */
    json: { type: 'string' },
    /** Only redraw the chart from a file written by --json (no load is sent). */
    replot: { type: 'string' },
  },
});
const RATES = args.rates!.split(',').map(Number).filter((r) => r > 0 && r <= 5_000);
const STEP_MS = Math.min(30_000, Math.max(1_000, Number(args['step-ms'])));
/** Bounds: at most this many requests outstanding (beyond it an arrival counts as an error). */
const MAX_OUTSTANDING = 2_000;
const REQUEST_TIMEOUT_MS = 10_000;
const DRAIN_MS = 10_000;
const MAX_TOKENS = 8;
const SESSIONS = 500;
/** Saturation criteria. */
const MIN_ACHIEVED = 0.9;
const MAX_ERROR_RATE = 0.01;
const MAX_P99_OVERHEAD_MS = 100;

const log = (msg: string) => process.stderr.write(`bench:load ${msg}\n`);

const BODY = JSON.stringify({
  model: 'demo-model',
  stream: true,
  max_tokens: MAX_TOKENS,
  messages: [
    { role: 'system', content: 'You are a load test. Answer briefly.' },
    { role: 'user', content: 'Say eight words.' },
  ],
});
const FIRST_CONTENT = /"delta":\{"content":"[^"]/;

interface Target {
  name: 'router' | 'direct';
  /** Port for request i (the direct baseline spreads over the mocks by session). */
  portFor(session: number): number;
  headers: Record<string, string>;
}

/** One streaming request; resolves with TTFT in ms (time to the first content event), or null on error. */
function oneRequest(agent: Agent, t: Target, session: number): Promise<number | null> {
  return new Promise((done) => {
    const started = performance.now();
    let ttft = -1;
    let tail = '';
    let settled = false;
    const finish = (v: number | null) => {
      if (settled) return;
      settled = true;
      done(v);
    };
    const req = httpRequest(
      {
        agent,
        host: '127.0.0.1',
        port: t.portFor(session),
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(BODY), 'x-session-id': `load-${session}`, ...t.headers },
        timeout: REQUEST_TIMEOUT_MS,
      },
      (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          finish(null);
          return;
        }
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          if (ttft < 0) {
            const s = tail + chunk;
            if (FIRST_CONTENT.test(s)) ttft = performance.now() - started;
            else tail = s.slice(-64);
          }
        });
        res.on('end', () => finish(ttft >= 0 ? ttft : null));
        res.on('error', () => finish(null));
        res.on('aborted', () => finish(null));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => finish(null));
    req.end(BODY);
  });
}

function percentile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}

interface StepResult {
  target: Target['name'];
  offered: number;
  sent: number;
  ok: number;
  errors: number;
  achieved: number;
  ttftP50: number;
  ttftP99: number;
  /** Leases released per second (one per request the coordinator placed), router only. */
  leaseRate: number | null;
  /** Coordinator RPCs per second, all methods (acquire, release, settle, …), router only; by method in `rpcsByMethod`. */
  rpcRate?: number | null;
  rpcsByMethod?: Record<string, number> | null;
  workerdRssMb: number | null;
  /** CPU time of the workerd process(es) per successful request, ms, and as a share of one core. */
  workerdCpuMsPerReq: number | null;
  workerdCpuShare: number | null;
  nodeRssMb: number;
  /** 1-minute load average at the end of the step (other work on the machine skews the tail). */
  load: number;
}

async function runStep(t: Target, rate: number, router: RouterHandle): Promise<StepResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: MAX_OUTSTANDING, maxFreeSockets: 256 });
  const ttfts: number[] = [];
  let errors = 0;
  let ok = 0;
  let outstanding = 0;
  const inflight: Promise<void>[] = [];
  const leases0 = t.name === 'router' ? await leaseCount(router) : { leases: 0, rpcs: {} };
  const interval = 1000 / rate;
  const total = Math.round((rate * STEP_MS) / 1000);
  let peakWorkerd = 0;
  let peakNode = 0;
  const sampleMem = () => {
    const w = workerdPids().reduce((s, p) => s + (processRssMb(p) ?? 0), 0);
    peakWorkerd = Math.max(peakWorkerd, w);
    peakNode = Math.max(peakNode, process.memoryUsage().rss / 1048576);
  };
  const memTimer = setInterval(sampleMem, 250);
  const pids = workerdPids();
  const cpu0 = pids.reduce((s, p) => s + (processCpuMs(p) ?? 0), 0);
  const t0 = performance.now();
  let lastDone = t0;
  for (let i = 0; i < total; i++) {
    // Open loop: the i-th arrival is due at t0 + i × interval, whatever the answers do.
    const due = t0 + i * interval;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    if (outstanding >= MAX_OUTSTANDING) {
      errors++;
      continue;
    }
    outstanding++;
    const session = (i * 7919) % SESSIONS;
    inflight.push(
      oneRequest(agent, t, session).then((v) => {
        outstanding--;
        lastDone = performance.now();
        if (v === null) errors++;
        else {
          ok++;
          ttfts.push(v);
        }
      }),
    );
  }
  const sentEnd = performance.now();
  await Promise.race([Promise.all(inflight), new Promise((r) => setTimeout(r, DRAIN_MS))]);
  clearInterval(memTimer);
  sampleMem();
  const unfinished = total - ok - errors;
  errors += Math.max(0, unfinished);
  const spanS = (Math.max(lastDone, sentEnd) - t0) / 1000;
  const cpu1 = pids.reduce((s, p) => s + (processCpuMs(p) ?? 0), 0);
  const leases1 = t.name === 'router' ? await leaseCount(router) : { leases: 0, rpcs: {} };
  // The coordinator counts RPCs by method since it started (an eviction would restart them; a step keeps it busy).
  const rpcsByMethod = Object.fromEntries(Object.entries(leases1.rpcs).map(([m, n]) => [m, n - (leases0.rpcs[m] ?? 0)]));
  const rpcs = Object.values(rpcsByMethod).reduce((a, n) => a + n, 0);
  agent.destroy();
  return {
    target: t.name,
    offered: rate,
    sent: total,
    ok,
    errors,
    achieved: ok / spanS,
    ttftP50: percentile(ttfts, 0.5),
    ttftP99: percentile(ttfts, 0.99),
    leaseRate: t.name === 'router' ? (leases1.leases - leases0.leases) / spanS : null,
    rpcRate: t.name === 'router' ? rpcs / spanS : null,
    rpcsByMethod: t.name === 'router' ? rpcsByMethod : null,
    workerdRssMb: t.name === 'router' ? peakWorkerd : null,
    workerdCpuMsPerReq: t.name === 'router' && pids.length > 0 && ok > 0 ? (cpu1 - cpu0) / ok : null,
    workerdCpuShare: t.name === 'router' && pids.length > 0 ? (cpu1 - cpu0) / (spanS * 1000) : null,
    nodeRssMb: peakNode,
    load: loadavg()[0]!,
  };
}

/** Leases released so far (Σ requests in the pool's stats) and the coordinator's RPCs by method. */
async function leaseCount(router: RouterHandle): Promise<{ leases: number; rpcs: Record<string, number> }> {
  const res = await router.adminFetch('/admin/pools/chat');
  const snap = (await res.json()) as { replicas: { stats: { requests: number } }[]; lease?: { rpcs?: Record<string, number> } };
  return { leases: snap.replicas.reduce((s, r) => s + r.stats.requests, 0), rpcs: snap.lease?.rpcs ?? {} };
}

interface Row {
  rate: number;
  router: StepResult;
  direct: StepResult;
  saturated: string | null;
}

function saturation(r: StepResult, d: StepResult): string | null {
  const why: string[] = [];
  if (r.achieved < MIN_ACHIEVED * r.offered) why.push(`achieved ${(r.achieved / r.offered * 100).toFixed(0)}% of offered`);
  if (r.errors / r.sent > MAX_ERROR_RATE) why.push(`errors ${(r.errors / r.sent * 100).toFixed(1)}%`);
  const over = r.ttftP99 - d.ttftP99;
  if (!(over <= MAX_P99_OVERHEAD_MS)) why.push(`p99 TTFT overhead ${over.toFixed(0)} ms`);
  return why.length > 0 ? why.join(', ') : null;
}

const f1 = (x: number | null) => (x === null || !Number.isFinite(x) ? '–' : x.toFixed(1));
const f0 = (x: number | null) => (x === null || !Number.isFinite(x) ? '–' : x.toFixed(0));

function table(rows: Row[]): string {
  const head = '| offered req/s | achieved req/s | errors | TTFT p50 ms router / direct | TTFT p99 ms router / direct | p50 / p99 overhead ms | leases/s | coordinator RPCs/s (per lease) | workerd CPU ms/req (cores) | workerd RSS MB | Node RSS MB | load avg | saturated |';
  const sep = '|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|';
  const lines = rows.map((x) => {
    const r = x.router;
    const d = x.direct;
    return `| ${r.offered} | ${f0(r.achieved)} | ${r.errors}/${r.sent} | ${f1(r.ttftP50)} / ${f1(d.ttftP50)} | ${f1(r.ttftP99)} / ${f1(d.ttftP99)} | ${f1(r.ttftP50 - d.ttftP50)} / ${f1(r.ttftP99 - d.ttftP99)} | ${f0(r.leaseRate)} | ${r.rpcRate == null ? '–' : `${f0(r.rpcRate)} (${r.leaseRate ? (r.rpcRate / r.leaseRate).toFixed(2) : '–'})`} | ${f1(r.workerdCpuMsPerReq)} (${f1(r.workerdCpuShare)}) | ${f0(r.workerdRssMb)} | ${f0(Math.max(r.nodeRssMb, d.nodeRssMb))} | ${f1(r.load)} | ${x.saturated ?? 'no'} |`;
  });
  return [head, sep, ...lines].join('\n');
}

function svg(rows: Row[]): string {
  const W = 900;
  const H = 360;
  const pad = { l: 60, r: 20, t: 40, b: 50 };
  const pw = (W - pad.l - pad.r - 80) / 2;
  const ph = H - pad.t - pad.b;
  const maxRate = Math.max(...rows.map((r) => r.rate));
  const xs = (x: number, ox: number) => ox + (x / maxRate) * pw;
  const panel = (ox: number, title: string, yMax: number, yLabel: string, series: { name: string; color: string; dash?: string; pts: [number, number][] }[], log = false) => {
    // Log scale: 1 … yMax (decades); linear: 0 … yMax.
    const ys = (y: number) => pad.t + ph - (log ? Math.log10(Math.max(1, Math.min(y, yMax))) / Math.log10(yMax) : Math.min(y, yMax) / yMax) * ph;
    const out: string[] = [];
    out.push(`<text x="${ox + pw / 2}" y="${pad.t - 16}" text-anchor="middle" font-weight="bold">${title}</text>`);
    out.push(`<rect x="${ox}" y="${pad.t}" width="${pw}" height="${ph}" fill="none" stroke="#999"/>`);
    const ticks = log ? Array.from({ length: Math.round(Math.log10(yMax)) + 1 }, (_, k) => 10 ** k) : [0, 1, 2, 3, 4].map((k) => (yMax * k) / 4);
    for (const v of ticks) {
      out.push(`<line x1="${ox}" x2="${ox + pw}" y1="${ys(v)}" y2="${ys(v)}" stroke="#eee"/><text x="${ox - 6}" y="${ys(v) + 4}" text-anchor="end" font-size="11">${v.toFixed(yMax < 20 ? 1 : 0)}</text>`);
    }
    for (const r of rows) out.push(`<text x="${xs(r.rate, ox)}" y="${pad.t + ph + 16}" text-anchor="middle" font-size="11">${r.rate}</text>`);
    out.push(`<text x="${ox + pw / 2}" y="${H - 12}" text-anchor="middle" font-size="12">offered req/s</text>`);
    out.push(`<text transform="translate(${ox - 44},${pad.t + ph / 2}) rotate(-90)" text-anchor="middle" font-size="12">${yLabel}</text>`);
    series.forEach((s, i) => {
      const d = s.pts.filter(([, y]) => Number.isFinite(y)).map(([x, y], j) => `${j === 0 ? 'M' : 'L'}${xs(x, ox).toFixed(1)},${ys(y).toFixed(1)}`).join(' ');
      out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"${s.dash ? ` stroke-dasharray="${s.dash}"` : ''}/>`);
      for (const [x, y] of s.pts) if (Number.isFinite(y)) out.push(`<circle cx="${xs(x, ox).toFixed(1)}" cy="${ys(y).toFixed(1)}" r="3" fill="${s.color}"/>`);
      out.push(`<line x1="${ox + 10}" x2="${ox + 30}" y1="${pad.t + 14 + i * 16}" y2="${pad.t + 14 + i * 16}" stroke="${s.color}" stroke-width="2"${s.dash ? ` stroke-dasharray="${s.dash}"` : ''}/><text x="${ox + 36}" y="${pad.t + 18 + i * 16}" font-size="11">${s.name}</text>`);
    });
    return out.join('\n');
  };
  const ttMax = Math.max(10, ...rows.flatMap((r) => [r.router.ttftP99, r.direct.ttftP99]).filter(Number.isFinite));
  const yT = 10 ** Math.ceil(Math.log10(ttMax));
  const left = panel(pad.l, 'Throughput', maxRate * 1.1, 'req/s', [
    { name: 'offered', color: '#999', dash: '4 3', pts: rows.map((r) => [r.rate, r.rate]) },
    { name: 'achieved via router', color: '#d62728', pts: rows.map((r) => [r.rate, r.router.achieved]) },
    { name: 'achieved direct', color: '#1f77b4', pts: rows.map((r) => [r.rate, r.direct.achieved]) },
  ]);
  const right = panel(pad.l + pw + 60 + 20, 'Time to first token (log scale)', yT, 'ms', [
    { name: 'router p99', color: '#d62728', pts: rows.map((r) => [r.rate, r.router.ttftP99]) },
    { name: 'router p50', color: '#d62728', dash: '4 3', pts: rows.map((r) => [r.rate, r.router.ttftP50]) },
    { name: 'direct p99', color: '#1f77b4', pts: rows.map((r) => [r.rate, r.direct.ttftP99]) },
    { name: 'direct p50', color: '#1f77b4', dash: '4 3', pts: rows.map((r) => [r.rate, r.direct.ttftP50]) },
  ], true);
  return `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
${left}
${right}
</svg>
`;
}

async function main(): Promise<void> {
  if (args.replot) {
    const saved = JSON.parse(readFileSync(args.replot, 'utf8')) as { rows: Row[] };
    process.stdout.write(`${table(saved.rows)}\n`);
    writeFileSync(args.svg!, svg(saved.rows));
    log(`chart: ${args.svg}`);
    return;
  }
  const mocks: MockVllm[] = [];
  let router: RouterHandle | undefined;
  try {
    for (let i = 1; i <= 4; i++) mocks.push(await startMockVllm({ id: `r${i}`, port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], decodeMsPerToken: 1, maxRunning: 512 }));
    router = await startRouter({ config: routerConfig({ replicas: mocks, overrides: { traceLog: false } }) });
    log(`router (Miniflare) on ${router.url}, workerd pids ${workerdPids().join(',') || '?'}; ${cpus().length} CPUs, load ${loadavg()[0]!.toFixed(1)}; steps of ${STEP_MS} ms at ${RATES.join(', ')} req/s`);
    const viaRouter: Target = { name: 'router', portFor: () => router!.port, headers: { authorization: `Bearer ${TEST_KEY}` } };
    const direct: Target = { name: 'direct', portFor: (s) => mocks[s % mocks.length]!.port, headers: { authorization: `Bearer ${TEST_ORIGIN_API_KEY}` } };
    // Warm up both paths (JIT, connections, the coordinator's first load).
    await runStep(viaRouter, 50, router);
    await runStep(direct, 50, router);
    const rows: Row[] = [];
    for (const rate of RATES) {
      const d = await runStep(direct, rate, router);
      const r = await runStep(viaRouter, rate, router);
      const row: Row = { rate, router: r, direct: d, saturated: saturation(r, d) };
      rows.push(row);
      log(`${rate} req/s: router ${f0(r.achieved)} ok/s, ${r.errors} errors, TTFT p50/p99 ${f1(r.ttftP50)}/${f1(r.ttftP99)} ms (direct ${f1(d.ttftP50)}/${f1(d.ttftP99)}), leases ${f0(r.leaseRate)}/s, coordinator RPCs ${f0(r.rpcRate ?? null)}/s (${Object.entries(r.rpcsByMethod ?? {}).map(([m, n]) => `${m} ${n}`).join(', ')}), workerd ${f1(r.workerdCpuMsPerReq)} CPU ms/req, ${f0(r.workerdRssMb)} MB${row.saturated ? ` — saturated: ${row.saturated}` : ''}`);
      if (row.saturated && !args['keep-going']) break;
    }
    // Sustainable: the last step before the first saturated one.
    const firstBad = rows.findIndex((r) => r.saturated);
    const best = firstBad === 0 ? 0 : rows[(firstBad < 0 ? rows.length : firstBad) - 1]!.rate;
    if (args.json) writeFileSync(args.json, JSON.stringify({ rows, sustainable: best, cpus: cpus().length }, null, 2) + '\n');
    {
      process.stdout.write(`${table(rows)}\n\nsustainable: ${best} req/s (the last step before the first saturated one: achieved < ${MIN_ACHIEVED * 100}% of offered, errors > ${MAX_ERROR_RATE * 100}% or p99 TTFT overhead > ${MAX_P99_OVERHEAD_MS} ms)\n`);
    }
    if (!args['no-svg']) {
      writeFileSync(args.svg!, svg(rows));
      log(`chart: ${args.svg}`);
    }
  } finally {
    await router?.close();
    await Promise.allSettled(mocks.map((m) => m.close()));
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`bench:load failed: ${(e as Error).stack ?? String(e)}\n`);
  process.exit(1);
});
