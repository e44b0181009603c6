// The recorded session workload of `npm run bench:haproxy`: seeded multi-turn chat sessions
// (Pareto turn counts, exponential think times, session starts placed in a window whose length
// is calibrated on a virtual clock to ≈ a target number of requests in flight). Pure: no I/O, no
// clock; the same seed gives the same schedule, which every configuration replays.

import { expRandom, mulberry32 } from '../../sim/rng.js';

export interface Turn {
  /** The user message appended to the history this turn. */
  user: string;
  /** `max_tokens` of the request (the mock decodes exactly this many tokens). */
  maxTokens: number;
  /** Think time after this turn's answer ends, before the next turn is sent (s). */
  thinkS: number;
}

export interface Session {
  /** `X-Session-Id`: 32 hex characters, as a client would generate. */
  id: string;
  /** Start of the first turn, seconds after the run starts. */
  startS: number;
  system: string;
  turns: Turn[];
}

export interface WorkloadOptions {
  seed: number;
  sessions: number;
  /** Total requests the Pareto turn counts are scaled to. */
  totalRequests: number;
  paretoAlpha: number;
  maxTurns: number;
  meanThinkS: number;
  /** Mean `max_tokens`. */
  meanMaxTokens: number;
  /** Target mean of requests in flight seen by each new request (as scripts/stickiness.ts). */
  targetInFlight: number;
  /** Cost model used for calibration only: per-request overhead, decode per token, prefill tokens/s. */
  model: { overheadMs: number; decodeMs: number; prefillTokensPerSec: number; cachedShare: number };
}

export interface Workload {
  sessions: Session[];
  requests: number;
  /** Virtual-clock estimate of the mean in flight at the picks and the makespan (s). */
  estInFlight: number;
  estMakespanS: number;
  /** The window every session is placed in (s), and the longest session's estimated duration. */
  windowS: number;
  longestSessionS: number;
}

const SYLLABLES = ['ka', 'lo', 'mi', 'ren', 'to', 'va', 'shi', 'por', 'den', 'lu', 'ne', 'fa', 'gri', 'so', 'tem', 'bar', 'qui', 'el', 'zon', 'mar'];

function words(rand: () => number, chars: number): string {
  let s = '';
  while (s.length < chars) {
    const n = 1 + Math.floor(rand() * 3);
    let w = '';
    for (let i = 0; i < n; i++) w += SYLLABLES[Math.floor(rand() * SYLLABLES.length)]!;
    s += (s ? ' ' : '') + w;
  }
  return s;
}

/** Mock tokens (4 characters) of a rendered chat prompt, approximately. */
const tokensOf = (chars: number) => Math.ceil(chars / 4);

export function makeWorkload(o: WorkloadOptions): Workload {
  const rand = mulberry32(o.seed);
  // Pareto(α, x_m = 1) turn counts, capped, scaled so they total ≈ totalRequests.
  const raw = Array.from({ length: o.sessions }, () => 1 / Math.pow(1 - rand(), 1 / o.paretoAlpha));
  const turnsAt = (k: number) => raw.map((x) => Math.max(1, Math.min(o.maxTurns, Math.round(x * k))));
  let k = o.totalRequests / raw.reduce((a, b) => a + b, 0);
  for (let i = 0; i < 30; i++) k *= o.totalRequests / turnsAt(k).reduce((a, b) => a + b, 0);
  const counts = turnsAt(k);

  // A preamble every session shares (a product's system prompt) plus a per-session document.
  const preamble = `You are the assistant of a help desk. ${words(rand, 900)}`;
  const sessions: Session[] = counts.map((n) => {
    let id = '';
    for (let i = 0; i < 4; i++) id += Math.floor(rand() * 2 ** 32).toString(16).padStart(8, '0');
    const system = `${preamble}\nCustomer file: ${words(rand, 400 + Math.floor(rand() * 800))}`;
    const turns: Turn[] = Array.from({ length: n }, () => ({
      user: words(rand, 80 + Math.floor(rand() * 520)),
      maxTokens: Math.max(2, Math.min(6 * o.meanMaxTokens, Math.round(expRandom(rand, o.meanMaxTokens)))),
      thinkS: expRandom(rand, o.meanThinkS),
    }));
    return { id, startS: 0, system, turns };
  });
  // Where in its window each session starts (0 = at once, 1 = as late as still ends in time).
  const place = sessions.map(() => rand());
  // Estimated service time per request: overhead + decode + prefill of the uncached part.
  const service = sessions.map((s) => {
    let ctx = tokensOf(s.system.length + 20);
    return s.turns.map((t) => {
      const fresh = tokensOf(t.user.length + 12);
      const prompt = ctx + fresh;
      const uncached = fresh + (1 - o.model.cachedShare) * ctx;
      ctx = prompt + t.maxTokens;
      return (o.model.overheadMs + (t.maxTokens - 1) * o.model.decodeMs + (uncached / o.model.prefillTokensPerSec) * 1000) / 1000;
    });
  });

  const duration = sessions.map((s, i) => s.turns.reduce((acc, t, j) => acc + service[i]![j]! + t.thinkS, 0) - s.turns[s.turns.length - 1]!.thinkS);
  const simulate = (windowS: number) => {
    // Each session starts at a uniform point that still lets it end inside the window (long
    // sessions start early), so the load is flat except for short ramps at both ends.
    const starts = sessions.map((_, i) => place[i]! * Math.max(0, windowS - duration[i]!));
    // Each session is sequential: send, served for service[i], think, next. Count in-flight at sends.
    const events: { t: number; d: number }[] = [];
    let sends = 0;
    let end = 0;
    sessions.forEach((s, i) => {
      let at = starts[i]!;
      s.turns.forEach((turn, j) => {
        sends++;
        events.push({ t: at, d: +1 }, { t: at + service[i]![j]!, d: -1 });
        at += service[i]![j]! + turn.thinkS;
      });
      end = Math.max(end, at - s.turns[s.turns.length - 1]!.thinkS);
    });
    // Ends sort before starts at the same instant.
    events.sort((a, b) => a.t - b.t || a.d - b.d);
    let busy = 0;
    let seen = 0;
    for (const e of events) {
      if (e.d > 0) seen += busy;
      busy += e.d;
    }
    return { starts, inFlight: seen / sends, makespan: end };
  };

  const longest = Math.max(...duration);
  let windowS = Math.max(longest, 30);
  let r = simulate(windowS);
  for (let i = 0; i < 40 && Math.abs(r.inFlight / o.targetInFlight - 1) > 0.005; i++) {
    windowS = Math.max(longest, windowS * (r.inFlight / o.targetInFlight));
    r = simulate(windowS);
  }
  sessions.forEach((s, i) => (s.startS = r.starts[i]!));
  return { sessions, requests: counts.reduce((a, b) => a + b, 0), estInFlight: r.inFlight, estMakespanS: r.makespan, windowS, longestSessionS: longest };
}
