// SGLang and llama.cpp server scrapes read into the same view as vLLM's: hit-rate counters (or
// gauge), waiting, running, KV usage. Fixtures: test/fixtures/engine-metrics (sources in README).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parsePromText } from '../../../src/engines/prom-text.js';
import { emptyHitRateWindow, pushSample, windowHitRate } from '../../../src/engines/hit-rate.js';
import { detectEngine, extractEngineSample, kvCapacity, type EngineSample, type SampleGeneration } from '../../../src/engines/index.js';

const fixture = (dir: string, name: string): string => readFileSync(join(import.meta.dirname, '../../fixtures', dir, name), 'utf8');
const engine = (name: string, at = 1000) => extractEngineSample(parsePromText(fixture('engine-metrics', name)), at);

describe('detectEngine', () => {
  it('tells the engines apart by their metric names', () => {
    expect(detectEngine(parsePromText(fixture('vllm-metrics', 'v1-tokens.txt')))).toBe('vllm');
    expect(detectEngine(parsePromText(fixture('vllm-metrics', 'v0-gauge.txt')))).toBe('vllm');
    expect(detectEngine(parsePromText(fixture('engine-metrics', 'sglang-docs.txt')))).toBe('sglang');
    expect(detectEngine(parsePromText(fixture('engine-metrics', 'llamacpp-current.txt')))).toBe('llamacpp');
    expect(detectEngine(parsePromText('process_cpu_seconds_total 3\n'))).toBeNull();
  });

  it('reads a vLLM scrape exactly as extractEngineSample does', () => {
    expect(extractEngineSample(parsePromText(fixture('vllm-metrics', 'v1-tokens-dp2.txt')), 5)).toMatchObject({ generation: 'v1-tokens', prefixQueries: 100_000, prefixHits: 60_000, waiting: 7, running: 16 });
  });
});

describe('kvCapacity', () => {
  it("is vLLM's per-engine capacity, and null for engines that report only totals (their sample carries them)", () => {
    expect(kvCapacity(parsePromText(fixture('vllm-metrics', 'v1-tokens-dp2.txt')))?.engines.map((e) => e.engine)).toEqual(['0', '1']);
    for (const name of ['sglang-docs.txt', 'llamacpp-current.txt']) expect(kvCapacity(parsePromText(fixture('engine-metrics', name))), name).toBeNull();
    expect(kvCapacity(parsePromText('process_cpu_seconds_total 3\n'))).toBeNull();
  });
});

describe('SGLang', () => {
  it('the documented example (no cached-token counter): the engine\'s hit-rate gauge, queue, running, token usage', () => {
    expect(engine('sglang-docs.txt')).toEqual({
      at: 1000,
      generation: 'sglang-gauge',
      hitRateGauge: 0.007507552643049313,
      waiting: 2826,
      running: 162,
      kvUsage: 0.28,
      engines: 1,
    });
  });

  it('current release, two data-parallel schedulers: token counters win over the gauge, counts summed, usage averaged, KV pool in tokens', () => {
    expect(engine('sglang-tokens-dp2.txt')).toEqual({
      at: 1000,
      generation: 'sglang-tokens',
      prefixQueries: 42_000_000,
      prefixHits: 29_400_000,
      unit: 'tokens',
      waiting: 7,
      running: 42,
      kvUsage: 0.5,
      blockSize: 1,
      numGpuBlocks: 1_004_110,
      engines: 2,
    });
  });

  it('a declared cached-token counter with no series yet (no hit so far) reads as 0 hits, not as a missing counter', () => {
    const text = fixture('engine-metrics', 'sglang-tokens-dp2.txt').replace(/^sglang:cached_tokens_total\{.*$/m, '');
    const s = engine('sglang-tokens-dp2.txt');
    const empty = extractEngineSample(parsePromText(text), 1000);
    expect(empty.generation).toBe('sglang-tokens');
    expect(empty.prefixHits).toBe(0);
    expect(s.prefixHits).toBe(29_400_000);
  });

  it('tensor-parallel ranks of one scheduler are counted once', () => {
    const text = [
      'sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 8',
      'sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0"} 8',
      'sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 3',
      'sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0"} 3',
    ].join('\n');
    expect(extractEngineSample(parsePromText(text), 1)).toEqual({ at: 1, generation: 'none', waiting: 3, running: 8, engines: 1 });
  });

  it('hit rate over the window from counter deltas, across a restart', () => {
    const at = (t: number, prompt: number, cached: number): EngineSample<SampleGeneration> =>
      extractEngineSample(parsePromText(`# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name="m"} ${prompt}\n# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{model_name="m"} ${cached}\n`), t);
    let w = emptyHitRateWindow();
    for (const s of [at(0, 1000, 100), at(5000, 3000, 1100), at(10_000, 500, 400)]) w = pushSample(w, s, 60_000);
    // Δ = (2000 queries, 1000 hits) then a reset: the new values are the increase since it.
    expect(windowHitRate(w)).toBeCloseTo(1400 / 2500, 12);
    expect(w.resets).toBe(1);
  });

  it('the gauge generation keeps the latest value, like vLLM V0', () => {
    let w = emptyHitRateWindow();
    w = pushSample(w, engine('sglang-docs.txt', 1), 60_000);
    w = pushSample(w, { at: 2, generation: 'sglang-gauge', hitRateGauge: 0.5 }, 60_000);
    expect(windowHitRate(w)).toBe(0.5);
  });
});

describe('llama.cpp server', () => {
  it('current release: hit rate = cached / (processed + cached), deferred = waiting, processing = running', () => {
    expect(engine('llamacpp-current.txt')).toEqual({
      at: 1000,
      generation: 'llamacpp-tokens',
      prefixQueries: 1_000_000,
      prefixHits: 750_000,
      unit: 'tokens',
      waiting: 9,
      running: 4,
      engines: 1,
    });
    let w = pushSample(emptyHitRateWindow(), engine('llamacpp-current.txt', 0), 60_000);
    w = pushSample(w, extractEngineSample(parsePromText(fixture('engine-metrics', 'llamacpp-current.txt').replace('cached_total 750000', 'cached_total 790000').replace('prompt_tokens_total 250000', 'prompt_tokens_total 260000')), 5000), 60_000);
    expect(windowHitRate(w)).toBeCloseTo(40_000 / 50_000, 12);
  });

  it('older release: KV usage ratio, no cached-token counter so no hit rate', () => {
    expect(engine('llamacpp-legacy.txt')).toEqual({ at: 1000, generation: 'none', waiting: 0, running: 2, kvUsage: 0.3125, engines: 1 });
  });

  it('a hostile body with llama.cpp names cannot make the parser throw or report non-finite values', () => {
    const s = extractEngineSample(parsePromText('llamacpp:requests_deferred NaN\nllamacpp:requests_processing +Inf\nllamacpp:prompt_tokens_total -Inf\nllamacpp:prompt_tokens_cached_total 5\n'), 1);
    expect(s).toEqual({ at: 1, generation: 'none' });
  });
});
