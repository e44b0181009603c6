// How much of a vLLM replica's KV cache can hold prefixes the router may later reuse, per
// data-parallel engine, from one parsed `/metrics` scrape. Pure: no I/O.
//
// vLLM (v1 KVCacheManager / BlockPool) evicts only free blocks: a block pinned by a running
// request is never evicted, and a finished request's blocks go back to the free queue with
// their hashes, evictable in LRU order. `vllm:kv_cache_usage_perc` (older
// `vllm:gpu_cache_usage_perc`) is 1 − free / total, so the cache that outlives the running
// requests is
//
//   free_e = num_gpu_blocks_e × (1 − usage_e)            per engine e (label `engine`)
//   free   = Σ_e free_e
//
// The router's index holds that evictable part plus the prompts of its own requests in flight
// (recorded at pick time, pinned in the engine while they run): its capacity is
// min(total, free + those prompts), `indexCapacityOf`.
// Engines are kept apart: a data-parallel server reports one `cache_config_info` and one
// usage gauge per engine, and averaging the usage over engines of different sizes (or
// summing blocks against a mean) misstates the free part. An engine without a usage gauge is
// taken as wholly free (the old behaviour: capacity = its blocks).

import { capacityInBlocks, DEFAULT_BLOCK_TOKENS } from '../core/index.js';
import { findSamples, type LabelFilter, type PromParse } from './prom-text.js';

export interface EngineKv {
  /** The `engine` label ('' when absent: a server with one engine). */
  readonly engine: string;
  readonly numGpuBlocks: number;
  readonly blockSize: number;
  /** 0..1, or null when the engine exposed no usage gauge. */
  readonly usage: number | null;
  /** numGpuBlocks × (1 − usage), in vLLM blocks. */
  readonly freeBlocks: number;
}

export interface KvCapacity {
  readonly engines: readonly EngineKv[];
  /** Σ free blocks over engines, in vLLM blocks of `blockSize` tokens. */
  readonly freeBlocks: number;
  readonly totalBlocks: number;
  readonly blockSize: number;
}

const USAGE = ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'] as const;

/** Per-engine KV capacity and free blocks, or null when the scrape has no `vllm:cache_config_info`. */
export function kvCapacity(parsed: PromParse, filter?: LabelFilter): KvCapacity | null {
  const usageByEngine = new Map<string, number>();
  for (const name of USAGE) {
    for (const s of findSamples(parsed, name, filter)) {
      const e = s.labels['engine'] ?? '';
      if (!usageByEngine.has(e) && Number.isFinite(s.value)) usageByEngine.set(e, Math.min(1, Math.max(0, s.value)));
    }
  }
  const engines: EngineKv[] = [];
  const seen = new Set<string>();
  for (const s of findSamples(parsed, 'vllm:cache_config_info', filter)) {
    const engine = s.labels['engine'] ?? '';
    if (seen.has(engine)) continue;
    const blocks = positiveInt(s.labels['num_gpu_blocks']);
    const blockSize = positiveInt(s.labels['block_size']);
    if (blocks === undefined || blockSize === undefined) continue;
    seen.add(engine);
    const usage = usageByEngine.get(engine) ?? null;
    engines.push({ engine, numGpuBlocks: blocks, blockSize, usage, freeBlocks: Math.floor(blocks * (1 - (usage ?? 0))) });
  }
  if (engines.length === 0) return null;
  let free = 0;
  let total = 0;
  for (const e of engines) {
    free += e.freeBlocks;
    total += e.numGpuBlocks;
  }
  return { engines, freeBlocks: free, totalBlocks: total, blockSize: engines[0]!.blockSize };
}

function positiveInt(s: string | undefined): number | undefined {
  if (s === undefined || !/^\d{1,15}$/.test(s)) return undefined;
  const n = Number(s);
  return n > 0 ? n : undefined;
}

/**
 * The prefix index's capacity for the replica in router blocks, or undefined when unknown:
 *
 *   capacity = min(total, free + inFlight)        (router blocks of `routerBlockTokens` tokens)
 *
 * `inFlight` is the prompt blocks of the router's own requests in flight there: the index
 * records a route at pick time (pool-coordinator.ts), so it also holds those prompts, which
 * vLLM holds too (pinned while they run) and which the usage gauge counts as used. Free alone
 * shrank the index under load, when usage is high, below what the engine really reuses
 * (simulator, Mooncake ×2: hit rate 14.6% → 6.7%, p95 TTFT 15 s → 55 s); free + in flight
 * tracks it (14.5%, 16 s). docs/benchmarks.md, "Prefix-aware routing (simulator)".
 */
export function indexCapacityOf(kv: KvCapacity | null, inFlightBlocks = 0, routerBlockTokens = DEFAULT_BLOCK_TOKENS): number | undefined {
  if (kv === null) return undefined;
  return capacityFrom(kv.totalBlocks, kv.freeBlocks, kv.blockSize, inFlightBlocks, routerBlockTokens);
}

/**
 * One data-parallel engine's slot of the index (dp-engines.ts), from that engine's own blocks
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
 * One engine from a sample's totals, for servers with no per-engine `vllm:cache_config_info`
 * (SGLang, llama.cpp: vllm.ts `extractEngineSample`): blocks × (1 − usage).
 */
export function kvCapacityFromTotals(numGpuBlocks: number | undefined, blockSize: number | undefined, usage: number | undefined): KvCapacity | null {
  if (!(numGpuBlocks !== undefined && numGpuBlocks > 0) || !(blockSize !== undefined && blockSize > 0)) return null;
  const u = usage !== undefined && Number.isFinite(usage) ? Math.min(1, Math.max(0, usage)) : null;
  const free = Math.floor(numGpuBlocks * (1 - (u ?? 0)));
  return { engines: [{ engine: '', numGpuBlocks, blockSize, usage: u, freeBlocks: free }], freeBlocks: free, totalBlocks: numGpuBlocks, blockSize };
}
