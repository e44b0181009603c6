// The inference engines a pool can run and the keyless APIs (embeddings, rerank, score, tokenize,
// detokenize) each serves, with the origin path for each. Pure data, read by config.ts (to check
// and resolve a pool's `engine` / `endpoints`) and by the keyless dialects (http/apis/keyless.ts).
//
// Sources (the engines' own HTTP servers):
// - vLLM (vllm/entrypoints/.../api_router.py files): POST /v1/embeddings; /rerank, /v1/rerank and
//   /v2/rerank (one RerankRequest); /score and /v1/score; /tokenize, /detokenize.
// - SGLang (python/sglang/srt/entrypoints/http_server.py): /v1/embeddings, /v1/rerank,
//   /tokenize and /detokenize (also under /v1/). Its /v1/score is a different API (query, items,
//   label_token_ids), not vLLM's pair scoring, so it is not offered as `score`.
// - llama.cpp server (tools/server): /v1/embeddings, /v1/rerank (also /rerank, /reranking),
//   /detokenize ({ tokens }). Its /tokenize takes `content`, not vLLM's `prompt`, so it is not
//   offered as `tokenize`; no score API.

export const ENGINES = ['vllm', 'sglang', 'llamacpp'] as const;
export type EngineName = (typeof ENGINES)[number];

export const KEYLESS_APIS = ['embeddings', 'rerank', 'score', 'tokenize', 'detokenize'] as const;
export type KeylessApi = (typeof KEYLESS_APIS)[number];

/**
 * Origin path per engine and API; `null` where the engine keeps the client's own path (vLLM
 * serves every alias the router accepts). An API missing from an engine's map is not served.
 */
const ENGINE_PATHS: Record<EngineName, Partial<Record<KeylessApi, string | null>>> = {
  vllm: { embeddings: null, rerank: null, score: null, tokenize: null, detokenize: null },
  sglang: { embeddings: '/v1/embeddings', rerank: '/v1/rerank', tokenize: '/tokenize', detokenize: '/detokenize' },
  llamacpp: { embeddings: '/v1/embeddings', rerank: '/v1/rerank', detokenize: '/detokenize' },
};

/** The keyless APIs an engine serves, in KEYLESS_APIS order. */
export function engineApis(engine: EngineName): KeylessApi[] {
  return KEYLESS_APIS.filter((a) => ENGINE_PATHS[engine][a] !== undefined);
}

/** The origin path for `api` on `engine`, given the path the client called. */
export function engineApiPath(engine: EngineName, api: KeylessApi, clientPath: string): string {
  return ENGINE_PATHS[engine][api] ?? clientPath;
}
