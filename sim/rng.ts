// Random variates for the simulator and the trace generator over a seeded source. Pure: no I/O,
// no clock.

import { seededRandom, type RandomSource } from '../src/core/index.js';

/** mulberry32, the core's seeded source (src/core/random.ts); the same seed gives the same sequence. */
export const mulberry32: (seed: number) => RandomSource = seededRandom;

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
