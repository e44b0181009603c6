// SGLang's engine profile: its `/metrics` names read into one replica's sample, its keyless API
// paths and its engine control fields. Pure: no I/O; the scrape time is passed in.
//
// Metrics (sgl-project/sglang python/sglang/srt/metrics/collector.py; `--enable-metrics`):
// - TokenizerMetricsCollector, counters per finished request: `sglang:prompt_tokens_total`
//   ("Number of prefill tokens processed", the whole prompt) and `sglang:cached_tokens_total`
//   ("Number of cached prompt tokens"). The cached counter is incremented only when a request
//   had cached tokens, so a labelled series is absent until the first hit while its HELP/TYPE
//   lines are already there: a declared family with no sample reads as 0.
// Data parallelism: SGLang reads an `X-Data-Parallel-Rank` header too (serving_base.py
// extract_routed_dp_rank_from_header: it overrides the body's `routed_dp_rank`, deprecated alias
// `data_parallel_rank`; a value int() cannot parse is a 400 "Invalid X-Data-Parallel-Rank header",
// where vLLM ignores it), checked in TokenizerManager.generate_request ("routed_dp_rank=R out of
// range [0, N)", a ValueError; rank 0 on one engine is ignored) and sent straight to that
// scheduler by the DataParallelController (managers/data_parallel_controller.py
// maybe_external_dp_rank_routing). The router pins no SGLang engine: its /metrics give no per-rank
// prefix counters or capacity to index (one label set per scheduler, summed here), so it sends no
// rank header, and the header and both body fields are fenced from clients (origin/
// forward-headers.ts, controlFields below).
// - SchedulerMetricsCollector gauges: `sglang:num_running_reqs`, `sglang:num_queue_reqs`
//   ("requests in the waiting queue"), `sglang:token_usage` (KV token pool in use, 0..1),
//   `sglang:cache_hit_rate` (the scheduler's recent prefill hit rate, 0..1; the only hit
//   signal of releases without `cached_tokens_total`), `sglang:max_total_num_tokens` (KV pool
//   size in tokens). One label set per scheduler (data-parallel rank): summed / averaged as
//   for vLLM's engines.

import type { EngineProfile, EngineSample, ExtractOptions, MutableSample } from './engine.js';
import { counterDeclared, findSamples, finiteValue, sumCounter, type LabelFilter, type PromParse } from './prom-text.js';

/** Which counters (or gauge) an SGLang hit rate comes from: cached / prompt token counters, or its own gauge. */
export type SglangGeneration = 'sglang-tokens' | 'sglang-gauge';

export const SGLANG_METRIC = {
  promptTokens: 'sglang:prompt_tokens_total',
  cachedTokens: 'sglang:cached_tokens_total',
  hitRate: 'sglang:cache_hit_rate',
  running: 'sglang:num_running_reqs',
  waiting: 'sglang:num_queue_reqs',
  tokenUsage: 'sglang:token_usage',
  maxTotalTokens: 'sglang:max_total_num_tokens',
} as const;

/** SGLang's signals (see the notes above). Never throws. */
export function extractSglangSample(parsed: PromParse, at: number, options: ExtractOptions = {}): EngineSample<SglangGeneration> {
  const filter: LabelFilter | undefined = options.modelName !== undefined ? { model_name: options.modelName } : undefined;
  const out: MutableSample<SglangGeneration> = { at, generation: 'none' };
  const prompt = finiteValue(sumCounter(parsed, SGLANG_METRIC.promptTokens, filter));
  const cached = counterDeclared(parsed, SGLANG_METRIC.cachedTokens) ? (finiteValue(sumCounter(parsed, SGLANG_METRIC.cachedTokens, filter)) ?? 0) : undefined;
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

export const sglang: EngineProfile<'sglang', SglangGeneration> = {
  name: 'sglang',
  metricNames: Object.values(SGLANG_METRIC),
  hitRateSources: { 'sglang-tokens': 'counters', 'sglang-gauge': 'gauge' },
  extractSample: extractSglangSample,
  // No per-engine KV capacity (its token pool size comes with the sample) and no rank header
  // the router sends.
  // python/sglang/srt/entrypoints/http_server.py: /v1/embeddings, /v1/rerank, /tokenize and
  // /detokenize (also under /v1/). Its /v1/score is a different API (query, items,
  // label_token_ids), not vLLM's pair scoring, so it is not offered as `score`.
  keylessPaths: { embeddings: '/v1/embeddings', rerank: '/v1/rerank', tokenize: '/tokenize', detokenize: '/detokenize' },
  // python/sglang/srt/managers/io_struct.py GenerateReqInput and the OpenAI protocol.
  controlFields: {
    priority: 'scheduling priority (SGLang)',
    data_parallel_rank: 'pins the request to a data-parallel rank (SGLang)',
    rid: 'the engine\'s request id (SGLang)',
    bootstrap_host: 'prefill/decode disaggregation peer (SGLang)',
    bootstrap_port: 'prefill/decode disaggregation peer (SGLang)',
    bootstrap_room: 'prefill/decode disaggregation room (SGLang)',
    custom_logit_processor: 'serialized logits processor code (SGLang)',
    return_hidden_states: 'the model\'s hidden states (SGLang)',
    session_params: 'engine-side session state (SGLang)',
    extra_key: 'prefix cache namespace (SGLang)',
    lora_path: 'which LoRA adapter to load (SGLang)',
    routed_dp_rank: 'pins the request to a data-parallel rank (SGLang)',
    disagg_prefill_dp_rank: 'which prefill data-parallel rank holds the KV cache, for decode (SGLang)',
  },
  // python/sglang/srt/entrypoints/openai/protocol.py: `class StreamOptions: include_usage:
  // Optional[bool] = False`; serving_chat.py / serving_completions.py send the usage chunk only
  // `if request.stream_options and request.stream_options.include_usage`. Unlike vLLM, an empty
  // `stream_options` asks for nothing.
  streamOptionsIncludeUsage: false,
};
