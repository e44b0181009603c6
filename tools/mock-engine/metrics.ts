// Prometheus text exposition of the mock's counters under vLLM's metric names. Pure: renders a
// snapshot, no I/O.
//
// Names, help texts and histogram buckets follow vllm/v1/metrics/loggers.py; the layout follows
// prometheus_client (which vLLM uses): `# HELP`/`# TYPE` per family, labels sorted by name, values
// as Go-style floats ("3.0"), counters with a `_created` sample, histogram buckets then
// `_count`, `_sum`, `_created`.

import { renderLlamacppMetrics, renderSglangMetrics } from './engine-metrics.js';
import type { MetricsFlavor } from './types.js';

/** vLLM's `vllm:time_to_first_token_seconds` buckets. */
export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
  640.0, 2560.0,
];

export const FINISH_REASONS = ['stop', 'length', 'abort'] as const;
export type FinishReason = (typeof FINISH_REASONS)[number];

export interface MetricsCounters {
  promptTokens: number;
  generationTokens: number;
  prefixQueriesTokens: number;
  prefixHitsTokens: number;
  prefixQueriesBlocks: number;
  prefixHitsBlocks: number;
  finished: Record<FinishReason, number>;
  ttftBucketCounts: number[]; // non-cumulative, one per bucket, plus +Inf last
  ttftSum: number;
  ttftCount: number;
  /** Unix seconds when the counters were (re)created, for the `_created` samples. */
  createdAt: number;
}

export function newCounters(now: number): MetricsCounters {
  return {
    promptTokens: 0,
    generationTokens: 0,
    prefixQueriesTokens: 0,
    prefixHitsTokens: 0,
    prefixQueriesBlocks: 0,
    prefixHitsBlocks: 0,
    finished: { stop: 0, length: 0, abort: 0 },
    ttftBucketCounts: new Array<number>(TTFT_BUCKETS.length + 1).fill(0),
    ttftSum: 0,
    ttftCount: 0,
    createdAt: now / 1000,
  };
}

export function observeTtft(c: MetricsCounters, seconds: number): void {
  let i = 0;
  while (i < TTFT_BUCKETS.length && seconds > TTFT_BUCKETS[i]!) i++;
  c.ttftBucketCounts[i]!++;
  c.ttftSum += seconds;
  c.ttftCount++;
}

export interface MetricsSnapshot {
  counters: MetricsCounters;
  modelName: string;
  running: number;
  waiting: number;
  /** 0..1 */
  kvUsage: number;
  numGpuBlocks: number;
  flavor: MetricsFlavor;
  /**
   * Data-parallel mode: per engine core (rank order), its scheduler gauges, KV usage, blocks and
   * prefix counters, rendered as series with `engine="<rank>"` (V1 flavors). The other series
   * (tokens, requests, TTFT) stay whole-server totals under engine 0.
   */
  engines?: readonly EngineMetrics[];
}

export interface EngineMetrics {
  running: number;
  waiting: number;
  kvUsage: number;
  numGpuBlocks: number;
  queriesTokens: number;
  hitsTokens: number;
  queriesBlocks: number;
  hitsBlocks: number;
}

/** prometheus_client's floatToGoString. */
export function formatValue(d: number): string {
  if (d === Infinity) return '+Inf';
  if (d === -Infinity) return '-Inf';
  if (Number.isNaN(d)) return 'NaN';
  let s = Number.isInteger(d) && Math.abs(d) < 1e16 ? `${d}.0` : String(d);
  const dot = s.indexOf('.');
  // Python prints large positive floats in exponent form past 6 integer digits.
  if (d > 0 && dot > 6) {
    const mantissa = `${s[0]}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/0+$/, '').replace(/\.$/, '');
    s = `${mantissa}e+0${dot - 1}`;
  }
  return s;
}

function labelString(labels: Record<string, string>): string {
  const parts = Object.keys(labels)
    .sort()
    .map((k) => `${k}="${labels[k]!.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"')}"`);
  return parts.length ? `{${parts.join(',')}}` : '';
}

class Exposition {
  private lines: string[] = [];
  constructor(private readonly base: Record<string, string>) {}

  family(name: string, type: 'counter' | 'gauge' | 'histogram', help: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  }

  sample(name: string, value: number, extra: Record<string, string> = {}, withBase = true): void {
    this.lines.push(`${name}${labelString(withBase ? { ...this.base, ...extra } : extra)} ${formatValue(value)}`);
  }

  /** A counter; `values` gives one series per engine (label `engine` = its rank) instead of one. */
  counter(name: string, help: string, value: number, created: number, values?: readonly number[]): void {
    this.family(`${name}_total`, 'counter', help);
    if (values) {
      values.forEach((v, rank) => this.sample(`${name}_total`, v, { engine: String(rank) }));
      values.forEach((_, rank) => this.sample(`${name}_created`, created, { engine: String(rank) }));
      return;
    }
    this.sample(`${name}_total`, value);
    this.sample(`${name}_created`, created);
  }

  gauge(name: string, help: string, value: number, values?: readonly number[]): void {
    this.family(name, 'gauge', help);
    if (values) values.forEach((v, rank) => this.sample(name, v, { engine: String(rank) }));
    else this.sample(name, value);
  }

  text(): string {
    return `${this.lines.join('\n')}\n`;
  }
}

export function renderMetrics(s: MetricsSnapshot): string {
  if (s.flavor === 'sglang') return renderSglangMetrics(s);
  if (s.flavor === 'llamacpp') return renderLlamacppMetrics(s);
  const c = s.counters;
  // V0 had one engine per server and no `engine` label; V1 labels every series with its engine index.
  const v0 = s.flavor === 'v0';
  const e = new Exposition(v0 ? { model_name: s.modelName } : { model_name: s.modelName, engine: '0' });
  // V0 had no data parallelism behind one server: its series stay whole-server.
  const dp = !v0 && s.engines && s.engines.length > 1 ? s.engines : undefined;
  const per = (f: (m: EngineMetrics) => number) => dp?.map(f);

  e.gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', s.running, per((m) => m.running));
  e.gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', s.waiting, per((m) => m.waiting));

  if (s.flavor === 'current') {
    e.gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', s.kvUsage, per((m) => m.kvUsage));
    e.counter(
      'vllm:prefix_cache_queries',
      'Prefix cache queries, in terms of number of queried tokens.',
      c.prefixQueriesTokens,
      c.createdAt,
      per((m) => m.queriesTokens),
    );
    e.counter(
      'vllm:prefix_cache_hits',
      'Prefix cache hits, in terms of number of cached tokens.',
      c.prefixHitsTokens,
      c.createdAt,
      per((m) => m.hitsTokens),
    );
  } else {
    e.gauge('vllm:gpu_cache_usage_perc', 'GPU KV-cache usage. 1 means 100 percent usage.', s.kvUsage, per((m) => m.kvUsage));
    if (s.flavor === 'v1-blocks') {
      e.counter(
        'vllm:gpu_prefix_cache_queries',
        'GPU prefix cache queries, in terms of number of queried blocks.',
        c.prefixQueriesBlocks,
        c.createdAt,
        per((m) => m.queriesBlocks),
      );
      e.counter(
        'vllm:gpu_prefix_cache_hits',
        'GPU prefix cache hits, in terms of number of cached blocks.',
        c.prefixHitsBlocks,
        c.createdAt,
        per((m) => m.hitsBlocks),
      );
    } else {
      const rate = c.prefixQueriesBlocks > 0 ? c.prefixHitsBlocks / c.prefixQueriesBlocks : 0;
      e.gauge('vllm:gpu_prefix_cache_hit_rate', 'GPU prefix cache block hit rate.', rate);
    }
  }

  e.counter('vllm:prompt_tokens', 'Number of prefill tokens processed.', c.promptTokens, c.createdAt);
  e.counter('vllm:generation_tokens', 'Number of generation tokens processed.', c.generationTokens, c.createdAt);

  e.family('vllm:request_success_total', 'counter', 'Count of successfully processed requests.');
  for (const reason of FINISH_REASONS) e.sample('vllm:request_success_total', c.finished[reason], { finished_reason: reason });
  for (const reason of FINISH_REASONS) e.sample('vllm:request_success_created', c.createdAt, { finished_reason: reason });

  const ttft = 'vllm:time_to_first_token_seconds';
  e.family(ttft, 'histogram', 'Histogram of time to first token in seconds.');
  let cumulative = 0;
  for (let i = 0; i <= TTFT_BUCKETS.length; i++) {
    cumulative += c.ttftBucketCounts[i]!;
    const le = i < TTFT_BUCKETS.length ? formatValue(TTFT_BUCKETS[i]!) : '+Inf';
    e.sample(`${ttft}_bucket`, cumulative, { le });
  }
  e.sample(`${ttft}_count`, c.ttftCount);
  e.sample(`${ttft}_sum`, c.ttftSum);
  e.sample(`${ttft}_created`, c.createdAt);

  // An info metric emulated with a gauge set to 1; vLLM gives it only the config's labels and `engine`.
  // One label set per engine on a data-parallel server (loggers.py `log_metrics_info`).
  e.family('vllm:cache_config_info', 'gauge', 'Information of the LLMEngine CacheConfig');
  const configs = dp ? dp.map((m, rank) => ({ engine: String(rank), blocks: m.numGpuBlocks })) : [{ engine: v0 ? null : '0', blocks: s.numGpuBlocks }];
  for (const cfg of configs) {
    e.sample(
      'vllm:cache_config_info',
      1,
      {
        block_size: '16',
        cache_dtype: 'auto',
        enable_prefix_caching: 'True',
        ...(cfg.engine === null ? {} : { engine: cfg.engine }),
        gpu_memory_utilization: '0.9',
        num_cpu_blocks: 'None',
        num_gpu_blocks: String(cfg.blocks),
        prefix_caching_hash_algo: 'sha256',
      },
      false,
    );
  }

  return e.text();
}
