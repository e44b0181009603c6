// The consistent-hash ring: structure, lookup against a linear scan, order independence,
// signatures. Placement statistics (moved share, weights) live in strategies.test.ts.
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random.js';
import { hashString } from '../../../src/core/hash.js';
import { buildRing, DEFAULT_POINTS_PER_WEIGHT, MAX_RING_POINTS, ringSignature, type RingMember } from '../../../src/core/ring.js';

const members = (n: number, weight = (i: number) => 1 + (i % 3)): RingMember[] => Array.from({ length: n }, (_, i) => ({ id: `replica-${i}`, weight: weight(i) }));

describe('buildRing', () => {
  it('gives each member pointsPerWeight × weight points, hash(`${id}#${i}`), sorted ascending', () => {
    const ms = members(5);
    const ring = buildRing(ms);
    const total = ms.reduce((s, m) => s + m.weight * DEFAULT_POINTS_PER_WEIGHT, 0);
    expect(DEFAULT_POINTS_PER_WEIGHT).toBe(160);
    expect(ring.points.length).toBe(total);
    expect(ring.owners.length).toBe(total);
    expect(ring.ids).toEqual(ms.map((m) => m.id));
    expect(ring.weights).toEqual(ms.map((m) => m.weight));
    expect(ring.size).toBe(5);
    for (let i = 1; i < total; i++) expect(ring.points[i - 1]! <= ring.points[i]!).toBe(true);
    // Every (owner, point) pair is one of the owner's labels, each used exactly once.
    const expected = new Map<string, number>();
    ms.forEach((m, idx) => {
      for (let i = 0; i < m.weight * DEFAULT_POINTS_PER_WEIGHT; i++) {
        const k = `${idx}:${hashString(`${m.id}#${i}`)}`;
        expected.set(k, (expected.get(k) ?? 0) + 1);
      }
    });
    for (let i = 0; i < total; i++) {
      const k = `${ring.owners[i]}:${ring.points[i]}`;
      const c = expected.get(k);
      expect(c, `unexpected point ${k}`).toBeGreaterThan(0);
      expected.set(k, c! - 1);
    }
    expect([...expected.values()].every((c) => c === 0)).toBe(true);
  });

  it('honours a custom pointsPerWeight', () => {
    const ring = buildRing(members(3, (i) => 1 + i), 7);
    expect(ring.points.length).toBe((1 + 2 + 3) * 7);
  });

  it('divides the weights by their GCD: 2, 4, 6 is the ring of 1, 2, 3 (same points, same homes)', () => {
    const a = buildRing(members(3, (i) => 2 * (i + 1)));
    const b = buildRing(members(3, (i) => i + 1));
    expect(a.points.length).toBe(6 * DEFAULT_POINTS_PER_WEIGHT);
    expect(Array.from(a.points)).toEqual(Array.from(b.points));
    expect(Array.from(a.owners)).toEqual(Array.from(b.owners));
    expect(a.signature).toBe(b.signature);
    expect(a.weights).toEqual([2, 4, 6]);
    expect(buildRing(members(4, () => 256)).points.length).toBe(4 * DEFAULT_POINTS_PER_WEIGHT);
  });

  it('caps the total points at MAX_RING_POINTS by lowering the points per weight', () => {
    // 256 replicas with co-prime weights 255/256: 130,944 reduced weight × 160 would be 21M points.
    const ms = members(256, (i) => (i % 2 === 0 ? 255 : 256));
    const ring = buildRing(ms);
    const sum = ms.reduce((s, m) => s + m.weight, 0);
    expect(ring.points.length).toBeLessThanOrEqual(MAX_RING_POINTS);
    expect(ring.points.length).toBe(sum * Math.max(1, Math.floor(MAX_RING_POINTS / sum)));
    for (let i = 1; i < ring.points.length; i++) expect(ring.points[i - 1]! <= ring.points[i]!).toBe(true);
  });

  it('reuses the previous ring when the signature is unchanged (a drain-only PATCH never rebuilds)', () => {
    const ms = members(6);
    const ring = buildRing(ms);
    expect(buildRing(members(6), DEFAULT_POINTS_PER_WEIGHT, ring)).toBe(ring);
    // Weights scaled by a common factor: the same points arrays, new weights.
    const doubled = buildRing(ms.map((m) => ({ ...m, weight: m.weight * 2 })), DEFAULT_POINTS_PER_WEIGHT, ring);
    expect(doubled).not.toBe(ring);
    expect(doubled.points).toBe(ring.points);
    expect(doubled.weights).toEqual(ms.map((m) => m.weight * 2));
    // A real change rebuilds.
    const changed = buildRing(ms.map((m, i) => (i === 0 ? { ...m, weight: m.weight + 1 } : m)), DEFAULT_POINTS_PER_WEIGHT, ring);
    expect(changed.points).not.toBe(ring.points);
  });

  it('rejects non-integer, zero or negative weights and too many members', () => {
    expect(() => buildRing([{ id: 'a', weight: 0 }])).toThrow(RangeError);
    expect(() => buildRing([{ id: 'a', weight: -1 }])).toThrow(RangeError);
    expect(() => buildRing([{ id: 'a', weight: 1.5 }])).toThrow(/weight of a/);
    expect(() => buildRing([{ id: 'a', weight: NaN }])).toThrow(RangeError);
    expect(() => buildRing(Array.from({ length: 0x10000 }, (_, i) => ({ id: `r${i}`, weight: 1 })), 1)).toThrow(/65535/);
  });

  it('an empty ring has no home', () => {
    const ring = buildRing([]);
    expect(ring.points.length).toBe(0);
    expect(ring.home(123)).toBe(-1);
  });

  it('does not depend on the order members are given in (same key → same replica id)', () => {
    const ms = members(12);
    const a = buildRing(ms);
    const rnd = seededRandom(3);
    const shuffled = [...ms].sort(() => rnd() - 0.5);
    const b = buildRing(shuffled);
    expect(b.ids).not.toEqual(a.ids);
    for (let k = 0; k < 5000; k++) {
      const h = hashString(`session-${k}`);
      expect(b.ids[b.home(h)]).toBe(a.ids[a.home(h)]);
    }
  });
});

describe('Ring.locate / home', () => {
  const ring = buildRing(members(7), 20);
  const linearLocate = (h: number) => {
    for (let i = 0; i < ring.points.length; i++) if (ring.points[i]! >= h) return i;
    return 0;
  };

  it('finds the first point ≥ hash, wrapping past the last point (random hashes)', () => {
    const rnd = seededRandom(11);
    for (let n = 0; n < 20_000; n++) {
      const h = Math.floor(rnd() * 2 ** 32);
      const i = ring.locate(h);
      if (i !== linearLocate(h)) throw new Error(`locate(${h}) = ${i}, want ${linearLocate(h)}`);
      expect(ring.home(h)).toBe(ring.owners[i]);
    }
  });

  it('handles the edges: exact point hits, 0, 2^32−1, above the last point, negative int32 input', () => {
    const pts = ring.points;
    for (let i = 0; i < pts.length; i += 13) expect(ring.points[ring.locate(pts[i]!)]).toBe(pts[i]);
    expect(ring.locate(0)).toBe(0);
    expect(ring.locate(pts[pts.length - 1]! + 1 > 0xffffffff ? 0 : pts[pts.length - 1]! + 1)).toBe(0);
    expect(ring.locate(0xffffffff)).toBe(linearLocate(0xffffffff));
    // A signed 32-bit view of the same hash (e.g. `h | 0`) must land on the same point.
    const h = 0xdeadbeef;
    expect(ring.locate(h | 0)).toBe(ring.locate(h));
  });
});

describe('ringSignature', () => {
  it('changes exactly when membership, weights or pointsPerWeight change', () => {
    const ms = members(4);
    const sig = ringSignature(ms);
    expect(ringSignature(members(4))).toBe(sig);
    expect(buildRing(ms).signature).toBe(sig);
    expect(ringSignature(members(5))).not.toBe(sig);
    expect(ringSignature(ms.slice(1))).not.toBe(sig);
    expect(ringSignature(ms.map((m, i) => (i === 2 ? { ...m, weight: m.weight + 1 } : m)))).not.toBe(sig);
    expect(ringSignature(ms.map((m, i) => (i === 0 ? { ...m, id: 'other' } : m)))).not.toBe(sig);
    expect(ringSignature(ms, 100)).not.toBe(sig);
    // Weights up to a common factor are the same ring.
    expect(ringSignature(ms.map((m) => ({ ...m, weight: m.weight * 3 })))).toBe(sig);
  });
});
