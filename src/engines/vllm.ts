// vLLM's engine profile: its `/metrics` names across versions read into one replica's sample,
// KV capacity per data-parallel engine, the engine labels a request can be pinned to (the rank
// header, and its refusal of a stale rank), its keyless API paths and its engine control fields.
// Pure: no I/O; the scrape time is passed in.
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
//   set per engine in V1. On a data-parallel server every engine's `num_gpu_blocks` is the
//   SERVER's total, not the engine's own: the front end sums the engines' blocks at start-up
//   into its one CacheConfig (vllm/v1/engine/utils.py, wait_for_engine_startup: "Sum values from
//   all engines in DP case", `num_gpu_blocks += msg["num_gpu_blocks"]`), and each engine's
//   logger labels with that same config. So the total is the label and an engine is
//   label ÷ engines (`serverBlocks`).
//
// Across label sets: counts (queries, hits, waiting, running) are summed, since several
// `engine` values on one server are data-parallel engines behind one endpoint; fractions (KV
// usage, the V0 hit-rate gauge) are averaged; GPU blocks are the label, as above.

import type { EngineProfile, EngineSample, ExtractOptions, MutableSample } from './engine.js';
import type { EngineKv, KvCapacity } from './kv-capacity.js';
import { counterHelp, findSamples, finiteValue, meanSamples, positiveIntLabel, sumCounter, sumSamples, type LabelFilter, type PromParse } from './prom-text.js';

/** Which counters (or gauge) a vLLM hit rate comes from: V1 in tokens or blocks, V0's gauge. */
export type VllmGeneration = 'v1-tokens' | 'v1-blocks' | 'v0-gauge';

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

/** Reads one replica's signals from a parsed scrape taken at `at`. Never throws. */
export function extractVllmSample(parsed: PromParse, at: number, options: ExtractOptions = {}): EngineSample<VllmGeneration> {
  const filter: LabelFilter | undefined = options.modelName !== undefined ? { model_name: options.modelName } : undefined;
  const out: MutableSample<VllmGeneration> = { at, generation: 'none' };

  const q = finiteValue(sumCounter(parsed, VLLM_METRIC.prefixQueries, filter));
  const h = finiteValue(sumCounter(parsed, VLLM_METRIC.prefixHits, filter));
  const gq = finiteValue(sumCounter(parsed, VLLM_METRIC.gpuPrefixQueries, filter));
  const gh = finiteValue(sumCounter(parsed, VLLM_METRIC.gpuPrefixHits, filter));
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
    const rate = finiteValue(meanSamples(parsed, VLLM_METRIC.gpuPrefixHitRate, filter));
    if (rate !== undefined) {
      out.generation = 'v0-gauge';
      out.hitRateGauge = rate;
    }
  }

  const waiting = finiteValue(sumSamples(parsed, VLLM_METRIC.waiting, filter));
  if (waiting !== undefined) out.waiting = waiting;
  const running = finiteValue(sumSamples(parsed, VLLM_METRIC.running, filter));
  if (running !== undefined) out.running = running;
  const kv = finiteValue(meanSamples(parsed, VLLM_METRIC.kvUsage, filter)) ?? finiteValue(meanSamples(parsed, VLLM_METRIC.gpuCacheUsage, filter));
  if (kv !== undefined) out.kvUsage = kv;

  // cache_config_info: one label set per engine, each carrying the server's total (see above).
  for (const s of findSamples(parsed, VLLM_METRIC.cacheConfig, filter)) {
    const blockSize = positiveIntLabel(s.labels['block_size']);
    if (blockSize !== undefined) {
      out.blockSize = blockSize;
      break;
    }
  }
  const server = serverBlocks(parsed, filter);
  if (server !== undefined) out.numGpuBlocks = server.total;

  const engines = countEngines(parsed, filter);
  if (engines > 0) out.engines = engines;
  return out;
}

/**
 * The server's GPU blocks from `vllm:cache_config_info` and how many engines share them: every
 * engine's label carries the server's total (wait_for_engine_startup sums the engines), so the
 * total is the label, not a sum of labels, and one engine holds total ÷ engines. Labels that
 * disagree are not a shape vLLM writes; the largest is taken as the total.
 */
function serverBlocks(parsed: PromParse, filter: LabelFilter | undefined): { total: number; engines: number } | undefined {
  const engines = new Set<string>();
  let total: number | undefined;
  for (const s of findSamples(parsed, VLLM_METRIC.cacheConfig, filter)) {
    const blocks = positiveIntLabel(s.labels['num_gpu_blocks']);
    if (blocks === undefined) continue;
    engines.add(s.labels['engine'] ?? '');
    total = Math.max(total ?? 0, blocks);
  }
  return total === undefined ? undefined : { total, engines: engines.size };
}

function countEngines(parsed: PromParse, filter: LabelFilter | undefined): number {
  const seen = new Set<string>();
  for (const name of [VLLM_METRIC.waiting, VLLM_METRIC.running]) {
    for (const s of findSamples(parsed, name, filter)) seen.add(s.labels['engine'] ?? '');
  }
  return seen.size;
}

// ---- KV capacity per data-parallel engine ---------------------------------------------------
//
// vLLM (v1 KVCacheManager / BlockPool) evicts only free blocks: a block pinned by a running
// request is never evicted, and a finished request's blocks go back to the free queue with
// their hashes, evictable in LRU order. `vllm:kv_cache_usage_perc` (older
// `vllm:gpu_cache_usage_perc`) is 1 − free / total, so the cache that outlives the running
// requests is
//
//   blocks_e = num_gpu_blocks ÷ engines                  (the label is the server's total)
//   free_e = blocks_e × (1 − usage_e)                     per engine e (label `engine`)
//   free   = Σ_e free_e
//
// Engines are kept apart: a data-parallel server reports one usage gauge per engine, and averaging the usage over engines of different sizes (or
// summing blocks against a mean) misstates the free part. An engine without a usage gauge is
// taken as wholly free (the old behaviour: capacity = its blocks). What the router's index
// makes of it: kv-capacity.ts.

const USAGE = [VLLM_METRIC.kvUsage, VLLM_METRIC.gpuCacheUsage] as const;

/** Per-engine KV capacity and free blocks, or null when the scrape has no `vllm:cache_config_info`. */
export function vllmKvCapacity(parsed: PromParse, filter?: LabelFilter): KvCapacity | null {
  const usageByEngine = new Map<string, number>();
  for (const name of USAGE) {
    for (const s of findSamples(parsed, name, filter)) {
      const e = s.labels['engine'] ?? '';
      if (!usageByEngine.has(e) && Number.isFinite(s.value)) usageByEngine.set(e, Math.min(1, Math.max(0, s.value)));
    }
  }
  const server = serverBlocks(parsed, filter);
  if (server === undefined) return null;
  // Each engine core gets an equal share of the server's total: the label is Σ engines
  // (wait_for_engine_startup), and vLLM's engines of one server are sized alike.
  const perEngine = Math.floor(server.total / server.engines);
  const engines: EngineKv[] = [];
  const seen = new Set<string>();
  for (const s of findSamples(parsed, VLLM_METRIC.cacheConfig, filter)) {
    const engine = s.labels['engine'] ?? '';
    if (seen.has(engine)) continue;
    const blockSize = positiveIntLabel(s.labels['block_size']);
    if (positiveIntLabel(s.labels['num_gpu_blocks']) === undefined || blockSize === undefined) continue;
    seen.add(engine);
    const usage = usageByEngine.get(engine) ?? null;
    engines.push({ engine, numGpuBlocks: perEngine, blockSize, usage, freeBlocks: Math.floor(perEngine * (1 - (usage ?? 0))) });
  }
  if (engines.length === 0) return null;
  let free = 0;
  for (const e of engines) free += e.freeBlocks;
  return { engines, freeBlocks: free, totalBlocks: server.total, blockSize: engines[0]!.blockSize };
}

// ---- Data-parallel ranks ------------------------------------------------------------------
//
// A server started with --data-parallel-size N labels every per-engine series with
// `engine="<rank>"` (vllm/v1/metrics/loggers.py, from the client's engine_ranks_managed,
// vllm/v1/engine/core_client.py), including one `vllm:cache_config_info` and one
// `vllm:kv_cache_usage_perc` per engine; it honours a request header `X-data-parallel-rank: <int>`
// (vllm/entrypoints/openai/engine/serving.py `_get_data_parallel_rank`: int(), a value that does
// not parse is ignored), which must be in [0, managed engines) (vllm/v1/engine/input_processor.py:
// otherwise a 400; on a stream an in-band error after the 200, on /v1/messages a 500 or, streamed,
// the converter's error event, refusesEngineRankConverted) and indexes the managed engines in rank order
// (`DPLBAsyncMPClient.get_core_engine_for_request`). So the header value is an engine's position
// among the reported labels in numeric order: equal to the label on a plain --data-parallel-size
// server, label − first rank when one API server manages a contiguous slice of ranks (hybrid load
// balancing). docs/operations.md, "Data-parallel engines"; the coordinator's slots per engine:
// coordinator/dp-engines.ts.

/**
 * The `engine` labels of a scrape's engines in rank order when requests can be pinned to them:
 * two or more, each a decimal integer, contiguous once sorted (what one vLLM API server manages).
 * Null otherwise (one engine, no labels, or labels the rank header could not address).
 */
export function rankedEngines(kv: KvCapacity | null): string[] | null {
  if (kv === null || kv.engines.length < 2) return null;
  const ranks: number[] = [];
  for (const e of kv.engines) {
    if (!/^\d{1,6}$/.test(e.engine)) return null;
    ranks.push(Number(e.engine));
  }
  ranks.sort((a, b) => a - b);
  for (let i = 1; i < ranks.length; i++) if (ranks[i] !== ranks[0]! + i) return null;
  const byRank = new Map(kv.engines.map((e) => [Number(e.engine), e.engine]));
  return ranks.map((r) => byRank.get(r)!);
}

/** The request header that pins a request to a data-parallel engine: its position in `rankedEngines`. */
export const DATA_PARALLEL_RANK_HEADER = 'x-data-parallel-rank';

/**
 * Whether an origin's 400 body is vLLM refusing the rank the router sent: its error message is
 * exactly "data_parallel_rank R is out of range [0, N)." for that R (vllm/v1/engine/
 * input_processor.py), i.e. the server now manages fewer engines than its last scrape said. The
 * whole message must match, with the router's own R: a validation error that echoes a client's
 * field value cannot pass for it (a tenant must not be able to unpin a replica for everyone).
 */
export function refusesEngineRank(body: string, rank: number): boolean {
  let v: unknown;
  try {
    v = JSON.parse(body);
  } catch {
    return false;
  }
  const err = typeof v === 'object' && v !== null ? (v as { error?: unknown }).error : undefined;
  const message = typeof err === 'object' && err !== null ? (err as { message?: unknown }).message : undefined;
  const m = typeof message === 'string' ? /^data_parallel_rank (\d+) is out of range \[0, \d+\)\.$/.exec(message) : null;
  return m !== null && Number(m[1]) === rank;
}

/** What is left of vLLM's rank refusal inside its Messages stream's error (below): the chunk's repr, cut by pydantic. */
const CONVERTED_RANK_REFUSAL = "input_value={'error': {'message': 'da...am': None, 'code': 400}}, input_type=dict]";

/**
 * Whether an `event: error` of vLLM's Messages API stream is its refusal of a data-parallel
 * rank. The Messages converter (vllm/entrypoints/anthropic/serving.py message_stream_converter)
 * validates every chat chunk as a ChatCompletionStreamResponse; the chat stream's error chunk
 * `{"error":{"message":"data_parallel_rank R is out of range [0, N).","type":"BadRequestError",
 * "param":null,"code":400}}` fails (no `model`, no `choices`), and the event's message is
 * pydantic's ValidationError text, where the chunk survives only as its repr's first 25 and
 * last 24 characters (pydantic-core src/errors/validation_exception.rs truncate_input_value):
 * `{'error': {'message': 'da...am': None, 'code': 400}}`. So the rank itself is lost: this
 * matches a 400 engine error whose message starts with "da" before the first token of a pinned
 * request, which only the rank check writes. The whole shape must match (an `internal_error`,
 * pydantic's two missing fields of that class), not a substring a client could echo.
 */
export function refusesEngineRankConverted(body: string): boolean {
  let v: unknown;
  try {
    v = JSON.parse(body);
  } catch {
    return false;
  }
  if (typeof v !== 'object' || v === null || (v as { type?: unknown }).type !== 'error') return false;
  const err = (v as { error?: unknown }).error;
  if (typeof err !== 'object' || err === null || (err as { type?: unknown }).type !== 'internal_error') return false;
  const message = (err as { message?: unknown }).message;
  if (typeof message !== 'string' || !message.startsWith('2 validation errors for ChatCompletionStreamResponse\n')) return false;
  const lines = message.split('\n');
  return lines.length === 7 && lines[1] === 'model' && lines[4] === 'choices' && lines[2] === lines[5] && lines[2] === `  Field required [type=missing, ${CONVERTED_RANK_REFUSAL}`;
}

// ---- The profile --------------------------------------------------------------------------

export const vllm: EngineProfile<'vllm', VllmGeneration> = {
  name: 'vllm',
  // prometheus_client exposes the counters with `_total`; older clients without.
  metricNames: [...Object.values(VLLM_METRIC), `${VLLM_METRIC.prefixQueries}_total`, `${VLLM_METRIC.gpuPrefixQueries}_total`],
  hitRateSources: { 'v1-tokens': 'counters', 'v1-blocks': 'counters', 'v0-gauge': 'gauge' },
  extractSample: extractVllmSample,
  kvCapacity: vllmKvCapacity,
  dataParallelRanks: rankedEngines,
  // vllm/entrypoints/.../api_router.py files: POST /v1/embeddings; /rerank, /v1/rerank and
  // /v2/rerank (one RerankRequest); /score and /v1/score; /tokenize, /detokenize. vLLM serves
  // every alias the router accepts, so the client's own path is kept.
  keylessPaths: { embeddings: null, rerank: null, score: null, tokenize: null, detokenize: null },
  // vllm/entrypoints/openai/engine/protocol.py `class StreamOptions: include_usage: bool | None =
  // True`, read by should_include_usage when the options are present.
  streamOptionsIncludeUsage: true,
  // vllm/entrypoints/openai/protocol.py ChatCompletionRequest / CompletionRequest extra params.
  controlFields: {
    priority: 'scheduling priority (vLLM priority scheduling; SGLang priority)',
    kv_transfer_params: 'KV transfer for disaggregated prefill (vLLM)',
    ec_transfer_params: 'encoder-cache transfer for disaggregated multimodal serving (vLLM)',
    vllm_xargs: 'custom engine extension arguments (vLLM)',
    logits_processors: 'server-side logits processor classes to load (vLLM)',
    chat_template: 'a Jinja template rendered by the server (vLLM)',
    mm_processor_kwargs: 'multimodal processor arguments, memory and compute per request (vLLM)',
    // ChatCompletionRequest.media_io_kwargs (vllm/entrypoints/openai/chat_completion/protocol.py):
    // per-request options of the media loaders (frames decoded per video, and the like).
    media_io_kwargs: 'media loader arguments, memory and compute per request (vLLM)',
    guided_decoding_backend: 'overrides the server\'s structured output backend (vLLM)',
    data_parallel_rank: 'pins the request to a data-parallel engine rank (vLLM, SGLang)',
  },
};

// ---- The Responses store -------------------------------------------------------------------

/** The flag an operator sets on vLLM for a Responses store (vllm/entrypoints/openai/responses/serving.py `enable_store`). */
export const RESPONSES_STORE_FLAG = 'VLLM_ENABLE_RESPONSES_API_STORE=1';

/**
 * What a client is told about a response its replica does not have: vLLM keeps responses only
 * with its store on; without it `store: true` is turned off quietly (serving.py create_responses:
 * `request.store = False`, so the response says `store: false`) and every later
 * `previous_response_id`, retrieve and cancel of it is a 404.
 */
export function responseNotStoredMessage(responseId: string): string {
  return (
    `Response with id '${responseId}' was made on a replica that no longer has it. vLLM keeps responses only when its Responses store is on ` +
    `(start the server with ${RESPONSES_STORE_FLAG}; without it every previous_response_id, retrieve and cancel is a 404 and background is refused), ` +
    "and a replica restart (or the store's own expiry) loses stored responses. Send the conversation as input instead, or ask the operator to enable the store."
  );
}
