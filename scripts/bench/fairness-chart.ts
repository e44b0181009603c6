// The chart of `npm run bench:fairness`: one panel per scenario, bars grouped by what is compared
// (flow control off, the baseline, against on), each group's goal drawn in (a line, or a band for
// a share with a tolerance). A standalone SVG string. Pure: no I/O.

import { niceCeil } from './proxy-chart.js';

export interface ChartBar {
  readonly label: string;
  /** NaN draws no bar (not measured). */
  readonly value: number;
  readonly color: string;
  /** Shown above the bar (e.g. `12 errors`). */
  readonly note?: string;
}

export interface ChartGroup {
  readonly label: string;
  readonly bars: readonly ChartBar[];
  /** The goal over this group: a level (a line) or a range (a band). */
  readonly goal?: { readonly at: number } | { readonly from: number; readonly to: number };
}

export interface ChartPanel {
  readonly title: string;
  /** Axis unit, e.g. `ms` or `%`. */
  readonly unit: string;
  readonly groups: readonly ChartGroup[];
  /** Axis top; default a round number above every bar and goal. */
  readonly max?: number;
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const PANEL_W = 430;
const PANEL_H = 250;
const PAD = { left: 52, right: 14, top: 34, bottom: 46 };

function fmt(v: number, unit: string): string {
  return unit === '%' ? `${v.toFixed(1)}%` : `${v >= 100 ? v.toFixed(0) : v.toPrecision(3)} ${unit}`;
}

/** Panels two to a row; a legend at the bottom (`legend`, or the distinct bar labels and colours). */
export function renderFairnessChart(panels: readonly ChartPanel[], o: { title: string; subtitle: string; legend?: readonly { label: string; color: string }[] }): string {
  const cols = Math.min(2, Math.max(1, panels.length));
  const rows = Math.ceil(panels.length / cols);
  const width = 20 + cols * (PANEL_W + 20);
  const height = 64 + rows * (PANEL_H + 20) + 34;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="#fff"/>`,
    `<text x="12" y="22" font-size="15" font-weight="600">${esc(o.title)}</text>`,
    `<text x="12" y="40" fill="#495057">${esc(o.subtitle)}</text>`,
  ];
  const legend = new Map<string, string>((o.legend ?? []).map((l) => [l.label, l.color]));
  panels.forEach((p, k) => {
    const x0 = 10 + (k % cols) * (PANEL_W + 20);
    const y0 = 56 + Math.floor(k / cols) * (PANEL_H + 20);
    const plotW = PANEL_W - PAD.left - PAD.right;
    const plotH = PANEL_H - PAD.top - PAD.bottom;
    const px = x0 + PAD.left;
    const py = y0 + PAD.top;
    const values = p.groups.flatMap((g) => [...g.bars.map((b) => b.value), ...(g.goal ? ('at' in g.goal ? [g.goal.at] : [g.goal.to]) : [])]).filter((v) => Number.isFinite(v));
    const max = p.max ?? niceCeil(Math.max(1, ...values) * 1.08);
    const yOf = (v: number) => py + plotH - (Math.max(0, Math.min(v, max)) / max) * plotH;
    out.push(`<text x="${x0 + 4}" y="${y0 + 16}" font-size="12" font-weight="600">${esc(p.title)}</text>`);
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      const y = yOf(v);
      out.push(`<line x1="${px}" y1="${y.toFixed(1)}" x2="${px + plotW}" y2="${y.toFixed(1)}" stroke="#e9ecef"/>`);
      out.push(`<text x="${px - 6}" y="${(y + 4).toFixed(1)}" text-anchor="end" fill="#495057">${Number(v.toPrecision(3))}${p.unit === '%' ? '%' : ''}</text>`);
    }
    if (p.unit !== '%') out.push(`<text x="${px - 40}" y="${py - 8}" fill="#495057">${esc(p.unit)}</text>`);
    const groupW = plotW / Math.max(1, p.groups.length);
    p.groups.forEach((g, gi) => {
      const gx = px + gi * groupW;
      const barW = Math.min(44, (groupW - 20) / Math.max(1, g.bars.length));
      const startX = gx + (groupW - barW * g.bars.length) / 2;
      if (g.goal) {
        const x1 = (startX - 4).toFixed(1);
        const x2 = (startX + barW * g.bars.length + 2).toFixed(1);
        if ('at' in g.goal) {
          const y = yOf(g.goal.at).toFixed(1);
          out.push(`<line x1="${x1}" y1="${y}" x2="${x2}" y2="${y}" stroke="#212529" stroke-dasharray="4 3"><title>goal ${esc(fmt(g.goal.at, p.unit))}</title></line>`);
        } else {
          const yTop = yOf(g.goal.to);
          const yBottom = yOf(g.goal.from);
          out.push(`<rect x="${x1}" y="${yTop.toFixed(1)}" width="${(Number(x2) - Number(x1)).toFixed(1)}" height="${(yBottom - yTop).toFixed(1)}" fill="#212529" fill-opacity="0.12" stroke="#212529" stroke-dasharray="4 3"><title>goal ${esc(fmt(g.goal.from, p.unit))} to ${esc(fmt(g.goal.to, p.unit))}</title></rect>`);
        }
      }
      g.bars.forEach((b, bi) => {
        if (!o.legend) legend.set(b.label, b.color);
        if (!Number.isFinite(b.value)) return;
        const x = startX + bi * barW;
        const y = yOf(b.value);
        out.push(`<rect x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${(barW - 3).toFixed(1)}" height="${(py + plotH - y).toFixed(1)}" fill="${b.color}"><title>${esc(`${g.label}, ${b.label}: ${fmt(b.value, p.unit)}${b.note ? `, ${b.note}` : ''}`)}</title></rect>`);
        out.push(`<text x="${(x + (barW - 3) / 2).toFixed(1)}" y="${(y - 4).toFixed(1)}" text-anchor="middle" font-size="10" fill="#212529">${esc(p.unit === '%' ? `${b.value.toFixed(0)}%` : b.value.toFixed(0))}</text>`);
        if (b.note) out.push(`<text x="${(x + (barW - 3) / 2).toFixed(1)}" y="${(y - 15).toFixed(1)}" text-anchor="middle" font-size="9" fill="#c92a2a">${esc(b.note)}</text>`);
      });
      out.push(`<text x="${(gx + groupW / 2).toFixed(1)}" y="${py + plotH + 16}" text-anchor="middle" fill="#495057">${esc(g.label)}</text>`);
    });
    out.push(`<line x1="${px}" y1="${py + plotH}" x2="${px + plotW}" y2="${py + plotH}" stroke="#adb5bd"/>`);
  });
  const ly = height - 18;
  let lx = 14;
  for (const [label, color] of legend) {
    out.push(`<rect x="${lx}" y="${ly - 9}" width="12" height="12" fill="${color}"/><text x="${lx + 17}" y="${ly + 1}">${esc(label)}</text>`);
    lx += 32 + label.length * 6.2;
  }
  out.push(`<line x1="${lx}" y1="${ly - 3}" x2="${lx + 22}" y2="${ly - 3}" stroke="#212529" stroke-dasharray="4 3"/><text x="${lx + 27}" y="${ly + 1}">goal</text>`);
  out.push('</svg>');
  return out.join('\n');
}
