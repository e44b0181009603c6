// The one place the simulator makes a routing decision. It holds what the Worker's
// coordinator holds (ring, round-robin cursor, random source) and calls the same
// `src/core` pick. Pure: no I/O; randomness is a seeded source.
//
// A strategy that needs more context gets it here: per pick in `RouteInput` (the key, the
// request's 16-token block ids, its length, the virtual time) and per replica in `loads`;
// `observe` is called with every decision. `prefix-aware` is plugged in this way: a PrefixIndex
// per pool (sim/prefix-router.ts), matched before the pick (`prefixMatch` in the pick
// context), recorded in `observe` (the coordinator records at pick time too, and retracts a
// failed request's blocks at release), pruned in `setMembers`.

import { buildRing, createStrategy, pickReplica, type PickResult, type RandomSource, type ReplicaView, type Ring, type Strategy } from '../src/core/index.js';
import { DEFAULT_PROFILE } from './profile.js';
import { createPrefixTracker, indexCapacity, type PrefixTracker } from './prefix-router.js';
import { createShardedRouter } from './shards.js';

export interface RouteInput {
  /** 32-bit routing key hash, or null for a keyless request (the fallback picks). */
  readonly key: number | null;
  /** Dense ids of the prompt's full 16-token blocks (chained: each identifies its whole prefix). */
  readonly blocks: Int32Array;
  readonly promptTokens: number;
  /** Virtual time of the pick, ms. */
  readonly nowMs: number;
  /** The request's index in the trace (lets a router match `release` to its decision). */
  readonly index?: number;
  /**
   * The key names the request's session (key source `session`, or `auto` on a request with one),
   * as a session header does in the router: only then does prefix-aware's index remember where
   * the key went (PrefixIndex.keyHomeOf) to tell a session's next turn from a new session.
   */
  readonly sessionKey?: boolean;
}

export interface SimRouter {
  readonly name: string;
  readonly strategy: Strategy;
  /** Replica ids in routing order (ring order); `route` returns indexes into this list. */
  readonly members: readonly string[];
  /** Membership change (scale event): rebuild the ring, as the coordinator does. */
  setMembers(ids: readonly string[]): void;
  /**
   * Pick a replica for one request; `loads[i]` is the in-flight count of `members[i]`. With `cap`
   * (flow control's per-replica bound), a replica at it takes nothing new, as the coordinator's
   * pick sees it (pick-state.ts drainingOf): all there and the pick fails.
   */
  route(input: RouteInput, loads: ArrayLike<number>, cap?: number): PickResult;
  /** Told every decision after it is made (no-op for the core strategies; the hook for per-replica knowledge). */
  observe(input: RouteInput, replica: number): void;
  /** Told when request `index` finishes (only routers that keep their own in-flight view need it). */
  release?(index: number): void;
  /** Home replica id of a key on the current ring (for counting the keys a scale event moves). */
  homeOf(key: number): string | null;
  /**
   * prefix-aware: router blocks the index believed the last picked replica held (−1 unknown), for
   * comparing the index's predicted hits with the replica model's (engine.ts `indexTracking`).
   */
  lastMatchedBlocks?(): number;
  /**
   * prefix-aware: a scrape of replica `id`'s KV cache (free 16-token blocks, as vLLM's
   * num_gpu_blocks × (1 − kv_cache_usage_perc)), sizing its index as the coordinator does.
   */
  scrapeKv?(id: string, freeBlocks: number): void;
}

export interface SimRouterOptions {
  readonly random: RandomSource;
  /** Strategy for keyless requests; default `least-load`, as in the router. */
  readonly fallback?: string;
  /** Coordinators the key space is split into (`--shards`, sim/shards.ts); default 1. */
  readonly shards?: number;
  /** A replica's KV cache in 16-token blocks: sizes `prefix-aware`'s index (sim/prefix-router.ts). Default 28,000. */
  readonly kvCapacityBlocks?: number;
}

export function createSimRouter(spec: string, members: readonly string[], options: SimRouterOptions): SimRouter {
  if (options.shards !== undefined && options.shards > 1) return createShardedRouter(spec, members, options.shards, options);
  const strategy = createStrategy(spec);
  const fallback = createStrategy(options.fallback ?? 'least-load');
  const random = options.random;
  let ids: string[] = [];
  let ring: Ring = buildRing([]);
  let cursor = 0;
  // `prefix-aware` reads which replica holds how much of the prompt: a PrefixIndex per pool,
  // matched before the pick and recorded after it, as the coordinator does.
  const prefix: PrefixTracker | null = strategy.name.startsWith('prefix-aware') ? createPrefixTracker(members, options.kvCapacityBlocks ?? DEFAULT_PROFILE.kvCapacityBlocks) : null;
  // As the coordinator does, a route is recorded at pick time (and would be retracted if its
  // request failed; simulated requests never fail).
  let lastMatched = -1;
  let lastPick = -1;
  const setMembers = (next: readonly string[]) => {
    prefix?.setMembers(ids, next);
    ids = [...next];
    ring = buildRing(ids.map((id) => ({ id, weight: 1 })));
    cursor = 0;
  };
  setMembers(members);
  return {
    name: strategy.name,
    strategy,
    get members() {
      return ids;
    },
    setMembers,
    route(input, loads, cap) {
      const replicas: ReplicaView[] = ids.map((id, i) => ({ id, weight: 1, inFlight: loads[i]!, healthy: true, draining: cap !== undefined && loads[i]! >= cap }));
      const prefixMatch = prefix !== null && input.key !== null ? prefix.match(ids, input.blocks, input.sessionKey ? input.key : null) : undefined;
      const result = pickReplica(strategy, fallback, { ring, replicas, key: input.key, random, cursor, prefixMatch });
      if (result.ok && result.cursor !== undefined) cursor = result.cursor;
      lastPick = result.ok ? result.index : -1;
      lastMatched = prefixMatch !== undefined && result.ok ? (prefixMatch.matched[result.index] ?? -1) : -1;
      return result;
    },
    observe(input, replica) {
      if (prefix === null) return;
      prefix.record(ids[replica]!, input.blocks, input.sessionKey ? input.key : null);
      if (replica !== lastPick) lastMatched = -1;
    },
    ...(prefix !== null
      ? {
          lastMatchedBlocks: () => lastMatched,
          scrapeKv: (id: string, freeBlocks: number) => prefix.index.setCapacity(id, indexCapacity(Math.max(1, freeBlocks)) ?? undefined),
        }
      : {}),
    homeOf(key) {
      const i = ring.home(key);
      return i < 0 ? null : ids[i]!;
    },
  };
}
