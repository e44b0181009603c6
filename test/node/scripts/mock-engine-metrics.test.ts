// The mock's sglang and llamacpp metrics flavors parse as those engines' scrapes
// (extractEngineSample), from the same counters as its vLLM exposition.
import { describe, expect, it } from 'vitest';
import { newCounters, renderMetrics, type MetricsSnapshot } from '../../../tools/mock-engine/metrics.js';
import { parsePromText } from '../../../src/engines/prom-text.js';
import { extractEngineSample } from '../../../src/engines/index.js';

function snapshot(flavor: MetricsSnapshot['flavor']): MetricsSnapshot {
  const counters = { ...newCounters(1_767_225_600_000), prefixQueriesTokens: 1_234_567, prefixHitsTokens: 1_000_000, generationTokens: 500 };
  return { counters, modelName: 'demo-model', running: 3, waiting: 2, kvUsage: 0.25, numGpuBlocks: 2048, flavor };
}

describe('mock metrics flavors of other engines', () => {
  it('sglang: token counters, scheduler gauges, the KV pool in tokens', () => {
    const text = renderMetrics(snapshot('sglang'));
    expect(text).toContain('# TYPE sglang:cached_tokens_total counter');
    expect(text).not.toContain('vllm:');
    const s = extractEngineSample(parsePromText(text), 1);
    expect(s).toEqual({ at: 1, generation: 'sglang-tokens', prefixQueries: 1_234_567, prefixHits: 1_000_000, unit: 'tokens', waiting: 2, running: 3, kvUsage: 0.25, blockSize: 1, numGpuBlocks: 2048 * 16, engines: 1 });
  });

  it('llamacpp: unlabelled, prompt tokens excluding cached ones, C++-style numbers', () => {
    const text = renderMetrics(snapshot('llamacpp'));
    expect(text).toContain('llamacpp:prompt_tokens_total 234567\n');
    expect(text).toContain('llamacpp:prompt_tokens_cached_total 1e+06\n');
    const s = extractEngineSample(parsePromText(text), 1);
    expect(s).toEqual({ at: 1, generation: 'llamacpp-tokens', prefixQueries: 1_234_567, prefixHits: 1_000_000, unit: 'tokens', waiting: 2, running: 3, engines: 1 });
  });
});
