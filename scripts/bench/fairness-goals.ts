// The arithmetic of `npm run bench:fairness` (issue #29): arrival schedules, what one request
// recorded, percentiles, throughput and shares in a window, and each goal as MET or MISSED. Pure:
// no I/O, no clock; the bench (scripts/bench-fairness.ts) measures, this module judges.

import { expRandom, mulberry32 } from '../../sim/rng.js';

/** One client request as the bench saw it. Times in ms on the bench's clock. */
export interface RequestRecord {
  readonly tenant: string;
  /** Which phase sent it (e.g. `noisy/alone`). */
  readonly phase: string;
  readonly startMs: number;
  /** Start to the first content token; null when none came. */
  readonly ttftMs: number | null;
  readonly endMs: number;
  /** HTTP status (0: the connection failed or timed out). */
  readonly status: number;
  /** 200 and the stream ran to its end with content. */
  readonly ok: boolean;
  /** A refusal's Retry-After, ms (null: none given). */
  readonly retryAfterMs?: number | null;
}

/**
 * How long a client waits after a refusal before it tries again: the Retry-After it was given
 * (as the OpenAI SDKs honour it), held to [floorMs, capMs] so a run stays bounded; `fallbackMs`
 * without one.
 */
export function backoffMs(retryAfterMs: number | null | undefined, o: { floorMs: number; capMs: number; fallbackMs: number }): number {
  const v = retryAfterMs ?? o.fallbackMs;
  return Math.min(o.capMs, Math.max(o.floorMs, Number.isFinite(v) ? v : o.fallbackMs));
}

/**
 * Send times (ms from the phase start) for `ratePerSec` over `durationMs`: `steady` evenly spaced
 * (a well-behaved client), `poisson` with exponential gaps from a seeded source (a burst). At most
 * `cap` times, so a run is bounded in count whatever the rate.
 */
export function arrivals(kind: 'steady' | 'poisson', ratePerSec: number, durationMs: number, seed: number, cap = 5_000): number[] {
  if (!(ratePerSec > 0) || !(durationMs > 0)) return [];
  const gap = 1000 / ratePerSec;
  const out: number[] = [];
  if (kind === 'steady') {
    for (let t = gap / 2; t < durationMs && out.length < cap; t += gap) out.push(t);
    return out;
  }
  const random = mulberry32(seed);
  for (let t = expRandom(random, gap); t < durationMs && out.length < cap; t += expRandom(random, gap)) out.push(t);
  return out;
}

/** Nearest-rank percentile (q in [0, 1]) of the numbers (Infinity counts, NaN does not); NaN for none. */
export function percentile(values: readonly number[], q: number): number {
  const xs = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b);
  if (xs.length === 0) return NaN;
  return xs[Math.max(1, Math.ceil(q * xs.length)) - 1]!;
}

/** TTFTs of a tenant's successful requests in a phase. */
export function ttfts(records: readonly RequestRecord[], tenant: string, phase: string): number[] {
  return records.filter((r) => r.tenant === tenant && r.phase === phase && r.ok && r.ttftMs !== null).map((r) => r.ttftMs!);
}

/**
 * TTFTs of all a tenant's requests in a phase, a failed one as Infinity (it never got a first
 * token): what a TTFT goal is judged on, so refusing a request cannot improve its percentile.
 */
export function ttftsCountingFailures(records: readonly RequestRecord[], tenant: string, phase: string): number[] {
  return records.filter((r) => r.tenant === tenant && r.phase === phase).map((r) => (r.ok && r.ttftMs !== null ? r.ttftMs : Infinity));
}

/** Requests of a tenant in a phase that did not succeed. */
export function errors(records: readonly RequestRecord[], tenant: string, phase: string): number {
  return records.filter((r) => r.tenant === tenant && r.phase === phase && !r.ok).length;
}

/** Statuses of a tenant's failed requests in a phase, e.g. `{ 503: 12 }`. */
export function errorStatuses(records: readonly RequestRecord[], tenant: string, phase: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of records) if (r.tenant === tenant && r.phase === phase && !r.ok) out[r.status] = (out[r.status] ?? 0) + 1;
  return out;
}

/** Successful requests of `tenant` that finished in [fromMs, toMs), per second. */
export function throughput(records: readonly RequestRecord[], tenant: string, fromMs: number, toMs: number): number {
  if (!(toMs > fromMs)) return NaN;
  let n = 0;
  for (const r of records) if (r.tenant === tenant && r.ok && r.endMs >= fromMs && r.endMs < toMs) n++;
  return n / ((toMs - fromMs) / 1000);
}

/** Each tenant's part of the requests the tenants completed in [fromMs, toMs) (all requests are the same size). */
export function shares(records: readonly RequestRecord[], tenants: readonly string[], fromMs: number, toMs: number): Record<string, number> {
  const t = tenants.map((x) => throughput(records, x, fromMs, toMs));
  const sum = t.reduce((a, b) => a + b, 0);
  return Object.fromEntries(tenants.map((x, i) => [x, sum > 0 ? t[i]! / sum : NaN]));
}

/** One goal, judged. */
export interface Goal {
  readonly name: string;
  /** The measured value (a ratio, a count or a share), NaN when it could not be measured. */
  readonly value: number;
  /** How the value is printed, e.g. `1.32×`. */
  readonly shown: string;
  /** The goal as words, e.g. `≤ 1.5×`. */
  readonly target: string;
  readonly met: boolean;
}

const times = (x: number) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : x === Infinity ? '∞ (failed requests)' : 'n/a');
const pct = (x: number) => (Number.isFinite(x) ? `${(100 * x).toFixed(1)}%` : 'n/a');

/** value ≤ limit (a ratio goal); NaN is MISSED. */
export function atMost(name: string, value: number, limit: number): Goal {
  return { name, value, shown: times(value), target: `≤ ${limit}×`, met: Number.isFinite(value) && value <= limit };
}

/** value ≥ limit, as a share of something (shown in %). */
export function atLeastShare(name: string, value: number, limit: number): Goal {
  return { name, value, shown: pct(value), target: `≥ ${Math.round(limit * 100)}%`, met: Number.isFinite(value) && value >= limit };
}

/** |value − want| ≤ tolerance, shares shown in %. */
export function within(name: string, value: number, want: number, tolerance: number): Goal {
  return { name, value, shown: pct(value), target: `${Math.round(want * 100)} ± ${Math.round(tolerance * 100)}%`, met: Number.isFinite(value) && Math.abs(value - want) <= tolerance + 1e-9 };
}

/** A count that must be zero. */
export function none(name: string, count: number): Goal {
  return { name, value: count, shown: String(count), target: '0', met: count === 0 };
}

/** The noisy-neighbour measurements of one mode: Q alone, Q and N together (the burst window). */
export interface NoisyInput {
  readonly qAloneP99: number;
  readonly qBurstP99: number;
  /** Q's failed requests while N burst. */
  readonly qErrors: number;
  /** Completed per second in the burst window. */
  readonly qThroughput: number;
  readonly nThroughput: number;
  /** The pool's capacity, requests per second (calibrated). */
  readonly capacity: number;
}

/** The issue's three noisy-neighbour goals for one mode. */
export function noisyGoals(m: NoisyInput): Goal[] {
  const left = m.capacity - m.qThroughput;
  return [
    atMost("Q's TTFT p99 with N's burst ÷ without", m.qBurstP99 / m.qAloneP99, 1.5),
    none("Q's errors during the burst", m.qErrors),
    atLeastShare('N gets of the capacity Q leaves', left > 0 ? m.nThroughput / left : NaN, 0.9),
  ];
}

/** Two tenants bursting: the first tenant's share of the throughput against its weight's. */
export function shareGoal(name: string, share: number, weights: readonly [number, number]): Goal {
  return within(name, share, weights[0] / (weights[0] + weights[1]), 0.05);
}

/** A high-priority tenant under a full pool against an idle one. */
export function priorityGoal(idleP99: number, fullP99: number): Goal {
  return atMost("high band's TTFT p99 under a full pool ÷ idle pool", fullP99 / idleP99, 1.2);
}

/** `MET` or `MISSED`. */
export function verdict(g: Goal): 'MET' | 'MISSED' {
  return g.met ? 'MET' : 'MISSED';
}

/** One line per goal: the flow-control run's verdict and value, each baseline's beside it. */
export function goalLine(on: Goal, baselines: readonly { name: string; goal: Goal }[]): string {
  return `- ${verdict(on)}: ${on.name}: ${on.shown} (goal ${on.target}); ${baselines.map((b) => `${b.name}: ${b.goal.shown}, ${verdict(b.goal)}`).join('; ')}`;
}

/** The pool's nominal capacity in requests per second: slots ÷ (prefill + further tokens × decode). */
export function nominalCapacity(o: { replicas: number; maxNumSeqs: number; promptTokens: number; prefillTokensPerSec: number; maxTokens: number; decodeMsPerToken: number }): number {
  const serviceMs = (o.promptTokens / o.prefillTokensPerSec) * 1000 + (o.maxTokens - 1) * o.decodeMsPerToken;
  return (o.replicas * o.maxNumSeqs) / (serviceMs / 1000);
}
