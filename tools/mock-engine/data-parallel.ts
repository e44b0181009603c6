// The mock's data-parallel mode (--data-parallel-size N): how a request finds its engine core,
// as vLLM's API server does. Pure: header value and load counts in, an engine index out.
//
// vLLM (docs/operations.md, "Data-parallel engines", for the source files): the
// `X-data-parallel-rank` header is read with Python's int() and ignored when it does not parse;
// a parsed rank outside [0, engines) is a 400 (VLLMValidationError from the input processor),
// also on a server with one engine (on a stream an in-band error after the 200, and on the
// Messages API a 500 or the converter's error event: profiles.ts rankErrorInBand); without a rank, the internal balancer takes the engine with
// the lowest waiting × 4 + running (first one on ties for the first API server), from counts the
// DP coordinator publishes every 100 ms, which the API server bumps locally by one waiting request
// per pick in between (vllm/v1/engine/core_client.py `DPLBAsyncMPClient`).

/** Python int() of a header value: optional sign, decimal digits with single underscores between, surrounding whitespace. */
export function parseRankHeader(value: string | string[] | undefined): number | null {
  if (typeof value !== 'string') return null;
  const m = /^\s*([+-]?)(\d+(?:_\d+)*)\s*$/.exec(value);
  if (!m) return null;
  const n = Number(m[2]!.replace(/_/g, ''));
  if (!Number.isSafeInteger(n)) return null;
  return m[1] === '-' ? -n : n;
}

/**
 * The engine's message for a rank outside the engines: vLLM's (vllm/v1/engine/input_processor.py)
 * or SGLang's (python/sglang/srt/managers/tokenizer_manager.py generate_request, a ValueError its
 * kick-started stream answers as a 400 before any 200). SGLang also refuses a header int() cannot
 * parse (400 "Invalid X-Data-Parallel-Rank header", serving_base.py
 * extract_routed_dp_rank_from_header) where vLLM ignores it; the mock ignores it for both (the
 * router never sends one).
 */
export function rankOutOfRange(rank: number, engines: number, family: 'vllm' | 'sglang' | 'llama.cpp' = 'vllm'): string {
  if (family === 'sglang') return `routed_dp_rank=${rank} out of range [0, ${engines})`;
  return `data_parallel_rank ${rank} is out of range [0, ${engines}).`;
}

/** vLLM's DP coordinator publishes the engines' counts this often (its balancer works from them). */
export const STATS_INTERVAL_MS = 100;

/**
 * The engine vLLM's internal balancer picks: lowest waiting × 4 + running, the first on ties;
 * `waiting` includes the picks made since the last published counts.
 */
export function balanceEngine(loads: readonly { waiting: number; running: number }[]): number {
  let best = 0;
  let bestScore = Infinity;
  loads.forEach((l, i) => {
    const score = l.waiting * 4 + l.running;
    if (score < bestScore) {
      bestScore = score;
      best = i;
    }
  });
  return best;
}
