// llama.cpp server's engine profile: its `/metrics` names read into one replica's sample, its
// keyless API paths and its engine control fields. Pure: no I/O; the scrape time is passed in.
//
// Metrics (ggml-org/llama.cpp tools/server, `--metrics`; no labels):
// - current (server-task.cpp server_task_result_metrics::to_metrics): counters
//   `llamacpp:prompt_tokens_total` ("processed, excluding cached tokens") and
//   `llamacpp:prompt_tokens_cached_total` ("reused from the cache"); gauges
//   `llamacpp:requests_processing` (busy slots) and `llamacpp:requests_deferred` (tasks
//   waiting for a slot). The hit rate is cached / (processed + cached).
// - older releases (README "GET /metrics"): the same request gauges plus
//   `llamacpp:kv_cache_usage_ratio` (1 = 100 %) and no cached-token counter, so no hit rate.

import type { EngineProfile, EngineSample, MutableSample } from './engine.js';
import { finiteValue, meanSamples, sumCounter, sumSamples, type PromParse } from './prom-text.js';

/** A llama.cpp hit rate comes from its cached / processed prompt token counters. */
export type LlamaCppGeneration = 'llamacpp-tokens';

export const LLAMACPP_METRIC = {
  promptTokens: 'llamacpp:prompt_tokens_total',
  cachedTokens: 'llamacpp:prompt_tokens_cached_total',
  processing: 'llamacpp:requests_processing',
  deferred: 'llamacpp:requests_deferred',
  kvUsage: 'llamacpp:kv_cache_usage_ratio',
} as const;

/** llama.cpp server's signals (see the notes above). One process, no labels. Never throws. */
export function extractLlamacppSample(parsed: PromParse, at: number): EngineSample<LlamaCppGeneration> {
  const out: MutableSample<LlamaCppGeneration> = { at, generation: 'none' };
  const processed = finiteValue(sumCounter(parsed, LLAMACPP_METRIC.promptTokens));
  const cached = finiteValue(sumCounter(parsed, LLAMACPP_METRIC.cachedTokens));
  if (processed !== undefined && cached !== undefined) {
    out.generation = 'llamacpp-tokens';
    out.prefixQueries = processed + cached;
    out.prefixHits = cached;
    out.unit = 'tokens';
  }
  const waiting = finiteValue(sumSamples(parsed, LLAMACPP_METRIC.deferred));
  if (waiting !== undefined) out.waiting = waiting;
  const running = finiteValue(sumSamples(parsed, LLAMACPP_METRIC.processing));
  if (running !== undefined) out.running = running;
  const kv = finiteValue(meanSamples(parsed, LLAMACPP_METRIC.kvUsage));
  if (kv !== undefined) out.kvUsage = kv;
  if (waiting !== undefined || running !== undefined) out.engines = 1;
  return out;
}

export const llamaCpp: EngineProfile<'llamacpp', LlamaCppGeneration> = {
  name: 'llamacpp',
  metricNames: Object.values(LLAMACPP_METRIC),
  hitRateSources: { 'llamacpp-tokens': 'counters' },
  // No labels: a model-name filter has nothing to select.
  extractSample: (parsed, at) => extractLlamacppSample(parsed, at),
  // tools/server: /v1/embeddings, /v1/rerank (also /rerank, /reranking), /detokenize ({ tokens }).
  // Its /tokenize takes `content`, not vLLM's `prompt`, so it is not offered as `tokenize`; no
  // score API.
  keylessPaths: { embeddings: '/v1/embeddings', rerank: '/v1/rerank', detokenize: '/detokenize' },
  // tools/server: `id_slot`.
  // tools/server/server-common.cpp: json_value(stream_opt, "include_usage", false).
  streamOptionsIncludeUsage: false,
  controlFields: {
    id_slot: 'which server slot (and its cached prompt) to use (llama.cpp)',
  },
};
