// A seeded random source (mulberry32). Pure: no I/O, no clock, no global state.
//
// Why a seeded source lives in the core: the core never draws randomness itself, it takes a
// `RandomSource` as a parameter (least-load's tie-break, for one). The Worker passes the
// platform's generator; the simulator, the mock replicas, the benchmarks and the tests need a
// deterministic one so a run replays exactly, and they share this one instead of each keeping
// a copy.

import type { RandomSource } from './types.js';

/**
 * mulberry32 (Tommy Ettinger, public domain): a 32-bit state advanced by a Weyl step
 * (+0x6d2b79f5), then mixed; the same seed gives the same sequence of floats in [0, 1).
 * Small and well distributed; not for secrets.
 */
export function seededRandom(seed: number): RandomSource {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
