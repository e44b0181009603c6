// Choosing a data-parallel engine of the picked replica (src/core/engine-choice.ts).
import { describe, expect, it } from 'vitest';
import { chooseEngine, ENGINE_BALANCE_FACTOR } from '../../../src/core/engine-choice.js';
import { seededRandom } from '../../../src/core/random.js';

describe('chooseEngine', () => {
  it('a single engine is always 0', () => {
    expect(chooseEngine({ matched: [5], leases: [9], key: 1 })).toBe(0);
  });

  it('follows the longest match', () => {
    expect(chooseEngine({ matched: [2, 12, 7, -1], leases: [1, 0, 0, 0], key: 3 })).toBe(1);
    // Σ = 1 over 4 engines: cap = ceil(2 × 1.25 / 4) = 1, so the best match already running one yields to the next.
    expect(chooseEngine({ matched: [2, 12, 7, -1], leases: [0, 1, 0, 0], key: 3 })).toBe(2);
    // Equal matches (a shared system prompt on both): the one with fewer leases.
    expect(chooseEngine({ matched: [8, 8], leases: [1, 0], key: 3 })).toBe(1);
  });

  it('leaves a match whose engine is over its share: eligible ⇔ leases + 1 ≤ ceil((Σ + 1) × c / N)', () => {
    // Σ = 4, N = 2: cap = ceil(5 × 1.25 / 2) = 4; engine 0 at 4 is out, engine 1 (match 3) takes it.
    expect(chooseEngine({ matched: [20, 3], leases: [4, 0], key: 7 })).toBe(1);
    // At 3 it is within the bound and keeps its session.
    expect(chooseEngine({ matched: [20, 3], leases: [3, 1], key: 7 })).toBe(0);
  });

  it('with no useful match, the fewest leases', () => {
    expect(chooseEngine({ matched: [-1, 0, -1], leases: [2, 1, 3], key: 11 })).toBe(1);
    expect(chooseEngine({ matched: [0, 0], leases: [0, 5], key: 11 })).toBe(0);
  });

  it('ties go to a stable per-key engine, and keys spread over engines', () => {
    const counts = [0, 0, 0, 0];
    for (let key = 0; key < 4000; key++) {
      const e = chooseEngine({ matched: [-1, -1, -1, -1], leases: [0, 0, 0, 0], key });
      expect(chooseEngine({ matched: [-1, -1, -1, -1], leases: [0, 0, 0, 0], key })).toBe(e);
      counts[e]!++;
    }
    for (const c of counts) expect(c).toBeGreaterThan(800);
    // Rendezvous: the key's first choice wins whenever it is among the tied, whatever else ties.
    for (let key = 0; key < 500; key++) {
      const first = chooseEngine({ matched: [-1, -1, -1], leases: [0, 0, 0], key });
      const leases = [1, 1, 1];
      leases[first] = 0;
      leases[(first + 1) % 3] = 0;
      expect(chooseEngine({ matched: [-1, -1, -1], leases, key })).toBe(first);
    }
  });

  it('property: the chosen engine is within the bound or the least loaded; a longer eligible match never loses', () => {
    const rnd = seededRandom(17);
    for (let t = 0; t < 5000; t++) {
      const n = 2 + Math.floor(rnd() * 7);
      const leases = Array.from({ length: n }, () => Math.floor(rnd() * 6));
      const matched = Array.from({ length: n }, () => Math.floor(rnd() * 40) - 5);
      const e = chooseEngine({ matched, leases, key: Math.floor(rnd() * 2 ** 32) });
      const total = leases.reduce((a, b) => a + b, 0);
      const cap = Math.max(1, Math.ceil(((total + 1) * ENGINE_BALANCE_FACTOR) / n));
      const eligible = leases.map((l) => l + 1 <= cap);
      expect(eligible[e] || leases[e] === Math.min(...leases)).toBe(true);
      const bestEligible = Math.max(0, ...matched.filter((m, i) => eligible[i] && m >= 1));
      if (bestEligible >= 1) expect(matched[e]).toBe(bestEligible);
      else expect(leases[e]).toBe(Math.min(...leases));
    }
  });
});
