// The pieces of `npm run bench:fairness` that are arithmetic (scripts/bench/fairness-goals.ts) and
// its chart (scripts/bench/fairness-chart.ts); the timed run itself is the bench.
import { describe, expect, it } from 'vitest';

import { renderFairnessChart } from '../../../scripts/bench/fairness-chart.js';
import {
  arrivals,
  backoffMs,
  errorStatuses,
  goalLine,
  nominalCapacity,
  noisyGoals,
  percentile,
  priorityGoal,
  shareGoal,
  shares,
  throughput,
  ttfts,
  ttftsCountingFailures,
  type RequestRecord,
} from '../../../scripts/bench/fairness-goals.js';

const rec = (tenant: string, phase: string, endMs: number, ok = true, ttftMs: number | null = 100, status = 200): RequestRecord => ({ tenant, phase, startMs: endMs - 500, ttftMs, endMs, status, ok });

describe('bench:fairness arithmetic', () => {
  it('spaces a steady client evenly and draws a burst from its seed, bounded in count', () => {
    expect(arrivals('steady', 4, 1_000, 0)).toEqual([125, 375, 625, 875]);
    const a = arrivals('poisson', 100, 10_000, 7);
    expect(a).toEqual(arrivals('poisson', 100, 10_000, 7));
    expect(a).not.toEqual(arrivals('poisson', 100, 10_000, 8));
    // ~1,000 expected; a Poisson count is within a few standard deviations (√1000 ≈ 32).
    expect(a.length).toBeGreaterThan(850);
    expect(a.length).toBeLessThan(1_150);
    expect(a.every((t, i) => t < 10_000 && (i === 0 || t >= a[i - 1]!))).toBe(true);
    expect(arrivals('poisson', 1e6, 10_000, 1, 500)).toHaveLength(500);
    expect(arrivals('steady', 0, 1_000, 0)).toEqual([]);
  });

  it('takes nearest-rank percentiles of the successful requests only', () => {
    expect(percentile([5, 1, 4, 2, 3], 0.5)).toBe(3);
    expect(percentile([5, 1, 4, 2, 3], 0.99)).toBe(5);
    expect(percentile([], 0.5)).toBeNaN();
    expect(percentile([1, 2, Infinity], 0.99)).toBe(Infinity);
    expect(percentile([1, NaN, 3], 0.99)).toBe(3);
    const r = [rec('q', 'p', 1, true, 10), rec('q', 'p', 2, false, 999, 503), rec('q', 'p', 3, true, null), rec('n', 'p', 4, true, 50), rec('q', 'other', 5, true, 70)];
    expect(ttfts(r, 'q', 'p')).toEqual([10]);
    expect(ttftsCountingFailures(r, 'q', 'p')).toEqual([10, Infinity, Infinity]);
    // A refused request makes the TTFT goal fail, however fast the served ones were.
    expect(priorityGoal(100, percentile(ttftsCountingFailures(r, 'q', 'p'), 0.99)).met).toBe(false);
    expect(priorityGoal(100, Infinity).shown).toBe('∞ (failed requests)');
    expect(errorStatuses(r, 'q', 'p')).toEqual({ 503: 1 });
  });

  it('counts throughput and shares by finish time inside the window', () => {
    const r = [...Array.from({ length: 30 }, (_, i) => rec('a', 'x', 1_000 + i * 100)), ...Array.from({ length: 10 }, (_, i) => rec('b', 'x', 1_000 + i * 300)), rec('a', 'x', 999), rec('a', 'x', 4_000), rec('b', 'x', 2_000, false)];
    expect(throughput(r, 'a', 1_000, 4_000)).toBeCloseTo(10);
    expect(throughput(r, 'b', 1_000, 4_000)).toBeCloseTo(10 / 3);
    const s = shares(r, ['a', 'b'], 1_000, 4_000);
    expect(s.a).toBeCloseTo(0.75);
    expect(s.b).toBeCloseTo(0.25);
    expect(shares([], ['a', 'b'], 0, 1_000).a).toBeNaN();
  });

  it('judges the noisy-neighbour goals: TTFT ratio, no error for Q, N takes 90% of what Q leaves', () => {
    const ok = noisyGoals({ qAloneP99: 200, qBurstP99: 290, qErrors: 0, qThroughput: 10, nThroughput: 13.6, capacity: 25 });
    expect(ok.map((g) => g.met)).toEqual([true, true, true]);
    expect(ok[0]!.shown).toBe('1.45×');
    expect(ok[2]!.shown).toBe('90.7%');
    const bad = noisyGoals({ qAloneP99: 200, qBurstP99: 320, qErrors: 3, qThroughput: 10, nThroughput: 13, capacity: 25 });
    expect(bad.map((g) => g.met)).toEqual([false, false, false]);
    // Nothing measured is a MISS, never a pass.
    expect(noisyGoals({ qAloneP99: NaN, qBurstP99: 300, qErrors: 0, qThroughput: 30, nThroughput: 1, capacity: 25 }).map((g) => g.met)).toEqual([false, true, false]);
  });

  it('judges shares against the weights within five points, and the priority ratio', () => {
    expect(shareGoal('s', 0.549, [1, 1]).met).toBe(true);
    expect(shareGoal('s', 0.56, [1, 1]).met).toBe(false);
    expect(shareGoal('s', 0.7, [3, 1]).met).toBe(true);
    expect(shareGoal('s', 0.69, [3, 1]).met).toBe(false);
    expect(shareGoal('s', 0.75, [3, 1]).target).toBe('75 ± 5%');
    expect(priorityGoal(200, 240).met).toBe(true);
    expect(priorityGoal(200, 241).met).toBe(false);
    const line = goalLine(priorityGoal(200, 220), [{ name: 'no bound', goal: priorityGoal(200, 600) }, { name: 'bound 4', goal: priorityGoal(200, 230) }]);
    expect(line).toBe("- MET: high band's TTFT p99 under a full pool ÷ idle pool: 1.10× (goal ≤ 1.2×); no bound: 3.00×, MISSED; bound 4: 1.15×, MET");
  });

  it('backs a refused client off by its Retry-After, held to the bounds', () => {
    const o = { floorMs: 250, capMs: 2_000, fallbackMs: 1_000 };
    expect(backoffMs(1_000, o)).toBe(1_000);
    expect(backoffMs(0, o)).toBe(250);
    expect(backoffMs(60_000, o)).toBe(2_000);
    expect(backoffMs(null, o)).toBe(1_000);
    expect(backoffMs(undefined, o)).toBe(1_000);
    expect(backoffMs(NaN, o)).toBe(1_000);
  });

  it('computes the nominal capacity from the mock parameters', () => {
    // 16 slots; 1,200 tokens at 10,000/s = 120 ms, 15 more tokens × 30 ms = 450 ms.
    expect(nominalCapacity({ replicas: 4, maxNumSeqs: 4, promptTokens: 1_200, prefillTokensPerSec: 10_000, maxTokens: 16, decodeMsPerToken: 30 })).toBeCloseTo(16 / 0.57);
  });
});

describe('bench:fairness chart', () => {
  it('draws a bar per measured value, the goals as lines and bands, and escapes text', () => {
    const svg = renderFairnessChart(
      [
        { title: 'TTFT <p99>', unit: 'ms', groups: [{ label: 'off', bars: [{ label: 'alone', value: 200, color: '#111' }, { label: 'burst', value: 800, color: '#222', note: '3 failed' }], goal: { at: 300 } }] },
        { title: 'share', unit: '%', max: 100, groups: [{ label: 'eq', bars: [{ label: 'x', value: 52, color: '#333' }, { label: 'y', value: NaN, color: '#444' }], goal: { from: 45, to: 55 } }] },
      ],
      { title: 'T & t', subtitle: 's', legend: [{ label: 'L', color: '#555' }] },
    );
    expect(svg.startsWith('<svg')).toBe(true);
    expect(svg.endsWith('</svg>')).toBe(true);
    expect(svg).toContain('TTFT &lt;p99&gt;');
    expect(svg).toContain('T &amp; t');
    expect(svg).not.toContain('<p99>');
    // Three bars drawn (the NaN one is not), plus the legend's swatch and the goal band.
    expect(svg.match(/<rect [^>]*fill="#(111|222|333|444)"/g)).toHaveLength(3);
    expect(svg).toContain('3 failed');
    expect(svg).toContain('goal 300 ms');
    expect(svg).toContain('goal 45.0% to 55.0%');
    expect(svg).toContain('>L</text>');
  });
});
