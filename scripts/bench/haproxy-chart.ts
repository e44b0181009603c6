// The chart of `npm run bench:haproxy`: sessions split against load spread per configuration,
// two scatter panels (requests max÷mean, peak in-flight max÷mean) as a standalone SVG string.
// Pure: no I/O.

export interface ChartPoint {
  label: string;
  group: 'haproxy' | 'router' | 'router-slack' | 'least';
  split: number;
  reqSpread: number;
  peakSpread: number;
}

const COLORS: Record<ChartPoint['group'], string> = {
  haproxy: '#d9480f',
  router: '#1c7ed6',
  'router-slack': '#2b8a3e',
  least: '#868e96',
};
const LEGEND: [ChartPoint['group'], string][] = [
  ['haproxy', 'HAProxy 2.6 (hash + hash-balance-factor)'],
  ['least', 'least connections / least-load (HAProxy and router)'],
  ['router', 'router bounded-hash, slack 0 (HAProxy semantics)'],
  ['router-slack', 'router bounded-hash with slack'],
];

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

function niceMax(v: number): number {
  return Math.ceil(v * 10 + 0.5) / 10;
}

/** The goal region drawn for one reference point: split ≤ reference / 5 at a spread ≤ the reference's. */
export interface GoalReference {
  label: string;
  split: number;
  reqSpread: number;
  peakSpread: number;
}

export function renderChart(points: readonly ChartPoint[], title: string, subtitle: string, goal?: GoalReference): string {
  const W = 1100;
  const H = 560;
  const panelW = 440;
  const panelH = 360;
  const top = 90;
  const lefts = [80, 620];
  const yMin = 1;
  const yMax = niceMax(Math.max(1.5, ...points.map((p) => Math.max(p.reqSpread, p.peakSpread))));
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="#fff"/>`,
    `<text x="${W / 2}" y="28" text-anchor="middle" font-size="17" font-weight="600">${esc(title)}</text>`,
    `<text x="${W / 2}" y="50" text-anchor="middle" fill="#495057">${esc(subtitle)}</text>`,
  ];
  const panels: [string, (p: { reqSpread: number; peakSpread: number }) => number][] = [
    ['requests per backend, max ÷ mean', (p) => p.reqSpread],
    ['peak in-flight per backend, max ÷ mean', (p) => p.peakSpread],
  ];
  panels.forEach(([name, yOf], k) => {
    const x0 = lefts[k]!;
    const X = (v: number) => x0 + v * panelW;
    const Y = (v: number) => top + panelH - ((v - yMin) / (yMax - yMin)) * panelH;
    out.push(`<rect x="${x0}" y="${top}" width="${panelW}" height="${panelH}" fill="#f8f9fa" stroke="#ced4da"/>`);
    for (let i = 0; i <= 10; i += 2) {
      const x = X(i / 10);
      out.push(`<line x1="${x}" y1="${top}" x2="${x}" y2="${top + panelH}" stroke="#e9ecef"/>`);
      out.push(`<text x="${x}" y="${top + panelH + 16}" text-anchor="middle" fill="#495057">${i * 10}%</text>`);
    }
    for (let v = yMin; v <= yMax + 1e-9; v += 0.1) {
      const y = Y(v);
      out.push(`<line x1="${x0}" y1="${y}" x2="${x0 + panelW}" y2="${y}" stroke="#e9ecef"/>`);
      out.push(`<text x="${x0 - 6}" y="${y + 4}" text-anchor="end" fill="#495057">${v.toFixed(1)}</text>`);
    }
    if (goal) {
      const gx = X(goal.split / 5);
      const gy = Y(Math.max(yMin, Math.min(yMax, yOf(goal))));
      out.push(`<rect x="${x0}" y="${gy}" width="${gx - x0}" height="${top + panelH - gy}" fill="#2b8a3e" fill-opacity="0.08" stroke="#2b8a3e" stroke-dasharray="4 3"/>`);
      out.push(`<text x="${x0 + 4}" y="${gy - 5}" fill="#2b8a3e" font-size="11">goal vs ${esc(goal.label)}</text>`);
    }
    out.push(`<text x="${x0 + panelW / 2}" y="${top + panelH + 36}" text-anchor="middle">sessions split across backends (lower is stickier)</text>`);
    out.push(`<text x="${x0 - 48}" y="${top + panelH / 2}" text-anchor="middle" transform="rotate(-90 ${x0 - 48} ${top + panelH / 2})">${esc(name)} (lower is more even)</text>`);
    // Labels: right of the point (left near the right edge); when the box would overlap an
    // earlier label, try alternately below and above, one line at a time.
    const placed: { x1: number; x2: number; y: number }[] = [];
    for (const p of points) {
      const x = X(p.split);
      const y = Y(yOf(p));
      const c = COLORS[p.group];
      if (p.group === 'haproxy') out.push(`<rect x="${x - 5}" y="${y - 5}" width="10" height="10" fill="${c}"/>`);
      else out.push(`<circle cx="${x}" cy="${y}" r="5.5" fill="${c}"/>`);
      const right = x < x0 + panelW - 110;
      const w = 6.6 * p.label.length;
      const x1 = right ? x + 9 : x - 9 - w;
      const x2 = x1 + w;
      const clash = (ly: number) => placed.some((q) => q.x1 < x2 && x1 < q.x2 && Math.abs(q.y - ly) < 12);
      let ly = y + 4;
      for (let n = 1; n <= 8 && clash(ly); n++) ly = y + 4 + (n % 2 === 1 ? 1 : -1) * Math.ceil(n / 2) * 12;
      placed.push({ x1, x2, y: ly });
      out.push(`<text x="${right ? x + 9 : x - 9}" y="${ly}" text-anchor="${right ? 'start' : 'end'}" fill="${c}">${esc(p.label)}</text>`);
    }
  });
  LEGEND.forEach(([g, text], i) => {
    const x = 80 + (i % 2) * 540;
    const y = top + panelH + 62 + Math.floor(i / 2) * 20;
    if (g === 'haproxy') out.push(`<rect x="${x}" y="${y - 9}" width="10" height="10" fill="${COLORS[g]}"/>`);
    else out.push(`<circle cx="${x + 5}" cy="${y - 4}" r="5.5" fill="${COLORS[g]}"/>`);
    out.push(`<text x="${x + 16}" y="${y}">${esc(text)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
