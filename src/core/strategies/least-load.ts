// `least-load`: fewest requests in flight per unit of weight, ties broken at random. Pure.
// The fallback for requests without a routing key.

import type { PickResult } from '../types.js';
import { leastLoadedIndex, NO_HEALTHY, type PickContext, type Strategy } from './strategy.js';

export function pickLeastLoad(ctx: PickContext): PickResult {
  const i = leastLoadedIndex(ctx.replicas, ctx.exclude, ctx.random);
  if (i < 0) return NO_HEALTHY;
  return { ok: true, index: i, replica: ctx.replicas[i]!.id, spilled: false, steps: 0 };
}

export const leastLoad: Strategy = { name: 'least-load', keyed: false, pick: pickLeastLoad };
