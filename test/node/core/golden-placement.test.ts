// Golden placements: literal hashes and home replicas for fixed keys on fixed rings, generated
// once (test/fixtures/golden-placement.json) and never regenerated to make a test pass, since a
// change means every deployed router moves its sessions. test/workers/core-parity.test.ts
// checks the same literals inside workerd, so Node and the Workers runtime agree.
import { describe, expect, it } from 'vitest';
import golden from '../../fixtures/golden-placement.json';
import { canonicalPrompt, createStrategy, hashString, hex32, murmur3, parseKeySource, resolveRoutingKey, buildRing, type ReplicaView, type Strategy } from '../../../src/core/index.js';

type Placement = { hash: string; home: string; hash0: string; bounded0: string; bounded1: string; bounded3: string };

function place(strategy: Strategy, ring: ReturnType<typeof buildRing>, members: { id: string; weight: number }[], key: number, inFlight: number): string {
  const replicas: ReplicaView[] = members.map((m) => ({ id: m.id, weight: m.weight, inFlight, healthy: true, draining: false }));
  const p = strategy.pick({ ring, replicas, key, random: () => 0 });
  if (!p.ok) throw new Error(p.reason);
  return p.replica;
}

describe('golden placement (literal values)', () => {
  it('fixture is well formed', () => {
    expect(golden.hashes.length).toBeGreaterThanOrEqual(5);
    expect(Object.keys(golden.rings)).toEqual(['equal-8', 'weighted-4']);
    for (const r of Object.values(golden.rings)) expect(Object.keys(r.placements).length).toBeGreaterThanOrEqual(10);
  });

  it.each(golden.hashes as [string, string][])('hashString(%j) = %s', (input, want) => {
    expect(hex32(hashString(input))).toBe(want);
  });

  it('a lone surrogate hashes as U+FFFD', () => {
    expect(hashString('lone \ud800 surrogate')).toBe(hashString('lone \ufffd surrogate'));
  });

  describe.each(Object.entries(golden.rings))('ring %s', (_name, spec) => {
    const ring = buildRing(spec.members);
    const hash = createStrategy('hash');
    const bounded = createStrategy('bounded-hash:1.25');

    it('has the same points', () => {
      expect(ring.points.length).toBe(spec.points);
      expect(hex32(ring.points[0]!)).toBe(spec.firstPoint);
      expect(hex32(ring.points[ring.points.length - 1]!)).toBe(spec.lastPoint);
      expect(hex32(murmur3(new Uint8Array(ring.points.buffer, ring.points.byteOffset, ring.points.byteLength)))).toBe(spec.pointsChecksum);
    });

    it.each(Object.entries(spec.placements as Record<string, Placement>))('key %j', (key, want) => {
      const h = hashString(key);
      expect(hex32(h)).toBe(want.hash);
      expect(ring.ids[ring.home(h)]).toBe(want.home);
      expect(place(hash, ring, spec.members, h, 0)).toBe(want.hash0);
      // Equal loads: 0 (every replica has its minimum slot), 1 and 3 in flight everywhere.
      expect(place(bounded, ring, spec.members, h, 0)).toBe(want.bounded0);
      expect(place(bounded, ring, spec.members, h, 1)).toBe(want.bounded1);
      expect(place(bounded, ring, spec.members, h, 3)).toBe(want.bounded3);
    });

    it('the same key lands on the same replica when members are listed in another order', () => {
      const reversed = buildRing([...spec.members].reverse());
      for (const [key, want] of Object.entries(spec.placements as Record<string, Placement>)) {
        expect(reversed.ids[reversed.home(hashString(key))]).toBe(want.home);
      }
    });
  });

  it('prefix keys of a fixed chat body', () => {
    const { body } = golden.prefix;
    expect(hex32(hashString(canonicalPrompt(body)))).toBe(golden.prefix.canonicalPromptHash);
    const key = (n: number) => resolveRoutingKey([parseKeySource(`prefix:${n}`)], { header: () => null, body }).hash!;
    expect(hex32(key(32))).toBe(golden.prefix.prefix32);
    expect(hex32(key(4096))).toBe(golden.prefix.prefix4096);
  });
});
