// The mock's /metrics under SGLang's or llama.cpp server's names instead of vLLM's (metrics
// flavors `sglang`, `llamacpp`), from the same counters, so a pool of mocks can stand in for
// those engines (src/coordinator/vllm-metrics.ts reads them). Pure: renders a snapshot.
//
// SGLang (python/sglang/srt/metrics/collector.py, prometheus_client): scheduler gauges with the
// labels model_name, engine_type, tp_rank, pp_rank; tokenizer counters `sglang:prompt_tokens_total`
// (whole prompts) and `sglang:cached_tokens_total`; `sglang:cache_hit_rate` as the last batch's
// rate. llama.cpp (tools/server/server-task.cpp to_metrics): no labels, `prompt_tokens_total`
// excludes cached tokens, `prompt_tokens_cached_total`, `requests_processing`, `requests_deferred`.

import { formatValue, type MetricsSnapshot } from './metrics.js';

const BLOCK_TOKENS = 16;

export function renderSglangMetrics(s: MetricsSnapshot): string {
  const c = s.counters;
  const sched = `{engine_type="unified",model_name="${esc(s.modelName)}",pp_rank="0",tp_rank="0"}`;
  const tok = `{model_name="${esc(s.modelName)}"}`;
  const out: string[] = [];
  const gauge = (name: string, help: string, v: number) => out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name}${sched} ${formatValue(v)}`);
  const counter = (name: string, help: string, v: number) =>
    out.push(`# HELP ${name}_total ${help}`, `# TYPE ${name}_total counter`, `${name}_total${tok} ${formatValue(v)}`, `# HELP ${name}_created ${help}`, `# TYPE ${name}_created gauge`, `${name}_created${tok} ${formatValue(c.createdAt)}`);
  gauge('sglang:num_running_reqs', 'The number of running requests.', s.running);
  gauge('sglang:num_used_tokens', 'The number of used tokens.', Math.round(s.kvUsage * s.numGpuBlocks * BLOCK_TOKENS));
  gauge('sglang:token_usage', 'The token usage.', s.kvUsage);
  gauge('sglang:num_queue_reqs', 'The number of requests in the waiting queue.', s.waiting);
  gauge('sglang:cache_hit_rate', 'The prefix cache hit rate.', c.prefixQueriesTokens > 0 ? c.prefixHitsTokens / c.prefixQueriesTokens : 0);
  gauge('sglang:max_total_num_tokens', 'Maximum total number of tokens in the KV cache pool.', s.numGpuBlocks * BLOCK_TOKENS);
  counter('sglang:prompt_tokens', 'Number of prefill tokens processed.', c.prefixQueriesTokens);
  counter('sglang:generation_tokens', 'Number of generation tokens processed.', c.generationTokens);
  counter('sglang:cached_tokens', 'Number of cached prompt tokens.', c.prefixHitsTokens);
  return `${out.join('\n')}\n`;
}

export function renderLlamacppMetrics(s: MetricsSnapshot): string {
  const c = s.counters;
  const out: string[] = [];
  const item = (type: 'counter' | 'gauge', name: string, help: string, v: number) => out.push(`# HELP llamacpp:${name} ${help}`, `# TYPE llamacpp:${name} ${type}`, `llamacpp:${name} ${cpp(v)}`);
  item('counter', 'prompt_tokens_total', 'Number of prompt tokens processed, excluding cached tokens', c.prefixQueriesTokens - c.prefixHitsTokens);
  item('counter', 'prompt_tokens_cached_total', 'Number of prompt tokens reused from the cache', c.prefixHitsTokens);
  item('counter', 'tokens_predicted_total', 'Number of generation tokens processed', c.generationTokens);
  item('gauge', 'requests_processing', 'Number of requests processing', s.running);
  item('gauge', 'requests_deferred', 'Number of requests deferred', s.waiting);
  return `${out.join('\n')}\n`;
}

/** A double as a C++ ostream prints it by default (%g, 6 significant digits): 1.23457e+06, 0.5. */
function cpp(v: number): string {
  if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
  return v
    .toPrecision(6)
    .replace(/e([+-])(\d)$/, 'e$10$2')
    .replace(/(\.\d*?)0+(e|$)/, '$1$2')
    .replace(/\.(e|$)/, '$1');
}

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}
