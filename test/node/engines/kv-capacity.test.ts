// Free KV per data-parallel engine from a vLLM scrape (src/engines/kv-capacity.ts).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { kvCapacity } from '../../../src/engines/index.js';
import { indexCapacityOf } from '../../../src/engines/kv-capacity.js';
import { parsePromText } from '../../../src/engines/prom-text.js';

const fixture = (name: string) => parsePromText(readFileSync(join(import.meta.dirname, '../../fixtures/vllm-metrics', name), 'utf8'));

describe('kvCapacity', () => {
  it('keeps data-parallel engines apart: free = Σ_e blocks_e × (1 − usage_e)', () => {
    const kv = kvCapacity(fixture('v1-tokens-dp2.txt'))!;
    expect(kv.engines.map((e) => e.engine)).toEqual(['0', '1']);
    for (const e of kv.engines) expect(e.freeBlocks).toBe(Math.floor(e.numGpuBlocks * (1 - e.usage!)));
    expect(kv.freeBlocks).toBe(kv.engines.reduce((s, e) => s + e.freeBlocks, 0));
    expect(kv.totalBlocks).toBe(kv.engines.reduce((s, e) => s + e.numGpuBlocks, 0));
    expect(indexCapacityOf(kv)).toBe(Math.floor((kv.freeBlocks * kv.blockSize) / 64));
    // Plus the router's own prompts in flight there, never above the whole KV.
    expect(indexCapacityOf(kv, 100)).toBe(Math.floor((kv.freeBlocks * kv.blockSize) / 64) + 100);
    expect(indexCapacityOf(kv, 1e9)).toBe(Math.floor((kv.totalBlocks * kv.blockSize) / 64));
  });

  it("reads num_gpu_blocks as vLLM writes it on a data-parallel server: the server's total on every engine's label", () => {
    // vllm/v1/engine/utils.py wait_for_engine_startup sums the engines' blocks into the one
    // CacheConfig every engine's logger labels with: 3 engines × 1,000 blocks say 3000 thrice.
    const text = ['0', '1', '2'].map((e) => `vllm:cache_config_info{block_size="16",engine="${e}",num_gpu_blocks="3000"} 1\nvllm:kv_cache_usage_perc{engine="${e}"} 0.5\n`).join('');
    const kv = kvCapacity(parsePromText(text))!;
    expect(kv.engines.map((e) => e.numGpuBlocks)).toEqual([1000, 1000, 1000]);
    expect(kv.totalBlocks).toBe(3000);
    expect(kv.freeBlocks).toBe(1500);
    // One engine (no data parallelism): the label is that engine's.
    expect(kvCapacity(parsePromText('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="3000"} 1\n'))!.totalBlocks).toBe(3000);
  });

  it('an engine with no usage gauge counts as free; no cache_config_info is unknown', () => {
    const kv = kvCapacity(parsePromText('vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1\n'))!;
    expect(kv.freeBlocks).toBe(1000);
    expect(kv.engines[0]!.usage).toBeNull();
    expect(kvCapacity(parsePromText('vllm:kv_cache_usage_perc 0.5\n'))).toBeNull();
    expect(indexCapacityOf(null)).toBeUndefined();
    // Fully pinned: capacity 1 router block, never 0 (the index needs a positive capacity).
    const full = kvCapacity(parsePromText('vllm:kv_cache_usage_perc 1\nvllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1\n'))!;
    expect(indexCapacityOf(full)).toBe(1);
  });
});
