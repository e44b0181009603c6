// `npm run bench:haproxy`: the same recorded session workload through Debian's HAProxy and
// through the router (under Miniflare, test/helpers/router.ts), in front of the same 8 mock vLLM
// replicas on loopback. Per configuration: requests per backend max÷mean, peak in-flight per
// backend max÷mean, sessions split across backends, turns on the session's main backend, TTFT
// p50/p95 (client-measured) and the mocks' prefix-cache hit rate. Prints the table on stdout,
// progress on stderr, and writes docs/haproxy.svg. `-- --write` also replaces the "HAProxy side
// by side" section of docs/benchmarks.md (keeping its hand-written "### Reading").
// `-- --configs haproxy-150,router-1.5:2` runs a subset (names as in the table's first column).
// Loopback only; each configuration ≤ 40 s, the whole run < 8 minutes.

import { execSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { routerConfig, startMocks, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY } from '../test/helpers/router.js';
import { renderChart, type ChartPoint } from './bench/haproxy-chart.js';
import { haproxyVersion, startHaproxy, type HaproxyBalance } from './bench/haproxy-process.js';
import { replay, summarize, type ReplayMetrics, type ReplayTarget } from './bench/session-replay.js';
import { makeWorkload, type WorkloadOptions } from './bench/session-workload.js';
import type { MockVllm } from '../tools/mock-engine/index.js';
import { giveUpAfter, runMain, writeBenchSection } from './lib/bench-docs.js';
import { progress } from './lib/progress.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SECTION = '## HAProxy side by side (npm run bench:haproxy)';
const MODEL = 'demo-model';
const REPLICAS = 8;
/** Stop sending new turns after this, abort what is left GRACE_MS later. */
const DEADLINE_MS = 36_000;
const GRACE_MS = 4_000;
const TOTAL_BUDGET_MS = 8 * 60_000;
/** Requests per backend and peak in-flight ratios within this count as "the same spread". */
const SAME_SPREAD = 0.02;

const WORKLOAD: WorkloadOptions = {
  seed: 1,
  sessions: 200,
  totalRequests: 2_500,
  paretoAlpha: 1.5,
  maxTurns: 50,
  meanThinkS: 0.25,
  meanMaxTokens: 12,
  targetInFlight: 8,
  // The mocks' decode and prefill speeds plus the timer and proxy overhead seen on the dev
  // machine; only the calibration of the start window uses it.
  model: { overheadMs: 3, decodeMs: 4.3, prefillTokensPerSec: 50_000, cachedShare: 0.6 },
};
/**
 * 4 ms per token (vLLM's default mock speed is 2): the same request time with half the SSE
 * chunks, so the proxies' per-chunk CPU weighs less on a small shared machine.
 */
const DECODE_MS_PER_TOKEN = 4;
/** A run that saw more than this × the target in flight was slowed by other load: run it again (once, budget permitting) and keep the calmer run. */
const DISTURBED = 1.5;
const MAX_RERUNS = 3;

interface Config {
  name: string;
  group: ChartPoint['group'];
  haproxy?: HaproxyBalance;
  strategy?: string;
}

const CONFIGS: Config[] = [
  { name: 'haproxy-125', group: 'haproxy', haproxy: { kind: 'hash', factor: 125 } },
  { name: 'haproxy-150', group: 'haproxy', haproxy: { kind: 'hash', factor: 150 } },
  { name: 'haproxy-200', group: 'haproxy', haproxy: { kind: 'hash', factor: 200 } },
  { name: 'haproxy-leastconn', group: 'least', haproxy: { kind: 'leastconn' } },
  { name: 'router-1.25', group: 'router', strategy: 'bounded-hash:1.25' },
  { name: 'router-1.5', group: 'router', strategy: 'bounded-hash:1.5' },
  { name: 'router-2', group: 'router', strategy: 'bounded-hash:2' },
  { name: 'router-1.25:2', group: 'router-slack', strategy: 'bounded-hash:1.25:2' },
  { name: 'router-1.5:2', group: 'router-slack', strategy: 'bounded-hash:1.5:2' },
  { name: 'router-1.5:3', group: 'router-slack', strategy: 'bounded-hash:1.5:3' },
  { name: 'router-least-load', group: 'least', strategy: 'least-load' },
  // The router's default strategy.
  { name: 'router-prefix-aware', group: 'router-slack', strategy: 'prefix-aware:1.25:3' },
];

/**
 * Run order: HAProxy and router alternate, so a burst of load from other jobs on the machine
 * hits both sides rather than one. The table keeps the order of CONFIGS.
 */
const RUN_ORDER = [
  'haproxy-150', 'router-1.5', 'router-1.5:3', 'haproxy-125', 'router-1.25', 'router-1.25:2',
  'haproxy-200', 'router-2', 'router-1.5:2', 'haproxy-leastconn', 'router-least-load', 'router-prefix-aware',
];

const log = (msg: string) => process.stderr.write(`bench:haproxy ${msg}\n`);
/** A run's progress: redrawn on a terminal, a line at most every 5 s in a log. */
const live = progress({ label: 'bench:haproxy' });

function describe(c: Config): string {
  if (c.haproxy) return c.haproxy.kind === 'leastconn' ? 'HAProxy `balance leastconn`' : `HAProxy \`hdr(X-Session-Id)\` consistent, factor ${c.haproxy.factor}`;
  return `router \`${c.strategy}\``;
}

interface Row {
  config: Config;
  m: ReplayMetrics;
  hitRate: number;
  /** 1-minute load average right after the run. */
  load: number;
  /** Set when the run was disturbed by other load and repeated: the other run's in flight at sends (the row keeps the less disturbed one). */
  rerunOf?: number;
}

async function warmUp(t: ReplayTarget): Promise<void> {
  // A few requests so the runtime, the Durable Object and the connections are warm; not measured.
  const body = JSON.stringify({ model: MODEL, stream: true, max_tokens: 4, messages: [{ role: 'user', content: 'warm up' }] });
  for (let round = 0; round < 3; round++) {
    await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        const res = await fetch(`http://127.0.0.1:${t.port}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-session-id': `warmup-${i}`, ...t.headers },
          body,
          signal: AbortSignal.timeout(10_000),
        });
        await res.arrayBuffer();
        if (res.status !== 200) throw new Error(`warm-up request: status ${res.status}`);
      }),
    );
  }
}

async function runOne(c: Config, mocks: MockVllm[], w: ReturnType<typeof makeWorkload>): Promise<Row> {
  let target: ReplayTarget;
  let stop: () => Promise<void>;
  if (c.haproxy) {
    const h = await startHaproxy(
      c.haproxy,
      mocks.map((m) => ({ name: m.id, port: m.port })),
    );
    target = { port: h.port, headers: { authorization: `Bearer ${TEST_ORIGIN_API_KEY}` }, backendHeader: 'x-backend' };
    stop = h.stop;
  } else {
    const r = await startRouter({
      config: routerConfig({
        replicas: mocks,
        strategy: c.strategy,
        overrides: { traceLog: false },
        poolOverrides: { healthIntervalMs: 2_000 },
      }),
    });
    target = { port: r.port, headers: { authorization: `Bearer ${TEST_KEY}` }, backendHeader: 'x-prefix-router-replica' };
    stop = r.close;
  }
  try {
    await warmUp(target);
    for (const m of mocks) m.reset();
    const res = await replay(w, target, {
      model: MODEL,
      deadlineMs: DEADLINE_MS,
      graceMs: GRACE_MS,
      onProgress: (sent, inFlight, s) => live.update(` ${c.name}: ${s.toFixed(0)} s, ${sent}/${w.requests} sent, ${inFlight} in flight`),
    });
    live.done();
    if (res.firstError) log(`  ${c.name}: ${res.errors} errors, first: ${res.firstError}`);
    const m = summarize(
      res,
      mocks.map((x) => x.id),
    );
    let hits = 0;
    let queries = 0;
    for (const x of mocks) {
      const s = x.stats();
      hits += s.prefixCache.hitsTokens;
      queries += s.prefixCache.queriesTokens;
    }
    return { config: c, m, hitRate: queries > 0 ? hits / queries : NaN, load: loadavg()[0]! };
  } finally {
    await stop();
  }
}

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;

function table(rows: Row[]): string {
  const out = [
    '| configuration | what | req max÷mean | peak in-flight max÷mean | highest peak | sessions split | turns on main | TTFT p50 ms | TTFT p95 ms | mean request ms | cache hit | in flight at sends | requests | errors | wall s | load |',
    '|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
  ];
  for (const { config: c, m, hitRate, load, rerunOf } of rows) {
    out.push(
      `| ${c.name}${rerunOf !== undefined ? ` (ran twice; the other run: ${rerunOf.toFixed(1)} in flight)` : ''} | ${describe(c)} | ${m.reqSpread.toFixed(2)} | ${m.peakSpread.toFixed(2)} | ${m.peakMax} | ${pct(m.split)} | ${pct(m.main)} | ` +
        `${m.ttftP50.toFixed(1)} | ${m.ttftP95.toFixed(1)} | ${m.meanDurationMs.toFixed(0)} | ${pct(hitRate)} | ${m.inFlightAtSends.toFixed(1)} | ${m.requests} | ${m.errors + m.notSent} | ${m.wallS.toFixed(1)} | ${load.toFixed(1)} |`,
    );
  }
  return out.join('\n');
}

/** Per HAProxy hash configuration: the stickiest router configuration at the same or better spread. */
function goal(rows: Row[]): { text: string; met: boolean } {
  const lines = [
    '| HAProxy | its split | its req / peak max÷mean | stickiest router config at same or better spread (±' + SAME_SPREAD + ') | its split | ≤ ⅕ of HAProxy? |',
    '|---|--:|--:|---|--:|---|',
  ];
  let met = false;
  for (const h of rows.filter((r) => r.config.haproxy?.kind === 'hash')) {
    const candidates = rows
      .filter((r) => r.config.strategy && r.m.reqSpread <= h.m.reqSpread + SAME_SPREAD && r.m.peakSpread <= h.m.peakSpread + SAME_SPREAD)
      .sort((a, b) => a.m.split - b.m.split);
    const best = candidates[0];
    const ok = best !== undefined && best.m.split <= h.m.split / 5;
    met ||= ok;
    lines.push(
      `| ${h.config.name} | ${pct(h.m.split)} | ${h.m.reqSpread.toFixed(2)} / ${h.m.peakSpread.toFixed(2)} | ` +
        (best ? `${best.config.name} (${best.m.reqSpread.toFixed(2)} / ${best.m.peakSpread.toFixed(2)}) | ${pct(best.m.split)} | ${ok ? 'yes' : 'no'} |` : 'none | | no |'),
    );
  }
  return { text: lines.join('\n'), met };
}

function machine(): string {
  let commit = 'unknown';
  try {
    commit = execSync('git rev-parse --short HEAD', { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
  } catch {
    // not a git checkout
  }
  return `${cpus().length} CPUs (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Node ${process.version}, commit ${commit}`;
}

function logRow(row: Row): void {
  const m = row.m;
  log(
    `  ${row.config.name}: split ${pct(m.split)}, req ${m.reqSpread.toFixed(2)}, peak ${m.peakSpread.toFixed(2)}, TTFT p95 ${m.ttftP95.toFixed(1)} ms, mean ${m.meanDurationMs.toFixed(0)} ms, ` +
      `hit ${pct(row.hitRate)}, ${m.inFlightAtSends.toFixed(1)} in flight, ${m.requests} ok, ${m.errors} errors, ${m.wallS.toFixed(1)} s, load ${row.load.toFixed(1)}`,
  );
}

async function main(): Promise<void> {
  const { values: args } = parseArgs({ options: { write: { type: 'boolean', default: false }, configs: { type: 'string' } } });
  const wanted = args.configs?.split(',').map((s) => s.trim());
  const order = (c: Config) => (RUN_ORDER.includes(c.name) ? RUN_ORDER.indexOf(c.name) : RUN_ORDER.length);
  const configs = (wanted ? CONFIGS.filter((c) => wanted.includes(c.name)) : CONFIGS).slice().sort((a, b) => order(a) - order(b));
  if (configs.length === 0) throw new Error(`no configuration matches --configs (known: ${CONFIGS.map((c) => c.name).join(', ')})`);
  const version = haproxyVersion();
  if (!version && configs.some((c) => c.haproxy)) throw new Error('haproxy is not installed (Debian: apt-get install -y haproxy)');
  giveUpAfter(TOTAL_BUDGET_MS + 30_000, log);

  const t0 = Date.now();
  const w = makeWorkload(WORKLOAD);
  const turns = w.sessions.map((s) => s.turns.length).sort((a, b) => a - b);
  log(
    `workload: ${w.sessions.length} sessions, ${w.requests} requests (turns median ${turns[turns.length >> 1]}, max ${turns[turns.length - 1]}), ` +
      `start window ${w.windowS.toFixed(1)} s, estimated ${w.estInFlight.toFixed(1)} in flight, makespan ${w.estMakespanS.toFixed(1)} s`,
  );
  log(`${version ?? 'haproxy: not needed'}; starting ${REPLICAS} mock replicas`);
  const mocks = await startMocks(REPLICAS, { models: [MODEL], decodeMsPerToken: DECODE_MS_PER_TOKEN });
  const rows: Row[] = [];
    try {
    let reruns = 0;
    for (let i = 0; i < configs.length; i++) {
      const c = configs[i]!;
      if (Date.now() - t0 > TOTAL_BUDGET_MS - 45_000) {
        log(`skipping ${c.name}: the ${TOTAL_BUDGET_MS / 60_000}-minute budget is nearly spent`);
        continue;
      }
      log(`${c.name}: ${describe(c)}`);
      let row = await runOne(c, mocks, w);
      logRow(row);
      const left = configs.length - i - 1;
      if (row.m.inFlightAtSends > DISTURBED * WORKLOAD.targetInFlight && reruns < MAX_RERUNS && Date.now() - t0 + (left + 1) * 36_000 < TOTAL_BUDGET_MS - 30_000) {
        reruns++;
        log(`  ${c.name}: ${row.m.inFlightAtSends.toFixed(1)} in flight (> ${DISTURBED} × ${WORKLOAD.targetInFlight}, load ${row.load.toFixed(1)}): other load slowed it; running it once more`);
        const again = await runOne(c, mocks, w);
        logRow(again);
        // Keep the less disturbed of the two and say so in the table.
        if (again.m.inFlightAtSends < row.m.inFlightAtSends) row = { ...again, rerunOf: row.m.inFlightAtSends };
        else row = { ...row, rerunOf: again.m.inFlightAtSends };
      }
      rows.push(row);
    }
  } finally {
    await Promise.allSettled(mocks.map((m) => m.close()));
  }

  const when = new Date().toISOString().slice(0, 10);
  const inFlights = rows.map((r) => r.m.inFlightAtSends);
  const ref = rows.find((r) => r.config.name === 'haproxy-150');
  rows.sort((a, b) => CONFIGS.indexOf(a.config) - CONFIGS.indexOf(b.config));
  const g = goal(rows);
  const chart = renderChart(
    rows.map((r) => ({ label: r.config.name, group: r.config.group, split: r.m.split, reqSpread: r.m.reqSpread, peakSpread: r.m.peakSpread })),
    'Sessions split vs load spread: HAProxy 2.6 and prefix-router, same workload, same 8 backends',
    `${w.sessions.length} sessions, ${w.requests} streaming requests, calibrated for ${WORKLOAD.targetInFlight} in flight (measured at the sends: ` +
      `${Math.min(...inFlights).toFixed(1)}-${Math.max(...inFlights).toFixed(1)}); npm run bench:haproxy, ${when}`,
    ref ? { label: ref.config.name, split: ref.m.split, reqSpread: ref.m.reqSpread, peakSpread: ref.m.peakSpread } : undefined,
  );
  writeFileSync(join(ROOT, 'docs/haproxy.svg'), chart);
  log('wrote docs/haproxy.svg');

  const out = [
    SECTION,
    '',
    '```sh',
    'npm run bench:haproxy -- --write',
    '```',
    '',
    `${when}; ${machine()}; ${version ?? 'HAProxy not run'} (Debian package, \`nbthread 1\`, \`option http-no-delay\`, no health checks). 1-minute load average after each run in the last column (other jobs shared the machine). Total ${((Date.now() - t0) / 1000).toFixed(0)} s.`,
    '',
    `Workload (\`scripts/bench/session-workload.ts\`, seed ${WORKLOAD.seed}, generated once and replayed identically against every configuration): ${w.sessions.length} sessions, ${w.requests} streaming chat requests; turn counts Pareto (α ${WORKLOAD.paretoAlpha}, capped at ${WORKLOAD.maxTurns} so the longest session fits the window); each turn sends the whole history (a shared ~230-token system prompt, a per-session document of 100-300 tokens, then every user message of 20-150 tokens and the assistant's streamed answer), \`max_tokens\` exponential with mean ${WORKLOAD.meanMaxTokens}; think time exponential, mean ${WORKLOAD.meanThinkS * 1000} ms, from the end of an answer to the next turn; sessions start at seeded points of a ${w.windowS.toFixed(1)} s window such that each still ends inside it, the window calibrated for ≈ ${WORKLOAD.targetInFlight} requests in flight. Backends: ${REPLICAS} mock vLLM replicas (\`tools/mock-engine/index.ts\`: ${DECODE_MS_PER_TOKEN} ms/token decode, and the defaults: 50k tokens/s prefill of uncached tokens, 2,048-block (32k-token) prefix cache, 8 running slots) over plain HTTP on 127.0.0.1, reset before each run. HAProxy: \`balance hdr(X-Session-Id)\` + \`hash-type consistent\` (default sdbm hash, no avalanche) + \`hash-balance-factor\`, or \`balance leastconn\`; its \`http-response set-header X-Backend %s\` names the server. Router: Miniflare (\`test/helpers/router.ts\`), key \`header:x-session-id\`, its \`x-prefix-router-replica\` header names the replica.`,
    '',
    `Columns: requests per backend and per-backend peak concurrent requests (client-side: a request counts from send to the end of its stream, on the backend its response names) as max ÷ mean over the 8 backends; sessions split = share of sessions served by more than one backend; turns on main = share of requests on their session's most used backend; TTFT from request start to the first content event, measured by the client; cache hit = prefix-cache hit tokens ÷ prompt tokens summed over the mocks; in flight at sends = mean number of the client\'s outstanding requests seen by each new request (as \`scripts/stickiness.ts\`); errors include turns not sent before the 36 s deadline; a run that saw more than ${DISTURBED} × the target in flight (other jobs slowing the machine) is run once more and the less disturbed of the two is kept and marked.`,
    '',
    table(rows),
    '',
    '![sessions split vs load spread](haproxy.svg)',
    '',
    `Goal: at the same or better spread (requests max÷mean and peak in-flight max÷mean, each within ${SAME_SPREAD}), the router splits at most a fifth of HAProxy's split sessions: **${g.met ? 'met' : 'not met'}**.`,
    '',
    g.text,
    '',
  ].join('\n');
  process.stdout.write(out + '\n');
  log(`goal ${g.met ? 'met' : 'NOT met'}`);
  if (args.write) {
    writeBenchSection(SECTION, out, { keepReading: true });
    log('wrote docs/benchmarks.md');
  }
}

runMain(main, log);
