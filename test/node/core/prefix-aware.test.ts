// `prefix-aware` invariants: the load cap, usability, longest match, ring order on ties, the
// least-loaded replicas in ring order on short matches, and no starvation when every prompt
// shares its first blocks.
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random.js';
import { hashString } from '../../../src/core/hash.js';
import { PrefixIndex } from '../../../src/core/prefix-index.js';
import { buildRing, type Ring } from '../../../src/core/ring.js';
import {
  capOf,
  computeLoadBound,
  createPrefixAware,
  createStrategy,
  DEFAULT_PREFIX_AWARE_SLACK,
  pickBoundedHash,
  pickReplica,
  type PickContext,
} from '../../../src/core/strategies/index.js';
import type { ReplicaView } from '../../../src/core/types.js';
import { ok, ringOf, views } from '../../helpers/core-fixtures.js';

const ring8 = ringOf(new Array(8).fill(1));
/** Ring order of a key: distinct replica indexes clockwise from its point. */
function ringOrder(ring: Ring, key: number): number[] {
  const out: number[] = [];
  const start = ring.locate(key);
  for (let j = 0; j < ring.points.length && out.length < ring.size; j++) {
    const o = ring.owners[(start + j) % ring.points.length]!;
    if (!out.includes(o)) out.push(o);
  }
  return out;
}

describe('prefix-aware registry', () => {
  it('parses prefix-aware[:factor[:slack]]', () => {
    expect(createStrategy('prefix-aware').name).toBe(`prefix-aware:1.25:${DEFAULT_PREFIX_AWARE_SLACK}`);
    expect(createStrategy('prefix-aware:1.5').name).toBe(`prefix-aware:1.5:${DEFAULT_PREFIX_AWARE_SLACK}`);
    expect(createStrategy('prefix-aware:150:0').name).toBe('prefix-aware:1.5:0');
    expect(createStrategy('prefix-aware:inf:0').name).toBe('prefix-aware:inf:0');
    expect(createStrategy('prefix-aware').keyed).toBe(true);
    expect(() => createStrategy('prefix-aware:x')).toThrow(RangeError);
    expect(() => createStrategy('prefix-aware:1.25:-1')).toThrow(RangeError);
    expect(() => createStrategy('prefix-aware:1.25:1:x')).toThrow(RangeError);
    expect(() => createStrategy('prefix-aware:1.25:1:2:0.5:9')).toThrow(RangeError);
    expect(() => createStrategy('prefix-aware:1.25:1:-1')).toThrow(RangeError);
    // The no-starvation window's S and ρ; the defaults keep the short name.
    expect(createStrategy('prefix-aware:1.25:3:4:0.5').name).toBe('prefix-aware:1.25:3');
    expect(createStrategy('prefix-aware:1.25:3:2:0.25').name).toBe('prefix-aware:1.25:3:2:0.25');
    expect(createStrategy('prefix-aware:1.25:3:inf:0').name).toBe('prefix-aware:1.25:3:inf:0');
    expect(() => createPrefixAware({ minShare: 2 })).toThrow(RangeError);
    expect(() => createPrefixAware({ spread: -1 })).toThrow(RangeError);
  });
});

describe('prefix-aware pick', () => {
  const strat = createPrefixAware({ balanceFactor: 1.25, slack: 0 });

  it('without a prefix match (or with an empty request) it is exactly bounded-hash', () => {
    const rand = seededRandom(1);
    for (let t = 0; t < 500; t++) {
      const load = Array.from({ length: 8 }, () => Math.floor(rand() * 6));
      const ctx: PickContext = { ring: ring8, replicas: views(ring8, load), key: (rand() * 2 ** 32) >>> 0, random: rand };
      expect(strat.pick(ctx)).toEqual(pickBoundedHash(ctx, 125, 0));
      expect(strat.pick({ ...ctx, prefixMatch: { blocks: 0, matched: new Int32Array(8) } })).toEqual(pickBoundedHash(ctx, 125, 0));
    }
  });

  it('the longest match wins when it is eligible; at its cap the next longest does', () => {
    const key = hashString('session-1');
    const order = ringOrder(ring8, key);
    const far = order[5]!;
    const second = order[6]!;
    const matched = new Int32Array(8).fill(1);
    matched[far] = 40;
    matched[second] = 30;
    const prefixMatch = { blocks: 50, matched };
    const r = ok(strat.pick({ ring: ring8, replicas: views(ring8, new Array(8).fill(2)), key, random: Math.random, prefixMatch }));
    expect(r.index).toBe(far);
    expect(r.spilled).toBe(true);
    expect(r.steps).toBe(5);
    // Put `far` at its cap: U = 2·7 + 5 = 19 → 25 slots over 8 → far has at most 4 < 5.
    const load = new Array(8).fill(2);
    load[far] = 5;
    const r2 = ok(strat.pick({ ring: ring8, replicas: views(ring8, load), key, random: Math.random, prefixMatch }));
    expect(r2.index).toBe(second);
  });

  it('ties on the longest match go to the first in ring order', () => {
    const key = hashString('session-2');
    const order = ringOrder(ring8, key);
    const matched = new Int32Array(8);
    matched[order[6]!] = 20;
    matched[order[3]!] = 20;
    const r = ok(strat.pick({ ring: ring8, replicas: views(ring8, []), key, random: Math.random, prefixMatch: { blocks: 30, matched } }));
    expect(r.index).toBe(order[3]);
  });

  it('short matches go to the first least-loaded replica in ring order (spread 0); spread ∞ is bounded-hash', () => {
    const rand = seededRandom(3);
    const loose = createPrefixAware({ balanceFactor: 1.25, slack: 0, spread: Infinity });
    const spread1 = createPrefixAware({ balanceFactor: 1.25, slack: 0, spread: 1 });
    for (let t = 0; t < 300; t++) {
      const key = (rand() * 2 ** 32) >>> 0;
      const blocks = 8 + Math.floor(rand() * 40);
      const need = Math.max(2, Math.ceil(0.25 * blocks));
      const matched = new Int32Array(8);
      matched[Math.floor(rand() * 8)] = need - 1; // just below the threshold
      const load = Array.from({ length: 8 }, () => Math.floor(rand() * 4));
      const ctx: PickContext = { ring: ring8, replicas: views(ring8, load), key, random: rand };
      const min = Math.min(...load);
      const order = ringOrder(ring8, key);
      const b = computeLoadBound(ctx.replicas, 125, 0);
      const under = (i: number) => load[i]! < capOf(b, ctx.replicas, i);
      const r = ok(strat.pick({ ...ctx, prefixMatch: { blocks, matched } }));
      expect(r.index).toBe(order.find((i) => load[i] === min && under(i)) ?? order.find(under));
      expect(r.steps).toBe(order.indexOf(r.index));
      expect(ok(spread1.pick({ ...ctx, prefixMatch: { blocks, matched } })).index).toBe(order.find((i) => load[i]! <= min + 1 && under(i)) ?? order.find(under));
      expect(loose.pick({ ...ctx, prefixMatch: { blocks, matched } })).toEqual(pickBoundedHash(ctx, 125, 0));
    }
  });

  it('a prefix every replica holds earns no pull; only blocks beyond it count', () => {
    const key = hashString('session-3');
    const order = ringOrder(ring8, key);
    const matched = new Int32Array(8).fill(10);
    matched[order[4]!] = 12; // 2 blocks beyond the shared 10, of a 30-block request: need max(2, ceil(0.25·20)) = 5
    const ctx: PickContext = { ring: ring8, replicas: views(ring8, []), key, random: Math.random };
    expect(ok(strat.pick({ ...ctx, prefixMatch: { blocks: 30, matched } })).index).toBe(order[0]);
    matched[order[4]!] = 15; // 5 beyond the base: followed
    expect(ok(strat.pick({ ...ctx, prefixMatch: { blocks: 30, matched } })).index).toBe(order[4]);
  });

  it('replicas the index knows nothing about (−1) do not hold the shared base at 0', () => {
    const key = hashString('session-4');
    const order = ringOrder(ring8, key);
    const matched = new Int32Array(8).fill(-1);
    matched[order[3]!] = 2; // the only warm replica holds the 2 shared blocks of a 3-block request
    const ctx: PickContext = { ring: ring8, replicas: views(ring8, []), key, random: Math.random };
    expect(ok(strat.pick({ ...ctx, prefixMatch: { blocks: 3, matched } })).index).toBe(order[0]);
    // Had the others been known to hold nothing (0), the 2 blocks would be a real gain.
    const known = Int32Array.from(matched, (m) => Math.max(0, m));
    expect(ok(strat.pick({ ...ctx, prefixMatch: { blocks: 3, matched: known } })).index).toBe(order[3]);
  });

  it('never picks above the load cap, nor an unhealthy, draining or excluded replica', () => {
    const rand = seededRandom(11);
    // Sizes 2-11 and one of 100 (past the reused visit buffer's initial 64), interleaved.
    const rings = Array.from({ length: 12 }, (_, k) => {
      const n = k === 11 ? 100 : 2 + (k % 10);
      return buildRing(Array.from({ length: n }, (_, i) => ({ id: `r${i}`, weight: 1 + ((i * 7 + k) % 3) })));
    });
    for (const spec of ['prefix-aware:1.25:0', 'prefix-aware:1.25:2', 'prefix-aware:2:1', 'prefix-aware:1.1:4']) {
      const s = createStrategy(spec);
      const [, f, sl] = spec.split(':');
      const percent = Math.round(Number(f) * 100);
      for (let t = 0; t < 1500; t++) {
        const ring = rings[Math.floor(rand() * rings.length)]!;
        const n = ring.size;
        const patch: Record<number, Partial<ReplicaView>> = {};
        for (let i = 0; i < n; i++) if (rand() < 0.15) patch[i] = rand() < 0.5 ? { healthy: false } : { draining: true };
        const replicas = views(ring, Array.from({ length: n }, () => Math.floor(rand() * 8)), patch);
        const exclude = rand() < 0.3 ? new Set([`r${Math.floor(rand() * n)}`]) : undefined;
        const blocks = 1 + Math.floor(rand() * 64);
        const matched = Int32Array.from({ length: n }, () => (rand() < 0.1 ? -1 : Math.floor(rand() * (blocks + 1))));
        const ctx: PickContext = { ring, replicas, key: (rand() * 2 ** 32) >>> 0, exclude, random: rand, prefixMatch: { blocks, matched } };
        const r = s.pick(ctx);
        const usable = replicas.filter((x) => x.healthy && !x.draining && !exclude?.has(x.id));
        if (usable.length === 0) {
          expect(r.ok).toBe(false);
          continue;
        }
        const p = ok(r);
        const c = replicas[p.index]!;
        expect(c.healthy && !c.draining && !exclude?.has(c.id)).toBe(true);
        const bound = computeLoadBound(replicas, percent, Number(sl));
        const anyUnder = replicas.some((x, i) => x.healthy && !x.draining && !exclude?.has(x.id) && x.inFlight < capOf(bound, replicas, i));
        expect(p.spilled).toBe(p.index !== ring.home(ctx.key!));
        if (!anyUnder) continue;
        expect(c.inFlight).toBeLessThan(capOf(bound, replicas, p.index));
        // Reference: the longest match among eligible replicas (first in ring order), when it is
        // long enough beyond the base, otherwise the ring order's first eligible.
        const eligible = (i: number) => {
          const x = replicas[i]!;
          return x.healthy && !x.draining && !exclude?.has(x.id) && x.inFlight < capOf(bound, replicas, i);
        };
        const warm = replicas.map((x, i) => i).filter((i) => replicas[i]!.healthy && !replicas[i]!.draining && !exclude?.has(replicas[i]!.id) && matched[i]! >= 0);
        const base = warm.length ? Math.min(...warm.map((i) => matched[i]!)) : 0;
        const usableIdx = replicas.map((_, i) => i).filter((i) => replicas[i]!.healthy && !replicas[i]!.draining && !exclude?.has(replicas[i]!.id));
        const minLoad = Math.min(...usableIdx.map((i) => replicas[i]!.inFlight / replicas[i]!.weight));
        // The no-starvation window (defaults S = 4, ρ = 0.5): nothing above it is picked.
        const window = minLoad + 4 + 0.5 * minLoad;
        expect(c.inFlight / c.weight).toBeLessThanOrEqual(window + 1e-9);
        const order = ringOrder(ring, ctx.key!).filter((i) => eligible(i) && replicas[i]!.inFlight / replicas[i]!.weight <= window);
        // Every eligible replica is outside the window: the least loaded, ties at random.
        if (order.length === 0) {
          expect(c.inFlight / c.weight).toBe(minLoad);
          continue;
        }
        const best = Math.max(0, ...order.map((i) => matched[i]! - base));
        const need = Math.max(2, Math.ceil(0.25 * (blocks - base)));
        // Nothing worth following: the least loaded (per unit of weight) in ring order.
        // (When the least loaded are all at their cap: the first eligible in ring order.)
        const want = best >= need ? order.find((i) => matched[i]! - base === best) : (order.find((i) => replicas[i]!.inFlight / replicas[i]!.weight <= minLoad) ?? order[0]);
        expect(p.index).toBe(want);
        expect(p.steps).toBe(ringOrder(ring, ctx.key!).indexOf(p.index));
      }
    }
  });

  it('keyless requests go to least-load via pickReplica', () => {
    const s = createStrategy('prefix-aware');
    const load = [3, 1, 4, 1, 5, 9, 2, 6];
    const r = ok(pickReplica(s, createStrategy('least-load'), { ring: ring8, replicas: views(ring8, load), key: null, random: () => 0 }));
    expect(load[r.index]).toBe(1);
  });
});

describe('prefix-aware: no starvation when every prompt shares its first blocks', () => {
  // 400 sessions × 5 turns = 2,000 requests. Every prompt starts with the same 2 blocks, then
  // the session's own blocks; each turn extends the previous one by 1-3 blocks. Requests stay
  // in flight for a few picks (≈ 8 in flight), or finish at once (an idle fleet).
  for (const inFlightModel of ['loaded', 'idle'] as const) {
    it(`every replica gets at least half the mean (${inFlightModel})`, () => {
      const rand = seededRandom(2024);
      const strat = createStrategy('prefix-aware');
      const index = new PrefixIndex();
      const load = new Int32Array(8);
      const counts = new Int32Array(8);
      const pending: { at: number; r: number }[] = [];
      const sessions = Array.from({ length: 400 }, (_, s) => ({ key: hashString(`s${s}`), blocks: [0xaaaa0001, 0xaaaa0002] as number[], turns: 0, next: 0 }));
      let spawned = 0;
      const matched = new Int32Array(8);
      let seq = 1;
      for (let t = 0; t < 2000; t++) {
        // Interleave sessions: pick a random live one (turns left), new sessions join over time.
        if (spawned < sessions.length && (rand() < 0.25 || spawned === 0)) spawned++;
        let s = sessions[Math.floor(rand() * spawned)]!;
        if (s.turns >= 5) s = sessions.find((x) => x.turns < 5)!;
        if (s.turns === 0) spawned = Math.max(spawned, sessions.indexOf(s) + 1);
        const add = 1 + Math.floor(rand() * 3);
        for (let k = 0; k < add; k++) s.blocks.push(seq++ * 2654435761);
        s.turns++;
        const blocks = Uint32Array.from(s.blocks);
        index.matchAll(ring8.ids, blocks, matched);
        const r = ok(strat.pick({ ring: ring8, replicas: views(ring8, load), key: s.key, random: rand, prefixMatch: { blocks: blocks.length, matched } }));
        index.recordRoute(ring8.ids[r.index]!, blocks);
        counts[r.index]!++;
        if (inFlightModel === 'loaded') {
          load[r.index]!++;
          pending.push({ at: t + 4 + Math.floor(rand() * 9), r: r.index });
          for (let i = pending.length - 1; i >= 0; i--) {
            if (pending[i]!.at <= t) {
              load[pending[i]!.r]!--;
              pending.splice(i, 1);
            }
          }
        }
      }
      const mean = 2000 / 8;
      expect(Math.min(...counts), `counts ${Array.from(counts).join(' ')}`).toBeGreaterThanOrEqual(mean / 2);
    });
  }
});
