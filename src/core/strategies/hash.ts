// `hash`: consistent hashing with no load bound (NGINX `hash $key consistent`). Pure.
// Walk clockwise from the key's point to the first usable replica.

import type { PickResult } from '../types.js';
import { pickLeastLoad } from './least-load.js';
import { isUsable, NO_HEALTHY, type PickContext, type Strategy } from './strategy.js';

export function pickHash(ctx: PickContext): PickResult {
  const { ring, replicas, key, exclude } = ctx;
  if (key === null) return pickLeastLoad(ctx);
  const pts = ring.points.length;
  if (pts === 0) return NO_HEALTHY;
  const start = ring.locate(key);
  const home = ring.owners[start]!;
  const seen = new Uint8Array(replicas.length);
  let steps = 0;
  for (let j = 0; j < pts && steps < replicas.length; j++) {
    const o = ring.owners[(start + j) % pts]!;
    if (seen[o]) continue;
    seen[o] = 1;
    if (isUsable(replicas[o]!, exclude)) return { ok: true, index: o, replica: replicas[o]!.id, spilled: o !== home, steps };
    steps++;
  }
  return NO_HEALTHY;
}

export const hashStrategy: Strategy = { name: 'hash', keyed: true, pick: pickHash };
