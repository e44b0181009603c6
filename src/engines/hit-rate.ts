// A replica's prefix cache hit rate over a sliding window of successive scrapes, from the
// engine-neutral samples every engine profile reads. Pure: no I/O; the scrape time is in the sample.
//
// hitRate(window) = Σ Δhits / Σ Δqueries over consecutive scrapes inside the window, the
// ratio of two `increase()`s. A counter that goes down means the replica restarted: like
// Prometheus `rate()` (promql/functions.go extrapolatedRate, which adds the pre-reset value
// back), the new value is taken as the increase since the reset. Queries and hits reset
// together (one process), so a drop in either resets both. The point just before the window
// start is kept as the baseline, so the window covers `windowMs` exactly at any scrape period.
// Generations whose hit rate is the engine's own gauge (vLLM V0, SGLang without its token
// counters) keep the latest value instead (`hitRateSource`, from the engine profiles).

import type { EngineSample, PrefixCacheUnit } from './engine.js';
import { hitRateSource, type SampleGeneration } from './index.js';

export interface HitRatePoint {
  readonly at: number;
  readonly queries: number;
  readonly hits: number;
}

/** Plain JSON; safe to persist in Durable Object storage. */
export interface HitRateWindowState {
  readonly generation: SampleGeneration;
  readonly unit?: PrefixCacheUnit;
  /** Cumulative counter readings, oldest first, at most `maxPoints`. */
  readonly points: readonly HitRatePoint[];
  /** Gauge generations: the latest hit-rate gauge. */
  readonly gauge?: { readonly at: number; readonly value: number };
  /** Counter resets seen since this state was created (a restart count, for the dashboard). */
  readonly resets: number;
}

export const DEFAULT_MAX_POINTS = 240; // 5 min at a 1.25 s scrape, or 1 h at 15 s

export function emptyHitRateWindow(): HitRateWindowState {
  return { generation: 'none', points: [], resets: 0 };
}

export interface PushOptions {
  /** Points kept at most (the oldest go first). Default `DEFAULT_MAX_POINTS`. */
  readonly maxPoints?: number;
}

/**
 * Adds a scrape to the window and drops what fell out of it. Returns a new state; the input
 * is not modified. Samples not newer than the last point are ignored. A change of generation
 * or unit (a replica upgraded in place) starts over, since the counters are not comparable;
 * a `none` sample (no prefix cache metrics) empties the window.
 */
export function pushSample(state: HitRateWindowState, sample: EngineSample<SampleGeneration>, windowMs: number, options: PushOptions = {}): HitRateWindowState {
  const maxPoints = Math.max(2, Math.floor(options.maxPoints ?? DEFAULT_MAX_POINTS));
  if (!Number.isFinite(sample.at)) return state;
  const last = state.points[state.points.length - 1];
  if (last !== undefined && sample.at <= last.at) return state;
  if (state.gauge !== undefined && sample.at <= state.gauge.at) return state;

  if (sample.generation === 'none') return { generation: 'none', points: [], resets: state.resets };

  if (hitRateSource(sample.generation) === 'gauge') {
    if (sample.hitRateGauge === undefined) return state;
    return { generation: sample.generation, points: [], gauge: { at: sample.at, value: sample.hitRateGauge }, resets: state.resets };
  }

  const queries = sample.prefixQueries;
  const hits = sample.prefixHits;
  if (queries === undefined || hits === undefined || !(queries >= 0) || !(hits >= 0)) return state;
  const sameSeries = state.generation === sample.generation && state.unit === sample.unit;
  const prior = sameSeries ? state.points : [];
  const prev = prior[prior.length - 1];
  const reset = prev !== undefined && (queries < prev.queries || hits < prev.hits);

  let points = [...prior, { at: sample.at, queries, hits }];
  // Keep everything inside [at − windowMs, at] plus the newest point before it as a baseline.
  const cutoff = sample.at - Math.max(0, windowMs);
  let first = 0;
  while (first + 1 < points.length && points[first + 1]!.at <= cutoff) first++;
  if (first > 0) points = points.slice(first);
  if (points.length > maxPoints) points = points.slice(points.length - maxPoints);

  const next: HitRateWindowState = { generation: sample.generation, points, resets: state.resets + (reset ? 1 : 0) };
  return sample.unit !== undefined ? { ...next, unit: sample.unit } : next;
}

export interface WindowTotals {
  readonly queries: number;
  readonly hits: number;
  readonly unit?: PrefixCacheUnit;
  /** Time covered by the deltas, ms. */
  readonly spanMs: number;
  /** Resets inside the window. */
  readonly resets: number;
}

/** Σ Δqueries and Σ Δhits over the window; null with fewer than two points. */
export function windowTotals(state: HitRateWindowState): WindowTotals | null {
  const pts = state.points;
  if (pts.length < 2) return null;
  let queries = 0;
  let hits = 0;
  let resets = 0;
  for (let i = 1; i < pts.length; i++) {
    const a = pts[i - 1]!;
    const b = pts[i]!;
    if (b.queries < a.queries || b.hits < a.hits) {
      resets++;
      queries += b.queries;
      hits += b.hits;
    } else {
      queries += b.queries - a.queries;
      hits += b.hits - a.hits;
    }
  }
  const spanMs = pts[pts.length - 1]!.at - pts[0]!.at;
  return state.unit !== undefined ? { queries, hits, unit: state.unit, spanMs, resets } : { queries, hits, spanMs, resets };
}

/**
 * The prefix cache hit rate over the window, 0..1: the ratio of counter increases, or for
 * V0 (and SGLang without its token counters) the latest gauge. null when unknown: fewer than two scrapes, or no queries in the window.
 */
export function windowHitRate(state: HitRateWindowState): number | null {
  if (hitRateSource(state.generation) === 'gauge') {
    const v = state.gauge?.value;
    return v !== undefined && Number.isFinite(v) ? Math.min(1, Math.max(0, v)) : null;
  }
  const t = windowTotals(state);
  if (t === null || t.queries <= 0) return null;
  return Math.min(1, Math.max(0, t.hits / t.queries));
}
