// Low-load stickiness: how often each strategy splits a multi-turn session across replicas
// when the fleet is nearly idle, and what it pays for stickiness in load spread. Replays a
// synthetic, seeded session workload through the pure core (`createStrategy`) on a virtual
// clock; no I/O besides printing.
//
//   npx tsx scripts/stickiness.ts [--seeds 5] [--sessions 200] [--replicas 8] [--inflight 8]
//
// Workload: sessions arrive uniformly over a window; turn counts are Pareto (α = 1.5, scaled
// to a mean of 12.5 turns: 200 sessions ≈ 2,500 requests); each turn is a request served for an
// exponential time, then the user thinks for an exponential time before the next turn. The
// mean service time is calibrated so that ≈ `--inflight` requests are in flight on average.
// Every request carries its session's key (what `X-Session-Id` gives the router).
//
// Reported per strategy, averaged over the seeds:
//   split       share of sessions served by more than one replica
//   main        share of turns on the session's main (most used) replica
//   req max/mean   requests per replica, max ÷ mean (load spread over the run)
//   peak max/mean  per-replica peak in-flight, max ÷ mean
//   highest        the highest in-flight any replica reached

import { parseArgs } from 'node:util';
import { buildRing, createStrategy, hashString, PrefixIndex, seededRandom, type ReplicaView, type Strategy } from '../src/core/index.js';

const { values: args } = parseArgs({
  options: {
    seeds: { type: 'string', default: '5' },
    sessions: { type: 'string', default: '200' },
    replicas: { type: 'string', default: '8' },
    inflight: { type: 'string', default: '8' },
  },
});
const SEEDS = Number(args.seeds);
const SESSIONS = Number(args.sessions);
const REPLICAS = Number(args.replicas);
const TARGET_INFLIGHT = Number(args.inflight);

const exp = (rand: () => number, mean: number) => -Math.log(1 - rand()) * mean;

interface Workload {
  readonly turns: number[];
  readonly starts: number[];
  /** Session start times in units of the mean inter-arrival time (scaled by calibration). */
  /** Per session, per turn: service time and think time after it, seconds. */
  readonly service: number[][];
  readonly think: number[][];
}

const TOTAL_REQUESTS = 2500;
const PARETO_ALPHA = 1.5;
const MAX_TURNS = 100;
const MEAN_SERVICE_S = 8;
const MEAN_THINK_S = 60;

/** Sessions arrive as a Poisson process at `rate` per second (before calibration, 0.1/s). */
function makeWorkload(seed: number): Workload {
  const rand = seededRandom(seed);
  // Pareto(α, x_m = 1) turn counts, capped, then scaled so they total ≈ TOTAL_REQUESTS.
  const raw = Array.from({ length: SESSIONS }, () => 1 / Math.pow(1 - rand(), 1 / PARETO_ALPHA));
  const turnsAt = (k: number) => raw.map((x) => Math.max(1, Math.min(MAX_TURNS, Math.round(x * k))));
  let k = TOTAL_REQUESTS / raw.reduce((a, b) => a + b, 0);
  for (let i = 0; i < 20; i++) k *= TOTAL_REQUESTS / turnsAt(k).reduce((a, b) => a + b, 0);
  const turns = turnsAt(k);
  const starts: number[] = [];
  let t = 0;
  for (let s = 0; s < SESSIONS; s++) starts.push((t += exp(rand, 1)));
  const service = turns.map((n) => Array.from({ length: n }, () => exp(rand, MEAN_SERVICE_S)));
  const think = turns.map((n) => Array.from({ length: n }, () => exp(rand, MEAN_THINK_S)));
  return { turns, starts, service, think };
}

/** A binary min-heap of events by time. */
class Heap<T extends { t: number }> {
  private a: T[] = [];
  get size(): number {
    return this.a.length;
  }
  push(x: T): void {
    const a = this.a;
    a.push(x);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (a[p]!.t <= a[i]!.t) break;
      [a[p], a[i]] = [a[i]!, a[p]!];
      i = p;
    }
  }
  pop(): T {
    const a = this.a;
    const top = a[0]!;
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && a[l]!.t < a[m]!.t) m = l;
        if (r < a.length && a[r]!.t < a[m]!.t) m = r;
        if (m === i) break;
        [a[m], a[i]] = [a[i]!, a[m]!];
        i = m;
      }
    }
    return top;
  }
}

interface Result {
  split: number;
  main: number;
  reqSpread: number;
  peakSpread: number;
  peakMax: number;
  avgInFlight: number;
  requests: number;
}

type Ev = { t: number; kind: 'arrive'; s: number; turn: number } | { t: number; kind: 'done'; s: number; turn: number; r: number };

/** Replay one workload; session start times are multiplied by `arrivalScale` seconds. */
function replay(spec: string, w: Workload, arrivalScale: number, seed: number): Result {
  const strategy: Strategy = createStrategy(spec);
  const prefixAware = spec.startsWith('prefix-aware');
  const rand = seededRandom(seed ^ 0x5eed);
  const ids = Array.from({ length: REPLICAS }, (_, i) => `replica-${i}`);
  const ring = buildRing(ids.map((id) => ({ id, weight: 1 })));
  const inFlight = new Int32Array(REPLICAS);
  const peak = new Int32Array(REPLICAS);
  const requests = new Int32Array(REPLICAS);
  const perSession = w.turns.map(() => new Int32Array(REPLICAS));
  const keys = w.turns.map((_, s) => hashString(`session-${seed}-${s}`));
  // prefix-aware only: each turn's prompt extends the previous one by a few 64-token blocks.
  const index = new PrefixIndex();
  const blocks: number[][] = w.turns.map(() => []);
  const matched = new Int32Array(REPLICAS);
  let blockSeq = 1;

  const heap = new Heap<Ev>();
  w.starts.forEach((t, s) => heap.push({ t: t * arrivalScale, kind: 'arrive', s, turn: 0 }));
  let busy = 0;
  let seenAtPicks = 0;
  while (heap.size > 0) {
    const e = heap.pop();
    if (e.kind === 'done') {
      inFlight[e.r]!--;
      busy--;
      if (e.turn + 1 < w.turns[e.s]!) heap.push({ t: e.t + w.think[e.s]![e.turn]!, kind: 'arrive', s: e.s, turn: e.turn + 1 });
      continue;
    }
    seenAtPicks += busy;
    const replicas: ReplicaView[] = ids.map((id, i) => ({ id, weight: 1, inFlight: inFlight[i]!, healthy: true, draining: false }));
    let prefixMatch;
    if (prefixAware) {
      const b = blocks[e.s]!;
      const add = e.turn === 0 ? 8 + Math.floor(rand() * 24) : 2 + Math.floor(rand() * 8);
      for (let k = 0; k < add; k++) b.push(Math.imul(blockSeq++, 2654435761) >>> 0);
      index.matchAll(ring.ids, b, matched);
      prefixMatch = { blocks: b.length, matched };
    }
    const r = strategy.pick({ ring, replicas, key: keys[e.s]!, random: rand, prefixMatch });
    if (!r.ok) throw new Error(`pick failed: ${r.reason}`);
    if (prefixAware) index.recordRoute(ids[r.index]!, blocks[e.s]!);
    inFlight[r.index]!++;
    busy++;
    if (inFlight[r.index]! > peak[r.index]!) peak[r.index] = inFlight[r.index]!;
    requests[r.index]!++;
    perSession[e.s]![r.index]!++;
    heap.push({ t: e.t + w.service[e.s]![e.turn]!, kind: 'done', s: e.s, turn: e.turn, r: r.index });
  }
  let split = 0;
  let mainTurns = 0;
  let total = 0;
  for (const c of perSession) {
    let used = 0;
    let max = 0;
    for (const x of c) {
      if (x > 0) used++;
      if (x > max) max = x;
      total += x;
    }
    if (used > 1) split++;
    mainTurns += max;
  }
  const spread = (a: Int32Array) => Math.max(...a) / (a.reduce((x, y) => x + y, 0) / a.length);
  return { split: split / perSession.length, main: mainTurns / total, reqSpread: spread(requests), peakSpread: spread(peak), peakMax: Math.max(...peak), avgInFlight: seenAtPicks / total, requests: total };
}

/** Mean inter-arrival time (s) of sessions giving ≈ TARGET_INFLIGHT in flight, as seen by the picks. */
function calibrate(w: Workload): number {
  let scale = 10;
  for (let k = 0; k < 8; k++) {
    const r = replay('least-load', w, scale, 1);
    scale *= r.avgInFlight / TARGET_INFLIGHT;
  }
  return scale;
}

const specs: string[] = [];
for (const f of ['1.25', '1.5', '2']) for (const s of [0, 1, 2, 3, 4]) specs.push(`bounded-hash:${f}:${s}`);
specs.push('hash', 'least-load');
for (const s of [0, 1, 2, 3, 4]) specs.push(`prefix-aware:1.25:${s}`);

const acc = new Map<string, Result>();
let reqTotal = 0;
let inflightTotal = 0;
let scaleTotal = 0;
for (let seed = 1; seed <= SEEDS; seed++) {
  const w = makeWorkload(seed);
  const scale = calibrate(w);
  scaleTotal += scale;
  for (const spec of specs) {
    const r = replay(spec, w, scale, seed);
    const a = acc.get(spec) ?? { split: 0, main: 0, reqSpread: 0, peakSpread: 0, peakMax: 0, avgInFlight: 0, requests: 0 };
    for (const k of Object.keys(a) as (keyof Result)[]) a[k] += r[k] / SEEDS;
    acc.set(spec, a);
    if (spec === 'least-load') {
      reqTotal += r.requests / SEEDS;
      inflightTotal += r.avgInFlight / SEEDS;
    }
  }
}

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;
console.log(
  `${SESSIONS} sessions, ${reqTotal.toFixed(0)} requests (mean over ${SEEDS} seeds), ${REPLICAS} replicas, ` +
    `${inflightTotal.toFixed(1)} in flight on average at the picks (service ${MEAN_SERVICE_S} s, think ${MEAN_THINK_S} s, ` +
    `a session every ${(scaleTotal / SEEDS).toFixed(1)} s)\n`,
);
console.log('| strategy | sessions split | turns on main replica | requests max÷mean | peak in-flight max÷mean | highest in-flight |');
console.log('|---|---:|---:|---:|---:|---:|');
for (const spec of specs) {
  const a = acc.get(spec)!;
  console.log(`| \`${spec}\` | ${pct(a.split)} | ${pct(a.main)} | ${a.reqSpread.toFixed(2)} | ${a.peakSpread.toFixed(2)} | ${a.peakMax.toFixed(1)} |`);
}
