// How much of a replica's KV cache can hold prefixes the router may later reuse, per
// data-parallel engine, and the prefix index's capacity from it. Pure: no I/O.
//
// An engine profile reads the free part from a scrape (engines/vllm.ts per `engine` label; the
// others from the sample's totals, `kvCapacityFromTotals`): blocks × (1 − usage), the cache
// that outlives the running requests, since an engine evicts only blocks no request pins.
// The router's index holds that evictable part plus the prompts of its own requests in flight
// (recorded at pick time, pinned in the engine while they run): its capacity is
// min(total, free + those prompts), `indexCapacityOf`.

import { capacityInBlocks, DEFAULT_BLOCK_TOKENS } from '../core/index.js';

export interface EngineKv {
  /** The `engine` label ('' when absent: a server with one engine). */
  readonly engine: string;
  readonly numGpuBlocks: number;
  readonly blockSize: number;
  /** 0..1, or null when the engine exposed no usage gauge. */
  readonly usage: number | null;
  /** numGpuBlocks × (1 − usage), in the engine's blocks. */
  readonly freeBlocks: number;
}

export interface KvCapacity {
  readonly engines: readonly EngineKv[];
  /** Σ free blocks over engines, in engine blocks of `blockSize` tokens. */
  readonly freeBlocks: number;
  readonly totalBlocks: number;
  readonly blockSize: number;
}

/**
 * The prefix index's capacity for the replica in router blocks, or undefined when unknown:
 *
 *   capacity = min(total, free + inFlight)        (router blocks of `routerBlockTokens` tokens)
 *
 * `inFlight` is the prompt blocks of the router's own requests in flight there: the index
 * records a route at pick time (pool-coordinator.ts), so it also holds those prompts, which
 * the engine holds too (pinned while they run) and which the usage gauge counts as used. Free alone
 * shrank the index under load, when usage is high, below what the engine really reuses
 * (simulator, Mooncake ×2: hit rate 14.6% → 6.7%, p95 TTFT 15 s → 55 s); free + in flight
 * tracks it (14.5%, 16 s). docs/benchmarks.md, "Prefix-aware routing (simulator)".
 */
export function indexCapacityOf(kv: KvCapacity | null, inFlightBlocks = 0, routerBlockTokens = DEFAULT_BLOCK_TOKENS): number | undefined {
  if (kv === null) return undefined;
  return capacityFrom(kv.totalBlocks, kv.freeBlocks, kv.blockSize, inFlightBlocks, routerBlockTokens);
}

/**
 * One data-parallel engine's slot of the index (coordinator/dp-engines.ts), from that engine's own blocks
 * and usage and the router's prompts in flight on that engine:
 *
 *   capacity_e = min(total_e, free_e + inFlight_e)        (router blocks)
 *
 * Each engine core has its own KV cache and evicts on its own, so one engine's free blocks say
 * nothing about another's.
 */
export function engineIndexCapacityOf(engine: EngineKv, inFlightBlocks = 0, routerBlockTokens = DEFAULT_BLOCK_TOKENS): number {
  return capacityFrom(engine.numGpuBlocks, engine.freeBlocks, engine.blockSize, inFlightBlocks, routerBlockTokens);
}

function capacityFrom(totalBlocks: number, freeBlocks: number, blockSize: number, inFlightBlocks: number, routerBlockTokens: number): number {
  const total = capacityInBlocks(totalBlocks, blockSize, routerBlockTokens);
  const free = freeBlocks > 0 ? capacityInBlocks(freeBlocks, blockSize, routerBlockTokens) : 0;
  return Math.max(1, Math.min(total, free + Math.max(0, inFlightBlocks)));
}

/**
 * One engine from a sample's totals, for servers with no per-engine capacity (SGLang, llama.cpp:
 * their profiles' `extractSample`): blocks × (1 − usage).
 */
export function kvCapacityFromTotals(numGpuBlocks: number | undefined, blockSize: number | undefined, usage: number | undefined): KvCapacity | null {
  if (!(numGpuBlocks !== undefined && numGpuBlocks > 0) || !(blockSize !== undefined && blockSize > 0)) return null;
  const u = usage !== undefined && Number.isFinite(usage) ? Math.min(1, Math.max(0, usage)) : null;
  const free = Math.floor(numGpuBlocks * (1 - (u ?? 0)));
  return { engines: [{ engine: '', numGpuBlocks, blockSize, usage: u, freeBlocks: free }], freeBlocks: free, totalBlocks: numGpuBlocks, blockSize };
}
