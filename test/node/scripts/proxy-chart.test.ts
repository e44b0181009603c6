import { describe, expect, it } from 'vitest';
import { logTicks, niceCeil, niceFloor, renderProxyChart, type ProxyChartRow } from '../../../scripts/bench/proxy-chart.js';

const targets = [
  { name: 'bare worker', label: 'bare', color: '#888' },
  { name: 'JS-copy worker', label: 'floor', color: '#f80' },
  { name: 'router', label: 'router', color: '#18f' },
];

function rows(): ProxyChartRow[] {
  const out: ProxyChartRow[] = [];
  for (const regime of ['GPU-paced', 'saturation'])
    for (const c of [1, 16, 64])
      for (const [i, t] of targets.entries()) out.push({ regime, target: t.name, concurrency: c, rps: 100 * c * (1 - i * 0.2), ttftP50: 3 + i * c * 0.1 });
  return out;
}

describe('bench:proxy chart', () => {
  it('rounds axis tops up to 1, 2 or 5 times a power of ten', () => {
    expect([0.3, 1, 1.2, 3, 7, 99, 101].map(niceCeil)).toEqual([0.5, 1, 2, 5, 10, 100, 200]);
    expect(niceCeil(0)).toBe(1);
    expect([0.3, 1, 1.2, 3, 7, 99].map(niceFloor)).toEqual([0.2, 1, 1, 2, 5, 50]);
    expect(logTicks(1, 100)).toEqual([1, 2, 5, 10, 20, 50, 100]);
    expect(logTicks(0.5, 5)).toEqual([0.5, 1, 2, 5]);
  });

  it('draws one bar per regime, metric, concurrency and target, and the goal lines', () => {
    const svg = renderProxyChart(rows(), { title: 'T <&>', subtitle: 's', targets, goalTtftMs: 2, goalThroughput: 0.6 });
    expect(svg.startsWith('<svg')).toBe(true);
    expect(svg.endsWith('</svg>')).toBe(true);
    expect(svg).toContain('T &lt;&amp;&gt;');
    const bars = svg.match(/<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="#(888|f80|18f)"><title>/g) ?? [];
    expect(bars).toHaveLength(2 * 2 * 3 * 3);
    // The router at 64 clients, saturation: 60 % of bare, and TTFT 3 + 2 * 6.4.
    expect(svg).toContain('<title>router, 64 clients: 60 %</title>');
    expect(svg).toContain('<title>router, 64 clients: 15.80 ms</title>');
    // Goal lines: one per TTFT group (2 regimes × 3) and one per req/s panel (2), plus the legend's.
    expect(svg.match(/stroke-dasharray="4 3"/g)).toHaveLength(6 + 2 + 1);
  });

  it('leaves out a missing row instead of drawing a bar of NaN', () => {
    const svg = renderProxyChart(rows().filter((r) => !(r.target === 'router' && r.concurrency === 16)), { title: 't', subtitle: 's', targets, goalTtftMs: 2, goalThroughput: 0.6 });
    expect(svg).not.toContain('NaN');
    expect(svg).not.toContain('router, 16 clients');
  });
});
