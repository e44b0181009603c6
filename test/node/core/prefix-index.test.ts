// The approximate prefix index: match semantics, per-replica LRU bounds, the global cap,
// dropReplica, and agreement with a naive model under random operations.
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random.js';
import { capacityInBlocks, MAX_KEY_HOMES, matchPrefix, PrefixIndex, PrefixMatchScratch, STARVED_ROUTES_PER_REPLICA } from '../../../src/core/prefix-index.js';

const chain = (...xs: number[]) => Uint32Array.from(xs);

describe('PrefixIndex matching', () => {
  it('matchLength counts leading blocks and stops at the first miss', () => {
    const ix = new PrefixIndex();
    ix.recordRoute('a', chain(1, 2, 3, 4));
    expect(ix.matchLength('a', chain(1, 2, 3, 4, 5, 6))).toBe(4);
    expect(ix.matchLength('a', chain(1, 2, 9, 4))).toBe(2);
    expect(ix.matchLength('a', chain(9, 2, 3))).toBe(0);
    expect(ix.matchLength('a', chain())).toBe(0);
    expect(ix.matchLength('b', chain(1, 2))).toBe(0);
    // A later block present without its predecessor does not count.
    ix.recordRoute('b', chain(7, 8));
    expect(ix.matchLength('b', chain(1, 8))).toBe(0);
  });

  it('matchAll agrees with matchLength and marks unknown replicas −1', () => {
    const ix = new PrefixIndex();
    ix.recordRoute('a', chain(1, 2, 3, 4));
    ix.recordRoute('b', chain(1, 2, 5));
    ix.recordRoute('c', chain(9));
    ix.setCapacity('d', 10); // known capacity, no entries
    const ids = ['a', 'b', 'c', 'd', 'e'];
    const req = chain(1, 2, 3, 4, 6);
    expect(Array.from(ix.matchAll(ids, req))).toEqual([4, 2, 0, -1, -1]);
    for (const id of ['a', 'b', 'c']) expect(ix.matchAll(ids, req)[ids.indexOf(id)]).toBe(ix.matchLength(id, req));
    const out = new Int32Array(5);
    expect(ix.matchAll(ids, chain(1), out)).toBe(out);
    expect(Array.from(out)).toEqual([1, 1, 0, -1, -1]);
    // Int32 ids (a simulator's dense block ids) work as well as Uint32 hashes.
    ix.recordRoute('e', Int32Array.from([0xfffffff0 | 0, 5]));
    expect(ix.matchLength('e', Uint32Array.from([0xfffffff0, 5]))).toBe(2);
  });
});

describe('PrefixIndex bounds', () => {
  it('keeps at most the capacity per replica, evicting least recently used, tails first', () => {
    const ix = new PrefixIndex({ defaultCapacity: 6 });
    ix.recordRoute('a', chain(1, 2, 3, 4));
    ix.recordRoute('a', chain(10, 11, 12, 13));
    // 8 blocks into 6: the oldest request's tail (3, 4) goes first, its head survives.
    expect(ix.stats().perReplica.a).toEqual({ entries: 6, capacity: 6 });
    expect(ix.matchLength('a', chain(1, 2, 3, 4))).toBe(2);
    expect(ix.matchLength('a', chain(10, 11, 12, 13))).toBe(4);
    // Touching a prefix makes it recent again.
    ix.recordRoute('a', chain(1, 2));
    ix.recordRoute('a', chain(20, 21));
    expect(ix.matchLength('a', chain(1, 2))).toBe(2);
    expect(ix.matchLength('a', chain(10, 11, 12, 13))).toBe(2);
    expect(ix.stats().evictions).toBeGreaterThan(0);
  });

  it('a prompt longer than the capacity keeps its leading blocks', () => {
    const ix = new PrefixIndex({ defaultCapacity: 5 });
    const long = Uint32Array.from({ length: 20 }, (_, i) => 100 + i);
    ix.recordRoute('a', long);
    expect(ix.matchLength('a', long)).toBe(5);
  });

  it('setCapacity overrides the default and trims at once', () => {
    const ix = new PrefixIndex({ defaultCapacity: 100 });
    ix.recordRoute('a', Uint32Array.from({ length: 50 }, (_, i) => i + 1));
    ix.setCapacity('a', 10);
    expect(ix.stats().perReplica.a).toEqual({ entries: 10, capacity: 10 });
    ix.setCapacity('a', undefined);
    expect(ix.stats().perReplica.a!.capacity).toBe(100);
    expect(() => ix.setCapacity('a', 0)).toThrow(RangeError);
  });

  it('never holds more than maxEntries in total, scaling the per-replica bounds', () => {
    const ix = new PrefixIndex({ defaultCapacity: 1000, maxEntries: 2000 });
    const rand = seededRandom(7);
    for (let k = 0; k < 400; k++) {
      const r = `r${k % 8}`;
      ix.recordRoute(r, Uint32Array.from({ length: 40 }, () => (rand() * 2 ** 32) >>> 0));
      expect(ix.stats().entries).toBeLessThanOrEqual(2000);
    }
    const s = ix.stats();
    expect(s.replicas).toBe(8);
    for (const v of Object.values(s.perReplica)) {
      expect(v.capacity).toBe(250);
      expect(v.entries).toBe(250);
    }
    expect(s.entries).toBe(2000);
    expect(s.approxBytes).toBeGreaterThan(2000 * 18);
    expect(s.approxBytes).toBeLessThan(2000 * 60);
  });

  it('capacityInBlocks converts vLLM cache config to router blocks', () => {
    expect(capacityInBlocks(30_000, 16, 64)).toBe(7500);
    expect(capacityInBlocks(1, 16, 64)).toBe(1);
    expect(() => capacityInBlocks(0, 16)).toThrow(RangeError);
  });
});

describe('PrefixIndex dropReplica', () => {
  it('forgets the replica, keeps the others, and frees its entries for reuse', () => {
    const ix = new PrefixIndex();
    ix.recordRoute('a', chain(1, 2, 3));
    ix.recordRoute('b', chain(1, 2, 3));
    ix.dropReplica('a');
    ix.dropReplica('zzz'); // unknown: no-op
    expect(ix.matchLength('a', chain(1, 2, 3))).toBe(0);
    expect(ix.matchLength('b', chain(1, 2, 3))).toBe(3);
    expect(Array.from(ix.matchAll(['a', 'b'], chain(1, 2, 3)))).toEqual([-1, 3]);
    expect(ix.stats().entries).toBe(3);
    expect(ix.replicas()).toEqual(['b']);
    ix.recordRoute('c', chain(1, 2, 3, 4));
    expect(Array.from(ix.matchAll(['a', 'b', 'c'], chain(1, 2, 3, 4)))).toEqual([-1, 3, 4]);
  });
});

describe('PrefixIndex against a naive model', () => {
  it.each([5, 70])('matches a Map-per-replica LRU model under random routes and drops (%i replicas)', (replicaCount) => {
    const cap = 64;
    const ix = new PrefixIndex({ defaultCapacity: cap, maxEntries: 1 << 16 });
    const model = new Map<string, Map<number, true>>(); // insertion order = LRU order (oldest first)
    const rand = seededRandom(42 + replicaCount);
    const ids = Array.from({ length: replicaCount }, (_, i) => `r${i}`);
    // A small tree of chains so prompts share prefixes.
    const mk = () => {
      const len = 1 + Math.floor(rand() * 12);
      const out = new Uint32Array(len);
      let h = Math.floor(rand() * 3);
      for (let i = 0; i < len; i++) out[i] = h = (Math.imul(h + 1, 2654435761) ^ Math.floor(rand() * (i < 3 ? 2 : 6))) >>> 0;
      return out;
    };
    for (let step = 0; step < 3000; step++) {
      const r = ids[Math.floor(rand() * ids.length)]!;
      if (rand() < 0.01) {
        ix.dropReplica(r);
        model.delete(r);
        continue;
      }
      const blocks = mk();
      if (rand() < 0.6) {
        ix.recordRoute(r, blocks);
        let m = model.get(r);
        if (!m) model.set(r, (m = new Map()));
        for (let i = blocks.length - 1; i >= 0; i--) {
          m.delete(blocks[i]!);
          if (m.size >= cap) m.delete(m.keys().next().value!);
          m.set(blocks[i]!, true);
        }
      }
      const got = Array.from(ix.matchAll(ids, blocks));
      const want = ids.map((id) => {
        const m = model.get(id);
        let w = m && m.size > 0 ? 0 : -1;
        if (m) while (w < blocks.length && m.has(blocks[w]!)) w++;
        return w;
      });
      expect(got, `step ${step}`).toEqual(want);
      const k = Math.floor(rand() * ids.length);
      expect(ix.matchLength(ids[k]!, blocks)).toBe(Math.max(0, want[k]!));
    }
    let total = 0;
    for (const m of model.values()) total += m.size;
    expect(ix.stats().entries).toBe(total);
  });
});

describe('PrefixIndex.forget and staleAll', () => {
  it('forget takes back a route\'s own blocks for one replica, leaving the prefix it matched and other replicas', async () => {
    const { PrefixIndex } = await import('../../../src/core/prefix-index.js');
    const index = new PrefixIndex();
    const base = Uint32Array.from({ length: 10 }, (_, i) => 100 + i);
    const longer = Uint32Array.from({ length: 16 }, (_, i) => 100 + i);
    index.recordRoute('a', base);
    index.recordRoute('b', longer);
    index.recordRoute('a', longer);
    expect(index.matchLength('a', longer)).toBe(16);
    expect(index.forget('a', longer, 10)).toBe(6);
    expect(index.matchLength('a', longer)).toBe(10);
    expect(index.matchLength('b', longer)).toBe(16);
    expect(index.stats().entries).toBe(26);
    expect(index.forget('nobody', longer)).toBe(0);
    // The LRU lists stay consistent: fill 'a' past a small capacity after a forget.
    index.setCapacity('a', 12);
    index.recordRoute('a', Uint32Array.from({ length: 30 }, (_, i) => 900 + i));
    expect(index.stats().perReplica['a']!.entries).toBe(12);
  });

  it('staleAll marks replicas with no route among the last 4 × R routes, and unknown ones', async () => {
    const { PrefixIndex } = await import('../../../src/core/prefix-index.js');
    const index = new PrefixIndex();
    const ids = ['a', 'b', 'c'];
    const one = Uint32Array.of(1, 2, 3);
    index.recordRoute('a', one);
    index.recordRoute('b', one);
    expect(Array.from(index.staleAll(ids))).toEqual([0, 0, 1]);
    for (let k = 0; k < 8; k++) index.recordRoute('b', one);
    // 2 replicas known: horizon 8 routes; 'a' last routed 9 routes ago.
    expect(Array.from(index.staleAll(ids))).toEqual([1, 0, 1]);
    index.recordRoute('a', one);
    expect(Array.from(index.staleAll(ids))).toEqual([0, 0, 1]);
  });
});

describe('PrefixIndex anchors (sparse past the first 16 blocks)', () => {
  it('indexes L = 1..16, then 4 lengths per doubling: 37 of a 512-block prompt', () => {
    const ix = new PrefixIndex();
    const lens = Array.from({ length: 512 }, (_, i) => i).filter((i) => ix.isAnchor(i)).map((i) => i + 1);
    expect(lens.slice(0, 16)).toEqual(Array.from({ length: 16 }, (_, i) => i + 1));
    expect(lens.slice(16)).toEqual([20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]);
    expect(lens.length).toBe(36);
    expect(new PrefixIndex({ denseBlocks: Infinity }).isAnchor(400)).toBe(true);
    expect(() => new PrefixIndex({ anchorsPerDoubling: 3 })).toThrow(RangeError);
  });

  it('a match is the longest matched anchor: exact to 16 blocks, at most 25% short past them', () => {
    const rand = seededRandom(5);
    // No eviction here (room for everything): matching alone is compared.
    const dense = new PrefixIndex({ denseBlocks: Infinity, defaultCapacity: 100_000, maxEntries: 1 << 19 });
    const sparse = new PrefixIndex({ defaultCapacity: 100_000, maxEntries: 1 << 19 });
    const ids = ['a', 'b', 'c'];
    const prompts: Uint32Array[] = [];
    for (let t = 0; t < 300; t++) {
      // Prompts branch off earlier ones at random points (shared prefixes of any length).
      const parent = prompts.length > 0 && rand() < 0.7 ? prompts[Math.floor(rand() * prompts.length)]! : new Uint32Array(0);
      const keep = Math.floor(rand() * (parent.length + 1));
      const p = Uint32Array.from([...parent.subarray(0, keep), ...Array.from({ length: 1 + Math.floor(rand() * 200) }, () => (rand() * 2 ** 32) >>> 0)]);
      prompts.push(p);
      const r = ids[Math.floor(rand() * 3)]!;
      dense.recordRoute(r, p);
      sparse.recordRoute(r, p);
      const q = prompts[Math.floor(rand() * prompts.length)]!;
      const md = dense.matchAll(ids, q);
      const ms = sparse.matchAll(ids, q);
      for (let i = 0; i < 3; i++) {
        const d = md[i]!;
        const s = ms[i]!;
        expect(s, `dense ${d}`).toBeLessThanOrEqual(d);
        // The longest anchor length ≤ d.
        let want = 0;
        for (let L = 1; L <= d; L++) if (sparse.isAnchor(L - 1)) want = L;
        expect(s).toBe(d < 0 ? -1 : want);
        if (d > 16) expect(s).toBeGreaterThanOrEqual(Math.floor(0.75 * d));
        expect(sparse.matchLength(ids[i]!, q)).toBe(Math.max(0, s));
      }
    }
    // Capacity is in blocks: each anchor counts the blocks it stands for; far fewer nodes.
    const st = sparse.stats();
    const dt = dense.stats();
    expect(st.entries).toBeLessThanOrEqual(dt.entries);
    expect(st.nodes).toBeLessThan(dt.nodes / 2);
  });

  it('capacity counts anchor weights: a 512-block prompt fills 512 of it, in 36 nodes', () => {
    const ix = new PrefixIndex({ defaultCapacity: 600 });
    const p = Uint32Array.from({ length: 512 }, (_, i) => 7 + i);
    ix.recordRoute('a', p);
    expect(ix.stats().perReplica.a).toEqual({ entries: 512, capacity: 600 });
    expect(ix.stats().nodes).toBe(36);
    ix.recordRoute('a', Uint32Array.from({ length: 200 }, (_, i) => 9000 + i));
    // 512 + 200 > 600: the first prompt's far anchors went, its head stayed.
    expect(ix.stats().perReplica.a!.entries).toBeLessThanOrEqual(600);
    expect(ix.matchLength('a', p)).toBeGreaterThanOrEqual(256);
    expect(ix.matchLength('a', p)).toBeLessThan(512);
  });
});

describe('anchorLength', () => {
  it('is the longest anchor length ≤ n', async () => {
    const { anchorLength } = await import('../../../src/core/prefix-index.js');
    const ix = new PrefixIndex();
    for (let n = 0; n <= 1100; n++) {
      let want = 0;
      for (let L = 1; L <= n; L++) if (ix.isAnchor(L - 1)) want = L;
      expect(anchorLength(n)).toBe(want);
    }
  });
});

describe('PrefixIndex recent routes and key homes', () => {
  it('counts exactly the routes in its window (the last ones, at most 16 × R), per replica, against a naive model', () => {
    const rand = seededRandom(42);
    const ix = new PrefixIndex();
    // The model: a route enters the window after the oldest ones beyond 16 × (replicas known)
    // leave it; a replica dropped takes its routes out. When R grows the window refills.
    let window: string[] = [];
    let ids = ['a', 'b', 'c'];
    for (let t = 0; t < 3000; t++) {
      if (t === 1000) ids = [...ids, 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l']; // past the buffer's first size
      if (t === 2000) {
        ix.dropReplica('b');
        ids = ids.filter((x) => x !== 'b');
        window = window.filter((x) => x !== 'b');
      }
      const r = ids[Math.floor(rand() ** 2 * ids.length)]!;
      ix.recordRoute(r, chain(t + 1));
      const limit = STARVED_ROUTES_PER_REPLICA * ix.replicas().length;
      while (window.length >= limit) window.shift();
      window.push(r);
      if (t % 97 === 0 || t === 1000 || t === 2000 || t === 2999) {
        const recent = new Int32Array(ids.length);
        ix.staleAll(ids, undefined, undefined, recent);
        expect(Array.from(recent), `after route ${t}`).toEqual(ids.map((id) => window.filter((x) => x === id).length));
        expect(ix.recentRoutes()).toBe(window.length);
      }
    }
    expect(window.length).toBe(STARVED_ROUTES_PER_REPLICA * 11);
  });

  it('remembers where each key last went, in a bounded table that keeps the recent ones, and forgets a removed replica', () => {
    const ix = new PrefixIndex();
    ix.recordRoute('a', chain(1), 7);
    ix.recordRoute('b', chain(2), 8);
    expect(ix.keyHomeOf(7)).toBe('a');
    ix.recordRoute('b', chain(1, 3), 7);
    expect(ix.keyHomeOf(7)).toBe('b');
    expect(ix.keyHomeOf(9)).toBeUndefined();
    ix.recordRoute('a', chain(5)); // no key: nothing remembered
    expect(ix.keyHomeOf(7)).toBe('b');
    ix.dropReplica('b');
    expect(ix.keyHomeOf(7)).toBeUndefined();
    expect(ix.keyHomeOf(8)).toBeUndefined();
    // Bounded: after 4 × MAX_KEY_HOMES new keys at most MAX_KEY_HOMES are remembered, the most
    // recent ones are, and a key routed again every 64 routes survives the churn.
    for (let k = 0; k < 4 * MAX_KEY_HOMES; k++) {
      ix.recordRoute('a', chain(1), 1000 + k);
      if (k % 64 === 0) ix.recordRoute('c', chain(9), 77);
    }
    let remembered = 0;
    for (let k = 0; k < 4 * MAX_KEY_HOMES; k++) if (ix.keyHomeOf(1000 + k) !== undefined) remembered++;
    expect(remembered).toBeLessThanOrEqual(MAX_KEY_HOMES);
    expect(remembered).toBeGreaterThan(MAX_KEY_HOMES / 2);
    for (let k = 4 * MAX_KEY_HOMES - 100; k < 4 * MAX_KEY_HOMES; k++) expect(ix.keyHomeOf(1000 + k)).toBe('a');
    expect(ix.keyHomeOf(77)).toBe('c');
    expect(ix.keyHomeOf(1000)).toBeUndefined();
    // matchPrefix reports the key's home as a ring index (−1 unknown), and nothing without a key.
    const scratch = new PrefixMatchScratch();
    ix.recordRoute('c', chain(1, 2), 55);
    expect(matchPrefix(ix, ['a', 'c'], chain(1, 2, 3), scratch, 55).keyHome).toBe(1);
    expect(matchPrefix(ix, ['a', 'c'], chain(1, 2, 3), scratch, 56).keyHome).toBe(-1);
    expect(matchPrefix(ix, ['a', 'c'], chain(1, 2, 3), scratch).keyHome).toBeUndefined();
  });
});
