import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { simulate, type SimConfig } from '../../../sim/engine.js';
import { resolveProfile } from '../../../sim/profile.js';
import { computeBound, parseKeySpec, parseTrace, routingKey, type Trace } from '../../../sim/trace.js';

// CI runs on a fresh clone without ../shared: the Mooncake excerpt lives in test/fixtures.
const mooncake = parseTrace(readFileSync(join(import.meta.dirname, '../../fixtures/mooncake-excerpt.jsonl'), 'utf8'), 'mooncake-excerpt');

function keysFor(trace: Trace, spec = 'prefix:2blocks') {
  const k = parseKeySpec(spec);
  return trace.requests.map((r) => routingKey(r, k));
}

function run(trace: Trace, over: Partial<SimConfig> = {}) {
  return simulate(trace, { strategy: 'bounded-hash:1.25', replicas: 8, keys: keysFor(trace), seed: 7, ...over });
}

describe('simulator against the reuse bound', () => {
  it('the excerpt is the first 300 lines of the Mooncake conversation trace', () => {
    expect(mooncake.requests.length).toBe(300);
    expect(mooncake.format).toBe('mooncake');
  });

  it('one replica with an infinite cache reaches exactly the bound', () => {
    const bound = computeBound(mooncake);
    expect(bound.tokenHitRate).toBeGreaterThan(0.05);
    const r = run(mooncake, { replicas: 1, profile: resolveProfile({ kvCapacityBlocks: Infinity }), timeScale: 4 });
    expect(r.cachedTokens).toBe(bound.cachedTokens);
    expect(r.promptTokens).toBe(bound.promptTokens);
    expect(r.tokenHitRate).toBe(bound.tokenHitRate);
  });

  it('no strategy beats the bound', () => {
    const bound = computeBound(mooncake);
    for (const strategy of ['round-robin', 'hash', 'bounded-hash:1.25']) {
      expect(run(mooncake, { strategy, profile: resolveProfile({ kvCapacityBlocks: Infinity }) }).cachedTokens).toBeLessThanOrEqual(bound.cachedTokens);
    }
  });

  it('caches of one block give almost no hits', () => {
    const r = run(mooncake, { replicas: 1, profile: resolveProfile({ kvCapacityBlocks: 1 }) });
    expect(r.tokenHitRate).toBeLessThan(0.005);
    expect(r.ttftByRequest.every(Number.isFinite)).toBe(true);
  });
});

describe('determinism', () => {
  it('same seed, same results', () => {
    for (const strategy of ['least-load', 'bounded-hash:1.25', 'round-robin']) {
      const a = run(mooncake, { strategy });
      const b = run(mooncake, { strategy });
      expect(Array.from(a.ttftByRequest)).toEqual(Array.from(b.ttftByRequest));
      expect({ ...a, wallMs: 0 }).toEqual({ ...b, wallMs: 0 });
    }
  });

  it('every strategy gets the same arrivals', () => {
    const results = ['round-robin', 'least-load', 'hash', 'bounded-hash:1.5'].map((strategy) => run(mooncake, { strategy }));
    for (const r of results) {
      expect(r.perReplica.reduce((s, x) => s + x.requests, 0)).toBe(300);
      expect(r.promptTokens).toBe(results[0]!.promptTokens);
      expect(r.ttftByRequest.every(Number.isFinite)).toBe(true);
    }
  });
});

describe('hand-computed trace', () => {
  // 1 replica; step = 10 ms + 1 ms per prefilled token; no batch, KV-read or attention terms.
  const profile = resolveProfile({ stepBaseMs: 10, stepPerSeqMs: 0, kvReadMsPerKToken: 0, prefillTokensPerSec: 1000, prefillAttentionTokens: 1e15, kvCapacityBlocks: 1000 });
  const line = (timestamp: number, input_length: number, output_length: number, hash_ids: number[]) => JSON.stringify({ timestamp, input_length, output_length, hash_ids, block_tokens: 16 });
  const trace = parseTrace(
    [
      line(0, 100, 3, [1, 2, 3, 4, 5, 6]), // A: 6 full blocks + 4 tokens
      line(50, 40, 1, [1, 2]), // B: shares A's first 2 blocks
      line(200, 32, 1, [1, 2]), // C: exactly 2 blocks; the last is recomputed
    ].join('\n'),
  );

  it('gives the TTFTs worked out by hand', () => {
    const r = simulate(trace, { strategy: 'round-robin', replicas: 1, keys: [null, null, null], profile });
    // A: step 0-110 prefills 100 tokens (10 + 100). A decodes in 110-128 and 128-138.
    // B: waits for the step boundary at 110; 2 blocks (32 tokens) cached, prefills 8: 10 + 8 → ends 128; 128 - 50 = 78.
    // C: idle replica at 200; only 1 block may hit (the last prompt token is recomputed): 10 + 16 = 26.
    const t = Array.from(r.ttftByRequest);
    expect(t[0]).toBeCloseTo(110, 6);
    expect(t[1]).toBeCloseTo(78, 6);
    expect(t[2]).toBeCloseTo(26, 6);
    expect(r.cachedTokens).toBe(48);
    expect(r.promptTokens).toBe(172);
    expect(r.perReplica[0]!.outputTokens).toBe(5);
    expect(r.spanMs).toBeCloseTo(226, 6);
  });
});

describe('router log input', () => {
  it('replays request lines, skips the rest, uses keyHash as the session key', () => {
    const req = (ts: number, keyHash: string, blocks: string[]) =>
      JSON.stringify({ type: 'request', ts, pool: 'chat', tenant: 'acme', keyKind: 'header', keyHash, replica: 'r2', status: 200, promptTokens: 300, cachedTokens: 0, completionTokens: 20, ttftMs: 80, durationMs: 900, retried: false, spilled: false, blocks });
    const trace = parseTrace(
      [
        JSON.stringify({ type: 'startup', ts: 1 }),
        'not json',
        req(1_700_000_000_500, '9f3a12bc', ['a1b2c3d4', '00ff00ff']),
        req(1_700_000_000_000, '9f3a12bc', ['a1b2c3d4']),
        '[1,2]',
      ].join('\n'),
    );
    expect(trace.format).toBe('router-log');
    expect(trace.requests.length).toBe(2);
    expect(trace.skipped).toBe(3);
    expect(trace.requests[0]!.arrivalMs).toBe(0);
    expect(trace.requests[1]!.arrivalMs).toBe(500);
    // 64-token blocks → 4 blocks of 16; the truncated remainder gets unshared ids.
    const [a, b] = trace.requests;
    expect(Array.from(b!.blocks.slice(0, 4))).toEqual(Array.from(a!.blocks.slice(0, 4)));
    expect(b!.blocks[4]).not.toBe(a!.blocks[4]);
    expect(routingKey(a!, parseKeySpec('session'))).toBe(0x9f3a12bc);
    expect(routingKey(a!, parseKeySpec('tenant'))).not.toBeNull();
  });
});

describe('early connect as one isolate would see it', () => {
  it('never misses under plain hashing, is absent for keyless strategies, and misses only where a bound moves a key', () => {
    // Plain hashing with a fixed membership sends a key to the same replica every time.
    const hash = run(mooncake, { strategy: 'hash' });
    expect(hash.earlyConnect.missRate).toBe(0);
    expect(hash.earlyConnect.hitRate).toBeGreaterThan(0);
    // least-load and round-robin ignore keys: the router makes no guess for them.
    for (const strategy of ['least-load', 'round-robin']) expect(run(mooncake, { strategy }).earlyConnect).toEqual({ hitRate: 0, missRate: 0 });
    // A tight bound at a faster replay spills keys, so some guesses miss. Hits + misses are at most
    // the keyed requests whose key was seen within the memory's TTL.
    const bounded = run(mooncake, { strategy: 'bounded-hash:1.05', timeScale: 8 });
    expect(bounded.spillRate).toBeGreaterThan(0);
    expect(bounded.earlyConnect.missRate).toBeGreaterThan(0);
    const keys = keysFor(mooncake);
    const repeats = (scale: number) => {
      const last = new Map<number, number>();
      let n = 0;
      mooncake.requests.forEach((r, i) => {
        const k = keys[i]!;
        if (k === null) return;
        const t = r.arrivalMs / scale;
        const prev = last.get(k);
        if (prev !== undefined && t - prev <= 60_000) n++;
        last.set(k, t);
      });
      return n / keys.filter((k) => k !== null).length;
    };
    expect(repeats(1)).toBeLessThan(repeats(8));
    // A bounded-hash spill is not remembered (forward.ts), so fewer guesses than repeats there;
    // prefix-aware remembers every pick.
    expect(bounded.earlyConnect.hitRate + bounded.earlyConnect.missRate).toBeLessThan(repeats(8));
    const prefix = run(mooncake, { strategy: 'prefix-aware:1.25:3', timeScale: 8 });
    expect(prefix.earlyConnect.hitRate + prefix.earlyConnect.missRate).toBeCloseTo(repeats(8), 10);
    expect(hash.earlyConnect.hitRate).toBeCloseTo(repeats(1), 10);
  });

  it('spread over isolates, each remembering only its own leases: fewer guesses, the same routing', () => {
    const one = run(mooncake, { strategy: 'hash', timeScale: 8 });
    const four = run(mooncake, { strategy: 'hash', timeScale: 8, isolates: 4 });
    expect(four.earlyConnect.hitRate).toBeGreaterThan(0);
    expect(four.earlyConnect.hitRate).toBeLessThan(one.earlyConnect.hitRate);
    expect(four.earlyConnect.missRate).toBe(0);
    expect(Array.from(four.ttftByRequest)).toEqual(Array.from(one.ttftByRequest));
    expect(four.tokenHitRate).toBe(one.tokenHitRate);
    expect(() => run(mooncake, { isolates: 0 })).toThrow(RangeError);
  });
});
