// Public types of the mock vLLM replica: options, fault flags and the stats snapshot.
// No I/O; shared by the server, the CLI and the tests.

import type { MockProfile } from './profiles.js';

/** Fault flags; settable at start, by `setFaults` and by `POST /_mock/faults` (merged). */
export interface MockFaults {
  /** `GET /health` answers 503. */
  failHealth: boolean;
  /** Probability (0..1) that a completion request answers 500 with an error JSON; drawn from the seeded PRNG. */
  error500Rate: number;
  /** The status of those injected errors: 500 (default), or 502/503/504 (the router retries only those). */
  errorStatus: number;
  /** Delay before a completion request is admitted (before any header is sent), in ms. Not scaled by `slowFactor`. */
  stallBeforeMs: number;
  /** A completion request never gets an answer (until the client goes away). */
  stallBeforeForever: boolean;
  /**
   * Streaming only: after this many SSE chunks (the role chunk counts), stop sending but keep the
   * connection and the running slot until the client goes away. `null` = off; 0 = stall right after
   * the headers.
   */
  stallMidStream: number | null;
  /** Multiplies the prefill and decode delays (not the stall faults). */
  slowFactor: number;
  /** Destroy the socket instead of answering (every path except `/_mock/*`). */
  dropConnection: boolean;
  /**
   * Chat and completions: after this many content tokens, the engine fails: a stream gets the
   * profile's in-band error event (vLLM and SGLang: `data: {"error":…}` then `data: [DONE]`;
   * llama.cpp: the error event alone, or a plain HTTP 500 when nothing was sent yet, as its
   * server answers a failed first result), a non-streamed request a 500. `null` = off; 0 = before
   * the first token (after the headers where the profile sends them first).
   */
  inBandErrorAfter: number | null;
  /** Chat and completions: destroy the connection after this many content tokens (headers sent first). `null` = off. */
  dropAfterTokens: number | null;
  /**
   * Chat and completions: after this many content tokens stop sending (headers sent first) and hold
   * the connection and the slot until the client goes away. `null` = off; 0 = no token at all.
   */
  stallAfterTokens: number | null;
}

export const DEFAULT_FAULTS: Readonly<MockFaults> = Object.freeze({
  failHealth: false,
  error500Rate: 0,
  errorStatus: 500,
  stallBeforeMs: 0,
  stallBeforeForever: false,
  stallMidStream: null,
  slowFactor: 1,
  dropConnection: false,
  inBandErrorAfter: null,
  dropAfterTokens: null,
  stallAfterTokens: null,
});

/**
 * Which generation of vLLM's prefix-cache metric names `/metrics` emits:
 * - `current`: `vllm:prefix_cache_{queries,hits}_total` in tokens, `vllm:kv_cache_usage_perc` (vLLM >= 0.9);
 * - `v1-blocks`: `vllm:gpu_prefix_cache_{queries,hits}_total` in blocks, `vllm:gpu_cache_usage_perc` (early V1, 0.7-0.8);
 * - `v0`: the `vllm:gpu_prefix_cache_hit_rate` gauge (0..1) and `vllm:gpu_cache_usage_perc` (V0 engine).
 */
/** vLLM's metric generations, or another engine's names (engine-metrics.ts). */
export type MetricsFlavor = 'current' | 'v1-blocks' | 'v0' | 'sglang' | 'llamacpp';

export interface MockVllmOptions {
  /**
   * Which engine's wire behaviour the mock follows (profiles.ts): `vllm` (V1 API server, default
   * flags), `vllm-cache-report` (--enable-prompt-tokens-details), `sglang`,
   * `sglang-cache-report` (--enable-cache-report), `llama.cpp` (--metrics), or `legacy`: the
   * mock as it was before the profiles (vLLM's shapes, headers with the first chunk, cached tokens
   * always reported, the Responses store on), which is no engine's behaviour. Default `vllm`.
   */
  profile?: MockProfile;
  /**
   * Override the profile's header timing: true sends a stream's 200 and headers before queueing
   * and prefill (vLLM, SGLang); false sends them with the first chunk (llama.cpp, and the legacy
   * mock's timing).
   */
  headersFirst?: boolean;
  /** Override the profile's Responses store (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1 turns it on). */
  responsesStore?: boolean;
  /** Replica id, printed on start and reported in stats. Default `mock`. */
  id?: string;
  /** Port on 127.0.0.1; 0 (the default) picks a free one. */
  port?: number;
  /** Served model name(s); the first is the default. Default `['demo-model']`. */
  models?: string | string[];
  /** When set, every `/v1/*` request needs `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Prefix cache capacity in 16-token blocks (also `num_gpu_blocks`). Default 2048. */
  cacheBlocks?: number;
  /** Prefill speed for uncached prompt tokens. Default 50,000 tokens/s (2,000 tokens cost 40 ms). */
  prefillTokensPerSec?: number;
  /** Delay per generated token after the first. Default 2 ms. */
  decodeMsPerToken?: number;
  /**
   * Concurrent sequences, vLLM's `--max-num-seqs` (its default is 256, or 1024 on a GPU of 70 GiB
   * and more: vllm/engine/arg_utils.py get_batch_defaults); the rest wait in a FIFO queue. Default 8.
   */
  maxRunning?: number;
  /** Context length: prompt + max_tokens above it is a 400, as in vLLM. Default 32768. */
  maxModelLen?: number;
  /** Seed of the PRNG behind `error500Rate`. Default 0. */
  seed?: number;
  /** Initial fault flags. */
  faults?: Partial<MockFaults>;
  /** Metric naming generation. Default: the profile's engine (`current` for vLLM and legacy). */
  metricsFlavor?: MetricsFlavor;
  /**
   * Engine cores behind the one server, as vLLM's --data-parallel-size (1..64). Default 1. Each
   * has its own prefix cache of `cacheBlocks` and `maxRunning` slots; /metrics labels its series
   * `engine="<rank>"`; chat, completion and Messages requests honour `X-data-parallel-rank`
   * (data-parallel.ts), Responses requests take the balancer's engine (as in vLLM).
   */
  dataParallelSize?: number;
  /**
   * Keep connections alive between requests (default true, as uvicorn does). false answers every
   * request with `Connection: close`: for tests that restart a replica on the same port and must
   * not meet a socket the client pooled to the old process.
   */
  keepAlive?: boolean;
  /**
   * vLLM's `--sse-keep-alive-interval` (default 0: off), in ms here: a chat or completions stream
   * idle this long writes the comment `: keep-alive` (profiles.ts SSE_KEEP_ALIVE_COMMENT), before
   * its first token (queued, prefill) as after it. Only for the vLLM profiles (no other engine
   * has such a flag).
   */
  sseKeepAliveMs?: number;
}

export interface ReceivedRequest {
  method: string;
  path: string;
  /** Header names lower-cased, as node:http gives them. */
  headers: Record<string, string | string[] | undefined>;
  /** Parsed JSON when the body was JSON, the raw text otherwise, `null` when empty. */
  body: unknown;
}

/** Snapshot returned by `stats()` and `GET /_mock/stats`. Tokens are mock tokens (4 characters). */
export interface MockStats {
  id: string;
  port: number;
  models: string[];
  /** Every request except `/_mock/*`. */
  requestsTotal: number;
  /** `/v1/chat/completions` and `/v1/completions` requests (any outcome). */
  completionRequestsTotal: number;
  /** Keyless API requests (embeddings, rerank, score, tokenize, detokenize; any outcome): keyless.ts. */
  keylessRequestsTotal: number;
  /** Responses by HTTP status code, counted when the response closes (so a stream counts once it ends). */
  byStatus: Record<string, number>;
  /** Streams whose headers went out and that have not ended yet. */
  activeStreams: number;
  /** Sequences holding a slot (prefill or decode), as `vllm:num_requests_running`. */
  running: number;
  /** Sequences queued for a slot, as `vllm:num_requests_waiting`. */
  waiting: number;
  /** Most sequences queued at once since start or the last reset (summed over data-parallel engines). */
  peakWaiting: number;
  /** Completion requests whose client went away before the answer was complete. */
  abortedByClient: number;
  /** Sockets destroyed by the `dropConnection` fault. */
  droppedConnections: number;
  /** Answers with a 500 from `error500Rate`. */
  injectedErrors: number;
  /** Engine failures injected by `inBandErrorAfter` (in-band events and their plain-HTTP form). */
  injectedInBandErrors: number;
  /** `: keep-alive` comments written (sseKeepAliveMs). */
  keepAlivesSent: number;
  /** The engine profile the mock follows. */
  profile: MockProfile;
  prefixCache: {
    /** Prompt tokens looked up (`vllm:prefix_cache_queries_total`). */
    queriesTokens: number;
    /** Prompt tokens found cached (`vllm:prefix_cache_hits_total`). */
    hitsTokens: number;
    /** Blocks stored now, and the capacity. */
    blocks: number;
    capacityBlocks: number;
    /** Blocks referenced by running sequences (cannot be evicted). */
    heldBlocks: number;
    evictions: number;
  };
  promptTokensTotal: number;
  generationTokensTotal: number;
  /** Finished sequences by reason (`stop`, `length`, `abort`). */
  finishedByReason: Record<string, number>;
  /** Data-parallel mode only: each engine core's completion requests, load and prefix cache. */
  engines?: {
    rank: number;
    requests: number;
    running: number;
    waiting: number;
    prefixCache: { queriesTokens: number; hitsTokens: number; blocks: number; capacityBlocks: number };
  }[];
  faults: MockFaults;
  /** The last request on any path except `/_mock/*` (health checks and scrapes included). */
  lastRequest: ReceivedRequest | null;
  /** The last `/v1/chat/completions` or `/v1/completions` request. */
  lastCompletionRequest: ReceivedRequest | null;
  /** The last POST on each path (health checks and scrapes never overwrite it): what an engine was asked. */
  lastPostByPath: Record<string, ReceivedRequest>;
}

export interface MockVllm {
  id: string;
  port: number;
  /** `http://127.0.0.1:<port>` (no trailing slash, no `/v1`). */
  url: string;
  /** Stop listening, abort every in-flight request and close every connection. */
  close(): Promise<void>;
  /** Merge fault flags. */
  setFaults(partial: Partial<MockFaults>): void;
  stats(): MockStats;
  /** Clear the prefix cache and every counter (as `POST /_mock/reset`); faults stay. */
  reset(): void;
}
