import { describe, expect, it } from 'vitest';
import { simulate } from '../../../sim/engine.js';
import { computeBound, parseKeySpec, parseTrace, routingKey } from '../../../sim/trace.js';
import { WORKLOAD_CLASSES, generateWorkload } from '../../../sim/workloads.js';

type Generated = ReturnType<typeof generateWorkload>;
const textOf = (rows: Generated) => [JSON.stringify({ type: 'header', block_tokens: 16 }), ...rows.map((r) => JSON.stringify(r))].join('\n');
const toText = (cls: (typeof WORKLOAD_CLASSES)[number], seed: number) => textOf(generateWorkload(cls, { seed, durationSec: 60 }));

describe('gen-trace workloads', () => {
  for (const cls of WORKLOAD_CLASSES) {
    it(`${cls}: seeded, sorted, parseable, with sessions`, () => {
      const rows = generateWorkload(cls, { seed: 3, durationSec: 60 });
      const a = textOf(rows);
      expect(toText(cls, 3)).toBe(a);
      expect(toText(cls, 4)).not.toBe(a);
      const ts = rows.map((r) => r.timestamp);
      expect(ts.every((t, i) => i === 0 || t >= ts[i - 1]!)).toBe(true);
      const t = parseTrace(a);
      expect(t.format).toBe('generated');
      expect(t.requests.length).toBeGreaterThan(5);
      for (const r of t.requests) expect(r.blocks.length).toBe(Math.floor(r.promptTokens / 16));
      expect(t.requests.every((r) => r.session !== null)).toBe(true);
    });
  }

  it('multi-turn sessions reuse their own history: session affinity approaches the bound', () => {
    const t = parseTrace(toText('multi-turn', 1));
    const keys = t.requests.map((r) => routingKey(r, parseKeySpec('session')));
    const bound = computeBound(t).tokenHitRate;
    const hash = simulate(t, { strategy: 'hash', replicas: 4, keys }).tokenHitRate;
    const rr = simulate(t, { strategy: 'round-robin', replicas: 4, keys }).tokenHitRate;
    expect(bound).toBeGreaterThan(0.5);
    expect(hash).toBeGreaterThan(rr);
    expect(hash).toBeGreaterThan(0.8 * bound);
  });
});
