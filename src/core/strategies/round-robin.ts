// `round-robin`: weighted, interleaved (each round visits every replica whose weight exceeds
// the round number), for comparison. Pure: the position is passed in and returned.

import type { Ring } from '../ring.js';
import type { PickResult } from '../types.js';
import { isUsable, NO_HEALTHY, type PickContext, type Strategy } from './strategy.js';

// The schedule depends only on the weights, which change only with the ring.
const schedules = new WeakMap<Ring, Uint16Array>();

function scheduleFor(ring: Ring): Uint16Array {
  let s = schedules.get(ring);
  if (s) return s;
  const weights = ring.weights;
  const maxW = Math.max(0, ...weights);
  const seq: number[] = [];
  for (let round = 0; round < maxW; round++) for (let i = 0; i < weights.length; i++) if (weights[i]! > round) seq.push(i);
  s = Uint16Array.from(seq);
  schedules.set(ring, s);
  return s;
}

export function pickRoundRobin(ctx: PickContext): PickResult {
  const seq = scheduleFor(ctx.ring);
  const len = seq.length;
  if (len === 0) return NO_HEALTHY;
  const cursor = ((ctx.cursor ?? 0) % len + len) % len;
  for (let k = 0; k < len; k++) {
    const i = seq[(cursor + k) % len]!;
    const r = ctx.replicas[i];
    if (r && isUsable(r, ctx.exclude)) return { ok: true, index: i, replica: r.id, spilled: false, steps: 0, cursor: (cursor + k + 1) % len };
  }
  return NO_HEALTHY;
}

export const roundRobin: Strategy = { name: 'round-robin', keyed: false, pick: pickRoundRobin };
