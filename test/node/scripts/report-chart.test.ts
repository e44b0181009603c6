// The simulator report's per-replica requests chart: starvation visible at a glance.
import { describe, expect, it } from 'vitest';

import type { SimResult } from '../../../sim/engine.js';
import { renderReport, replicaRequestsChart } from '../../../sim/report.js';

const result = (strategy: string, requests: number[]): SimResult =>
  ({
    strategy,
    perReplica: requests.map((n, k) => ({ id: `r${k}`, requests: n, tokenHitRate: 0, outputTokens: 0, busyFraction: 0, meanInFlight: 0, peakInFlight: 0, evictions: 0 })),
  }) as unknown as SimResult;

describe('replicaRequestsChart', () => {
  it('draws one bar per replica per strategy, the starved ones red and counted', () => {
    const svg = replicaRequestsChart([result('even', [100, 100, 100, 100]), result('skewed', [190, 190, 10, 10])]);
    expect(svg.match(/<rect /g)).toHaveLength(8);
    // skewed: mean 100, r2 and r3 under half of it.
    expect(svg.match(/fill="#e15759"/g)).toHaveLength(2);
    expect(svg).toContain('skewed r2: 10 requests');
    expect(svg).toContain('2 starved');
    expect(svg).toContain('none starved');
    expect(svg).toContain('min ÷ mean 0.10');
    expect(svg).toContain('min ÷ mean 1.00');
    // Common scale: the 190 bars are the tallest, the even ones at 100/190 of them.
    const heights = [...svg.matchAll(/<rect [^>]*height="([\d.]+)"/g)].map((m) => Number(m[1]));
    expect(Math.max(...heights)).toBeCloseTo(heights[4]!, 5);
    expect(heights[0]! / heights[4]!).toBeCloseTo(100 / 190, 1);
  });

  it('escapes strategy names and is empty without per-replica data', () => {
    expect(replicaRequestsChart([result('<x>', [1, 1])])).toContain('&#60;x&#62;');
    expect(replicaRequestsChart([])).toBe('');
  });
});

describe('renderReport', () => {
  it('includes the per-replica requests chart', async () => {
    const { simulate } = await import('../../../sim/engine.js');
    const { parseTrace, parseKeySpec, routingKey, computeBound } = await import('../../../sim/trace.js');
    const lines = Array.from({ length: 60 }, (_, i) => JSON.stringify({ timestamp: i * 50, input_length: 600, output_length: 4, hash_ids: [i % 6, i], session: `s${i % 6}` }));
    const trace = parseTrace(lines.join('\n'));
    const keys = trace.requests.map((r) => routingKey(r, parseKeySpec('session')));
    const r = simulate(trace, { strategy: 'hash', replicas: 3, keys, timeScale: 1, seed: 1 } as Parameters<typeof simulate>[1]);
    const html = renderReport({ meta: { trace: 't', key: 'session', replicas: 3, timeScale: 1 }, bound: computeBound(trace), results: [r], sweep: [] });
    expect(html).toContain('Requests per replica');
    expect(html.match(/<title>hash r\d: \d+ requests<\/title>/g)).toHaveLength(3);
  });
});
