// `npm run demo:traffic`: drive multi-turn chat sessions against the local router (`npm start`)
// twice, once through the round-robin pool and once through bounded-hash on x-session-id, and
// print per-replica prefix-cache hit rate and TTFT for each. Talks only to 127.0.0.1.
import { DEV_TENANTS } from './lib/dev-credentials.js';
import { reportPerReplica, requireRouter, type DemoSample, type DemoSummary } from './lib/demo-report.js';
import { progress } from './lib/progress.js';

interface Args {
  router: string;
  sessions: number;
  turns: number;
  concurrency: number;
  mockPorts: number[];
}

function parseArgs(argv: string[]): Args {
  const a: Args = { router: 'http://127.0.0.1:8787', sessions: 32, turns: 6, concurrency: 8, mockPorts: [9001, 9002, 9003, 9004] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--router': a.router = v!; i++; break;
      case '--sessions': a.sessions = Number(v); i++; break;
      case '--turns': a.turns = Number(v); i++; break;
      case '--concurrency': a.concurrency = Number(v); i++; break;
      case '--mock-ports': a.mockPorts = v!.split(',').map(Number); i++; break;
      case '--help':
        console.log('usage: npm run demo:traffic -- [--router URL] [--sessions 32] [--turns 6] [--concurrency 8] [--mock-ports 9001,9002,9003,9004]');
        process.exit(0);
    }
  }
  return a;
}

type Sample = DemoSample;

const WORDS = 'alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango'.split(' ');

function documentFor(session: number): string {
  // Each session chats about its own ~1,500-token document, as a support or RAG chat would.
  let s = `You are a helpful assistant. Answer questions about document #${session}.\n`;
  let x = session * 2654435761;
  while (s.length < 6000) {
    x = (x * 1103515245 + 12345) >>> 0;
    s += WORDS[x % WORDS.length] + ' ';
  }
  return s;
}

async function turn(args: Args, pool: string, session: number, messages: { role: string; content: string }[]): Promise<{ sample: Sample; reply: string }> {
  const started = performance.now();
  const res = await fetch(`${args.router}/v1/chat/completions`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${DEV_TENANTS[0].key}`,
      'content-type': 'application/json',
      'x-session-id': `demo-${session}`,
      'x-pool': pool,
    },
    body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: 24, stream_options: { include_usage: true }, messages }),
  });
  if (!res.ok || !res.body) throw new Error(`router answered ${res.status}: ${await res.text()}`);
  const replica = res.headers.get('x-prefix-router-replica') ?? '?';
  let ttftMs = -1;
  let reply = '';
  let promptTokens = 0;
  let cachedTokens = 0;
  let buf = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = event.replace(/^data: /, '');
      if (data === '[DONE]') continue;
      const j = JSON.parse(data) as { choices: { delta?: { content?: string } }[]; usage?: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } };
      const content = j.choices[0]?.delta?.content;
      if (content) {
        if (ttftMs < 0) ttftMs = performance.now() - started;
        reply += content;
      }
      if (j.usage) {
        promptTokens = j.usage.prompt_tokens;
        cachedTokens = j.usage.prompt_tokens_details?.cached_tokens ?? 0;
      }
    }
  }
  return { sample: { replica, ttftMs, promptTokens, cachedTokens }, reply };
}

async function runPool(args: Args, pool: string, label: string): Promise<Sample[]> {
  // Fresh caches for a fair comparison.
  await Promise.all(args.mockPorts.map((p) => fetch(`http://127.0.0.1:${p}/_mock/reset`, { method: 'POST' }).catch(() => undefined)));
  const samples: Sample[] = [];
  const total = args.sessions * args.turns;
  let next = 0;
  const bar = progress({ label: 'demo:traffic' });
  const worker = async () => {
    for (;;) {
      const s = next++;
      if (s >= args.sessions) return;
      const messages = [{ role: 'system', content: documentFor(s) }];
      for (let t = 0; t < args.turns; t++) {
        messages.push({ role: 'user', content: `Question ${t + 1} about document ${s}: what does section ${t + 1} say?` });
        const { sample, reply } = await turn(args, pool, s, messages);
        messages.push({ role: 'assistant', content: reply });
        samples.push(sample);
        bar.update(`${label}: ${samples.length}/${total} requests`);
      }
    }
  };
  await Promise.all(Array.from({ length: args.concurrency }, worker));
  bar.step(`${label}: ${samples.length}/${total} requests`);
  return samples;
}

const report = (label: string, samples: Sample[]): DemoSummary => reportPerReplica(label, samples);

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  await requireRouter(args.router);
  console.log(`${args.sessions} chat sessions × ${args.turns} turns, ${args.concurrency} at a time, each with its own ~1,500-token document`);
  const rr = report('round-robin (pool chat-rr)', await runPool(args, 'chat-rr', 'round-robin'));
  const bh = report('bounded-hash:1.25 on x-session-id (pool chat)', await runPool(args, 'chat', 'bounded-hash'));
  const pa = report('prefix-aware (pool chat-prefix)', await runPool(args, 'chat-prefix', 'prefix-aware'));
  const line = (label: string, r: DemoSummary) =>
    `${label.padEnd(14)} hit rate ${(r.hit * 100).toFixed(1).padStart(5)}%   TTFT p50 ${r.p50.toFixed(1).padStart(6)} ms   p95 ${r.p95.toFixed(1).padStart(6)} ms`;
  console.log(`\n${line('round-robin', rr)}\n${line('bounded-hash', bh)}\n${line('prefix-aware', pa)}`);
}

main().catch((e: unknown) => {
  console.error(`demo:traffic failed: ${(e as Error).message}`);
  process.exit(1);
});
