// Chained block hashes: prefix sharing, change propagation, the cap, canonical JSON order.
import { describe, expect, it } from 'vitest';
import { BLOCK_SEED, blockHashes, blockHashesOfBytes, DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS, promptBlockHashes } from '../../../src/core/blocks.js';
import { murmur3, utf8 } from '../../../src/core/hash.js';

const text = (n: number, salt = 'x') => Array.from({ length: n }, (_, i) => `${salt}${i % 10}`).join('').slice(0, n);

describe('blockHashes', () => {
  it('hashes full blocks only, chained from BLOCK_SEED', () => {
    const s = text(DEFAULT_BLOCK_BYTES * 3 + 100);
    const h = blockHashes(s);
    expect(h).toBeInstanceOf(Uint32Array);
    expect(h.length).toBe(3);
    const b = utf8(s);
    const h0 = murmur3(b, BLOCK_SEED, 0, 256);
    const h1 = murmur3(b, h0, 256, 512);
    expect([h[0], h[1]]).toEqual([h0, h1]);
    expect(blockHashes(text(DEFAULT_BLOCK_BYTES - 1)).length).toBe(0);
    expect(blockHashes('').length).toBe(0);
  });

  it('same prefix gives the same leading hashes; a change in block k changes every hash from k on', () => {
    const a = text(256 * 10);
    const k = 4;
    const b = a.slice(0, 256 * k + 17) + (a[256 * k + 17] === 'y' ? 'z' : 'y') + a.slice(256 * k + 18);
    const ha = blockHashes(a);
    const hb = blockHashes(b);
    expect(hb.length).toBe(10);
    for (let i = 0; i < k; i++) expect(hb[i]).toBe(ha[i]);
    for (let i = k; i < 10; i++) expect(hb[i]).not.toBe(ha[i]);
    // Identical later blocks still hash differently: each hash covers everything before it.
    const rep = 'q'.repeat(256 * 4);
    const hr = blockHashes(rep);
    expect(new Set(hr).size).toBe(4);
  });

  it('a longer prompt extends the chain without changing it', () => {
    const a = text(256 * 6);
    const h6 = blockHashes(a);
    const h9 = blockHashes(a + text(256 * 3, 'n'));
    expect(Array.from(h9.subarray(0, 6))).toEqual(Array.from(h6));
  });

  it('caps the number of blocks, and the cap does not change the leading hashes', () => {
    const big = text(256 * (DEFAULT_MAX_BLOCKS + 40));
    const h = blockHashes(big);
    expect(h.length).toBe(DEFAULT_MAX_BLOCKS);
    const few = blockHashes(big, { maxBlocks: 8 });
    expect(Array.from(few)).toEqual(Array.from(h.subarray(0, 8)));
    expect(blockHashes(big, { maxBlocks: 0 }).length).toBe(0);
    const small = blockHashes(big, { blockBytes: 64, maxBlocks: 3 });
    expect(small.length).toBe(3);
    expect(small[0]).toBe(murmur3(utf8(big), BLOCK_SEED, 0, 64));
  });

  it('cuts by UTF-8 bytes, consistently with blockHashesOfBytes', () => {
    const s = 'héllo wörld ☃ 你好 '.repeat(200);
    const b = utf8(s);
    expect(Array.from(blockHashes(s))).toEqual(Array.from(blockHashesOfBytes(b)));
    expect(blockHashes(s).length).toBe(Math.floor(b.length / 256));
  });

  it('rejects bad options', () => {
    expect(() => blockHashes('x', { blockBytes: 8 })).toThrow(RangeError);
    expect(() => blockHashes('x', { maxBlocks: -1 })).toThrow(RangeError);
    expect(() => blockHashes('x', { maxBlocks: 1.5 })).toThrow(RangeError);
  });
});

describe('promptBlockHashes', () => {
  const tools = [{ type: 'function', function: { name: 'lookup', description: 'd'.repeat(300), parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const messages = [
    { role: 'system', content: 'You are helpful. '.repeat(40) },
    { role: 'user', content: 'Question one? '.repeat(30) },
  ];

  it('is independent of JSON key order (via canonicalPrompt)', () => {
    const a = promptBlockHashes({ model: 'm', tools, messages });
    const reordered = {
      messages: messages.map((m) => ({ content: m.content, role: m.role })),
      tools: tools.map((t) => ({ function: { parameters: t.function.parameters, description: t.function.description, name: t.function.name }, type: t.type })),
      model: 'other',
    };
    const b = promptBlockHashes(reordered);
    expect(a.length).toBeGreaterThan(3);
    expect(Array.from(b)).toEqual(Array.from(a));
  });

  it('a follow-up turn shares every full block of the earlier turn', () => {
    const turn1 = promptBlockHashes({ messages });
    const turn2 = promptBlockHashes({ messages: [...messages, { role: 'assistant', content: 'Answer. '.repeat(50) }, { role: 'user', content: 'More?' }] });
    expect(turn2.length).toBeGreaterThan(turn1.length);
    expect(Array.from(turn2.subarray(0, turn1.length))).toEqual(Array.from(turn1));
  });

  it('returns no blocks for a body without a prompt', () => {
    expect(promptBlockHashes(null).length).toBe(0);
    expect(promptBlockHashes({ model: 'm' }).length).toBe(0);
  });
});
