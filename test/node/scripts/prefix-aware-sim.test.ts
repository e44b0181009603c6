// `prefix-aware` through the simulator: the PrefixIndex plumbing in sim/router.ts
// (router blocks from the 16-token ids, match before the pick, record after, drop on removal),
// determinism, the hit-rate win over bounded-hash on multi-turn chat, and no starvation on the
// Mooncake excerpt.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { simulate, type SimConfig } from '../../../sim/engine.js';
import { createPrefixTracker, indexCapacity, routerBlocks } from '../../../sim/prefix-router.js';
import { createSimRouter } from '../../../sim/router.js';
import { mulberry32 } from '../../../sim/rng.js';
import { computeBound, computeCacheBound, parseKeySpec, parseTrace, routingKey, type Trace } from '../../../sim/trace.js';
import { generateWorkload } from '../../../sim/workloads.js';

const mooncake = parseTrace(readFileSync(join(import.meta.dirname, '../../fixtures/mooncake-excerpt.jsonl'), 'utf8'), 'mooncake-excerpt');
const multiTurn = parseTrace(generateWorkload('multi-turn', { seed: 3, sessions: 60 }).map((r) => JSON.stringify(r)).join('\n'), 'multi-turn');

const keysFor = (trace: Trace, spec: string) => trace.requests.map((r) => routingKey(r, parseKeySpec(spec)));
const run = (trace: Trace, over: Partial<SimConfig> & { key?: string } = {}) =>
  simulate(trace, { strategy: 'prefix-aware', replicas: 8, keys: keysFor(trace, over.key ?? 'auto'), seed: 5, ...over });

describe('router blocks and the index', () => {
  it('router block j is the 16-token id at 4j + 3; a partial router block is left out', () => {
    const ids = Int32Array.from({ length: 11 }, (_, i) => 100 + i);
    expect(Array.from(routerBlocks(ids))).toEqual([103, 107]);
    expect(routerBlocks(ids, 1).length).toBe(1);
    expect(indexCapacity(28_000)).toBe(7_000);
    expect(indexCapacity(Infinity)).toBeUndefined();
  });

  it('matches what was recorded, and forgets a replica that leaves', () => {
    const t = createPrefixTracker(['a', 'b'], 28_000);
    const blocks = Int32Array.from({ length: 40 }, (_, i) => i + 1);
    expect(Array.from(t.match(['a', 'b'], blocks).matched)).toEqual([-1, -1]);
    t.record('b', blocks);
    const m = t.match(['a', 'b'], blocks);
    expect(m.blocks).toBe(10);
    expect(Array.from(m.matched)).toEqual([-1, 10]);
    t.setMembers(['a', 'b'], ['a']);
    expect(t.index.replicas()).toEqual([]);
  });

  it('the simulated router keeps an index only for prefix-aware and follows a recorded prefix', () => {
    const members = Array.from({ length: 8 }, (_, i) => `r${i}`);
    const router = createSimRouter('prefix-aware', members, { random: mulberry32(1) });
    const blocks = Int32Array.from({ length: 400 }, (_, i) => i + 1);
    const loads = new Array(8).fill(0);
    // Every replica has had its share of other routes (none is under-served, which a new key
    // would be seeded to).
    for (let k = 0; k < 16 * 8; k++) router.observe({ key: 50_000 + k, blocks: Int32Array.from({ length: 8 }, (_, i) => 100_000 + 8 * k + i), promptTokens: 128, nowMs: 0 }, k % 8);
    const first = router.route({ key: 1234, blocks: blocks.subarray(0, 200), promptTokens: 3200, nowMs: 0 }, loads);
    expect(first.ok).toBe(true);
    if (!first.ok) return;
    router.observe({ key: 1234, blocks: blocks.subarray(0, 200), promptTokens: 3200, nowMs: 0 }, first.index);
    // Another key whose prompt continues the recorded one goes where that prefix lives.
    const next = router.route({ key: 98765, blocks, promptTokens: 6400, nowMs: 1 }, loads);
    expect(next.ok && next.index).toBe(first.index);
  });
});

describe('prefix-aware in the simulator', () => {
  it('same seed, same result', () => {
    const a = run(mooncake, { key: 'prefix:2blocks' });
    const b = run(mooncake, { key: 'prefix:2blocks' });
    expect(Array.from(a.ttftByRequest)).toEqual(Array.from(b.ttftByRequest));
    expect({ ...a, wallMs: 0 }).toEqual({ ...b, wallMs: 0 });
    const c = run(multiTurn, { timeScale: 16 });
    const d = run(multiTurn, { timeScale: 16 });
    expect({ ...c, wallMs: 0 }).toEqual({ ...d, wallMs: 0 });
  });

  it('beats bounded-hash on the hit rate of multi-turn chat, within the bound', () => {
    for (const timeScale of [1, 16]) {
      const pa = run(multiTurn, { timeScale });
      const bh = run(multiTurn, { timeScale, strategy: 'bounded-hash:1.25', key: 'session' });
      expect(pa.tokenHitRate, `×${timeScale}`).toBeGreaterThan(bh.tokenHitRate);
      expect(pa.cachedTokens).toBeLessThanOrEqual(computeBound(multiTurn).cachedTokens);
    }
  });

  it('starves no replica on the Mooncake excerpt (each gets at least half the mean)', () => {
    for (const timeScale of [1, 2, 4]) {
      const r = run(mooncake, { key: 'prefix:2blocks', timeScale });
      const counts = r.perReplica.map((p) => p.requests);
      expect(counts.reduce((s, x) => s + x, 0)).toBe(300);
      expect(Math.min(...counts), `×${timeScale}: ${counts.join(' ')}`).toBeGreaterThanOrEqual(r.requestsPerReplica.mean / 2);
    }
  });

  it('a removed replica is dropped from the index and gets nothing after the event', () => {
    const r = run(mooncake, { key: 'prefix:2blocks', timeScale: 2, scaleEvent: { kind: 'remove', atMs: 60_000 } });
    expect(r.perReplica.reduce((s, p) => s + p.requests, 0)).toBe(300);
    expect(r.scale?.event).toBe('remove@60s');
  });
});

describe('the finite-cache bound', () => {
  it('is the infinite bound when the pool holds everything, lower when it does not, and never higher', () => {
    const inf = computeBound(mooncake);
    expect(computeCacheBound(mooncake, Infinity)).toEqual(inf);
    expect(computeCacheBound(mooncake, 1e9).cachedTokens).toBe(inf.cachedTokens);
    const small = computeCacheBound(mooncake, 2_000);
    expect(small.cachedTokens).toBeLessThan(inf.cachedTokens);
    expect(small.promptTokens).toBe(inf.promptTokens);
  });
});

describe('the index tracks the replica model', () => {
  it('predicted hit rate = the model hits the index can see (64-token blocks, first 512, anchors), and within its resolution of the model\'s', () => {
    const r = run(multiTurn, { key: 'session', timeScale: 16 });
    const t = r.indexTracking!;
    expect(t.requests).toBeGreaterThan(r.requests * 0.9);
    // The index's own drift: none in the simulator (it is fed what each replica was sent).
    expect(Math.abs(t.predictedHitRate - t.visibleHitRate)).toBeLessThanOrEqual(0.01);
    expect(t.meanAbsErrorVisible).toBeLessThanOrEqual(0.01);
    // Its resolution (64-token blocks; anchors at most 25% short past 16 blocks): under, never over.
    expect(t.predictedHitRate).toBeLessThanOrEqual(t.modelHitRate + 1e-9);
    expect(t.modelHitRate - t.predictedHitRate).toBeLessThanOrEqual(0.15);
    expect(r.minRequestShare).toBeGreaterThanOrEqual(0.5);
    expect(run(multiTurn, { strategy: 'least-load', key: 'session', timeScale: 16 }).indexTracking).toBeNull();
  });
});
