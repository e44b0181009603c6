// `npm run demo:responses`: an agent-style Responses API workload against the local router
// (`npm start`), per pool, with the per-replica prefix-cache hit rate and TTFT of each:
//   - stateful agents: each turn continues the last with `previous_response_id` (vLLM keeps the
//     conversation on the replica that made it); on the round-robin pool the router's pin is what
//     keeps every follow-up working, and the table counts follow-ups that reached another replica;
//   - stateless agents (as Codex sends them: `store: false`, the whole conversation as `input`
//     each turn, tools and instructions first), through round-robin, bounded-hash on the session
//     header and prefix-aware.
// Talks only to 127.0.0.1, through the official openai SDK; bounded in requests and time.
import OpenAI from 'openai';

import { reportPerReplica, requireRouter, type DemoSample, type DemoSummary } from './lib/demo-report.js';
import { DEV_TENANTS } from './lib/dev-credentials.js';

interface Args {
  router: string;
  agents: number;
  turns: number;
  concurrency: number;
  mockPorts: number[];
}

function parseArgs(argv: string[]): Args {
  const a: Args = { router: 'http://127.0.0.1:8787', agents: 16, turns: 6, concurrency: 8, mockPorts: [9001, 9002, 9003, 9004] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--router': a.router = v!; i++; break;
      case '--agents': a.agents = Number(v); i++; break;
      case '--turns': a.turns = Number(v); i++; break;
      case '--concurrency': a.concurrency = Number(v); i++; break;
      case '--mock-ports': a.mockPorts = v!.split(',').map(Number); i++; break;
      case '--help':
        console.log('usage: npm run demo:responses -- [--router URL] [--agents 16] [--turns 6] [--concurrency 8] [--mock-ports 9001,9002,9003,9004]');
        process.exit(0);
    }
  }
  for (const [k, v] of Object.entries({ agents: a.agents, turns: a.turns, concurrency: a.concurrency })) {
    if (!Number.isInteger(v) || v < 1 || v > 1000) throw new Error(`--${k} must be an integer in [1, 1000]`);
  }
  return a;
}

interface Sample extends DemoSample {
  /** A follow-up that reached another replica than its previous response's (stateful only). */
  strayed: boolean;
}

const TOOLS: OpenAI.Responses.Tool[] = ['read_file', 'write_file', 'run_tests', 'search_code'].map((name) => ({
  type: 'function',
  name,
  description: `${name.replace('_', ' ')} in the workspace. ${'Use it carefully and report what changed. '.repeat(6)}`,
  parameters: { type: 'object', properties: { path: { type: 'string' }, query: { type: 'string' } }, additionalProperties: false },
  strict: false,
}));
const INSTRUCTIONS = `You are a coding agent working in a repository. ${'Follow the repository conventions, keep changes small, and explain each step. '.repeat(20)}`;

function task(agent: number): string {
  const words = 'parser lexer cache router lease pool replica stream token index'.split(' ');
  let s = `Task #${agent}: `;
  let x = agent * 2654435761;
  while (s.length < 8000) {
    x = (x * 1103515245 + 12345) >>> 0;
    s += words[x % words.length] + ' ';
  }
  return s;
}

async function streamOne(client: OpenAI, body: OpenAI.Responses.ResponseCreateParamsStreaming, headers: Record<string, string>): Promise<{ id: string; text: string; sample: Omit<Sample, 'strayed'> }> {
  const started = performance.now();
  const { data: stream, response } = await client.responses.create(body, { headers }).withResponse();
  const replica = response.headers.get('x-prefix-router-replica') ?? '?';
  let ttftMs = -1;
  let text = '';
  let id = '';
  let usage: OpenAI.Responses.ResponseUsage | undefined;
  for await (const ev of stream) {
    if (ev.type === 'response.created') id = ev.response.id;
    else if (ev.type === 'response.output_text.delta') {
      if (ttftMs < 0) ttftMs = performance.now() - started;
      text += ev.delta;
    } else if (ev.type === 'response.completed' || ev.type === 'response.incomplete') usage = ev.response.usage;
  }
  return { id, text, sample: { replica, ttftMs, promptTokens: usage?.input_tokens ?? 0, cachedTokens: usage?.input_tokens_details.cached_tokens ?? 0 } };
}

async function run(args: Args, pool: string, label: string, stateful: boolean): Promise<Sample[]> {
  // Fresh caches (and stores) for a fair comparison.
  await Promise.all(args.mockPorts.map((p) => fetch(`http://127.0.0.1:${p}/_mock/reset`, { method: 'POST' }).catch(() => undefined)));
  const client = new OpenAI({ baseURL: `${args.router}/v1`, apiKey: DEV_TENANTS[0].key, maxRetries: 0, timeout: 30_000 });
  const samples: Sample[] = [];
  const total = args.agents * args.turns;
  const deadline = Date.now() + 120_000;
  let next = 0;
  const worker = async () => {
    for (;;) {
      const a = next++;
      if (a >= args.agents || Date.now() > deadline) return;
      const headers = { 'x-pool': pool, 'x-session-id': `agent-${a}` };
      let previous: { id: string; replica: string } | null = null;
      const input: OpenAI.Responses.ResponseInputItem[] = [];
      for (let t = 0; t < args.turns; t++) {
        const user: OpenAI.Responses.ResponseInputItem = { role: 'user', content: t === 0 ? task(a) : `Step ${t}: continue with the next file.` };
        input.push(user);
        const body: OpenAI.Responses.ResponseCreateParamsStreaming = stateful
          ? { model: 'demo-model', instructions: INSTRUCTIONS, tools: TOOLS, input: [user], max_output_tokens: 48, stream: true, ...(previous ? { previous_response_id: previous.id } : {}) }
          : { model: 'demo-model', instructions: INSTRUCTIONS, tools: TOOLS, input: [...input], max_output_tokens: 48, stream: true, store: false };
        const r = await streamOne(client, body, headers);
        input.push({ role: 'assistant', content: r.text });
        samples.push({ ...r.sample, strayed: previous !== null && previous.replica !== r.sample.replica });
        previous = { id: r.id, replica: r.sample.replica };
        if (samples.length % 8 === 0 || samples.length === total) process.stderr.write(process.stderr.isTTY ? `\r${label}: ${samples.length}/${total} requests` : `${label}: ${samples.length}/${total} requests\n`);
      }
    }
  };
  await Promise.all(Array.from({ length: args.concurrency }, worker));
  if (process.stderr.isTTY) process.stderr.write('\n');
  return samples;
}

function report(label: string, samples: Sample[], stateful: boolean): DemoSummary {
  return reportPerReplica(label, samples, stateful ? { header: 'follow-ups elsewhere', value: (xs) => String(xs.filter((s) => s.strayed).length) } : undefined);
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  await requireRouter(args.router);
  console.log(`${args.agents} agents × ${args.turns} turns, ${args.concurrency} at a time; 4 tools, ~1,200-token instructions, a ~2,000-token task each (its own repository context)`);
  const results: Array<[string, DemoSummary]> = [];
  results.push(['stateful, round-robin', report('stateful agents (previous_response_id), round-robin pool chat-rr: pinned by the router', await run(args, 'chat-rr', 'stateful/round-robin', true), true)]);
  results.push(['stateless, round-robin', report('stateless agents (full input, store: false), round-robin pool chat-rr', await run(args, 'chat-rr', 'stateless/round-robin', false), false)]);
  results.push(['stateless, bounded-hash', report('stateless agents, bounded-hash:1.25 on x-session-id (pool chat)', await run(args, 'chat', 'stateless/bounded-hash', false), false)]);
  results.push(['stateless, prefix-aware', report('stateless agents, prefix-aware (pool chat-prefix)', await run(args, 'chat-prefix', 'stateless/prefix-aware', false), false)]);
  console.log('');
  for (const [label, r] of results) console.log(`${label.padEnd(24)} hit rate ${(r.hit * 100).toFixed(1).padStart(5)}%   TTFT p50 ${r.p50.toFixed(1).padStart(6)} ms   p95 ${r.p95.toFixed(1).padStart(6)} ms`);
}

main().catch((e: unknown) => {
  console.error(`demo:responses failed: ${(e as Error).message}`);
  process.exit(1);
});
