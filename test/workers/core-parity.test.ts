// The routing core inside workerd gives the same hashes and placements as in Node: both this
// file and test/node/core/golden-placement.test.ts compare against the same literal fixture.
import { describe, expect, it } from 'vitest';
import golden from '../fixtures/golden-placement.json';
import { buildRing, canonicalPrompt, createStrategy, hashString, hex32, murmur3, parseKeySource, resolveRoutingKey, type ReplicaView } from '../../src/core/index.js';

type Placement = { hash: string; home: string; hash0: string; bounded0: string; bounded1: string; bounded3: string };

describe('routing core parity (workerd)', () => {
  it('runs inside workerd, not Node', () => {
    expect(navigator.userAgent).toBe('Cloudflare-Workers');
  });

  it('hashes the fixture strings to the literal values (incl. UTF-8 and a lone surrogate)', () => {
    for (const [input, want] of golden.hashes as [string, string][]) expect(hex32(hashString(input)), JSON.stringify(input)).toBe(want);
    expect(hashString('lone \ud800 surrogate')).toBe(hashString('lone \ufffd surrogate'));
    // The fixture holds U+FFFD: a lone surrogate in JSON trips Vite's JSON loader; TextEncoder makes both the same bytes.
    expect(hex32(hashString('lone \ud800 surrogate'))).toBe('80c7ad51');
    // Two published MurmurHash3 x86_32 vectors, for a check independent of the fixture.
    expect(hashString('Hello, world!', 0x9747b28c)).toBe(0x24884cba);
    expect(hashString('ππππππππ', 0x9747b28c)).toBe(0xd58063c1);
  });

  for (const [name, spec] of Object.entries(golden.rings)) {
    it(`ring ${name}: same points and the same placements at equal loads`, () => {
      const ring = buildRing(spec.members);
      expect(ring.points.length).toBe(spec.points);
      expect(hex32(murmur3(new Uint8Array(ring.points.buffer, ring.points.byteOffset, ring.points.byteLength)))).toBe(spec.pointsChecksum);
      const hash = createStrategy('hash');
      const bounded = createStrategy('bounded-hash:1.25');
      const place = (s: typeof hash, key: number, inFlight: number) => {
        const replicas: ReplicaView[] = spec.members.map((m) => ({ id: m.id, weight: m.weight, inFlight, healthy: true, draining: false }));
        const p = s.pick({ ring, replicas, key, random: () => 0 });
        if (!p.ok) throw new Error(p.reason);
        return p.replica;
      };
      for (const [key, want] of Object.entries(spec.placements as Record<string, Placement>)) {
        const h = hashString(key);
        const got: Placement = {
          hash: hex32(h),
          home: ring.ids[ring.home(h)]!,
          hash0: place(hash, h, 0),
          bounded0: place(bounded, h, 0),
          bounded1: place(bounded, h, 1),
          bounded3: place(bounded, h, 3),
        };
        expect(got, `key ${JSON.stringify(key)}`).toEqual(want);
      }
    });
  }

  it('prefix keys of the fixed chat body', () => {
    const { body } = golden.prefix;
    expect(hex32(hashString(canonicalPrompt(body)))).toBe(golden.prefix.canonicalPromptHash);
    const key = (n: number) => resolveRoutingKey([parseKeySource(`prefix:${n}`)], { header: () => null, body }).hash!;
    expect(hex32(key(32))).toBe(golden.prefix.prefix32);
    expect(hex32(key(4096))).toBe(golden.prefix.prefix4096);
  });
});
