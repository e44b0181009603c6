// A sharded coordinator for the simulator (`npm run simulate -- --shards S`): the pool's key
// space is cut into S equal ranges of the 32-bit key hash (its ring position), each served by
// its own coordinator. A shard runs the same `src/core` pick, but over its own view of in-flight:
// only the requests it placed itself, as S Durable Objects that never talk to each other would.
// Keyless requests go to a shard drawn at random (any Worker may call any shard). Pure: no I/O.
//
// What it changes (docs/scaling.md): each shard's bounded-hash cap is ceil((own in-flight + 1) × c)
// split over the replicas, at least one slot each, so a replica's global in-flight can reach the
// sum of S per-shard caps, about c × mean + S at worst, instead of c × mean + 1; and a shard sees a
// replica as free while the other shards fill it, so spills (and hit-rate losses) follow the
// shard's local picture, not the pool's.

import { buildRing, createStrategy, pickReplica, type ReplicaView, type Ring } from '../src/core/index.js';
import type { RouteInput, SimRouter, SimRouterOptions } from './router.js';

/** Shard of a 32-bit key: its range on the ring, [s × 2^32 / S, (s + 1) × 2^32 / S). */
export function shardOfKey(key: number, shards: number): number {
  return Math.min(shards - 1, Math.floor(((key >>> 0) / 4294967296) * shards));
}

export function createShardedRouter(spec: string, members: readonly string[], shards: number, options: SimRouterOptions): SimRouter {
  if (!Number.isInteger(shards) || shards < 1) throw new RangeError(`shards must be a positive integer, got ${shards}`);
  const strategy = createStrategy(spec);
  const fallback = createStrategy(options.fallback ?? 'least-load');
  const random = options.random;
  let ids: string[] = [];
  let ring: Ring = buildRing([]);
  /** own[s].get(id) = requests shard s placed on replica `id` that have not finished. */
  const own: Map<string, number>[] = Array.from({ length: shards }, () => new Map());
  const cursors = new Array<number>(shards).fill(0);
  /** Request index → [shard, replica id], until the request finishes. */
  const placed = new Map<number, [number, string]>();
  let lastShard = 0;
  const setMembers = (next: readonly string[]) => {
    ids = [...next];
    ring = buildRing(ids.map((id) => ({ id, weight: 1 })));
    cursors.fill(0);
  };
  setMembers(members);
  return {
    name: `${strategy.name} ×${shards} shards`,
    strategy,
    get members() {
      return ids;
    },
    setMembers,
    route(input: RouteInput) {
      const s = input.key === null ? Math.floor(random() * shards) : shardOfKey(input.key, shards);
      lastShard = s;
      const view = own[s]!;
      const replicas: ReplicaView[] = ids.map((id) => ({ id, weight: 1, inFlight: view.get(id) ?? 0, healthy: true, draining: false }));
      const result = pickReplica(strategy, fallback, { ring, replicas, key: input.key, random, cursor: cursors[s]! });
      if (result.ok && result.cursor !== undefined) cursors[s] = result.cursor;
      return result;
    },
    observe(input, replica) {
      const id = ids[replica]!;
      const view = own[lastShard]!;
      view.set(id, (view.get(id) ?? 0) + 1);
      if (input.index !== undefined) placed.set(input.index, [lastShard, id]);
    },
    release(index) {
      const p = placed.get(index);
      if (!p) return;
      placed.delete(index);
      const view = own[p[0]]!;
      const n = (view.get(p[1]) ?? 1) - 1;
      if (n > 0) view.set(p[1], n);
      else view.delete(p[1]);
    },
    homeOf(key) {
      const i = ring.home(key);
      return i < 0 ? null : ids[i]!;
    },
  };
}
