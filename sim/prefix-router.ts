// The simulator's side of `prefix-aware`: one `PrefixIndex` per simulated pool, fed the router
// blocks the Worker would compute for each request. Pure: in-memory soft state, no I/O.
//
// Router blocks (src/core/blocks.ts) are 256 bytes ≈ 64 tokens, chained like vLLM's 16-token
// blocks. The trace's ids are chained 16-token block ids, so router block j ends at the 16-token
// block 4j + 3, and that block's id identifies the whole 64(j + 1)-token prefix: it stands in
// for router block j's chained hash. A prompt's trailing partial router block is not hashed (as
// in blocks.ts), and at most `maxBlocks` (the router's default 512 = 32K tokens) are indexed.
//
// The index's per-replica capacity is the modelled KV cache in router blocks:
// capacityInBlocks(kvCapacityBlocks, 16, 64) = 28,000 × 16 / 64 = 7,000 with the default profile.

import { DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_BLOCKS, DEFAULT_MAX_ENTRIES, PrefixIndex, PrefixMatchScratch, capacityInBlocks, matchPrefix, type PrefixMatch } from '../src/core/index.js';
import { KV_BLOCK_TOKENS } from './trace.js';

/** 16-token blocks per router block. */
export const ROUTER_BLOCK_WIDTH = DEFAULT_BLOCK_TOKENS / KV_BLOCK_TOKENS;

/** The router's chained block hashes of a prompt, from its chained 16-token block ids. */
export function routerBlocks(blocks: Int32Array, maxBlocks = DEFAULT_MAX_BLOCKS): Int32Array {
  const n = Math.min(maxBlocks, Math.floor(blocks.length / ROUTER_BLOCK_WIDTH));
  const out = new Int32Array(n);
  for (let j = 0; j < n; j++) out[j] = blocks[j * ROUTER_BLOCK_WIDTH + ROUTER_BLOCK_WIDTH - 1]!;
  return out;
}

/** Index capacity per replica, in router blocks, for a KV cache of `kvCapacityBlocks` 16-token blocks. */
export function indexCapacity(kvCapacityBlocks: number): number | undefined {
  return Number.isFinite(kvCapacityBlocks) ? capacityInBlocks(kvCapacityBlocks, KV_BLOCK_TOKENS, DEFAULT_BLOCK_TOKENS) : undefined;
}

export interface PrefixTracker {
  /** Per-member matches of the request (members in ring order), for the pick context. */
  match(members: readonly string[], blocks: Int32Array, key?: number | null): PrefixMatch;
  /** The request was routed to `replica`: record its blocks there (and its routing key). */
  record(replica: string, blocks: Int32Array, key?: number | null): void;
  /** Replicas joined or left: capacities for the new ones, forget the removed ones. */
  setMembers(previous: readonly string[], next: readonly string[]): void;
  readonly index: PrefixIndex;
}

export function createPrefixTracker(members: readonly string[], kvCapacityBlocks: number): PrefixTracker {
  const cap = indexCapacity(kvCapacityBlocks);
  // Room for every replica at its full capacity (plus one scale-event replica), so the global
  // cap never scales the per-replica capacities down; an infinite cache gets the default cap.
  const maxEntries = cap === undefined ? DEFAULT_MAX_ENTRIES : Math.max(DEFAULT_MAX_ENTRIES, (members.length + 1) * cap);
  const index = new PrefixIndex({ maxEntries, defaultCapacity: cap ?? Math.floor(DEFAULT_MAX_ENTRIES / (members.length + 1)) });
  let lastIn: Int32Array | null = null;
  let lastOut: Int32Array = new Int32Array(0);
  const toRouter = (blocks: Int32Array) => {
    if (blocks !== lastIn) {
      lastIn = blocks;
      lastOut = routerBlocks(blocks);
    }
    return lastOut;
  };
  const scratch = new PrefixMatchScratch();
  return {
    index,
    match(ids, blocks, key) {
      return matchPrefix(index, ids, toRouter(blocks), scratch, key);
    },
    record(replica, blocks, key) {
      index.recordRoute(replica, toRouter(blocks), key);
    },
    setMembers(previous, next) {
      const keep = new Set(next);
      for (const id of previous) if (!keep.has(id)) index.dropReplica(id);
    },
  };
}
