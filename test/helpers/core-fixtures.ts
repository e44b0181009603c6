// Fixtures shared by the core strategy tests (test/node/core: strategies, prefix-aware,
// prefix-starvation): replica ids, rings built from weights, replica views over a ring, and
// unwrapping a successful pick.
import { buildRing, type Ring } from '../../src/core/ring.js';
import type { PickResult, PickSuccess, ReplicaView } from '../../src/core/types.js';

/** `n` replica ids: replica-0, replica-1, … */
export const replicaIds = (n: number, prefix = 'replica-'): string[] => Array.from({ length: n }, (_, i) => `${prefix}${i}`);

/** A ring with one replica per weight, named as `replicaIds` names them. */
export const ringOf = (weights: number[], prefix = 'replica-'): Ring => buildRing(weights.map((weight, i) => ({ id: `${prefix}${i}`, weight })));

/** Healthy, non-draining views of the ring's replicas with the given in-flight counts (0 where missing), patched per index. */
export const views = (ring: Ring, inFlight: ArrayLike<number> = [], patch: Partial<Record<number, Partial<ReplicaView>>> = {}): ReplicaView[] =>
  ring.ids.map((id, i) => ({ id, weight: ring.weights[i]!, inFlight: inFlight[i] ?? 0, healthy: true, draining: false, ...patch[i] }));

/** Every replica of the ring healthy and idle. */
export const idle = (ring: Ring): ReplicaView[] => views(ring);

/** The success of a pick; throws with the reason when it failed. */
export function ok(res: PickResult): PickSuccess {
  if (!res.ok) throw new Error(`pick failed: ${res.reason}`);
  return res;
}
