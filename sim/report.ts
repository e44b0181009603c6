// The self-contained HTML report: the tables plus inline SVG charts (hit rate and p95 TTFT per
// strategy, requests per replica per strategy, the balance-factor sweep, per-replica load over
// time). No scripts, no external resources. Pure: returns a string.

import type { SimResult } from './engine.js';
import type { SweepPoint } from './format.js';
import { scaleTable, strategyTable, sweepTable } from './format.js';
import type { ReuseBound } from './trace.js';

export interface ReportInput {
  readonly meta: Readonly<Record<string, unknown>> & { readonly trace: string; readonly key: string; readonly replicas: number; readonly timeScale: number };
  readonly bound: ReuseBound;
  /** One replica with the pool's whole KV (null when the cache is infinite). */
  readonly cacheBound?: ReuseBound | null;
  readonly results: readonly SimResult[];
  readonly sweep: readonly SweepPoint[];
}

const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const r1 = (x: number) => Math.round(x * 10) / 10;

function barChart(title: string, labels: readonly string[], values: readonly number[], fmt: (v: number) => string, refLine?: { value: number; label: string }): string {
  const W = 640;
  const rowH = 26;
  const left = 170;
  const H = 30 + labels.length * rowH + 10;
  const max = Math.max(...values.filter(Number.isFinite), refLine?.value ?? 0, 1e-9) * 1.1;
  const x = (v: number) => left + ((W - left - 60) * v) / max;
  let g = `<text x="0" y="16" class="t">${esc(title)}</text>`;
  labels.forEach((l, i) => {
    const y = 30 + i * rowH;
    const v = values[i]!;
    g += `<text x="${left - 6}" y="${y + 16}" text-anchor="end">${esc(l)}</text>`;
    if (Number.isFinite(v)) {
      g += `<rect x="${left}" y="${y + 3}" width="${r1(x(v) - left)}" height="${rowH - 8}" fill="${PALETTE[i % PALETTE.length]}"/>`;
      g += `<text x="${r1(x(v) + 4)}" y="${y + 16}">${esc(fmt(v))}</text>`;
    }
  });
  if (refLine) {
    const rx = r1(x(refLine.value));
    g += `<line x1="${rx}" x2="${rx}" y1="24" y2="${H - 6}" stroke="#333" stroke-dasharray="4 3"/><text x="${rx + 3}" y="${H - 2}" class="s">${esc(refLine.label)}</text>`;
  }
  return `<svg viewBox="0 0 ${W} ${H + 6}" width="${W}" height="${H + 6}">${g}</svg>`;
}

function sweepChart(points: readonly SweepPoint[]): string {
  const W = 640;
  const H = 320;
  const m = { l: 60, r: 20, t: 30, b: 40 };
  const xs = points.map((p) => p.result.tokenHitRate * 100);
  const ys = points.map((p) => p.result.ttftMs.p95 / 1000);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const padX = (x1 - x0) * 0.1 || 1;
  const padY = (y1 - y0) * 0.1 || 1;
  const sx = (v: number) => m.l + ((W - m.l - m.r) * (v - (x0 - padX))) / (x1 - x0 + 2 * padX);
  const sy = (v: number) => H - m.b - ((H - m.t - m.b) * (v - Math.max(0, y0 - padY))) / (y1 + padY - Math.max(0, y0 - padY));
  let g = `<text x="0" y="16" class="t">Balance factor sweep (bounded-hash): token hit rate vs p95 TTFT</text>`;
  g += `<line x1="${m.l}" y1="${H - m.b}" x2="${W - m.r}" y2="${H - m.b}" stroke="#999"/><line x1="${m.l}" y1="${m.t}" x2="${m.l}" y2="${H - m.b}" stroke="#999"/>`;
  g += `<text x="${(W + m.l) / 2}" y="${H - 6}" text-anchor="middle" class="s">token hit rate %</text>`;
  g += `<text x="14" y="${(H + m.t) / 2}" transform="rotate(-90 14 ${(H + m.t) / 2})" text-anchor="middle" class="s">p95 TTFT s</text>`;
  for (const v of [x0, (x0 + x1) / 2, x1]) g += `<text x="${r1(sx(v))}" y="${H - m.b + 14}" text-anchor="middle" class="s">${v.toFixed(1)}</text>`;
  for (const v of [y0, (y0 + y1) / 2, y1]) g += `<text x="${m.l - 4}" y="${r1(sy(v) + 4)}" text-anchor="end" class="s">${v.toFixed(1)}</text>`;
  g += `<polyline fill="none" stroke="#4e79a7" points="${points.map((_, i) => `${r1(sx(xs[i]!))},${r1(sy(ys[i]!))}`).join(' ')}"/>`;
  points.forEach((p, i) => {
    g += `<circle cx="${r1(sx(xs[i]!))}" cy="${r1(sy(ys[i]!))}" r="4" fill="#e15759"/><text x="${r1(sx(xs[i]!) + 6)}" y="${r1(sy(ys[i]!) - 6)}" class="s">c=${esc(p.factor)}</text>`;
  });
  return `<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}">${g}</svg>`;
}

function loadChart(r: SimResult): string {
  const W = 640;
  const H = 200;
  const m = { l: 40, r: 10, t: 24, b: 24 };
  const t = r.load.tMs;
  if (t.length < 2) return '';
  const tMax = t[t.length - 1]!;
  const yMax = Math.max(1, ...r.load.inFlight.flat());
  const sx = (v: number) => m.l + ((W - m.l - m.r) * v) / tMax;
  const sy = (v: number) => H - m.b - ((H - m.t - m.b) * v) / yMax;
  let g = `<text x="0" y="14" class="t">${esc(r.strategy)}: in-flight per replica over time</text>`;
  g += `<line x1="${m.l}" y1="${H - m.b}" x2="${W - m.r}" y2="${H - m.b}" stroke="#999"/>`;
  g += `<text x="${m.l - 4}" y="${m.t + 4}" text-anchor="end" class="s">${yMax}</text><text x="${m.l - 4}" y="${H - m.b}" text-anchor="end" class="s">0</text>`;
  g += `<text x="${W - m.r}" y="${H - 6}" text-anchor="end" class="s">${(tMax / 1000).toFixed(0)} s</text>`;
  r.load.inFlight.forEach((series, k) => {
    g += `<polyline fill="none" stroke-width="1" stroke="${PALETTE[k % PALETTE.length]}" points="${series.map((v, i) => `${r1(sx(t[i]!))},${r1(sy(v))}`).join(' ')}"/>`;
  });
  return `<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}">${g}</svg>`;
}

/** Under this share of the mean a replica counts as starved and its bar is drawn red. */
export const STARVED_SHARE = 0.5;

/**
 * Requests per replica, one row of bars per strategy on a common scale, a dashed line at each
 * row's mean (the even share). A replica the strategy starves (under STARVED_SHARE of the mean)
 * is red and labelled, so a placement that leaves replicas idle shows at a glance.
 */
export function replicaRequestsChart(results: readonly SimResult[]): string {
  const rows = results.filter((r) => r.perReplica.length > 0);
  if (rows.length === 0) return '';
  const W = 760;
  const left = 190;
  const right = 120;
  const rowH = 64;
  const top = 30;
  const H = top + rows.length * rowH + 8;
  const maxReq = Math.max(1, ...rows.flatMap((r) => r.perReplica.map((p) => p.requests)));
  let g = `<text x="0" y="16" class="t">Requests per replica (dashed: the even share; red: under ${STARVED_SHARE * 100}% of it)</text>`;
  rows.forEach((r, i) => {
    const y0 = top + i * rowH;
    const base = y0 + rowH - 14;
    const plotH = rowH - 22;
    const n = r.perReplica.length;
    const slot = (W - left - right) / n;
    const bw = Math.max(2, Math.min(28, slot * 0.8));
    const mean = r.perReplica.reduce((a, p) => a + p.requests, 0) / n;
    const h = (v: number) => (plotH * v) / maxReq;
    const min = Math.min(...r.perReplica.map((p) => p.requests));
    const starved = r.perReplica.filter((p) => p.requests < STARVED_SHARE * mean).length;
    g += `<text x="${left - 8}" y="${base - plotH / 2 + 4}" text-anchor="end">${esc(r.strategy)}</text>`;
    g += `<line x1="${left}" x2="${W - right}" y1="${base}" y2="${base}" stroke="#999"/>`;
    r.perReplica.forEach((p, k) => {
      const x = left + k * slot + (slot - bw) / 2;
      const low = p.requests < STARVED_SHARE * mean;
      g += `<rect x="${r1(x)}" y="${r1(base - h(p.requests))}" width="${r1(bw)}" height="${r1(h(p.requests))}" fill="${low ? '#e15759' : '#4e79a7'}"><title>${esc(`${r.strategy} ${p.id}: ${p.requests} requests`)}</title></rect>`;
      if (n <= 16 || low) g += `<text x="${r1(x + bw / 2)}" y="${base + 11}" text-anchor="middle" class="s">${esc(p.id)}</text>`;
    });
    const my = r1(base - h(mean));
    g += `<line x1="${left}" x2="${W - right}" y1="${my}" y2="${my}" stroke="#333" stroke-dasharray="4 3"/>`;
    g += `<text x="${W - right + 6}" y="${base - plotH / 2}" class="s">min ÷ mean ${(mean > 0 ? min / mean : 0).toFixed(2)}</text>`;
    g += `<text x="${W - right + 6}" y="${base - plotH / 2 + 14}" class="s"${starved > 0 ? ' fill="#c0392b"' : ''}>${starved > 0 ? `${starved} starved` : 'none starved'}</text>`;
  });
  return `<svg viewBox="0 0 ${W} ${H}" width="${W}" height="${H}">${g}</svg>`;
}

function mdTableToHtml(md: string): string {
  const lines = md.split('\n').filter((l) => l.startsWith('|'));
  const cells = (l: string) => l.slice(1, -1).split('|').map((c) => esc(c.trim()));
  const [head, , ...rows] = lines;
  if (!head) return '';
  return `<table><thead><tr>${cells(head).map((c) => `<th>${c}</th>`).join('')}</tr></thead><tbody>${rows.map((r) => `<tr>${cells(r).map((c) => `<td>${c}</td>`).join('')}</tr>`).join('')}</tbody></table>`;
}

export function renderReport(input: ReportInput): string {
  const { meta, bound, cacheBound, results, sweep } = input;
  const labels = results.map((r) => r.strategy);
  const parts: string[] = [];
  parts.push(`<h1>prefix-router simulator report</h1>`);
  parts.push(
    `<p>Trace <code>${esc(meta.trace)}</code>, ${results[0]?.requests ?? 0} requests, ${meta.replicas} replicas, key <code>${esc(meta.key)}</code>, time scale ${meta.timeScale}. ` +
      `Bound (one replica, infinite cache): ${(bound.tokenHitRate * 100).toFixed(1)}% of prompt tokens` +
      (cacheBound ? `; one replica with the pool's whole KV (${meta.replicas}× one replica's): ${(cacheBound.tokenHitRate * 100).toFixed(1)}%` : '') +
      `.</p>`,
  );
  parts.push(mdTableToHtml(strategyTable(results, bound, cacheBound)));
  parts.push(barChart('Token hit rate per strategy (%)', labels, results.map((r) => r.tokenHitRate * 100), (v) => `${v.toFixed(1)}%`, { value: bound.tokenHitRate * 100, label: `bound ${(bound.tokenHitRate * 100).toFixed(1)}%` }));
  parts.push(barChart('p95 TTFT per strategy (s)', labels, results.map((r) => r.ttftMs.p95 / 1000), (v) => `${v.toFixed(2)} s`));
  parts.push(replicaRequestsChart(results));
  if (sweep.length > 0) {
    parts.push(`<h2>Balance factor sweep</h2>`, mdTableToHtml(sweepTable(sweep)), sweepChart(sweep));
  }
  const st = scaleTable(results);
  if (st) parts.push(`<h2>Scale event</h2>`, mdTableToHtml(st));
  parts.push(`<h2>Load over time</h2>`, ...results.map(loadChart));
  parts.push(`<h2>Run</h2><pre>${esc(JSON.stringify(meta, null, 2))}</pre>`);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>prefix-router simulator report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:12px 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left}
th{background:#f3f3f3}svg{display:block;margin:16px 0;font:12px system-ui,sans-serif}svg .t{font-weight:600;font-size:13px}svg .s{font-size:11px;fill:#555}
code,pre{background:#f6f6f6}pre{padding:8px;overflow:auto}
</style></head><body>
${parts.join('\n')}
</body></html>
`;
}
