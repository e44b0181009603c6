// Which data-parallel engine of a picked replica a request is pinned to (vLLM's
// `X-data-parallel-rank`, docs/operations.md "Data-parallel engines"). Pure: plain numbers in,
// an engine position out; no clock, no random source.
//
// A vLLM server started with --data-parallel-size N runs N engine cores behind one API server,
// each with its own KV cache and prefix cache: a prompt cached on engine 0 is a miss on engine 1.
// After the strategy has picked the replica (its match being the best over its engines), this
// picks the engine:
//
//   eligible(e) ⇔ leases_e + 1 ≤ ceil((Σ leases + 1) × c / N)        c = 1.25 (HAProxy's default)
//   1. among eligible engines with a useful match (≥ 1 block), the longest match;
//   2. otherwise the eligible engine with the fewest of the router's own leases in flight;
//   ties (equal match and leases, or equal leases) go to the engine ranked first for the key by
//   rendezvous hashing: score(key, e) = fmix32(key ⊕ golden × (e + 1)), highest wins.
//
// The bound keeps one hot prompt from queueing on one engine while the replica's others idle
// (the engine-level form of the pool's load bound: an engine holds at most c times its share of
// the router's in-flight, at least one); at least one engine is always eligible (the least
// loaded one: leases_min × N ≤ Σ leases). Rendezvous hashing makes the tie-break stable per key
// and stable under the tied set shrinking: the key's first choice wins whenever it is tied, so a
// session's turns meet on one engine, and its next turn then follows its match.

import { fmix32 } from './hash.js';

/** Load-bound factor c over the replica's engines (HAProxy's hash-balance-factor 125). */
export const ENGINE_BALANCE_FACTOR = 1.25;

export interface EngineChoiceInput {
  /** Matched leading blocks per engine (−1: the index holds nothing for it). */
  readonly matched: ArrayLike<number>;
  /** The router's own leases in flight per engine. */
  readonly leases: ArrayLike<number>;
  /** A stable per-request key (the routing key's hash, or the first block's): the tie-break. */
  readonly key: number;
  /** Defaults to ENGINE_BALANCE_FACTOR; must be > 1. */
  readonly factor?: number;
}

/** Per-key rank of engine e for the rendezvous tie-break (higher wins). */
export function engineScore(key: number, e: number): number {
  return fmix32((key ^ Math.imul(0x9e3779b9, e + 1)) >>> 0);
}

/** Position (0..N−1) of the engine to pin to; 0 for a single engine. */
export function chooseEngine(input: EngineChoiceInput): number {
  const n = input.leases.length;
  if (n <= 1) return 0;
  const c = input.factor ?? ENGINE_BALANCE_FACTOR;
  let total = 0;
  for (let e = 0; e < n; e++) total += Math.max(0, input.leases[e]!);
  const cap = Math.max(1, Math.ceil(((total + 1) * c) / n));
  let best = -1;
  let bestMatch = 0;
  let bestLeases = Infinity;
  let bestScore = -1;
  // Pass 1: the longest useful match among eligible engines.
  for (let e = 0; e < n; e++) {
    const l = Math.max(0, input.leases[e]!);
    const m = input.matched[e] ?? -1;
    if (l + 1 > cap || m < 1) continue;
    const s = engineScore(input.key, e);
    if (m > bestMatch || (m === bestMatch && (l < bestLeases || (l === bestLeases && s > bestScore)))) {
      best = e;
      bestMatch = m;
      bestLeases = l;
      bestScore = s;
    }
  }
  if (best >= 0) return best;
  // Pass 2: the fewest leases (every engine at the minimum is within the bound).
  for (let e = 0; e < n; e++) {
    const l = Math.max(0, input.leases[e]!);
    const s = engineScore(input.key, e);
    if (l < bestLeases || (l === bestLeases && s > bestScore)) {
      best = e;
      bestLeases = l;
      bestScore = s;
    }
  }
  return best;
}
