// `npm run bench:fairness`: overload without collapse (issue #29). A pool of four mock vLLM
// replicas with 4 running sequences each (`--max-num-seqs 4`, a FIFO waiting queue behind them),
// a ~1,200-token prompt and 16 output tokens at 30 ms per token, so the pool saturates at a few
// dozen requests per second; three routers under Miniflare (as `npm start` runs the Worker) in
// front of the same replicas: two baselines routed as today (no per-replica bound: the engines'
// FIFO queues; `maxInFlightPerReplica: 4` with `flowControl.enabled: false`: 503 at the bound) and
// flow control on. Tenants come from TENANT_KEYS with their fair-share weight and priority band.
// Flow control runs twice: work-conserving (every free slot to the queue's next request), and with
// one slot kept for tenants below their fair share and for the bands above low (`shareReserve: 1`,
// the low band's `headroom: 1`). Answers are 8-24 tokens long (16 on average), as real answers
// differ in length; `--fixed-length` sends 16 for every request, whose ends then come in convoys.
// Scenarios, each run through both baselines and then through flow control, in the same run:
//   - noisy neighbour: Q steady at 80% of its share, alone and then while N bursts at 10× its share;
//   - two tenants bursting: equal weights (one sending twice the other's rate), then weights 3:1;
//   - priorities: a high-band tenant's steady traffic on an idle pool, then under a low-band flood.
// Each goal printed MET or MISSED with its measured value, the baseline's beside it; progress on
// stderr (a line per step, redrawn on a terminal); the chart in docs/fairness.svg; `--write`
// records the section of docs/benchmarks.md. Only 127.0.0.1; bounded in requests and time.

import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { parseConfig, type RouterConfigInput } from '../src/config.js';
import { routerConfig, startRouter, TEST_ORIGIN_API_KEY, type RouterHandle } from '../test/helpers/router.js';
import { startMockPool, type PooledMock } from './bench/mock-pool.js';
import { renderFairnessChart, type ChartPanel } from './bench/fairness-chart.js';
import {
  arrivals,
  backoffMs,
  errorStatuses,
  errors,
  goalLine,
  nominalCapacity,
  noisyGoals,
  percentile,
  priorityGoal,
  shareGoal,
  shares,
  throughput,
  ttfts,
  ttftsCountingFailures,
  verdict,
  type Goal,
  type RequestRecord,
} from './bench/fairness-goals.js';
import { emitBenchReport, giveUpAfter, runMain, writeBenchSection } from './lib/bench-docs.js';
import { frontier } from './bench/reserve-frontier.js';
import { sha256Hex } from './lib/dev-credentials.js';
import { progress } from './lib/progress.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SECTION = '## Fairness under overload (npm run bench:fairness)';

const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '8' },
    write: { type: 'boolean', default: false },
    svg: { type: 'string' },
    'no-svg': { type: 'boolean', default: false },
    'release-flush-ms': { type: 'string' },
    'fixed-length': { type: 'boolean', default: false },
    reserve: { type: 'string' },
    headroom: { type: 'string' },
    'max-num-seqs': { type: 'string' },
    preempt: { type: 'string', default: 'streams' },
    model: { type: 'boolean', default: false },
    'trace-dir': { type: 'string' },
    help: { type: 'boolean', short: 'h', default: false },
  },
});
if (args.help) {
  process.stdout.write(`usage: npm run bench:fairness -- [--seconds N] [--write] [--svg FILE | --no-svg] [--release-flush-ms N]
  --seconds N   length of each phase (default 8, 3..30); the whole run takes about 25 N s
  --write       record the results in docs/benchmarks.md
  --svg FILE    where the chart goes (default docs/fairness.svg); --no-svg: none
  --release-flush-ms N   the routers' releaseFlushMs (default: the router's default)
  --fixed-length   every answer MAX_TOKENS long (default: 8-24 tokens, 16 on average)
  --reserve N   the reserve run's shareReserve (default 1, 0..8)
  --headroom N  the reserve run's low-band headroom (default 3, 0..8)
  --preempt MODE   the reserve run's preemption: streams (default: flowControl.preempt and preemptStreams,
                slots taken back before a first token and from streams past it, paused and continued),
                first-token (preempt only), off
  --model       print the noisy-neighbour scenario's idealised queueing model (reserve against both goals) and exit
  --trace-dir DIR   write each router's trace lines per phase there (fairness-<mode>-<phase>.jsonl)
  --max-num-seqs N   each mock replica's running sequences, and the routers' per-replica bound (default 4, 2..64)
`);
  process.exit(0);
}
if (args.model) {
  printModel();
  process.exit(0);
}
const PHASE_MS = Math.min(30, Math.max(3, Number(args.seconds) || 8)) * 1000;
/** Throughput and shares are read after the queues filled: from this far into a phase to its end. */
const WARM_MS = Math.min(2_000, PHASE_MS / 4);
const REQUEST_TIMEOUT_MS = 20_000;
const RELEASE_FLUSH_MS = args['release-flush-ms'] === undefined ? undefined : Math.min(5_000, Math.max(0, Math.round(Number(args['release-flush-ms']) || 0)));

// The pool: 4 replicas × 4 slots; ~1,200 prompt tokens at 10,000 tokens/s (120 ms of prefill) and
// 16 output tokens at 30 ms each: ~570 ms a request, so ~28 requests/s for the pool.
const REPLICAS = 4;
const MAX_NUM_SEQS = args['max-num-seqs'] === undefined ? 4 : Math.min(64, Math.max(2, Math.round(Number(args['max-num-seqs']) || 4)));
const SLOTS = REPLICAS * MAX_NUM_SEQS;
/**
 * `--preempt MODE`: how the reserve run takes slots back for tenants below their share. `streams`
 * (the default; flowControl.preempt and preemptStreams): before a first token, and from streams
 * past it, paused and continued when their tenant's turn comes; `first-token` (preempt only), `off`.
 * Measured 2026-12-05 (docs/benchmarks.md): only `streams` brings Q's p99 under 1.5×; before the
 * first token alone rarely finds a victim (N's youngest requests are mostly past it).
 */
const PREEMPT_MODE = args.preempt === 'off' || args.preempt === 'first-token' ? args.preempt : 'streams';
if (args.preempt !== PREEMPT_MODE) {
  process.stderr.write(`bench:fairness: --preempt ${args.preempt}: one of streams, first-token, off\n`);
  process.exit(2);
}
const PREEMPT_STREAMS = PREEMPT_MODE === 'streams';
const PREEMPT = PREEMPT_MODE !== 'off';
const DECODE_MS = 30;
const PREFILL_TOKENS_PER_SEC = 10_000;
/** The mean answer length; each request asks for MAX_TOKENS ± LENGTH_SPREAD (uniform) unless --fixed-length. */
const MAX_TOKENS = 16;
const LENGTH_SPREAD = args['fixed-length'] ? 0 : 8;
const PROMPT_CHARS = 4_800; // 4 characters a mock token: ~1,200 tokens
/** The bands of the flow-control pool: waits bounded under the router's first-token timeout. */
const BANDS = [
  { name: 'high', maxQueueMs: 3_000, maxQueueLength: 128 },
  { name: 'normal', maxQueueMs: 3_000, maxQueueLength: 128 },
  { name: 'low', maxQueueMs: 3_000, maxQueueLength: 128 },
];
const slotsArg = (v: string | undefined, fallback: number) => (v === undefined ? fallback : Math.min(8, Math.max(0, Math.round(Number(v) || 0))));
/**
 * The reserve run: slots kept for tenants below their fair share (1), and for the bands above low
 * (3 of the 16: a high request arriving while one or two are starting still finds one). Measured
 * 2026-12-04 (docs/benchmarks.md): reserve 2 brought Q's p99 down further but cost N a fifth of
 * what Q leaves; headroom 1 left the high band at 1.2-1.6× its idle p99.
 */
const RESERVE = slotsArg(args.reserve, 1);
const HEADROOM = slotsArg(args.headroom, 3);
const BANDS_RESERVE = BANDS.map((b) => (b.name === 'low' && HEADROOM > 0 ? { ...b, headroom: HEADROOM } : b));

interface BenchTenant {
  id: string;
  key: string;
  weight?: number;
  priority?: string;
  priorities?: string[];
}
const rnd = () => Math.random().toString(36).slice(2, 12);
const TENANTS: Record<string, BenchTenant> = Object.fromEntries(
  (
    [
      { id: 'cal' },
      { id: 'q' },
      { id: 'n' },
      { id: 'a' },
      { id: 'b' },
      { id: 'w3', weight: 3 },
      { id: 'w1', weight: 1 },
      { id: 'hi', priority: 'high', priorities: ['high', 'normal'] },
      { id: 'lo', priority: 'low', priorities: ['low'] },
    ] as Omit<BenchTenant, 'key'>[]
  ).map((t) => [t.id, { ...t, key: `sk-bench-fair-${t.id}-${rnd()}` }]),
);

/** TENANT_KEYS with each tenant's weight and bands (src/http/tenant-records.ts); only key hashes. */
function tenantKeys(): string {
  const out: { tenants: Record<string, object>; keys: Record<string, object> } = { tenants: {}, keys: {} };
  for (const t of Object.values(TENANTS)) {
    out.tenants[t.id] = { pools: ['*'], allowPoolHeader: false, ...(t.weight ? { weight: t.weight } : {}), ...(t.priority ? { priority: t.priority } : {}), ...(t.priorities ? { priorities: t.priorities } : {}) };
    out.keys[sha256Hex(t.key)] = { tenant: t.id, keyId: `bench-${t.id}` };
  }
  return JSON.stringify(out);
}

const log = (msg: string) => process.stderr.write(`bench:fairness ${msg}\n`);
const bar = progress({ label: 'bench:fairness' });
const t0 = performance.now();
const now = () => performance.now() - t0;

/**
 * The three routers, baselines first: `fifo` (no per-replica bound, flow control off: every request
 * goes to a replica and waits in its FIFO, the router's default pool), `off` (the bound, flow
 * control off: at the bound a 503), `on` (the bound and the edge queue).
 */
type Mode = 'fifo' | 'off' | 'on' | 'reserve';
const MODES: readonly Mode[] = ['fifo', 'off', 'on', 'reserve'];
const MODE_LABEL: Record<Mode, string> = { fifo: 'no bound (engine FIFO)', off: `bound ${MAX_NUM_SEQS}, flow control off`, on: 'flow control, work-conserving', reserve: `flow control, reserve ${RESERVE}, headroom ${HEADROOM}${PREEMPT_STREAMS ? ', preempt streams' : PREEMPT ? ', preempt' : ''}` };
const MODE_COLOR: Record<Mode, string> = { fifo: '#f59f00', off: '#adb5bd', on: '#74c0fc', reserve: '#1c7ed6' };
const byMode = <T>(f: () => T): Record<Mode, T> => ({ fifo: f(), off: f(), on: f(), reserve: f() });
const records: Record<Mode, RequestRecord[]> = byMode(() => []);
let sequence = 0;

/** One streamed chat request: TTFT at the first content delta, ok when the stream ended with [DONE]. */
async function send(router: RouterHandle, tenant: string, phase: string, headers: Record<string, string> = {}): Promise<RequestRecord> {
  const n = sequence++;
  const startMs = now();
  let ttftMs: number | null = null;
  let status = 0;
  let ok = false;
  let retryAfterMs: number | null = null;
  try {
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TENANTS[tenant]!.key}`, 'content-type': 'application/json', 'x-session-id': `${tenant}-${n}`, ...headers },
      // A unique start, so no request reuses another's prefix cache: every one costs a full prefill.
      body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: MAX_TOKENS - LENGTH_SPREAD + Math.floor(Math.random() * (2 * LENGTH_SPREAD + 1)), messages: [{ role: 'user', content: `Request ${n} of ${tenant}. ${'Summarise the incident log line by line. '.repeat(PROMPT_CHARS / 41)}` }] }),
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    status = res.status;
    const ra = res.headers.get('retry-after');
    if (ra !== null && Number.isFinite(Number(ra))) retryAfterMs = Number(ra) * 1000;
    if (status !== 200 || !res.body) {
      await res.arrayBuffer().catch(() => {});
    } else {
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      let done = false;
      let failed = false;
      while (!done) {
        const chunk = await reader.read();
        if (chunk.done) break;
        buf += decoder.decode(chunk.value, { stream: true });
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') {
            done = true;
            break;
          }
          try {
            const ev = JSON.parse(data) as { error?: unknown; choices?: { delta?: { content?: string } }[] };
            if (ev.error) failed = true;
            if (ttftMs === null && ev.choices?.[0]?.delta?.content) ttftMs = now() - startMs;
          } catch {
            failed = true;
          }
        }
      }
      ok = done && !failed && ttftMs !== null;
    }
  } catch {
    ok = false;
  }
  return { tenant, phase, startMs, ttftMs, endMs: now(), status, ok, retryAfterMs };
}

/**
 * A tenant's traffic in a phase: open loop (`times`: sends at those offsets, whatever happens), or
 * closed loop (`clients`: each sends again when its last request ended, after the refusal's
 * Retry-After when it was refused, until the phase ends).
 */
type Stream = { tenant: string; headers?: Record<string, string> } & ({ times: number[] } | { clients: number });
const BACKOFF = { floorMs: 250, capMs: 2_000, fallbackMs: 1_000 };

/** Send every stream's requests at their times from now; resolves when all have finished. */
async function runPhase(mode: Mode, router: RouterHandle, phase: string, streams: Stream[]): Promise<{ fromMs: number; toMs: number }> {
  const start = now();
  let finished = 0;
  let failed = 0;
  const pending: Promise<void>[] = [];
  const one = async (s: Stream): Promise<RequestRecord> => {
    const rec = await send(router, s.tenant, phase, s.headers);
    records[mode].push(rec);
    finished++;
    if (!rec.ok) failed++;
    return rec;
  };
  const tick = setInterval(() => bar.update(`${phase} [${MODE_LABEL[mode]}]: ${finished} done, ${failed} failed, ${(now() - start) / 1000 | 0} s`), 250);
  try {
    for (const s of streams) {
      if ('times' in s) {
        for (const at of s.times) pending.push(new Promise<void>((r) => setTimeout(r, at)).then(() => one(s).then(() => {})));
        continue;
      }
      for (let c = 0; c < s.clients; c++) {
        pending.push(
          (async () => {
            // Bounded: the phase's length, and at most one request per client in flight.
            while (now() - start < PHASE_MS) {
              const rec = await one(s);
              if (!rec.ok) await new Promise((r) => setTimeout(r, Math.min(backoffMs(rec.retryAfterMs, BACKOFF), Math.max(0, PHASE_MS - (now() - start)))));
            }
          })(),
        );
      }
    }
    await Promise.all(pending);
  } finally {
    clearInterval(tick);
  }
  bar.step(`${phase} [${MODE_LABEL[mode]}]: ${finished} requests, ${failed} failed, ${((now() - start) / 1000).toFixed(1)} s`);
  return { fromMs: start + WARM_MS, toMs: start + PHASE_MS };
}

/** Between phases: nothing running or waiting on any replica, no lease in the router. */
async function settle(mocks: PooledMock[], router: RouterHandle): Promise<void> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const stats = await Promise.all(mocks.map((m) => m.stats()));
    const busy = stats.reduce((a, s) => a + s.running + s.waiting, 0);
    const snap = (await (await router.adminFetch('/admin/pools/chat')).json()) as { replicas: { inFlight: number }[] };
    const leased = snap.replicas.reduce((a, r) => a + r.inFlight, 0);
    if (busy === 0 && leased === 0) return;
    if (Date.now() > deadline) throw new Error(`the pool did not go idle between phases: ${busy} sequences on the replicas, ${leased} leases`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Closed loop: `clients` at once, each sending its next request when the last ended, for `ms`. */
async function calibrate(mocks: PooledMock[], router: RouterHandle, clients: number, ms: number): Promise<{ measured: number; promptTokens: number }> {
  await Promise.all(mocks.map((m) => m.reset()));
  const start = now();
  const recs: RequestRecord[] = [];
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (now() - start < ms) recs.push(await send(router, 'cal', 'calibrate'));
    }),
  );
  await settle(mocks, router);
  const stats = await Promise.all(mocks.map((m) => m.stats()));
  const promptTokens = stats.reduce((a, st) => a + st.promptTokensTotal, 0) / Math.max(1, stats.reduce((a, st) => a + st.completionRequestsTotal, 0));
  const c = throughput(recs, 'cal', start + 1_000, start + ms);
  bar.step(`calibration: ${clients} clients back to back for ${ms / 1000} s: ${c.toFixed(1)} requests/s (${recs.filter((r) => !r.ok).length} failed), ${promptTokens.toFixed(0)} prompt tokens a request`);
  return { measured: c, promptTokens };
}

function config(mode: Mode, mocks: readonly { id: string; url: string }[]): RouterConfigInput {
  return routerConfig({
    replicas: mocks,
    strategy: 'bounded-hash:1.25',
    keys: ['header:x-session-id'],
    // Health checks that a loaded 2-core machine does not fail (the tests' 300 ms timeout would
    // take replicas out mid-burst and turn the run into 503s that are no one's policy).
    poolOverrides: {
      healthIntervalMs: 2_000,
      healthTimeoutMs: 1_500,
      fall: 3,
      ...(mode === 'fifo' ? {} : { maxInFlightPerReplica: MAX_NUM_SEQS }),
      flowControl: mode === 'on' ? { enabled: true, bands: BANDS, defaultBand: 'normal' } : mode === 'reserve' ? { enabled: true, bands: BANDS_RESERVE, defaultBand: 'normal', shareReserve: RESERVE, preempt: PREEMPT, preemptStreams: PREEMPT_STREAMS } : { enabled: false },
    },
    // The trace line carries each request's wait in the coordinator's queue (queueMs): read per phase.
    // The router's own timeouts, not the tests' short ones (an engine's queue may hold a request for seconds).
    overrides: { traceLog: true, firstTokenTimeoutMs: 60_000, idleTimeoutMs: 60_000, clientStallMs: 10_000, ...(RELEASE_FLUSH_MS !== undefined ? { releaseFlushMs: RELEASE_FLUSH_MS } : {}) },
  });
}

interface ModeResult {
  capacity: number;
  noisy: { qAloneP50: number; qAloneP99: number; qBurstP50: number; qBurstP99: number; qErrors: number; qErrorStatuses: Record<string, number>; qThroughput: number; nThroughput: number; nErrors: number; nErrorStatuses: Record<string, number> };
  equal: { shareA: number; errorsA: Record<string, number>; errorsB: Record<string, number> };
  weighted: { shareW3: number; errorsW3: Record<string, number>; errorsW1: Record<string, number> };
  priority: { idleP50: number; idleP99: number; fullP50: number; fullP99: number; hiErrors: number; loErrors: Record<string, number> };
  peakEngineWaiting: number;
  /** Per phase and tenant: the router's queueMs (trace line) of its served requests. */
  queueMs: Record<string, Record<string, number[]>>;
  /** The router's refusals over all phases, by status and the trace line's error reason. */
  refusals: Record<string, number>;
  goals: Goal[];
}

async function main(): Promise<void> {
  giveUpAfter(Math.max(6, (40 * PHASE_MS) / 60_000) * 60_000, log);
  // A router without the feature strips the unknown field: its 'on' runs route as today.
  const onProbe = parseConfig(config('on', [{ id: 'probe', url: 'http://127.0.0.1:9' }])).pools[0] as unknown as Record<string, unknown>;
  const built = onProbe.flowControl !== undefined;
  if (!built) log('NOTE: this build has no flowControl pool setting (src/config.ts); the flow-control runs route as today');

  // The replicas in a process of their own: the client's hundreds of requests a second must not
  // delay their prefill and decode timers, nor they the client's TTFT readings.
  const pool = await startMockPool(REPLICAS, { apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], maxRunning: MAX_NUM_SEQS, decodeMsPerToken: DECODE_MS, prefillTokensPerSec: PREFILL_TOKENS_PER_SEC, profile: 'vllm' });
  const mocks = pool.mocks;
  const routers: Partial<Record<Mode, RouterHandle>> = {};
  const results: Partial<Record<Mode, ModeResult>> = {};
  const engineCapacity = (promptTokens: number) => nominalCapacity({ replicas: REPLICAS, maxNumSeqs: MAX_NUM_SEQS, promptTokens, prefillTokensPerSec: PREFILL_TOKENS_PER_SEC, maxTokens: MAX_TOKENS, decodeMsPerToken: DECODE_MS });
  let nominal = engineCapacity(PROMPT_CHARS / 4);
  let measured = NaN;
  try {
    const secrets = { TENANT_KEYS: tenantKeys() };
    for (const m of MODES) routers[m] = await startRouter({ config: config(m, mocks), secrets });
    for (const m of MODES) await settle(mocks, routers[m]!);
    log(`pool: ${REPLICAS} mock replicas × ${MAX_NUM_SEQS} slots, ~${PROMPT_CHARS / 4} prompt tokens (prefill ${PREFILL_TOKENS_PER_SEC} tokens/s), ${MAX_TOKENS} output tokens at ${DECODE_MS} ms: nominal capacity ${nominal.toFixed(1)} requests/s; phases of ${PHASE_MS / 1000} s`);
    const cal = await calibrate(mocks, routers.off!, REPLICAS * MAX_NUM_SEQS, 5_000);
    // The engines' capacity with the prompt as the mocks counted it (the chat template adds some):
    // what "the capacity Q leaves" is measured against. The calibrated rate (the router's and the
    // client's gaps between requests included) sets the steady senders' rates.
    nominal = engineCapacity(cal.promptTokens);
    measured = cal.measured;
    const C = measured;
    const peak: Record<Mode, number> = byMode(() => 0);
    const queueMs: Record<Mode, Record<string, Record<string, number[]>>> = byMode(() => ({}));
    const refusals: Record<Mode, Record<string, number>> = byMode(() => ({}));
    const phase = async (mode: Mode, name: string, streams: Stream[]) => {
      await Promise.all(mocks.map((m) => m.reset()));
      const router = routers[mode]!;
      router.logs.length = 0;
      const w = await runPhase(mode, router, name, streams);
      const byTenant: Record<string, number[]> = {};
      for (const l of router.traceLines()) {
        if (l.status === 200) (byTenant[String(l.tenant)] ??= []).push(typeof l.queueMs === 'number' ? l.queueMs : 0);
        else {
          const why = `${String(l.status)} ${typeof l.error === 'string' ? l.error : ''}`.trim();
          refusals[mode][why] = (refusals[mode][why] ?? 0) + 1;
        }
      }
      queueMs[mode][name] = byTenant;
      // Each request's trace line (queueMs, preempted, replica, attempts), for a closer look at one phase.
      if (args['trace-dir']) mkdirSync(args['trace-dir'], { recursive: true });
      if (args['trace-dir']) writeFileSync(resolve(args['trace-dir'], `fairness-${mode}-${name.replace('/', '-')}.jsonl`), router.traceLines().map((l) => JSON.stringify({ ...l, blocks: undefined })).join('\n') + '\n');
      router.logs.length = 0;
      peak[mode] = Math.max(peak[mode], (await Promise.all(mocks.map((m) => m.stats()))).reduce((a, st) => a + st.peakWaiting, 0));
      await settle(mocks, routers[mode]!);
      return w;
    };
    const steady = (rate: number) => arrivals('steady', rate, PHASE_MS, 0);
    const windows: Record<string, Record<Mode, { fromMs: number; toMs: number }>> = {};
    const keep = (name: string, mode: Mode, w: { fromMs: number; toMs: number }) => ((windows[name] ??= {} as Record<Mode, { fromMs: number; toMs: number }>)[mode] = w);

    // Noisy neighbour: Q steady at 80% of its half of the pool's rate; N keeps 10× its half of
    // the pool's slots asking (80 clients back to back, honouring Retry-After when refused).
    for (const mode of MODES) keep('noisy/alone', mode, await phase(mode, 'noisy/alone', [{ tenant: 'q', times: steady(0.4 * C) }]));
    for (const mode of MODES) keep('noisy/burst', mode, await phase(mode, 'noisy/burst', [{ tenant: 'q', times: steady(0.4 * C) }, { tenant: 'n', clients: 5 * SLOTS }]));
    // Two tenants bursting, equal weights: a with twice b's clients, both above their half.
    for (const mode of MODES) keep('equal', mode, await phase(mode, 'equal', [{ tenant: 'a', clients: 2 * SLOTS }, { tenant: 'b', clients: SLOTS }]));
    // Weights 3:1, as many clients each, both above their share.
    for (const mode of MODES) keep('weighted', mode, await phase(mode, 'weighted', [{ tenant: 'w3', clients: 2 * SLOTS }, { tenant: 'w1', clients: 2 * SLOTS }]));
    // Priorities: the high band's steady traffic on an idle pool, then with the low band keeping
    // twice the pool's slots asking.
    const high = { 'x-prefix-router-priority': 'high' };
    for (const mode of MODES) keep('priority/idle', mode, await phase(mode, 'priority/idle', [{ tenant: 'hi', times: steady(0.2 * C), headers: high }]));
    for (const mode of MODES) keep('priority/full', mode, await phase(mode, 'priority/full', [{ tenant: 'hi', times: steady(0.2 * C), headers: high }, { tenant: 'lo', clients: 2 * SLOTS }]));

    for (const mode of MODES) {
      const r = records[mode];
      const wb = windows['noisy/burst']![mode];
      const qA = ttfts(r, 'q', 'noisy/alone');
      const qB = ttfts(r, 'q', 'noisy/burst');
      const noisy = {
        qAloneP50: percentile(qA, 0.5),
        qAloneP99: percentile(qA, 0.99),
        qBurstP50: percentile(qB, 0.5),
        qBurstP99: percentile(qB, 0.99),
        qErrors: errors(r, 'q', 'noisy/burst'),
        qErrorStatuses: errorStatuses(r, 'q', 'noisy/burst'),
        qThroughput: throughput(r.filter((x) => x.phase === 'noisy/burst'), 'q', wb.fromMs, wb.toMs),
        nThroughput: throughput(r.filter((x) => x.phase === 'noisy/burst'), 'n', wb.fromMs, wb.toMs),
        nErrors: errors(r, 'n', 'noisy/burst'),
        nErrorStatuses: errorStatuses(r, 'n', 'noisy/burst'),
      };
      const we = windows.equal![mode];
      const ww = windows.weighted![mode];
      const shareA = shares(r.filter((x) => x.phase === 'equal'), ['a', 'b'], we.fromMs, we.toMs).a!;
      const shareW3 = shares(r.filter((x) => x.phase === 'weighted'), ['w3', 'w1'], ww.fromMs, ww.toMs).w3!;
      const pI = ttfts(r, 'hi', 'priority/idle');
      const pF = ttfts(r, 'hi', 'priority/full');
      const priority = { idleP50: percentile(pI, 0.5), idleP99: percentile(pI, 0.99), fullP50: percentile(pF, 0.5), fullP99: percentile(pF, 0.99), hiErrors: errors(r, 'hi', 'priority/full') + errors(r, 'hi', 'priority/idle'), loErrors: errorStatuses(r, 'lo', 'priority/full') };
      const goals = [
        // TTFT goals count a failed request as never answered (Infinity): refusing cannot pass them.
        ...noisyGoals({ qAloneP99: percentile(ttftsCountingFailures(r, 'q', 'noisy/alone'), 0.99), qBurstP99: percentile(ttftsCountingFailures(r, 'q', 'noisy/burst'), 0.99), qErrors: noisy.qErrors, qThroughput: noisy.qThroughput, nThroughput: noisy.nThroughput, capacity: nominal }),
        shareGoal("equal weights: a's share (a sends 2× b's rate)", shareA, [1, 1]),
        shareGoal("weights 3:1: w3's share", shareW3, [3, 1]),
        priorityGoal(percentile(ttftsCountingFailures(r, 'hi', 'priority/idle'), 0.99), percentile(ttftsCountingFailures(r, 'hi', 'priority/full'), 0.99)),
      ];
      results[mode] = {
        capacity: nominal,
        noisy,
        equal: { shareA, errorsA: errorStatuses(r, 'a', 'equal'), errorsB: errorStatuses(r, 'b', 'equal') },
        weighted: { shareW3, errorsW3: errorStatuses(r, 'w3', 'weighted'), errorsW1: errorStatuses(r, 'w1', 'weighted') },
        priority,
        peakEngineWaiting: peak[mode],
        queueMs: queueMs[mode],
        refusals: refusals[mode],
        goals,
      };
    }
  } finally {
    bar.done();
    await Promise.allSettled(Object.values(routers).map((r) => r!.close()));
    await pool.close();
  }
  report(results as Record<Mode, ModeResult>, measured, built);
}

function benchFlags(): string {
  const f = [...(args.seconds !== '8' ? [`--seconds ${args.seconds}`] : []), ...(args['fixed-length'] ? ['--fixed-length'] : []), ...(RELEASE_FLUSH_MS !== undefined ? [`--release-flush-ms ${RELEASE_FLUSH_MS}`] : []), ...(args.reserve !== undefined ? [`--reserve ${RESERVE}`] : []), ...(args.headroom !== undefined ? [`--headroom ${HEADROOM}`] : []), ...(args['max-num-seqs'] !== undefined ? [`--max-num-seqs ${MAX_NUM_SEQS}`] : []), ...(PREEMPT_MODE !== 'streams' ? [`--preempt ${PREEMPT_MODE}`] : [])];
  return f.length ? ` -- ${f.join(' ')}` : '';
}

const ms = (v: number) => (Number.isFinite(v) ? `${v.toFixed(0)} ms` : 'n/a');
const pc = (v: number) => (Number.isFinite(v) ? `${(100 * v).toFixed(1)}%` : 'n/a');
const statuses = (s: Record<string, number>) => {
  const e = Object.entries(s);
  return e.length === 0 ? '0' : e.map(([k, v]) => `${v} × ${k === '0' ? 'no answer' : k}`).join(', ');
};

const waits = (r: ModeResult, phase: string, tenant: string) => {
  const xs = r.queueMs[phase]?.[tenant] ?? [];
  return xs.length === 0 ? 'n/a' : `${ms(percentile(xs, 0.5))} / ${ms(percentile(xs, 0.99))}`;
};

function report(res: Record<Mode, ModeResult>, measured: number, built: boolean): void {
  const off = res.off;
  const on = res.on;
  const best = res.reserve;
  const row = (what: string, f: (r: ModeResult) => string, goal = '') => `| ${what} | ${MODES.map((m) => f(res[m])).join(' | ')} | ${goal} |`;
  const table = [
    `| measure | ${MODE_LABEL.fifo} (baseline) | ${MODE_LABEL.off} (baseline) | ${MODE_LABEL.on} | ${MODE_LABEL.reserve} | goal |`,
    '| --- | --- | --- | --- | --- | --- |',
    row("noisy: Q's TTFT p50 / p99, Q alone", (r) => `${ms(r.noisy.qAloneP50)} / ${ms(r.noisy.qAloneP99)}`),
    row("noisy: Q's TTFT p50 / p99, while N bursts", (r) => `${ms(r.noisy.qBurstP50)} / ${ms(r.noisy.qBurstP99)}`, 'p99 ≤ 1.5× alone'),
    row("noisy: Q's wait in the router's queue p50 / p99, while N bursts (trace queueMs)", (r) => waits(r, 'noisy/burst', 'q')),
    row("noisy: Q's failed requests during the burst", (r) => statuses(r.noisy.qErrorStatuses), '0'),
    row('noisy: completed requests/s in the burst, Q / N', (r) => `${r.noisy.qThroughput.toFixed(1)} / ${r.noisy.nThroughput.toFixed(1)}`, `N ≥ 90% of capacity − Q`),
    row("noisy: N's refused requests", (r) => statuses(r.noisy.nErrorStatuses)),
    row("equal weights: a's share (a sends 2× b's rate); refused a / b", (r) => `${pc(r.equal.shareA)}; ${statuses(r.equal.errorsA)} / ${statuses(r.equal.errorsB)}`, '50 ± 5%'),
    row("weights 3:1: w3's share; refused w3 / w1", (r) => `${pc(r.weighted.shareW3)}; ${statuses(r.weighted.errorsW3)} / ${statuses(r.weighted.errorsW1)}`, '75 ± 5%'),
    row("priority: high band's TTFT p50 / p99, idle pool", (r) => `${ms(r.priority.idleP50)} / ${ms(r.priority.idleP99)}`),
    row("priority: high band's TTFT p50 / p99, pool full of low", (r) => `${ms(r.priority.fullP50)} / ${ms(r.priority.fullP99)}`, 'p99 ≤ 1.2× idle'),
    row("priority: high band's wait in the router's queue p50 / p99, pool full", (r) => waits(r, 'priority/full', 'hi')),
    row("priority: high band's failed requests; low band's refused", (r) => `${r.priority.hiErrors}; ${statuses(r.priority.loErrors)}`),
    row("the router's refusals in all phases, by reason (trace line)", (r) => statuses(r.refusals)),
    row(`replicas' own waiting queue, deepest (Σ over the ${REPLICAS})`, (r) => String(r.peakEngineWaiting)),
  ].join('\n');
  // The headline is the reserve run; work-conserving flow control and the baselines beside it.
  const goalLines = best.goals.map((g, i) => goalLine({ ...g, name: `${g.name}, ${MODE_LABEL.reserve}` }, [{ name: MODE_LABEL.on, goal: on.goals[i]! }, { name: MODE_LABEL.fifo, goal: res.fifo.goals[i]! }, { name: MODE_LABEL.off, goal: off.goals[i]! }]));
  const [l1, l5] = loadavg();
  const svgPath = args['no-svg'] ? null : resolve(args.svg ?? resolve(ROOT, 'docs/fairness.svg'));
  if (svgPath) writeFileSync(svgPath, chart(res));
  const out = [
    SECTION,
    '',
    `\`npm run bench:fairness${benchFlags()}\` (${new Date().toISOString().slice(0, 10)}, ${cpus().length} cores, load average ${l1!.toFixed(1)} / ${l5!.toFixed(1)}; phases of ${PHASE_MS / 1000} s).`,
    `A pool of ${REPLICAS} mock vLLM replicas with \`--max-num-seqs ${MAX_NUM_SEQS}\` (a FIFO waiting queue behind the slots, as vLLM's scheduler), a`,
    `~${PROMPT_CHARS / 4}-token prompt (prefill ${PREFILL_TOKENS_PER_SEC.toLocaleString('en')} tokens/s) and ${LENGTH_SPREAD ? `${MAX_TOKENS - LENGTH_SPREAD}-${MAX_TOKENS + LENGTH_SPREAD} output tokens (uniform, ${MAX_TOKENS} on average)` : `${MAX_TOKENS} output tokens for every request`} at ${DECODE_MS} ms each, behind`,
    'four routers under Miniflare, each pool bounded-hash on a per-request session id: two baselines routed as today,',
    `**no bound** (the default pool: every request goes to a replica and waits in its FIFO) and **bound ${MAX_NUM_SEQS}**`,
    `(\`maxInFlightPerReplica: ${MAX_NUM_SEQS}\` with \`flowControl.enabled: false\`: at the bound a 503), and flow control (the`,
    'bound and the edge queue; bands of 3 s and 128 requests) twice: **work-conserving** (the defaults: every free slot to',
    `the queue's next request) and **reserve ${RESERVE}** (\`shareReserve: ${RESERVE}\`: a tenant holding its fair share leaves the last`,
    `${RESERVE === 1 ? 'free slot' : `${RESERVE} free slots`} to tenants below theirs; the low band's \`headroom: ${HEADROOM}\`${PREEMPT ? '; `preempt: true`: with every slot taken, a tenant below its share takes the slot of the youngest request of a tenant over its share that has sent no token yet, which queues again' : ''}${PREEMPT_STREAMS ? ', or, past its first token, pauses and is continued once its tenant\'s turn comes (`preemptStreams: true`)' : ''}). Router timeouts are its defaults.`,
    `Capacity: the engines' ${off.capacity.toFixed(1)} requests/s (${SLOTS} slots ÷ prefill and decode of one request), ${measured.toFixed(1)} measured through the`,
    `router with ${SLOTS} clients back to back (the gaps between requests included); steady rates below are shares of the`,
    'measured one, "the capacity Q leaves" is the engines\'. Tenants from',
    `TENANT_KEYS. Q sends steadily at 80% of its half of the pool's rate; N bursts with 10× its half of the ${SLOTS} slots`,
    `(${5 * SLOTS} clients back to back); a (${2 * SLOTS} clients) and b (${SLOTS}) have equal weights; w3 (weight 3) and w1 have ${2 * SLOTS} clients each;`,
    `hi (band high) sends steadily at 0.2× the pool's rate, alone and then against lo (band low, ${2 * SLOTS} clients). A client`,
    'refused waits its Retry-After (held to 0.25-2 s; 1 s without one) before it asks again. Throughput and shares count',
    `the requests completed after the first ${WARM_MS / 1000} s of a phase; streamed requests, TTFT at the first content token on the client;`,
    "the table's TTFTs are of the requests served, the goals count a failed request as never answered.",
    ...(built ? [] : ['', '**This build has no flow control** (`flowControl` is not a pool setting yet): the "on" column routes as today.']),
    '',
    table,
    '',
    ...goalLines,
    '',
    ...(svgPath ? ['![Q and the high band\'s TTFT p99, throughput shares, with the goals](fairness.svg)', ''] : []),
  ].join('\n');
  // A hand-written "### Reading" under the section survives a rewrite.
  emitBenchReport(SECTION, out.trimEnd(), goalLines, false, log);
  if (args.write) {
    writeBenchSection(SECTION, out.trimEnd(), { keepReading: true });
    log('wrote docs/benchmarks.md');
  }
  if (svgPath) log(`chart: ${svgPath}`);
  const met = (r: ModeResult) => r.goals.filter((g) => g.met).length;
  log(`${met(best)} of ${best.goals.length} goals MET with flow control and reserve ${RESERVE}, ${met(on)} work-conserving (baselines: ${met(res.fifo)} without a bound, ${met(off)} with it); ${best.goals.map(verdict).join(' ')}`);
}

function chart(res: Record<Mode, ModeResult>): string {
  const REF = '#e9ecef';
  // Per mode: the reference (alone / idle) and the loaded bar, the goal at factor × the reference.
  const pair = (f: (r: ModeResult) => [number, number], labels: [string, string], factor: number, note: (r: ModeResult) => string | undefined) =>
    MODES.map((m) => {
      const [ref, loaded] = f(res[m]);
      const n = note(res[m]);
      return {
        label: MODE_LABEL[m],
        bars: [
          { label: labels[0], value: ref, color: REF },
          { label: labels[1], value: loaded, color: MODE_COLOR[m], ...(n ? { note: n } : {}) },
        ],
        goal: { at: ref * factor },
      };
    });
  const one = (m: Mode, value: number) => ({ label: MODE_LABEL[m], value, color: MODE_COLOR[m] });
  const panels: ChartPanel[] = [
    { title: "Noisy neighbour: Q's TTFT p99 alone, and while N bursts", unit: 'ms', groups: pair((r) => [r.noisy.qAloneP99, r.noisy.qBurstP99], ['Q alone', 'Q while N bursts'], 1.5, (r) => (r.noisy.qErrors > 0 ? `${r.noisy.qErrors} failed` : undefined)) },
    {
      title: 'Noisy neighbour: N, % of the capacity Q leaves',
      unit: '%',
      max: 125,
      groups: [{ label: 'while N bursts', bars: MODES.map((m) => one(m, (100 * res[m].noisy.nThroughput) / (res[m].capacity - res[m].noisy.qThroughput))), goal: { at: 90 } }],
    },
    {
      title: "Two tenants bursting: first tenant's share",
      unit: '%',
      max: 100,
      groups: [
        { label: 'equal weights (a: 2× the clients)', bars: MODES.map((m) => one(m, 100 * res[m].equal.shareA)), goal: { from: 45, to: 55 } },
        { label: 'weights 3:1 (w3)', bars: MODES.map((m) => one(m, 100 * res[m].weighted.shareW3)), goal: { from: 70, to: 80 } },
      ],
    },
    { title: "Priorities: the high band's TTFT p99, idle pool and full", unit: 'ms', groups: pair((r) => [r.priority.idleP99, r.priority.fullP99], ['idle pool', 'pool full of low'], 1.2, (r) => (r.priority.hiErrors > 0 ? `${r.priority.hiErrors} failed` : undefined)) },
  ];
  return renderFairnessChart(panels, {
    title: 'npm run bench:fairness: overload without collapse (#29)',
    subtitle: `${REPLICAS} mock vLLM replicas × max_num_seqs ${MAX_NUM_SEQS}; two baselines routed as today, flow control work-conserving and with reserve ${RESERVE}; ${new Date().toISOString().slice(0, 10)}`,
    legend: [{ label: 'reference (alone / idle pool)', color: REF }, ...MODES.map((m) => ({ label: MODE_LABEL[m], color: MODE_COLOR[m] }))],
  });
}

/**
 * `--model`: the noisy-neighbour scenario without the router (scripts/bench/reserve-frontier.ts):
 * per pool size and share reserve, Q's wait p99 (its TTFT p99 ÷ alone) and N's share of what Q
 * leaves, each against its goal. What no non-preemptive admission policy can beat on this workload.
 */
function printModel(): void {
  const rows = frontier([16, 32, 64], 5).map((p) => {
    const q = p.qTtftRatio <= 1.5;
    const n = p.nShare >= 0.9;
    return `| ${p.slots} | ${p.reserve} | ${p.qWaitP50Ms.toFixed(0)} / ${p.qWaitP99Ms.toFixed(0)} | ${p.qTtftRatio.toFixed(2)}× ${q ? 'MET' : 'MISSED'} | ${(100 * p.nShare).toFixed(1)}% ${n ? 'MET' : 'MISSED'} | ${q && n ? 'both MET' : ''} |`;
  });
  process.stdout.write(
    [
      'Idealised model of the noisy-neighbour phase (Q Poisson at 40 % of capacity, N always waiting, 120 ms prefill, 8-24 tokens at 30 ms; a coordinator that costs nothing; 2,000 virtual seconds a row):',
      '',
      "| slots | reserve | Q's wait p50 / p99 (ms) | Q's TTFT p99 ÷ alone (goal ≤ 1.5×) | N of what Q leaves (goal ≥ 90 %) | |",
      '| ---: | ---: | ---: | --- | --- | --- |',
      ...rows,
      '',
    ].join('\n'),
  );
}

runMain(main, log);
