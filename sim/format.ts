// Text output of the simulator: the per-strategy table, the sweep table, the scale-event
// table. Pure: returns strings.

import type { SimResult } from './engine.js';
import type { ReuseBound } from './trace.js';

export interface SweepPoint {
  readonly factor: string;
  readonly result: SimResult;
}

const pct = (x: number) => (Number.isFinite(x) ? (x * 100).toFixed(1) : '-');
const secs = (ms: number) => (Number.isFinite(ms) ? (ms / 1000).toFixed(ms < 10_000 ? 2 : 1) : '-');
const fixed = (x: number, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '-');

/** A Markdown table (GitHub style), which also reads well in a terminal. */
export function markdownTable(head: readonly string[], rows: readonly (readonly string[])[], rightFrom = 1): string {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: readonly string[]) => '| ' + cells.map((c, i) => (i >= rightFrom ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join(' | ') + ' |';
  const sep = '|' + widths.map((w, i) => (i >= rightFrom ? '-'.repeat(w + 1) + ':' : '-'.repeat(w + 2))).join('|') + '|';
  return [line(head), sep, ...rows.map(line)].join('\n');
}

/** `cacheBound`: one replica with the whole pool's KV (trace.ts `computeCacheBound`), when finite. */
export function strategyTable(results: readonly SimResult[], bound: ReuseBound, cacheBound?: ReuseBound | null): string {
  const head = ['strategy', 'hit %', 'TTFT p50 s', 'p95 s', 'p99 s', 'out tok/s/replica', 'out tok/busy-s', 'in-flight peak', 'in-flight mean max/avg', 'req/replica max/avg', 'req/replica min ÷ mean', 'spill %', 'index predicted/model hit %', 'early connect hit/miss %'];
  const rows = results.map((r) => [
    r.strategy,
    pct(r.tokenHitRate),
    secs(r.ttftMs.p50),
    secs(r.ttftMs.p95),
    secs(r.ttftMs.p99),
    fixed(r.outputTokensPerSecPerReplica),
    fixed(r.outputTokensPerBusySec),
    String(r.inFlight.peak),
    `${fixed(r.inFlight.maxMean, 1)}/${fixed(r.inFlight.mean, 1)}`,
    `${r.requestsPerReplica.max}/${fixed(r.requestsPerReplica.mean)}`,
    fixed(r.minRequestShare, 2),
    pct(r.spillRate),
    r.indexTracking ? `${pct(r.indexTracking.predictedHitRate)}/${pct(r.indexTracking.modelHitRate)}` : '-',
    r.keyedShare > 0 && r.earlyConnect.hitRate + r.earlyConnect.missRate > 0 ? `${pct(r.earlyConnect.hitRate)}/${pct(r.earlyConnect.missRate)}` : '-',
  ]);
  const blank = head.slice(2).map(() => '');
  rows.push(['bound (1 replica, infinite cache)', pct(bound.tokenHitRate), ...blank]);
  if (cacheBound) rows.push([`bound (1 replica, ${results[0]?.replicas ?? ''}× KV)`, pct(cacheBound.tokenHitRate), ...blank]);
  return markdownTable(head, rows);
}

export function sweepTable(points: readonly SweepPoint[]): string {
  const head = ['balance factor', 'hit %', 'TTFT p50 s', 'p95 s', 'p99 s', 'in-flight peak', 'spill %'];
  return markdownTable(
    head,
    points.map(({ factor, result: r }) => [factor, pct(r.tokenHitRate), secs(r.ttftMs.p50), secs(r.ttftMs.p95), secs(r.ttftMs.p99), String(r.inFlight.peak), pct(r.spillRate)]),
  );
}

export function scaleTable(results: readonly SimResult[]): string {
  const withScale = results.filter((r) => r.scale !== null);
  if (withScale.length === 0) return '';
  const w = withScale[0]!.scale!.windowMs / 1000;
  const head = ['strategy', 'event', 'keys moved %', `p95 TTFT ${w}s before`, `p95 TTFT ${w}s after`, 'bump ×', 'hit % before', 'hit % after'];
  return markdownTable(
    head,
    withScale.map((r) => {
      const s = r.scale!;
      return [r.strategy, s.event, pct(s.keysMoved), secs(s.p95TtftBeforeMs), secs(s.p95TtftAfterMs), fixed(s.p95TtftAfterMs / s.p95TtftBeforeMs, 2), pct(s.hitRateBefore), pct(s.hitRateAfter)];
    }),
  );
}
