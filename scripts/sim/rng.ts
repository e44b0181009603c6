// Seeded random sources for the simulator and the trace generator. Pure: no I/O, no clock.

import type { RandomSource } from '../../src/core/index.js';

/** mulberry32: a tiny, well-distributed 32-bit PRNG; the same seed gives the same sequence. */
export function mulberry32(seed: number): RandomSource {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Exponential variate with the given mean. */
export function expRandom(random: RandomSource, mean: number): number {
  return -Math.log(1 - random()) * mean;
}

/** Integer uniform in [lo, hi]. */
export function intBetween(random: RandomSource, lo: number, hi: number): number {
  return lo + Math.floor(random() * (hi - lo + 1));
}

/** Log-normal variate with the given median and shape sigma (the spread of real prompt lengths). */
export function logNormal(random: RandomSource, median: number, sigma: number): number {
  // Box-Muller on two uniforms.
  const u = 1 - random();
  const v = random();
  const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  return median * Math.exp(sigma * z);
}

/** Index drawn from a Zipf(s) law over n items (rank 0 is the most popular). */
export function zipfIndex(random: RandomSource, cdf: Float64Array): number {
  const x = random() * cdf[cdf.length - 1]!;
  let lo = 0;
  let hi = cdf.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (cdf[mid]! < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export function zipfCdf(n: number, s: number): Float64Array {
  const cdf = new Float64Array(n);
  let acc = 0;
  for (let i = 0; i < n; i++) cdf[i] = acc += 1 / Math.pow(i + 1, s);
  return cdf;
}
