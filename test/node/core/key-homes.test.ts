// The key-home table (src/core/key-homes.ts): exact for what fits, bounded, and the older of a
// set's entries goes first, against a model of per-set LRU.
import { describe, expect, it } from 'vitest';
import { KeyHomes } from '../../../src/core/key-homes.js';
import { seededRandom } from '../../../src/core/random.js';

describe('KeyHomes', () => {
  it('returns what was stored last for a key, −1 for a key never stored, and allocates nothing before the first write', () => {
    const t = new KeyHomes(8);
    expect(t.get(5)).toBe(-1);
    expect(t.size()).toBe(0);
    t.set(5, 42);
    t.set(5, 43);
    t.set(0xffffffff, 7);
    t.set(-1, 8); // the same 32 bits as 0xffffffff
    expect(t.get(5)).toBe(43);
    expect(t.get(0xffffffff)).toBe(8);
    expect(t.get(6)).toBe(-1);
    expect(t.size()).toBe(2);
  });

  it('never holds more than its capacity and evicts the older entry of a set first (a per-set LRU model)', () => {
    const cap = 64;
    const t = new KeyHomes(cap);
    const sets = new Map<number, number[]>(); // set → keys, oldest first, as the table must hold them
    const setOf = (k: number) => (Math.imul(k ^ (k >>> 16), 0x45d9f3b) >>> 0) & (cap / 2 - 1);
    const rand = seededRandom(9);
    for (let step = 0; step < 5000; step++) {
      const key = Math.floor(rand() * 300);
      t.set(key, step);
      const s = sets.get(setOf(key)) ?? [];
      const at = s.indexOf(key);
      if (at >= 0) s.splice(at, 1);
      s.push(key);
      if (s.length > 2) s.shift();
      sets.set(setOf(key), s);
      if (step % 50 === 0) {
        expect(t.size()).toBeLessThanOrEqual(cap);
        for (let k = 0; k < 300; k++) expect(t.get(k) >= 0, `key ${k} at step ${step}`).toBe((sets.get(setOf(k)) ?? []).includes(k));
      }
    }
  });

  it('refuses a capacity that is not a power of two', () => {
    expect(() => new KeyHomes(12)).toThrow(RangeError);
    expect(() => new KeyHomes(1)).toThrow(RangeError);
  });
});
