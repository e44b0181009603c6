// Review of #17's index bookkeeping (src/core/prefix-index.ts): a slot freed by dropReplica and
// reused by another replica must not inherit the old one's key homes or recent routes, and the
// recent window keeps exact counts across drops, reuse and routes without blocks (noteRoute).

import { describe, expect, it } from 'vitest';
import { MAX_KEY_HOMES, PrefixIndex, STARVED_ROUTES_PER_REPLICA } from '../../../src/core/prefix-index';

const recentOf = (ix: PrefixIndex, ids: string[]) => {
  const recent = new Int32Array(ids.length);
  ix.staleAll(ids, new Uint8Array(ids.length), undefined, recent);
  return [...recent];
};

describe('prefix index slot reuse', () => {
  it("a reused slot starts with no key homes and no recent routes of the replica it replaced", () => {
    const ix = new PrefixIndex({});
    for (let k = 0; k < 40; k++) ix.recordRoute(k % 2 === 0 ? 'a' : 'b', new Uint32Array([k + 1]), k);
    expect(ix.keyHomeOf(0)).toBe('a');
    ix.dropReplica('a');
    expect(ix.keyHomeOf(0)).toBeUndefined();
    ix.recordRoute('c', new Uint32Array([999]), 1000); // takes a's slot
    expect(ix.keyHomeOf(0)).toBeUndefined();
    expect(ix.keyHomeOf(1)).toBe('b');
    expect(ix.keyHomeOf(1000)).toBe('c');
    // The window held the last 16 × 2 routes (16 each); a's left with it, c's one came in.
    expect(recentOf(ix, ['a', 'b', 'c'])).toEqual([0, 16, 1]);
    expect(ix.recentRoutes()).toBe(17);
  });

  it('the recent window stays exact (Σ counts = its length ≤ 16 × slots) through drops, reuse and noteRoute', () => {
    const ix = new PrefixIndex({});
    const ids = ['a', 'b', 'c', 'd'];
    let seed = 7;
    const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
    for (let step = 0; step < 5000; step++) {
      const id = ids[Math.floor(rnd() * ids.length)]!;
      const x = rnd();
      if (x < 0.02) ix.dropReplica(id);
      else if (x < 0.2) ix.noteRoute(id, Math.floor(rnd() * 50));
      else ix.recordRoute(id, new Uint32Array([Math.floor(rnd() * 100) + 1]), Math.floor(rnd() * 50));
      const counts = recentOf(ix, ids);
      expect(counts.every((c) => c >= 0)).toBe(true);
      expect(counts.reduce((a, b) => a + b, 0)).toBe(ix.recentRoutes());
      expect(ix.recentRoutes()).toBeLessThanOrEqual(STARVED_ROUTES_PER_REPLICA * Math.max(1, ix.replicas().length) + STARVED_ROUTES_PER_REPLICA * ids.length);
      for (let key = 0; key < 50; key++) {
        const home = ix.keyHomeOf(key);
        if (home !== undefined) expect(ix.replicas()).toContain(home);
      }
    }
  });

  it('key homes stay bounded', () => {
    const ix = new PrefixIndex({});
    for (let k = 0; k < 4 * MAX_KEY_HOMES; k++) ix.recordRoute('a', new Uint32Array([1]), k);
    let remembered = 0;
    for (let k = 0; k < 4 * MAX_KEY_HOMES; k++) if (ix.keyHomeOf(k) !== undefined) remembered++;
    expect(remembered).toBeLessThanOrEqual(MAX_KEY_HOMES);
    expect(ix.keyHomeOf(0)).toBeUndefined();
    expect(ix.keyHomeOf(4 * MAX_KEY_HOMES - 1)).toBe('a');
  });
});
