// The noisy-neighbour scenario of bench:fairness as an idealised queueing model (issue #29): what
// any non-preemptive admission policy that keeps `reserve` slots free for the light tenant can
// reach, with a coordinator that costs nothing and releases that land at once. `slots` slots, each
// request holding one for its prefill and decode (8-24 output tokens at 30 ms, 120 ms of prefill,
// as the bench); the heavy tenant N always has requests waiting and takes a free slot only while
// more than `reserve` are free; the light tenant Q arrives as a Poisson stream at `qShare` of the
// pool's capacity and takes any free slot, else waits (FIFO) for the next release. Printed by
// `npm run bench:fairness -- --model`: Q's wait p99 against its goal (TTFT p99 ≤ 1.5× alone, so a
// wait of at most half a prefill) beside N's share of the capacity Q leaves (goal ≥ 90 %). Pure,
// seeded, no I/O.

export interface FrontierPoint {
  slots: number;
  reserve: number;
  /** Q's wait for a slot (ms): median and p99. */
  qWaitP50Ms: number;
  qWaitP99Ms: number;
  /** Q's TTFT p99 (wait + prefill) ÷ its TTFT alone (the prefill). */
  qTtftRatio: number;
  /** N's completed requests ÷ (capacity − Q's rate). */
  nShare: number;
}

export interface FrontierOptions {
  slots: number;
  reserve: number;
  /** Q's rate as a share of the pool's capacity (the bench: 0.4, 80 % of its half). */
  qShare?: number;
  prefillMs?: number;
  decodeMs?: number;
  minTokens?: number;
  maxTokens?: number;
  /** Virtual seconds to run (the first 2 s not counted for N). */
  seconds?: number;
  seed?: number;
}

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 4294967296;
  };
}

/** One run of the model (event by event, virtual time in seconds). */
export function frontierPoint(o: FrontierOptions): FrontierPoint {
  const prefill = (o.prefillMs ?? 120) / 1000;
  const decode = (o.decodeMs ?? 30) / 1000;
  const lo = o.minTokens ?? 8;
  const hi = o.maxTokens ?? 24;
  const seconds = o.seconds ?? 2_000;
  const random = lcg(o.seed ?? 1);
  const service = () => prefill + (lo + Math.floor(random() * (hi - lo + 1))) * decode;
  const capacity = o.slots / (prefill + ((lo + hi) / 2) * decode);
  const qRate = (o.qShare ?? 0.4) * capacity;
  // Release times, kept sorted (a few dozen at most).
  const releases: { at: number; q: boolean }[] = [];
  const start = (at: number, q: boolean) => {
    const r = { at: at + service(), q };
    let i = releases.length;
    while (i > 0 && releases[i - 1]!.at > r.at) i--;
    releases.splice(i, 0, r);
  };
  let t = 0;
  let busy = 0;
  let nextQ = -Math.log(1 - random()) / qRate;
  const waiting: number[] = [];
  const waits: number[] = [];
  let nDone = 0;
  const fill = () => {
    while (busy < o.slots) {
      if (waiting.length > 0) {
        waits.push(t - waiting.shift()!);
        busy++;
        start(t, true);
      } else if (o.slots - busy > o.reserve) {
        busy++;
        start(t, false);
      } else break;
    }
  };
  fill();
  while (t < seconds) {
    if (releases.length > 0 && releases[0]!.at < nextQ) {
      const r = releases.shift()!;
      t = r.at;
      busy--;
      if (!r.q && t > 2) nDone++;
    } else {
      t = nextQ;
      nextQ = t - Math.log(1 - random()) / qRate;
      waiting.push(t);
    }
    fill();
  }
  waits.sort((a, b) => a - b);
  const at = (p: number) => (waits.length ? waits[Math.min(waits.length - 1, Math.floor(p * waits.length))]! * 1000 : 0);
  const p99 = at(0.99);
  return { slots: o.slots, reserve: o.reserve, qWaitP50Ms: at(0.5), qWaitP99Ms: p99, qTtftRatio: (prefill * 1000 + p99) / (prefill * 1000), nShare: nDone / (seconds - 2) / (capacity - qRate) };
}

/** The frontier: for each pool size, reserve 0..maxReserve. */
export function frontier(slotCounts: readonly number[], maxReserve: number, o: Omit<FrontierOptions, 'slots' | 'reserve'> = {}): FrontierPoint[] {
  const out: FrontierPoint[] = [];
  for (const slots of slotCounts) for (let reserve = 0; reserve <= maxReserve; reserve++) out.push(frontierPoint({ ...o, slots, reserve }));
  return out;
}
