// The chart of `npm run bench:proxy`: per origin pace, TTFT p50 and req/s (as a share of the bare
// Worker's) at each concurrency, for the bare Worker, the JS-copy Worker and the router, with the
// goal drawn in (bare + 2 ms, 60 % of bare). A standalone SVG string. Pure: no I/O.

export interface ProxyChartRow {
  regime: string;
  target: string;
  concurrency: number;
  rps: number;
  ttftP50: number;
}

export interface ProxyChartOptions {
  title: string;
  subtitle: string;
  /** Targets drawn, in order, each with its colour; the first is the reference ("bare"). */
  targets: readonly { name: string; label: string; color: string }[];
  goalTtftMs: number;
  goalThroughput: number;
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const PANEL_W = 430;
const PANEL_H = 230;
const PAD = { left: 56, right: 16, top: 34, bottom: 40 };

/** A round upper bound for an axis: 1, 2 or 5 times a power of ten, at or above `v`. */
export function niceCeil(v: number): number {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

/** A round lower bound: 1, 2 or 5 times a power of ten, at or below `v`. */
export function niceFloor(v: number): number {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [5, 2, 1]) if (m * p <= v) return m * p;
  return p;
}

/** 1-2-5 ticks from `min` to `max` (both such numbers). */
export function logTicks(min: number, max: number): number[] {
  const out: number[] = [];
  for (let p = 10 ** Math.floor(Math.log10(min)); p <= max; p *= 10) {
    for (const m of [1, 2, 5]) {
      const v = Number((m * p).toPrecision(3));
      if (v >= min && v <= max) out.push(v);
    }
  }
  return out;
}

export function renderProxyChart(rows: readonly ProxyChartRow[], o: ProxyChartOptions): string {
  const regimes = [...new Set(rows.map((r) => r.regime))];
  const concurrencies = [...new Set(rows.map((r) => r.concurrency))].sort((a, b) => a - b);
  const ref = o.targets[0]!.name;
  const width = PAD.left + 2 * (PANEL_W + 20) + 10;
  const height = 70 + regimes.length * (PANEL_H + 30) + 40;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="#fff"/>`,
    `<text x="12" y="22" font-size="15" font-weight="600">${esc(o.title)}</text>`,
    `<text x="12" y="40" fill="#495057">${esc(o.subtitle)}</text>`,
  ];
  const find = (regime: string, target: string, c: number) => rows.find((r) => r.regime === regime && r.target === target && r.concurrency === c);

  regimes.forEach((regime, ri) => {
    const y0 = 60 + ri * (PANEL_H + 30);
    for (const [pi, metric] of (['ttft', 'rps'] as const).entries()) {
      const x0 = 10 + pi * (PANEL_W + 20);
      const plotW = PANEL_W - PAD.left - PAD.right;
      const plotH = PANEL_H - PAD.top - PAD.bottom;
      const px = x0 + PAD.left;
      const py = y0 + PAD.top;
      const value = (r: ProxyChartRow | undefined): number | null => {
        if (!r) return null;
        if (metric === 'ttft') return r.ttftP50;
        const base = find(regime, ref, r.concurrency);
        return base && base.rps > 0 ? (100 * r.rps) / base.rps : null;
      };
      const all = rows.filter((r) => r.regime === regime && o.targets.some((t) => t.name === r.target)).map(value).filter((v): v is number => v !== null && Number.isFinite(v));
      const goalTops = metric === 'ttft' ? concurrencies.map((c) => (find(regime, ref, c)?.ttftP50 ?? 0) + o.goalTtftMs) : [100 * o.goalThroughput];
      // TTFT on a log axis (1-2-5 ticks), so a few ms of overhead at low load stays visible next to
      // a saturated row; req/s share on a linear axis from 0.
      const log = metric === 'ttft';
      const top = Math.max(...all, ...goalTops, log ? 1 : 100) * 1.05;
      const max = log ? niceCeil(top) : Math.ceil(top / 25) * 25;
      const min = log ? Math.min(1, niceFloor(Math.min(...all))) : 0;
      const yOf = log
        ? (v: number) => py + plotH - ((Math.log10(Math.max(v, min)) - Math.log10(min)) / (Math.log10(max) - Math.log10(min))) * plotH
        : (v: number) => py + plotH - (v / max) * plotH;
      const ticks = log ? logTicks(min, max) : Array.from({ length: max / 25 + 1 }, (_, k) => k * 25);
      const title = metric === 'ttft' ? `${regime}: TTFT p50 (ms, log scale), lower is better` : `${regime}: req/s, % of the ${o.targets[0]!.label}`;
      out.push(`<text x="${x0 + 4}" y="${y0 + 16}" font-size="12" font-weight="600">${esc(title)}</text>`);
      for (const v of ticks) {
        const y = yOf(v);
        out.push(`<line x1="${px}" y1="${y.toFixed(1)}" x2="${px + plotW}" y2="${y.toFixed(1)}" stroke="#e9ecef"/>`);
        out.push(`<text x="${px - 6}" y="${(y + 4).toFixed(1)}" text-anchor="end" fill="#495057">${Number(v.toPrecision(3))}</text>`);
      }
      const groupW = plotW / concurrencies.length;
      const barW = Math.min(26, (groupW - 16) / o.targets.length);
      concurrencies.forEach((c, ci) => {
        const gx = px + ci * groupW;
        const startX = gx + (groupW - barW * o.targets.length) / 2;
        o.targets.forEach((t, ti) => {
          const v = value(find(regime, t.name, c));
          if (v === null) return;
          const x = startX + ti * barW;
          const y = yOf(Math.min(v, max));
          out.push(`<rect x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${(barW - 2).toFixed(1)}" height="${(py + plotH - y).toFixed(1)}" fill="${t.color}"><title>${esc(`${t.label}, ${c} clients: ${metric === 'ttft' ? `${v.toFixed(2)} ms` : `${v.toFixed(0)} %`}`)}</title></rect>`);
        });
        // The goal: the reference's TTFT + 2 ms over this group, or 60 % across the panel.
        if (metric === 'ttft') {
          const base = find(regime, ref, c);
          if (base) {
            const y = yOf(base.ttftP50 + o.goalTtftMs);
            out.push(`<line x1="${(startX - 3).toFixed(1)}" y1="${y.toFixed(1)}" x2="${(startX + barW * o.targets.length + 1).toFixed(1)}" y2="${y.toFixed(1)}" stroke="#212529" stroke-dasharray="4 3"/>`);
          }
        }
        out.push(`<text x="${(gx + groupW / 2).toFixed(1)}" y="${py + plotH + 16}" text-anchor="middle" fill="#495057">${c} client${c === 1 ? '' : 's'}</text>`);
      });
      if (metric === 'rps') {
        const y = yOf(100 * o.goalThroughput);
        out.push(`<line x1="${px}" y1="${y.toFixed(1)}" x2="${px + plotW}" y2="${y.toFixed(1)}" stroke="#212529" stroke-dasharray="4 3"/>`);
      }
      out.push(`<line x1="${px}" y1="${py + plotH}" x2="${px + plotW}" y2="${py + plotH}" stroke="#adb5bd"/>`);
    }
  });

  const ly = height - 22;
  let lx = 14;
  for (const t of o.targets) {
    out.push(`<rect x="${lx}" y="${ly - 9}" width="12" height="12" fill="${t.color}"/><text x="${lx + 17}" y="${ly + 1}">${esc(t.label)}</text>`);
    lx += 30 + t.label.length * 6.2;
  }
  out.push(`<line x1="${lx}" y1="${ly - 3}" x2="${lx + 22}" y2="${ly - 3}" stroke="#212529" stroke-dasharray="4 3"/><text x="${lx + 27}" y="${ly + 1}">goal: ${o.targets[0]!.label} + ${o.goalTtftMs} ms TTFT p50; ${Math.round(o.goalThroughput * 100)} % of its req/s</text>`);
  out.push('</svg>');
  return out.join('\n');
}
