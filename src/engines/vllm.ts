// One replica's vLLM signals from a parsed `/metrics` scrape, and a sliding-window prefix
// cache hit rate over successive scrapes. Pure: no I/O; the scrape time is passed in.
//
// Metric names and units across vLLM versions (vllm-project/vllm):
// - V1, vLLM ≥ 0.9 (vllm/v1/metrics/loggers.py, PrometheusStatLogger): counters
//   `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`, "in terms of number of queried /
//   cached tokens"; prometheus_client exposes them as `…_total` (plus `…_created`). Gauges
//   `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
//   (0..1). Labels `model_name`, `engine`: one label set per data-parallel engine core.
//   0.9.x still exposes the deprecated `vllm:gpu_prefix_cache_*` and `vllm:gpu_cache_usage_perc`
//   next to the new names, incremented with the same (token) values.
// - V1, vLLM 0.7–0.8 (same file, older): only `vllm:gpu_prefix_cache_queries` /
//   `vllm:gpu_prefix_cache_hits`, HELP "in terms of number of queried blocks" (later releases
//   of the old names say "tokens"; the HELP text decides the unit) and `vllm:gpu_cache_usage_perc`.
// - V0 (vllm/engine/metrics.py): no counters, a gauge `vllm:gpu_prefix_cache_hit_rate`
//   ("GPU prefix cache block hit rate", 0..1, labels `model_name`).
// - All: `vllm:cache_config_info`, an info-style gauge fixed at 1 whose labels are the
//   CacheConfig fields as strings (`block_size="16"`, `num_gpu_blocks="27034"`, …), one label
//   set per engine in V1.
//
// Across label sets: counts (queries, hits, waiting, running, GPU blocks) are summed, since
// several `engine` values on one server are data-parallel engines behind one endpoint;
// fractions (KV usage, the V0 hit-rate gauge) are averaged.

import { counterHelp, findSamples, meanSamples, sumCounter, sumSamples, type LabelFilter, type PromParse } from './prom-text.js';

/**
 * Which counters (or gauge) the hit rate comes from. vLLM: `v1-tokens`, `v1-blocks`, `v0-gauge`;
 * SGLang: `sglang-tokens` (cached / prompt token counters), `sglang-gauge` (its own hit-rate
 * gauge); llama.cpp server: `llamacpp-tokens` (cached / processed prompt token counters).
 */
export type VllmGeneration = 'v1-tokens' | 'v1-blocks' | 'v0-gauge' | 'sglang-tokens' | 'sglang-gauge' | 'llamacpp-tokens' | 'none';

/** Generations whose hit rate is the engine's own gauge (latest value), not a ratio of counter deltas. */
const GAUGE_GENERATIONS: ReadonlySet<VllmGeneration> = new Set(['v0-gauge', 'sglang-gauge']);
export type PrefixCacheUnit = 'tokens' | 'blocks';

export interface VllmSample {
  /** Scrape time, milliseconds (the caller's clock). */
  readonly at: number;
  readonly generation: VllmGeneration;
  /** Cumulative prefix cache queries (a counter), summed over engines. */
  readonly prefixQueries?: number;
  /** Cumulative prefix cache hits (a counter), summed over engines. */
  readonly prefixHits?: number;
  readonly unit?: PrefixCacheUnit;
  /** V0 and old SGLang: the engine's own hit-rate gauge, 0..1. */
  readonly hitRateGauge?: number;
  readonly waiting?: number;
  readonly running?: number;
  /** KV cache usage, 0..1, averaged over engines. */
  readonly kvUsage?: number;
  readonly blockSize?: number;
  /** GPU KV blocks summed over engines. */
  readonly numGpuBlocks?: number;
  /** Number of distinct `engine` label values seen (1 when the label is absent). */
  readonly engines?: number;
}

export const VLLM_METRIC = {
  prefixQueries: 'vllm:prefix_cache_queries',
  prefixHits: 'vllm:prefix_cache_hits',
  gpuPrefixQueries: 'vllm:gpu_prefix_cache_queries',
  gpuPrefixHits: 'vllm:gpu_prefix_cache_hits',
  gpuPrefixHitRate: 'vllm:gpu_prefix_cache_hit_rate',
  waiting: 'vllm:num_requests_waiting',
  running: 'vllm:num_requests_running',
  kvUsage: 'vllm:kv_cache_usage_perc',
  gpuCacheUsage: 'vllm:gpu_cache_usage_perc',
  cacheConfig: 'vllm:cache_config_info',
} as const;

export interface ExtractOptions {
  /** Only label sets whose `model_name` equals this (a server that serves several names). */
  readonly modelName?: string;
}

/** Reads one replica's signals from a parsed scrape taken at `at`. Never throws. */
export function extractVllmSample(parsed: PromParse, at: number, options: ExtractOptions = {}): VllmSample {
  const filter: LabelFilter | undefined = options.modelName !== undefined ? { model_name: options.modelName } : undefined;
  const out: { -readonly [K in keyof VllmSample]: VllmSample[K] } = { at, generation: 'none' };

  const q = finite(sumCounter(parsed, VLLM_METRIC.prefixQueries, filter));
  const h = finite(sumCounter(parsed, VLLM_METRIC.prefixHits, filter));
  const gq = finite(sumCounter(parsed, VLLM_METRIC.gpuPrefixQueries, filter));
  const gh = finite(sumCounter(parsed, VLLM_METRIC.gpuPrefixHits, filter));
  if (q !== undefined && h !== undefined) {
    out.generation = 'v1-tokens';
    out.prefixQueries = q;
    out.prefixHits = h;
    out.unit = 'tokens';
  } else if (gq !== undefined && gh !== undefined) {
    out.generation = 'v1-blocks';
    out.prefixQueries = gq;
    out.prefixHits = gh;
    // 0.7.x HELP says "blocks"; releases that kept the old names next to the new ones say
    // "tokens" (one of them as "queriedtokens", hence no word boundary). Unknown: blocks.
    const help = `${counterHelp(parsed, VLLM_METRIC.gpuPrefixQueries) ?? ''} ${counterHelp(parsed, VLLM_METRIC.gpuPrefixHits) ?? ''}`;
    out.unit = /block/i.test(help) || !/token/i.test(help) ? 'blocks' : 'tokens';
  } else {
    const rate = finite(meanSamples(parsed, VLLM_METRIC.gpuPrefixHitRate, filter));
    if (rate !== undefined) {
      out.generation = 'v0-gauge';
      out.hitRateGauge = rate;
    }
  }

  const waiting = finite(sumSamples(parsed, VLLM_METRIC.waiting, filter));
  if (waiting !== undefined) out.waiting = waiting;
  const running = finite(sumSamples(parsed, VLLM_METRIC.running, filter));
  if (running !== undefined) out.running = running;
  const kv = finite(meanSamples(parsed, VLLM_METRIC.kvUsage, filter)) ?? finite(meanSamples(parsed, VLLM_METRIC.gpuCacheUsage, filter));
  if (kv !== undefined) out.kvUsage = kv;

  // cache_config_info: one label set per engine; blocks add up, block size is shared.
  const perEngine = new Map<string, { blockSize?: number; blocks?: number }>();
  for (const s of findSamples(parsed, VLLM_METRIC.cacheConfig, filter)) {
    const engine = s.labels['engine'] ?? '';
    if (perEngine.has(engine)) continue;
    perEngine.set(engine, { blockSize: positiveInt(s.labels['block_size']), blocks: positiveInt(s.labels['num_gpu_blocks']) });
  }
  let blocks = 0;
  let anyBlocks = false;
  for (const e of perEngine.values()) {
    if (out.blockSize === undefined && e.blockSize !== undefined) out.blockSize = e.blockSize;
    if (e.blocks !== undefined) {
      blocks += e.blocks;
      anyBlocks = true;
    }
  }
  if (anyBlocks) out.numGpuBlocks = blocks;

  const engines = countEngines(parsed, filter);
  if (engines > 0) out.engines = engines;
  return out;
}

// ---- SGLang and llama.cpp server ----------------------------------------------------------
//
// SGLang (sgl-project/sglang python/sglang/srt/metrics/collector.py; `--enable-metrics`):
// - TokenizerMetricsCollector, counters per finished request: `sglang:prompt_tokens_total`
//   ("Number of prefill tokens processed", the whole prompt) and `sglang:cached_tokens_total`
//   ("Number of cached prompt tokens"). The cached counter is incremented only when a request
//   had cached tokens, so a labelled series is absent until the first hit while its HELP/TYPE
//   lines are already there: a declared family with no sample reads as 0.
// - SchedulerMetricsCollector gauges: `sglang:num_running_reqs`, `sglang:num_queue_reqs`
//   ("requests in the waiting queue"), `sglang:token_usage` (KV token pool in use, 0..1),
//   `sglang:cache_hit_rate` (the scheduler's recent prefill hit rate, 0..1; the only hit
//   signal of releases without `cached_tokens_total`), `sglang:max_total_num_tokens` (KV pool
//   size in tokens). One label set per scheduler (data-parallel rank): summed / averaged as
//   for vLLM's engines.
// llama.cpp server (ggml-org/llama.cpp tools/server, `--metrics`; no labels):
// - current (server-task.cpp server_task_result_metrics::to_metrics): counters
//   `llamacpp:prompt_tokens_total` ("processed, excluding cached tokens") and
//   `llamacpp:prompt_tokens_cached_total` ("reused from the cache"); gauges
//   `llamacpp:requests_processing` (busy slots) and `llamacpp:requests_deferred` (tasks
//   waiting for a slot). The hit rate is cached / (processed + cached).
// - older releases (README "GET /metrics"): the same request gauges plus
//   `llamacpp:kv_cache_usage_ratio` (1 = 100 %) and no cached-token counter, so no hit rate.

export type EngineKind = 'vllm' | 'sglang' | 'llamacpp';

export const SGLANG_METRIC = {
  promptTokens: 'sglang:prompt_tokens_total',
  cachedTokens: 'sglang:cached_tokens_total',
  hitRate: 'sglang:cache_hit_rate',
  running: 'sglang:num_running_reqs',
  waiting: 'sglang:num_queue_reqs',
  tokenUsage: 'sglang:token_usage',
  maxTotalTokens: 'sglang:max_total_num_tokens',
} as const;

export const LLAMACPP_METRIC = {
  promptTokens: 'llamacpp:prompt_tokens_total',
  cachedTokens: 'llamacpp:prompt_tokens_cached_total',
  processing: 'llamacpp:requests_processing',
  deferred: 'llamacpp:requests_deferred',
  kvUsage: 'llamacpp:kv_cache_usage_ratio',
} as const;

/** Which engine's names a scrape carries: vLLM's first, then SGLang's, then llama.cpp's; null for none. */
export function detectEngine(parsed: PromParse): EngineKind | null {
  const has = (names: readonly string[]) => names.some((n) => parsed.families.has(n) || parsed.byName.has(n));
  if (has(Object.values(VLLM_METRIC)) || has([`${VLLM_METRIC.prefixQueries}_total`, `${VLLM_METRIC.gpuPrefixQueries}_total`])) return 'vllm';
  if (has(Object.values(SGLANG_METRIC))) return 'sglang';
  if (has(Object.values(LLAMACPP_METRIC))) return 'llamacpp';
  return null;
}

/**
 * One replica's signals from a scrape of any supported engine, told apart by metric names
 * (a pool may mix engines while it migrates). Same view for all: hit rate counters or gauge,
 * waiting, running, KV usage. Never throws.
 */
export function extractEngineSample(parsed: PromParse, at: number, options: ExtractOptions = {}): VllmSample {
  switch (detectEngine(parsed)) {
    case 'sglang':
      return extractSglangSample(parsed, at, options);
    case 'llamacpp':
      return extractLlamacppSample(parsed, at);
    default:
      return extractVllmSample(parsed, at, options);
  }
}

/** SGLang's signals (see the notes above). */
export function extractSglangSample(parsed: PromParse, at: number, options: ExtractOptions = {}): VllmSample {
  const filter: LabelFilter | undefined = options.modelName !== undefined ? { model_name: options.modelName } : undefined;
  const out: { -readonly [K in keyof VllmSample]: VllmSample[K] } = { at, generation: 'none' };
  const prompt = finite(sumCounter(parsed, SGLANG_METRIC.promptTokens, filter));
  const cached = counterDeclared(parsed, SGLANG_METRIC.cachedTokens) ? (finite(sumCounter(parsed, SGLANG_METRIC.cachedTokens, filter)) ?? 0) : undefined;
  if (prompt !== undefined && cached !== undefined) {
    out.generation = 'sglang-tokens';
    out.prefixQueries = prompt;
    out.prefixHits = Math.min(cached, prompt);
    out.unit = 'tokens';
  } else {
    const rates = perScheduler(parsed, SGLANG_METRIC.hitRate, filter);
    const rate = rates.length > 0 ? sum(rates) / rates.length : undefined;
    if (rate !== undefined) {
      out.generation = 'sglang-gauge';
      out.hitRateGauge = rate;
    }
  }
  const waiting = perScheduler(parsed, SGLANG_METRIC.waiting, filter);
  if (waiting.length > 0) out.waiting = sum(waiting);
  const running = perScheduler(parsed, SGLANG_METRIC.running, filter);
  if (running.length > 0) out.running = sum(running);
  const kv = perScheduler(parsed, SGLANG_METRIC.tokenUsage, filter);
  if (kv.length > 0) out.kvUsage = sum(kv) / kv.length;
  // The radix cache is token-granular: capacity in tokens is reported as blocks of one token.
  const tokens = sum(perScheduler(parsed, SGLANG_METRIC.maxTotalTokens, filter));
  if (tokens >= 1) {
    out.blockSize = 1;
    out.numGpuBlocks = Math.floor(tokens);
  }
  const schedulers = Math.max(waiting.length, running.length);
  if (schedulers > 0) out.engines = schedulers;
  return out;
}

/** llama.cpp server's signals (see the notes above). One process, no labels. */
export function extractLlamacppSample(parsed: PromParse, at: number): VllmSample {
  const out: { -readonly [K in keyof VllmSample]: VllmSample[K] } = { at, generation: 'none' };
  const processed = finite(sumCounter(parsed, LLAMACPP_METRIC.promptTokens));
  const cached = finite(sumCounter(parsed, LLAMACPP_METRIC.cachedTokens));
  if (processed !== undefined && cached !== undefined) {
    out.generation = 'llamacpp-tokens';
    out.prefixQueries = processed + cached;
    out.prefixHits = cached;
    out.unit = 'tokens';
  }
  const waiting = finite(sumSamples(parsed, LLAMACPP_METRIC.deferred));
  if (waiting !== undefined) out.waiting = waiting;
  const running = finite(sumSamples(parsed, LLAMACPP_METRIC.processing));
  if (running !== undefined) out.running = running;
  const kv = finite(meanSamples(parsed, LLAMACPP_METRIC.kvUsage));
  if (kv !== undefined) out.kvUsage = kv;
  if (waiting !== undefined || running !== undefined) out.engines = 1;
  return out;
}

/** A counter family declared by HELP/TYPE (as `x_total` or OpenMetrics-style `x`) or present in samples. */
function counterDeclared(parsed: PromParse, base: string): boolean {
  const stem = base.endsWith('_total') ? base.slice(0, -'_total'.length) : base;
  return parsed.families.has(`${stem}_total`) || parsed.families.has(stem) || parsed.byName.has(`${stem}_total`);
}

/**
 * One finite value per SGLang scheduler: label sets that differ only in `tp_rank` / `pp_rank`
 * are ranks of one scheduler reporting the same batch, so the first of them counts; distinct
 * `dp_rank` (or model) values are separate schedulers.
 */
function perScheduler(parsed: PromParse, name: string, filter: LabelFilter | undefined): number[] {
  const seen = new Map<string, number>();
  for (const s of findSamples(parsed, name, filter)) {
    if (!Number.isFinite(s.value)) continue;
    const key = Object.keys(s.labels)
      .filter((k) => k !== 'tp_rank' && k !== 'pp_rank')
      .sort()
      .map((k) => `${k}=${s.labels[k]}`)
      .join('\u0000');
    if (!seen.has(key)) seen.set(key, s.value);
  }
  return [...seen.values()];
}

function sum(values: readonly number[]): number {
  let t = 0;
  for (const v of values) t += v;
  return t;
}

function finite(v: number | undefined): number | undefined {
  return v !== undefined && Number.isFinite(v) ? v : undefined;
}

function positiveInt(s: string | undefined): number | undefined {
  if (s === undefined || !/^\d{1,15}$/.test(s)) return undefined; // "None" before profiling
  const n = Number(s);
  return n > 0 ? n : undefined;
}

function countEngines(parsed: PromParse, filter: LabelFilter | undefined): number {
  const seen = new Set<string>();
  for (const name of [VLLM_METRIC.waiting, VLLM_METRIC.running]) {
    for (const s of findSamples(parsed, name, filter)) seen.add(s.labels['engine'] ?? '');
  }
  return seen.size;
}

// ---- Sliding-window hit rate ------------------------------------------------------------
//
// hitRate(window) = Σ Δhits / Σ Δqueries over consecutive scrapes inside the window, the
// ratio of two `increase()`s. A counter that goes down means the replica restarted: like
// Prometheus `rate()` (promql/functions.go extrapolatedRate, which adds the pre-reset value
// back), the new value is taken as the increase since the reset. Queries and hits reset
// together (one process), so a drop in either resets both. The point just before the window
// start is kept as the baseline, so the window covers `windowMs` exactly at any scrape period.

export interface HitRatePoint {
  readonly at: number;
  readonly queries: number;
  readonly hits: number;
}

/** Plain JSON; safe to persist in Durable Object storage. */
export interface HitRateWindowState {
  readonly generation: VllmGeneration;
  readonly unit?: PrefixCacheUnit;
  /** Cumulative counter readings, oldest first, at most `maxPoints`. */
  readonly points: readonly HitRatePoint[];
  /** V0: the latest hit-rate gauge. */
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
export function pushSample(state: HitRateWindowState, sample: VllmSample, windowMs: number, options: PushOptions = {}): HitRateWindowState {
  const maxPoints = Math.max(2, Math.floor(options.maxPoints ?? DEFAULT_MAX_POINTS));
  if (!Number.isFinite(sample.at)) return state;
  const last = state.points[state.points.length - 1];
  if (last !== undefined && sample.at <= last.at) return state;
  if (state.gauge !== undefined && sample.at <= state.gauge.at) return state;

  if (sample.generation === 'none') return { generation: 'none', points: [], resets: state.resets };

  if (GAUGE_GENERATIONS.has(sample.generation)) {
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
  if (GAUGE_GENERATIONS.has(state.generation)) {
    const v = state.gauge?.value;
    return v !== undefined && Number.isFinite(v) ? Math.min(1, Math.max(0, v)) : null;
  }
  const t = windowTotals(state);
  if (t === null || t.queries <= 0) return null;
  return Math.min(1, Math.max(0, t.hits / t.queries));
}
