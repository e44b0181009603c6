// Data-parallel engines kept apart: per-engine slots and capacity, the engine matcher
// (src/coordinator/dp-engines.ts, engines/kv-capacity.ts engineIndexCapacityOf).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { PrefixIndex, PrefixMatchScratch } from '../../../src/core/index.js';
import { applyEngineScrape, countEngineLease, EngineMatcher, engineSlotId, MAX_POOL_ENGINE_SLOTS, singleEngine, slotBudget, type DpEngines } from '../../../src/coordinator/dp-engines.js';
import { kvCapacity } from '../../../src/engines/index.js';
import { engineIndexCapacityOf, indexCapacityOf } from '../../../src/engines/kv-capacity.js';
import { rankedEngines } from '../../../src/engines/vllm.js';
import { parsePromText } from '../../../src/engines/prom-text.js';

const fixture = (name: string) => parsePromText(readFileSync(join(import.meta.dirname, '../../fixtures/vllm-metrics', name), 'utf8'));
const config = (engine: string, blocks: number, usage?: number) =>
  `vllm:cache_config_info{block_size="16",engine="${engine}",num_gpu_blocks="${blocks}"} 1\n` + (usage === undefined ? '' : `vllm:kv_cache_usage_perc{engine="${engine}"} ${usage}\n`);

describe('per-engine capacity', () => {
  it('each engine from its own free blocks plus the router prompts in flight on it, capped at its own total', () => {
    const kv = kvCapacity(fixture('v1-tokens-dp2.txt'))!;
    const [e0, e1] = kv.engines;
    // 20,000 blocks × 16 tokens each; usage 0.25 and 0.75; router blocks of 64 tokens.
    expect(engineIndexCapacityOf(e0!)).toBe(3750);
    expect(engineIndexCapacityOf(e1!)).toBe(1250);
    expect(engineIndexCapacityOf(e1!, 100)).toBe(1350);
    expect(engineIndexCapacityOf(e1!, 1e9)).toBe(5000);
    // The summed view hides the difference: one slot of 5,000.
    expect(indexCapacityOf(kv)).toBe(5000);
  });

  it('applyEngineScrape gives a pinned replica one slot per engine, sized per engine', () => {
    const kv = kvCapacity(fixture('v1-tokens-dp2.txt'))!;
    const { dp, dropped } = applyEngineScrape(singleEngine('r1'), 'r1', kv, true, 0);
    expect(dp.pinned).toBe(true);
    expect(dp.slots).toEqual([engineSlotId('r1', 0), engineSlotId('r1', 1)]);
    expect(dp.capacity).toEqual([3750, 1250]);
    // The replica-wide slot held entries no engine can be named for: dropped.
    expect(dropped).toEqual(['r1']);
    // The router's own prompts in flight on engine 1 count for engine 1 only.
    dp.leaseBlocks[1] = 300;
    const again = applyEngineScrape(dp, 'r1', kv, true, 300);
    expect(again.dp).toBe(dp);
    expect(again.dropped).toEqual([]);
    expect(dp.capacity).toEqual([3750, 1550]);
  });

  it('pinning off, one engine or unaddressable labels: one slot of the whole replica', () => {
    const kv = kvCapacity(fixture('v1-tokens-dp2.txt'))!;
    const off = applyEngineScrape(singleEngine('r1'), 'r1', kv, false, 10);
    expect(off.dp.pinned).toBe(false);
    expect(off.dp.slots).toEqual(['r1']);
    expect(off.dp.capacity).toEqual([indexCapacityOf(kv, 10)]);
    expect(rankedEngines(kvCapacity(parsePromText(config('0', 1000))))).toBeNull();
    expect(rankedEngines(kvCapacity(parsePromText(config('0', 1000) + config('2', 1000))))).toBeNull();
    expect(rankedEngines(kvCapacity(parsePromText(config('a', 1000) + config('b', 1000))))).toBeNull();
    // An API server managing ranks 4 and 5 (hybrid load balancing): header values 0 and 1, in label order.
    expect(rankedEngines(kvCapacity(parsePromText(config('5', 1000) + config('4', 1000))))).toEqual(['4', '5']);
  });

  it('a changed set of engines rebuilds the slots and drops the old ones', () => {
    const two = kvCapacity(parsePromText(config('0', 1000, 0) + config('1', 1000, 0)))!;
    const three = kvCapacity(parsePromText(config('0', 1000, 0) + config('1', 1000, 0) + config('2', 1000, 0)))!;
    const a = applyEngineScrape(singleEngine('r'), 'r', two, true, 0).dp;
    const b = applyEngineScrape(a, 'r', three, true, 0);
    expect(b.dp).not.toBe(a);
    expect(b.dropped).toEqual(a.slots);
    expect(b.dp.slots).toHaveLength(3);
    // Back to one engine: one slot again.
    const c = applyEngineScrape(b.dp, 'r', kvCapacity(parsePromText(config('0', 1000, 0))), true, 0);
    expect(c.dp.slots).toEqual(['r']);
    expect(c.dropped).toEqual(b.dp.slots);
  });

  it('a pool pins at most MAX_POOL_ENGINE_SLOTS slots in all: an origin reporting hundreds of engines stays one slot', () => {
    const many = (n: number) => kvCapacity(parsePromText(Array.from({ length: n }, (_, e) => config(String(e), 1000, 0)).join('')));
    expect(applyEngineScrape(singleEngine('r'), 'r', many(500), true, 0).dp.slots).toEqual(['r']);
    // 62 single-engine replicas leave 2 slots: a two-engine replica fits, a third engine would not.
    const others = Array.from({ length: MAX_POOL_ENGINE_SLOTS - 2 }, (_, k) => ({ dp: singleEngine(`s${k}`) }));
    const r = { dp: singleEngine('r') };
    const pool = [...others, r];
    expect(slotBudget(pool, r)).toBe(2);
    expect(applyEngineScrape(r.dp, 'r', many(2), true, 0, slotBudget(pool, r)).dp.pinned).toBe(true);
    expect(applyEngineScrape(r.dp, 'r', many(3), true, 0, slotBudget(pool, r)).dp.pinned).toBe(false);
  });

  it('a lease counted on a replaced layout changes nothing when it ends', () => {
    const kv = kvCapacity(parsePromText(config('0', 1000, 0) + config('1', 1000, 0)))!;
    const dp = applyEngineScrape(singleEngine('r'), 'r', kv, true, 0).dp;
    countEngineLease({ dp, slot: 1 }, dp, 8, 1);
    expect(dp.leases).toEqual([0, 1]);
    expect(dp.leaseBlocks).toEqual([0, 8]);
    const other = applyEngineScrape(singleEngine('r'), 'r', kv, true, 0).dp;
    countEngineLease({ dp, slot: 1 }, other, 8, -1);
    expect(other.leases).toEqual([0, 0]);
    countEngineLease({ dp, slot: 1 }, dp, 8, -1);
    expect(dp.leases).toEqual([0, 0]);
  });
});

describe('EngineMatcher', () => {
  const blocks = Uint32Array.from({ length: 12 }, (_, i) => 1000 + i);
  const pinnedDp = (id: string): DpEngines => applyEngineScrape(singleEngine(id), id, kvCapacity(parsePromText(config('0', 4096, 0) + config('1', 4096, 0))), true, 0).dp;

  it('a replica matches as its best engine, and pick names that engine', () => {
    const index = new PrefixIndex();
    const replicas = [{ dp: singleEngine('a') }, { dp: pinnedDp('b') }];
    index.recordRoute('a', blocks.subarray(0, 4));
    index.recordRoute(engineSlotId('b', 1), blocks);
    index.recordRoute(engineSlotId('b', 0), blocks.subarray(0, 2));
    const m = new EngineMatcher();
    const pm = m.match(index, ['a', 'b'], replicas, blocks, new PrefixMatchScratch());
    expect([...pm.matched]).toEqual([4, 12]);
    expect(m.pick(1, replicas[1]!.dp, 5)).toEqual({ slot: 1, matched: 12 });
    // A single-engine replica is never pinned.
    expect(m.pick(0, replicas[0]!.dp, 5)).toBeNull();
  });

  it('without pinned replicas it is the plain per-replica match', () => {
    const index = new PrefixIndex();
    index.recordRoute('b', blocks);
    const m = new EngineMatcher();
    const pm = m.match(index, ['a', 'b'], [{ dp: singleEngine('a') }, { dp: singleEngine('b') }], blocks, new PrefixMatchScratch());
    expect([...pm.matched]).toEqual([index.matchAll(['a'], blocks)[0], 12]);
  });

  it('no match on either engine: the engine with fewer router leases', () => {
    const index = new PrefixIndex();
    const dp = pinnedDp('b');
    dp.leases[0] = 2;
    const m = new EngineMatcher();
    m.match(index, ['b'], [{ dp }], blocks, new PrefixMatchScratch());
    expect(m.pick(0, dp, 99)!.slot).toBe(1);
  });

  it('a replica\'s recent routes are its engines\' together, and a key sent to an engine has that replica as its home', () => {
    const index = new PrefixIndex();
    const replicas = [{ dp: singleEngine('a') }, { dp: pinnedDp('b') }];
    index.recordRoute('a', blocks.subarray(0, 3), 1);
    index.recordRoute(engineSlotId('b', 0), blocks.subarray(0, 5), 2);
    index.recordRoute(engineSlotId('b', 1), blocks.subarray(0, 7), 3);
    const m = new EngineMatcher();
    const scratch = new PrefixMatchScratch();
    const pm = m.match(index, ['a', 'b'], replicas, blocks, scratch, 3);
    expect([...pm.recent!]).toEqual([1, 2]);
    expect(index.recentRoutes()).toBe(3);
    expect(pm.keyHome).toBe(1);
    expect(m.match(index, ['a', 'b'], replicas, blocks, scratch, 1).keyHome).toBe(0);
    expect(m.match(index, ['a', 'b'], replicas, blocks, scratch, 77).keyHome).toBe(-1);
    expect(m.match(index, ['a', 'b'], replicas, blocks, scratch).keyHome).toBeUndefined();
  });

  it('keeps its layout until invalidated (the coordinator calls it whenever engines change)', () => {
    const index = new PrefixIndex();
    const ids = ['b'];
    const r = { dp: singleEngine('b') };
    index.recordRoute(engineSlotId('b', 1), blocks);
    const m = new EngineMatcher();
    const out = () => m.match(index, ids, [r], blocks, new PrefixMatchScratch()).matched[0];
    expect(out()).toBe(-1);
    r.dp = pinnedDp('b');
    // Not told: the old (single-slot) layout, and no pin for a replica it does not know as pinned.
    out();
    expect(m.pick(0, r.dp, 1)).toBeNull();
    m.invalidate();
    expect(out()).toBe(12);
    expect(m.pick(0, r.dp, 1)).toEqual({ slot: 1, matched: 12 });
  });
});
