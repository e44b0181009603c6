// Synthetic workload classes for `npm run gen-trace`: seeded session models that operators
// meet (chat, agents, short prompts, skew, tenants, RAG, a mix), written in the simulator's
// JSONL format with 16-token block ids. Pure: returns records; the CLI writes them.
//
// Prompts are built from content segments (a system prompt, a tool list, a document, a user
// message, an assistant reply), each an id and a token count. A 16-token block's id is a
// chained hash of the segment pieces it covers and the block before it, as vLLM hashes token
// blocks, so two prompts share exactly the blocks of their common leading content.

import { fmix32, murmur3Round, type RandomSource } from '../src/core/index.js';
import { expRandom, intBetween, logNormal, mulberry32, zipfCdf, zipfIndex } from './rng.js';

export const WORKLOAD_CLASSES = ['multi-turn', 'agent', 'short', 'skewed', 'multi-tenant', 'rag', 'mix'] as const;
export type WorkloadClass = (typeof WORKLOAD_CLASSES)[number];

export interface GenOptions {
  readonly seed?: number;
  /** Cap on sessions started. */
  readonly sessions?: number;
  /** Sessions start within [0, duration) seconds. */
  readonly durationSec?: number;
  /** Session starts per second (for `short`: requests per second). */
  readonly rate?: number;
}

export interface TraceRecord {
  readonly timestamp: number;
  readonly input_length: number;
  readonly output_length: number;
  readonly hash_ids: number[];
  readonly block_tokens: 16;
  readonly session: string;
  readonly tenant: string;
}

interface Segment {
  readonly id: number;
  readonly tokens: number;
}

/** Defaults per class: session start rate (/s), window (s), and a sentence for the docs. */
export const CLASS_DEFAULTS: Record<WorkloadClass, { rate: number; durationSec: number; about: string }> = {
  'multi-turn': { rate: 0.5, durationSec: 600, about: 'one shared 1.5k-token system prompt; sessions of 1-30 turns (mean 8); the history grows by each user message (median 150 tokens) and reply (median 300); 30 s mean think time' },
  agent: { rate: 0.12, durationSec: 600, about: 'four agent types, each with its own 8-12k-token tool list; runs of 10-40 steps, each adding a tool result (median 600 tokens) and a short reply (median 120); 2 s mean gap; history compacted past 64k tokens' },
  short: { rate: 8, durationSec: 600, about: 'independent single requests: a 100-token shared system prompt and a user prompt of median 200 tokens; replies median 150' },
  skewed: { rate: 0.6, durationSec: 600, about: 'four agent runs of 200-400 steps (tool list 10k tokens) started in the first minute, among small 1-4-turn chat sessions' },
  'multi-tenant': { rate: 0.5, durationSec: 600, about: '8 tenants with Zipf(1.1) popularity, each with its own 2-6k-token system prompt; sessions of 1-10 turns' },
  rag: { rate: 1, durationSec: 600, about: '500 shared documents of 300-1500 tokens with Zipf(1.0) popularity; each request puts 4 retrieved documents after a 400-token system prompt; 1-3 turns' },
  mix: { rate: 1, durationSec: 600, about: 'multi-turn, agent, short, multi-tenant and rag together, each at a share of the rate' },
};

// Chained block hashing over segment pieces: two 32-bit MurmurHash3 lanes (the core's round and
// finalizer) → a 53-bit key, interned to a small id.
class BlockIds {
  private readonly map = new Map<number, number>();
  of(segments: readonly Segment[]): number[] {
    const out: number[] = [];
    let ca = 0x243f6a88;
    let cb = 0x85a308d3;
    let a = ca;
    let b = cb;
    let fill = 0;
    for (const s of segments) {
      let off = 0;
      while (off < s.tokens) {
        const take = Math.min(16 - fill, s.tokens - off);
        a = murmur3Round(murmur3Round(murmur3Round(a, s.id), off), take);
        b = murmur3Round(murmur3Round(murmur3Round(b, take), s.id), off);
        off += take;
        fill += take;
        if (fill === 16) {
          ca = fmix32(a ^ 16);
          cb = fmix32(b ^ 61);
          const key = (ca & 0x1fffff) * 4294967296 + cb;
          let id = this.map.get(key);
          if (id === undefined) this.map.set(key, (id = this.map.size + 1));
          out.push(id);
          a = ca;
          b = cb;
          fill = 0;
        }
      }
    }
    return out;
  }
}

const total = (segs: readonly Segment[]) => segs.reduce((s, x) => s + x.tokens, 0);
const clampInt = (x: number, lo: number, hi: number) => Math.max(lo, Math.min(hi, Math.round(x)));

interface Ctx {
  readonly random: RandomSource;
  readonly ids: BlockIds;
  readonly out: TraceRecord[];
  nextSeg: number;
  nextSession: number;
}

function seg(ctx: Ctx, tokens: number): Segment {
  return { id: ctx.nextSeg++, tokens: Math.max(1, Math.round(tokens)) };
}

function emit(ctx: Ctx, t: number, prompt: readonly Segment[], output: number, session: string, tenant: string): void {
  ctx.out.push({ timestamp: Math.round(t), input_length: total(prompt), output_length: output, hash_ids: ctx.ids.of(prompt), block_tokens: 16, session, tenant });
}

/** Rough time for a reply to come back, so a session's next turn does not overlap it. */
const replyMs = (outputTokens: number) => 800 + outputTokens * 20;

const MAX_CONTEXT = 64_000;

/** A conversation: shared prefix, then history that grows turn by turn. */
function conversation(ctx: Ctx, start: number, prefix: readonly Segment[], turns: number, userMedian: number, outMedian: number, thinkMeanMs: number, tenant: string, kind: string): void {
  const r = ctx.random;
  const session = `${kind}-${ctx.nextSession++}`;
  let history: Segment[] = [];
  let t = start;
  for (let k = 0; k < turns; k++) {
    const user = seg(ctx, clampInt(logNormal(r, userMedian, 0.8), 5, 8000));
    const output = clampInt(logNormal(r, outMedian, 0.6), 1, 2000);
    const prompt = [...prefix, ...history, user];
    emit(ctx, t, prompt, output, session, tenant);
    history.push(user, seg(ctx, output));
    if (total(prefix) + total(history) > MAX_CONTEXT) history = [seg(ctx, 1500)]; // compaction: a summary replaces the history
    t += replyMs(output) + expRandom(r, thinkMeanMs);
  }
}

function sessionStarts(ctx: Ctx, rate: number, durationSec: number, cap: number): number[] {
  const starts: number[] = [];
  let t = expRandom(ctx.random, 1000 / rate);
  while (t < durationSec * 1000 && starts.length < cap) {
    starts.push(t);
    t += expRandom(ctx.random, 1000 / rate);
  }
  return starts;
}

function geometricTurns(r: RandomSource, mean: number, max: number): number {
  return Math.min(max, 1 + Math.floor(expRandom(r, mean - 1 + 1e-9)));
}

type Builder = (ctx: Ctx, o: Required<GenOptions>) => void;

const multiTurn: Builder = (ctx, o) => {
  const system = [seg(ctx, 1500)];
  for (const s of sessionStarts(ctx, o.rate, o.durationSec, o.sessions)) conversation(ctx, s, system, geometricTurns(ctx.random, 8, 30), 150, 300, 30_000, 'default', 'chat');
};

function agentRun(ctx: Ctx, start: number, prefix: readonly Segment[], steps: number, kind: string): void {
  const r = ctx.random;
  const session = `${kind}-${ctx.nextSession++}`;
  let history: Segment[] = [seg(ctx, clampInt(logNormal(r, 300, 0.7), 20, 4000))]; // the task
  let t = start;
  for (let k = 0; k < steps; k++) {
    const output = clampInt(logNormal(r, 120, 0.6), 1, 1500);
    emit(ctx, t, [...prefix, ...history], output, session, 'default');
    history.push(seg(ctx, output), seg(ctx, clampInt(logNormal(r, 600, 1.0), 20, 8000))); // call, then the tool result
    if (total(prefix) + total(history) > MAX_CONTEXT) history = [seg(ctx, 2000)];
    t += replyMs(output) + expRandom(r, 2000);
  }
}

function agentTypes(ctx: Ctx, n: number, lo: number, hi: number): Segment[][] {
  return Array.from({ length: n }, () => [seg(ctx, 800), seg(ctx, intBetween(ctx.random, lo, hi))]);
}

const agent: Builder = (ctx, o) => {
  const types = agentTypes(ctx, 4, 8000, 12000);
  for (const s of sessionStarts(ctx, o.rate, o.durationSec, o.sessions)) agentRun(ctx, s, types[intBetween(ctx.random, 0, 3)]!, intBetween(ctx.random, 10, 40), 'agent');
};

const short: Builder = (ctx, o) => {
  const system = [seg(ctx, 100)];
  for (const s of sessionStarts(ctx, o.rate, o.durationSec, o.sessions)) {
    const r = ctx.random;
    emit(ctx, s, [...system, seg(ctx, clampInt(logNormal(r, 200, 0.8), 5, 4000))], clampInt(logNormal(r, 150, 0.6), 1, 1500), `short-${ctx.nextSession++}`, 'default');
  }
};

const skewed: Builder = (ctx, o) => {
  const tools = [seg(ctx, 800), seg(ctx, 10_000)];
  for (let k = 0; k < 4; k++) agentRun(ctx, ctx.random() * 60_000, tools, intBetween(ctx.random, 200, 400), 'longagent');
  const system = [seg(ctx, 1000)];
  for (const s of sessionStarts(ctx, o.rate, o.durationSec, o.sessions)) conversation(ctx, s, system, intBetween(ctx.random, 1, 4), 150, 250, 20_000, 'default', 'chat');
};

const multiTenant: Builder = (ctx, o) => {
  const tenants = Array.from({ length: 8 }, (_, k) => ({ name: `tenant-${k}`, system: [seg(ctx, intBetween(ctx.random, 2000, 6000))] }));
  const cdf = zipfCdf(tenants.length, 1.1);
  for (const s of sessionStarts(ctx, o.rate, o.durationSec, o.sessions)) {
    const tn = tenants[zipfIndex(ctx.random, cdf)]!;
    conversation(ctx, s, tn.system, intBetween(ctx.random, 1, 10), 200, 250, 20_000, tn.name, 'mt');
  }
};

const rag: Builder = (ctx, o) => {
  const r = ctx.random;
  const docs = Array.from({ length: 500 }, () => seg(ctx, intBetween(r, 300, 1500)));
  const cdf = zipfCdf(docs.length, 1.0);
  const system = seg(ctx, 400);
  for (const s of sessionStarts(ctx, o.rate, o.durationSec, o.sessions)) {
    const picked: Segment[] = [];
    const seen = new Set<number>();
    while (picked.length < 4) {
      const i = zipfIndex(r, cdf);
      if (!seen.has(i)) {
        seen.add(i);
        picked.push(docs[i]!);
      }
    }
    conversation(ctx, s, [system, ...picked], intBetween(r, 1, 3), 80, 200, 15_000, 'default', 'rag');
  }
};

const mix: Builder = (ctx, o) => {
  const part = (share: number): Required<GenOptions> => ({ ...o, rate: o.rate * share, sessions: Math.ceil(o.sessions * share) });
  multiTurn(ctx, part(0.3));
  agent(ctx, part(0.05));
  short(ctx, part(2));
  multiTenant(ctx, part(0.3));
  rag(ctx, part(0.5));
};

const BUILDERS: Record<WorkloadClass, Builder> = { 'multi-turn': multiTurn, agent, short, skewed, 'multi-tenant': multiTenant, rag, mix };

/** Generate a class's requests, sorted by timestamp; the same seed gives the same records. */
export function generateWorkload(cls: WorkloadClass, options: GenOptions = {}): TraceRecord[] {
  const d = CLASS_DEFAULTS[cls];
  const o: Required<GenOptions> = {
    seed: options.seed ?? 1,
    sessions: options.sessions ?? Infinity,
    durationSec: options.durationSec ?? d.durationSec,
    rate: options.rate ?? d.rate,
  };
  const ctx: Ctx = { random: mulberry32(o.seed), ids: new BlockIds(), out: [], nextSeg: 1, nextSession: 0 };
  BUILDERS[cls](ctx, o);
  return ctx.out.map((rec, i) => ({ rec, i })).sort((a, b) => a.rec.timestamp - b.rec.timestamp || a.i - b.i).map((x) => x.rec);
}
