// The pin constraint: a request that must reach one replica (a Responses API follow-up, retrieve
// or cancel goes where its stored response lives). Pure.
//
// A hard affinity, not a preference: the load bound does not apply (the replica holding the state
// is the only one that can answer), and a pinned replica that cannot take the request is a failure,
// never a silent pick of another. A draining replica still takes pinned requests: draining stops
// new conversations, not the ones whose state only it holds.

import type { PickResult } from '../types.js';
import type { PickContext } from './strategy.js';

export function pickPinned(ctx: PickContext, pin: string): PickResult {
  const index = ctx.replicas.findIndex((r) => r.id === pin);
  if (index < 0) return { ok: false, reason: 'pinned_replica_gone' };
  const r = ctx.replicas[index]!;
  if (!r.healthy || ctx.exclude?.has(r.id)) return { ok: false, reason: 'pinned_replica_unavailable' };
  return { ok: true, index, replica: r.id, spilled: false, steps: 0 };
}
