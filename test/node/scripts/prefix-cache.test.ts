import { describe, expect, it } from 'vitest';
import { PrefixCache } from '../../../sim/prefix-cache.js';
import { KV_BLOCK_TOKENS, computeBound, lookupLimit, parseTrace } from '../../../sim/trace.js';

const ids = (...xs: number[]) => Int32Array.from(xs);

describe('PrefixCache', () => {
  it('hits only a leading run of cached blocks', () => {
    const c = new PrefixCache(100);
    const a = ids(1, 2, 3, 4);
    const adm = c.admit(a, 4, 4)!;
    expect(adm).toEqual({ hits: 0, pinned: 4 });
    c.release(a, adm.pinned, 4);
    expect(c.admit(ids(1, 2, 9, 4), 4, 4)!.hits).toBe(2);
    expect(c.match(ids(7, 1, 2), 3)).toBe(0);
  });

  it('frees a request tail first and evicts the least recently used free block', () => {
    const c = new PrefixCache(4);
    const x = ids(1, 2);
    const y = ids(3, 4);
    c.release(x, c.admit(x, 2, 2)!.pinned, 2);
    c.release(y, c.admit(y, 2, 2)!.pinned, 2);
    // Reverse order per request (vLLM frees a finished request's blocks tail first).
    expect(c.evictionOrder()).toEqual([2, 1, 4, 3]);
    const z = ids(5);
    c.release(z, c.admit(z, 1, 1)!.pinned, 1);
    expect(c.has(2)).toBe(false);
    expect(c.evictionOrder()).toEqual([1, 4, 3, 5]);
    expect(c.evictions).toBe(1);
    // A hit moves a block to the most recently used end once it is free again.
    const w = ids(1);
    c.release(w, c.admit(w, 1, 1)!.pinned, 1);
    expect(c.evictionOrder()).toEqual([4, 3, 5, 1]);
  });

  it('never evicts blocks held by running requests', () => {
    const c = new PrefixCache(4);
    const held = ids(1, 2);
    const hold = c.admit(held, 2, 2)!;
    const other = ids(3, 4);
    c.release(other, c.admit(other, 2, 2)!.pinned, 2);
    // Needs 2 new blocks: only 3 and 4 are free, so they go; 1 and 2 stay.
    const n = ids(5, 6);
    expect(c.admit(n, 2, 2)).not.toBeNull();
    expect(c.has(1) && c.has(2)).toBe(true);
    expect(c.has(3) || c.has(4)).toBe(false);
    // Nothing is free now: a further request does not fit beside the running ones.
    expect(c.admit(ids(7), 1, 1)).toBeNull();
    c.release(held, hold.pinned, 2);
    expect(c.admit(ids(7), 1, 1)).not.toBeNull();
  });

  it('reserves output blocks and refuses what does not fit', () => {
    const c = new PrefixCache(10);
    const a = ids(1, 2, 3);
    const adm = c.admit(a, 3, 8)!; // 3 prompt blocks + 5 output blocks
    expect(c.inUse).toBe(8);
    expect(c.admit(ids(4, 5, 6), 3, 3)).toBeNull();
    c.release(a, adm.pinned, 8);
    expect(c.inUse).toBe(0);
    expect(c.size).toBe(3);
  });
});

describe('trace block mapping', () => {
  it('maps a 512-token block to 32 blocks of 16 and caches only full blocks', () => {
    const t = parseTrace(
      [
        JSON.stringify({ timestamp: 0, input_length: 600, output_length: 10, hash_ids: [0, 1] }),
        JSON.stringify({ timestamp: 5, input_length: 530, output_length: 10, hash_ids: [0, 1] }),
        JSON.stringify({ timestamp: 9, input_length: 512, output_length: 10, hash_ids: [0] }),
      ].join('\n'),
    );
    const [a, b, c] = t.requests;
    expect(a!.blocks.length).toBe(37); // floor(600 / 16)
    expect(b!.blocks.length).toBe(33);
    expect(Array.from(b!.blocks)).toEqual(Array.from(a!.blocks.slice(0, 33)));
    expect(c!.nativeBlockWidth).toBe(32);
    // The last prompt token is always recomputed: a prompt of exactly 32 blocks may hit 31.
    expect(lookupLimit(512, 32)).toBe(31);
    const bound = computeBound(t);
    expect(bound.cachedTokens).toBe((33 + 31) * KV_BLOCK_TOKENS);
    expect(bound.promptTokens).toBe(600 + 530 + 512);
  });

  it('chains ids: equal trace ids after different prefixes are different blocks', () => {
    const t = parseTrace(
      [
        JSON.stringify({ timestamp: 0, input_length: 32, output_length: 1, hash_ids: [1, 2], block_tokens: 16 }),
        JSON.stringify({ timestamp: 1, input_length: 32, output_length: 1, hash_ids: [3, 2], block_tokens: 16 }),
      ].join('\n'),
    );
    expect(t.requests[0]!.blocks[1]).not.toBe(t.requests[1]!.blocks[1]);
    expect(t.format).toBe('generated');
  });
});
