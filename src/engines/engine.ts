// What an engine profile provides: one object per inference engine (engines/vllm.ts, sglang.ts,
// llama-cpp.ts) with its metric names, request fields, keyless API paths and capacity rules, and
// the engine-neutral sample every profile reads a `/metrics` scrape into. Types only; no I/O.
//
// Adding an engine is one module exporting an `EngineProfile` plus its line in the registry
// (engines/index.ts); config, the scrape, the fence and the keyless dialects read the registry.

import type { KvCapacity } from './kv-capacity.js';
import type { LabelFilter, PromParse } from './prom-text.js';

export const KEYLESS_APIS = ['embeddings', 'rerank', 'score', 'tokenize', 'detokenize'] as const;
export type KeylessApi = (typeof KEYLESS_APIS)[number];

export type PrefixCacheUnit = 'tokens' | 'blocks';

/** Where a hit rate comes from: a ratio of counter deltas (hits / queries) or the engine's own gauge. */
export type HitRateSource = 'counters' | 'gauge';

/**
 * One replica's signals from one scrape, whatever the engine. `Generation` names which of the
 * engine's metric sets the hit rate came from (`none`: no prefix cache metrics).
 */
export interface EngineSample<Generation extends string = string> {
  /** Scrape time, milliseconds (the caller's clock). */
  readonly at: number;
  readonly generation: Generation | 'none';
  /** Cumulative prefix cache queries (a counter), summed over engines. */
  readonly prefixQueries?: number;
  /** Cumulative prefix cache hits (a counter), summed over engines. */
  readonly prefixHits?: number;
  readonly unit?: PrefixCacheUnit;
  /** Gauge generations: the engine's own hit-rate gauge, 0..1. */
  readonly hitRateGauge?: number;
  readonly waiting?: number;
  readonly running?: number;
  /** KV cache usage, 0..1, averaged over engines. */
  readonly kvUsage?: number;
  readonly blockSize?: number;
  /** GPU KV blocks summed over engines. */
  readonly numGpuBlocks?: number;
  /** Number of distinct data-parallel engines (schedulers) seen (1 for a single one). */
  readonly engines?: number;
}

/** A sample being filled in by an extractor. */
export type MutableSample<Generation extends string = string> = { -readonly [K in keyof EngineSample<Generation>]: EngineSample<Generation>[K] };

export interface ExtractOptions {
  /** Only label sets whose `model_name` equals this (a server that serves several names). */
  readonly modelName?: string;
}

export interface EngineProfile<Name extends string = string, Generation extends string = string> {
  /** The pool's `engine` value in the configuration. */
  readonly name: Name;
  /** Metric names (families or samples) only this engine exposes: a scrape with any of them is this engine's. */
  readonly metricNames: readonly string[];
  /** Each generation the hit rate can come from, and whether it is counters or a gauge. */
  readonly hitRateSources: Readonly<Record<Generation, HitRateSource>>;
  /** Reads a parsed scrape into the engine-neutral sample. Never throws. */
  extractSample(parsed: PromParse, at: number, options?: ExtractOptions): EngineSample<Generation>;
  /**
   * KV capacity per data-parallel engine when the engine reports it that way (vLLM's
   * `cache_config_info` per `engine` label); absent or null: the sample's totals are used.
   */
  kvCapacity?(parsed: PromParse, filter?: LabelFilter): KvCapacity | null;
  /**
   * The engine labels of a scrape in rank order when a request can be pinned to one of them (a
   * rank header); null when it cannot. Absent: the engine cannot pin requests to an engine.
   */
  dataParallelRanks?(kv: KvCapacity | null): string[] | null;
  /**
   * Origin path per keyless API; `null` where the engine keeps the client's own path. An API
   * missing here is not served by the engine.
   */
  readonly keylessPaths: Readonly<Partial<Record<KeylessApi, string | null>>>;
  /**
   * Request-body fields that steer the engine itself (scheduling, request ids, KV cache and
   * transfer, code it loads), each with why: fenced from clients unless a pool allows them.
   */
  readonly controlFields: Readonly<Record<string, string>>;
  /**
   * Whether a `stream_options` object without `include_usage` turns usage on (vLLM: its
   * StreamOptions defaults the key to true; SGLang and llama.cpp: false). Decides whether the
   * client asked for usage, so whether the router strips the usage chunk it asked for itself.
   */
  readonly streamOptionsIncludeUsage: boolean;
}
