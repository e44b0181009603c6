// `npm run bench:dp`: what pinning requests to data-parallel engines buys. Two identical mock
// vLLM servers with `--data-parallel-size 2` (a prefix cache and a scheduler per engine, vLLM's
// waiting × 4 + running balancer when no rank is sent), each behind its own router under
// Miniflare: one pool pins each request to an engine (the default), the other has
// `dataParallelPinning: false` (the baseline, measured in the same run). The same multi-turn chat
// sessions go through both, a few at a time, each session's turns one after the other; reported
// per pool: the prompt tokens the engines served from cache (from the responses' usage), and the
// request latency (non-streaming, so prefill dominates). Goals printed as MET or MISSED. Progress
// on stderr, the table on stdout, the section of docs/benchmarks.md rewritten (`--no-docs`: not).
// Only 127.0.0.1; bounded in requests and time.

import { cpus, loadavg } from 'node:os';
import { parseArgs } from 'node:util';

import { routerConfig, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../test/helpers/router.js';
import { startMockVllm, type MockVllm } from '../tools/mock-engine/index.js';
import { giveUpAfter, runMain, writeBenchSection } from './lib/bench-docs.js';
import { progress } from './lib/progress.js';

const { values: args } = parseArgs({
  options: {
    sessions: { type: 'string', default: '48' },
    turns: { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '8' },
    'no-docs': { type: 'boolean', default: false },
  },
});
const SESSIONS = Math.min(200, Math.max(2, Number(args.sessions)));
const TURNS = Math.min(20, Math.max(2, Number(args.turns)));
const CONCURRENCY = Math.min(32, Math.max(1, Number(args.concurrency)));
const REQUEST_TIMEOUT_MS = 20_000;
/** Goals: pinned over unpinned, same run. */
const GOAL_HIT_RATIO = 1.5;
const GOAL_P50_RATIO = 0.8;

const log = (msg: string) => process.stderr.write(`bench:dp ${msg}\n`);
const bar = progress({ label: 'bench:dp' });

interface Side {
  name: string;
  router: RouterHandle;
  mock: MockVllm;
  prompt: number;
  cached: number;
  latencies: number[];
  errors: number;
}

type Message = { role: 'system' | 'user' | 'assistant'; content: string };

async function chat(side: Side, session: string, messages: Message[]): Promise<string | null> {
  const started = performance.now();
  try {
    const res = await fetch(`${side.router.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', 'x-session-id': session },
      body: JSON.stringify({ model: 'demo-model', max_tokens: 6, messages }),
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    const body = (await res.json()) as { choices?: { message: { content: string } }[]; usage?: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } };
    if (res.status !== 200 || !body.choices) {
      side.errors++;
      return null;
    }
    side.latencies.push(performance.now() - started);
    side.prompt += body.usage?.prompt_tokens ?? 0;
    side.cached += body.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    return body.choices[0]!.message.content;
  } catch {
    side.errors++;
    return null;
  }
}

/**
 * One session's turns in order, agent-like: its own system prompt, then every turn brings a tool
 * output of ~1,200 characters (~300 tokens), so the history grows and is the session's only reuse.
 */
async function session(side: Side, k: number): Promise<void> {
  const id = `dp-bench-${k}`;
  const history: Message[] = [{ role: 'system', content: `Session ${k}: you are the assistant of a support desk; answer in one short sentence. `.repeat(6) }];
  for (let t = 0; t < TURNS; t++) {
    history.push({ role: 'user', content: `Tool output ${t} of session ${k}: ${`row ${t}.${k} of the ticket log, status open, owner on call; `.repeat(20)} What changed?` });
    const answer = await chat(side, id, history);
    if (answer === null) return;
    history.push({ role: 'assistant', content: answer });
  }
}

async function run(side: Side): Promise<void> {
  let next = 0;
  let finished = 0;
  const worker = async () => {
    while (next < SESSIONS) {
      const k = next++;
      await session(side, k);
      finished++;
      bar.update(`${side.name}: ${finished}/${SESSIONS} sessions, ${side.latencies.length} requests, ${side.errors} errors`);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  bar.step(`${side.name}: ${SESSIONS} sessions × ${TURNS} turns done (${side.errors} errors)`);
}

function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

async function start(name: string, pinning: boolean): Promise<Side> {
  // Prefill at 10,000 uncached tokens/s (a ~1,000-token prompt costs ~100 ms), so what the cache
  // saves shows in the latency; 8 running sequences per engine.
  // vLLM with --enable-prompt-tokens-details: the hit rate here is read from each answer's usage,
  // which carries the cached count only with that flag (tools/mock-engine/profiles.ts).
  const mock = await startMockVllm({ id: name, port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], dataParallelSize: 2, prefillTokensPerSec: 10_000, decodeMsPerToken: 1, profile: 'vllm-cache-report' });
  const router = await startRouter({
    discardLogs: true,
    config: routerConfig({
      replicas: [mock],
      strategy: 'prefix-aware',
      keys: ['header:x-session-id', 'prefix:4096'],
      poolOverrides: { scrapeIntervalMs: 500, ...(pinning ? {} : { dataParallelPinning: false }) },
      overrides: { traceLog: false },
    }),
  });
  return { name, router, mock, prompt: 0, cached: 0, latencies: [], errors: 0 };
}

async function main(): Promise<void> {
  giveUpAfter(10 * 60_000, log);
  const pinned = await start('pinned', true);
  const unpinned = await start('unpinned', false);
  try {
    // Both have scraped their mock's engines (the pinned pool shows them per engine).
    for (let i = 0; i < 100; i++) {
      const snap = (await (await pinned.router.adminFetch('/admin/pools/chat')).json()) as { replicas: { engines?: unknown[] }[] };
      if (snap.replicas[0]?.engines?.length === 2) break;
      if (i === 99) throw new Error('the pinned pool never saw two engines');
      await new Promise((r) => setTimeout(r, 100));
    }
    // Baseline first, then the change, on the same machine in the same run.
    await run(unpinned);
    await run(pinned);
  } finally {
    bar.done();
    await Promise.allSettled([pinned.router.close(), unpinned.router.close()]);
    await Promise.allSettled([pinned.mock.close(), unpinned.mock.close()]);
  }
  const row = (s: Side) => {
    const perEngine = s.mock.stats().engines!.map((e) => e.requests);
    return { hit: s.prompt > 0 ? s.cached / s.prompt : 0, p50: quantile(s.latencies, 0.5), p95: quantile(s.latencies, 0.95), requests: s.latencies.length, errors: s.errors, perEngine };
  };
  const a = row(unpinned);
  const b = row(pinned);
  const hitRatio = a.hit > 0 ? b.hit / a.hit : Infinity;
  const p50Ratio = b.p50 / a.p50;
  const fmt = (r: ReturnType<typeof row>, name: string) =>
    `| ${name} | ${r.requests} | ${r.errors} | ${(100 * r.hit).toFixed(1)}% | ${r.p50.toFixed(0)} ms | ${r.p95.toFixed(0)} ms | ${r.perEngine.join(' / ')} |`;
  const goals = [
    `- cached share of prompt tokens, pinned ÷ unpinned: ${hitRatio.toFixed(2)}× (goal ≥ ${GOAL_HIT_RATIO}×): ${hitRatio >= GOAL_HIT_RATIO ? 'MET' : 'MISSED'}`,
    `- p50 request latency, pinned ÷ unpinned: ${p50Ratio.toFixed(2)}× (goal ≤ ${GOAL_P50_RATIO}×): ${p50Ratio <= GOAL_P50_RATIO ? 'MET' : 'MISSED'}`,
    `- p95 request latency, pinned ÷ unpinned: ${(b.p95 / a.p95).toFixed(2)}× (no goal set)`,
  ];
  const table = [
    '| pool | requests | errors | cached share of prompt tokens | p50 latency | p95 latency | requests per engine (0 / 1) |',
    '| --- | --- | --- | --- | --- | --- | --- |',
    fmt(a, '`dataParallelPinning: false` (baseline)'),
    fmt(b, 'pinned (default)'),
  ].join('\n');
  process.stdout.write(`${table}\n\n${goals.join('\n')}\n`);
  if (args['no-docs']) return;
  const [l1, l5] = loadavg();
  writeBenchSection(
    '## Data-parallel engines (npm run bench:dp)',
    [
      '## Data-parallel engines (npm run bench:dp)',
      '',
      `\`npm run bench:dp\` (${SESSIONS} sessions × ${TURNS} turns, ${CONCURRENCY} sessions at a time; ${new Date().toISOString().slice(0, 10)}, ${cpus().length} cores, load average ${l1!.toFixed(1)} / ${l5!.toFixed(1)}).`,
      'Two mock vLLM servers with two data-parallel engines each (`--data-parallel-size 2`: a prefix cache and 8 running',
      "sequences per engine, vLLM's `waiting × 4 + running` balancer when no rank is sent, prefill 10,000 uncached tokens/s),",
      'each behind its own router in workerd: the same sessions through a pool that pins each request to an engine',
      '(docs/operations.md, "Data-parallel engines") and through one with `dataParallelPinning: false`, baseline first.',
      'Each session is agent-like: its own short system prompt, then a ~300-token tool output per turn, so its reuse is',
      'its own growing history; latency is the non-streamed request (prefill dominates).',
      '',
      table,
      '',
      ...goals,
    ].join('\n'),
    { keepReading: true },
  );
}

runMain(main, log);
