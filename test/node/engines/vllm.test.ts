import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parsePromText } from '../../../src/engines/prom-text.js';
import { emptyHitRateWindow, pushSample, windowHitRate, windowTotals, type HitRateWindowState } from '../../../src/engines/hit-rate.js';
import type { EngineSample, SampleGeneration } from '../../../src/engines/index.js';
import { extractVllmSample, refusesEngineRank, refusesEngineRankConverted } from '../../../src/engines/vllm.js';

const fixture = (name: string): string => readFileSync(join(import.meta.dirname, '../../fixtures/vllm-metrics', name), 'utf8');
const extract = (name: string, at = 1000) => extractVllmSample(parsePromText(fixture(name)), at);

describe('extractVllmSample', () => {
  it('V1 token counters (vLLM ≥ 0.9), prometheus_client _total names, one engine', () => {
    expect(extract('v1-tokens.txt')).toEqual({
      at: 1000,
      generation: 'v1-tokens',
      prefixQueries: 1_284_032,
      prefixHits: 917_504,
      unit: 'tokens',
      waiting: 3,
      running: 12,
      kvUsage: 0.4172,
      blockSize: 16,
      numGpuBlocks: 27034,
      engines: 1,
    });
  });

  it('two data-parallel engines: counts summed, fractions averaged, new names win over deprecated ones', () => {
    expect(extract('v1-tokens-dp2.txt')).toEqual({
      at: 1000,
      generation: 'v1-tokens',
      prefixQueries: 100_000,
      prefixHits: 60_000,
      unit: 'tokens',
      waiting: 7,
      running: 16,
      kvUsage: 0.5,
      blockSize: 16,
      numGpuBlocks: 40_000,
      engines: 2,
    });
  });

  it('older V1 gpu_prefix_cache_* in blocks, gpu_cache_usage_perc, no engine label', () => {
    expect(extract('v1-blocks.txt')).toEqual({
      at: 1000,
      generation: 'v1-blocks',
      prefixQueries: 5120,
      prefixHits: 1280,
      unit: 'blocks',
      waiting: 0,
      running: 4,
      kvUsage: 0.0625,
      blockSize: 16,
      numGpuBlocks: 12000,
      engines: 1,
    });
  });

  it('old names whose HELP says tokens are read as tokens', () => {
    // vLLM 0.9.x wrote "queried" + "tokens" with no space between them.
    const text = fixture('v1-tokens-dp2.txt')
      .split('\n')
      .filter((l) => !/^(# (HELP|TYPE) )?vllm:prefix_cache_/.test(l))
      .join('\n');
    const s = extractVllmSample(parsePromText(text), 5);
    expect(s.generation).toBe('v1-blocks');
    expect(s.unit).toBe('tokens');
    expect(s.prefixQueries).toBe(100_000);
  });

  it('V0 hit-rate gauge', () => {
    const s = extract('v0-gauge.txt');
    expect(s).toEqual({
      at: 1000,
      generation: 'v0-gauge',
      hitRateGauge: 0.6431,
      waiting: 11,
      running: 6,
      kvUsage: 0.8812,
      blockSize: 16,
      numGpuBlocks: 7281,
      engines: 1,
    });
    expect(s.prefixQueries).toBeUndefined();
  });

  it('a body with no vLLM metrics', () => {
    expect(extractVllmSample(parsePromText('up 1\n'), 7)).toEqual({ at: 7, generation: 'none' });
    expect(extractVllmSample(parsePromText(''), 7)).toEqual({ at: 7, generation: 'none' });
  });

  it('ignores NaN gauges, filters by model name', () => {
    const text = [
      'vllm:num_requests_waiting{model_name="a",engine="0"} NaN',
      'vllm:num_requests_waiting{model_name="b",engine="0"} 2',
      'vllm:kv_cache_usage_perc{model_name="a",engine="0"} NaN',
      'vllm:cache_config_info{block_size="16",num_gpu_blocks="None",engine="0"} 1',
    ].join('\n');
    const p = parsePromText(text);
    expect(extractVllmSample(p, 1)).toEqual({ at: 1, generation: 'none', waiting: 2, blockSize: 16, engines: 1 });
    expect(extractVllmSample(p, 1, { modelName: 'a' })).toEqual({ at: 1, generation: 'none', engines: 1 });
  });
});

describe('HitRateWindow', () => {
  const scrapes = fixture('counter-reset-sequence.txt')
    .split(/^(?=# SCRAPE at=)/m)
    .filter((c) => c.startsWith('# SCRAPE'))
    .map((chunk) => extractVllmSample(parsePromText(chunk), Number(/^# SCRAPE at=(\d+)/.exec(chunk)![1])));

  const run = (samples: EngineSample<SampleGeneration>[], windowMs: number, state: HitRateWindowState = emptyHitRateWindow()) =>
    samples.reduce((s, x) => pushSample(s, x, windowMs), state);

  it('reads the fixture as five scrapes 15 s apart with a restart', () => {
    expect(scrapes.map((s) => [s.at, s.prefixQueries, s.prefixHits])).toEqual([
      [0, 10000, 6000],
      [15000, 12000, 7500],
      [30000, 14000, 9000],
      [45000, 1000, 200],
      [60000, 3000, 1700],
    ]);
  });

  it('survives a counter reset: the value after the reset is the increase since it', () => {
    const s = run(scrapes, 60_000);
    expect(windowTotals(s)).toEqual({ queries: 7000, hits: 4700, unit: 'tokens', spanMs: 60_000, resets: 1 });
    expect(windowHitRate(s)).toBeCloseTo(4700 / 7000, 12);
    expect(s.resets).toBe(1);
  });

  it('slides: a 30 s window keeps the baseline at 30 s and drops older points', () => {
    const s = run(scrapes, 30_000);
    expect(s.points.map((p) => p.at)).toEqual([30000, 45000, 60000]);
    expect(windowTotals(s)).toMatchObject({ queries: 3000, hits: 1700, spanMs: 30_000 });
    expect(windowHitRate(s)).toBeCloseTo(1700 / 3000, 12);
  });

  it('null until there are two points, and with no queries in the window', () => {
    const one = run(scrapes.slice(0, 1), 60_000);
    expect(windowHitRate(one)).toBeNull();
    const idle = run([scrapes[0]!, { ...scrapes[0]!, at: 15_000 }], 60_000);
    expect(windowHitRate(idle)).toBeNull();
  });

  it('does not modify its input, ignores stale or duplicate timestamps', () => {
    const s1 = run(scrapes.slice(0, 2), 60_000);
    const frozen = JSON.stringify(s1);
    const s2 = pushSample(s1, scrapes[2]!, 60_000);
    expect(JSON.stringify(s1)).toBe(frozen);
    expect(s2.points).toHaveLength(3);
    expect(pushSample(s2, { ...scrapes[4]!, at: 30_000 }, 60_000)).toBe(s2);
    expect(pushSample(s2, { ...scrapes[4]!, at: 10_000 }, 60_000)).toBe(s2);
  });

  it('stays bounded', () => {
    let s = emptyHitRateWindow();
    for (let i = 0; i < 10_000; i++) {
      s = pushSample(s, { at: i * 1000, generation: 'v1-tokens', unit: 'tokens', prefixQueries: i * 10, prefixHits: i * 5 }, 3_600_000, { maxPoints: 50 });
    }
    expect(s.points).toHaveLength(50);
    expect(windowHitRate(s)).toBe(0.5);
  });

  it('starts over when the generation or unit changes, empties on none', () => {
    const s = run(scrapes.slice(0, 3), 60_000);
    const blocks = pushSample(s, { at: 40_000, generation: 'v1-blocks', unit: 'blocks', prefixQueries: 5, prefixHits: 1 }, 60_000);
    expect(blocks.points).toHaveLength(1);
    expect(blocks.unit).toBe('blocks');
    expect(windowHitRate(blocks)).toBeNull();
    const none = pushSample(s, { at: 40_000, generation: 'none' }, 60_000);
    expect(none.points).toHaveLength(0);
    expect(windowHitRate(none)).toBeNull();
  });

  it('V0: reports the latest gauge', () => {
    const v0 = extract('v0-gauge.txt', 1000);
    let s = pushSample(emptyHitRateWindow(), v0, 60_000);
    expect(windowHitRate(s)).toBe(0.6431);
    s = pushSample(s, { ...v0, at: 2000, hitRateGauge: 0.7 }, 60_000);
    expect(windowHitRate(s)).toBe(0.7);
    expect(s.points).toEqual([]);
  });

  it('is plain JSON', () => {
    const s = run(scrapes, 60_000);
    expect(JSON.parse(JSON.stringify(s))).toEqual(s);
    expect(windowHitRate(JSON.parse(JSON.stringify(s)) as HitRateWindowState)).toBe(windowHitRate(s));
  });
});

describe('refusesEngineRank', () => {
  const body = (message: unknown, shape: 'openai' | 'anthropic' = 'openai') =>
    JSON.stringify(shape === 'openai' ? { error: { message, type: 'BadRequestError', param: null, code: 400 } } : { type: 'error', error: { type: 'invalid_request_error', message } });
  it("is vLLM's exact refusal of the rank the router sent, in either error shape", () => {
    expect(refusesEngineRank(body('data_parallel_rank 1 is out of range [0, 1).'), 1)).toBe(true);
    expect(refusesEngineRank(body('data_parallel_rank 3 is out of range [0, 2).', 'anthropic'), 3)).toBe(true);
    // Another rank than the router's, or the message inside a longer one (a validation error
    // echoing a client's field value): not a refusal of the pin.
    expect(refusesEngineRank(body('data_parallel_rank 1 is out of range [0, 1).'), 0)).toBe(false);
    expect(refusesEngineRank(body("1 validation error: stop: input 'data_parallel_rank 1 is out of range [0, 1).'"), 1)).toBe(false);
    expect(refusesEngineRank('data_parallel_rank 1 is out of range [0, 1).', 1)).toBe(false);
    expect(refusesEngineRank(body(42), 1)).toBe(false);
  });
});

describe('refusesEngineRankConverted', () => {
  // vLLM's Messages stream error for a chat error chunk: pydantic's text, the chunk cut to 25 + 24 characters.
  const cut = (head: string, tail: string) => `{'error': {'message': '${head}...${tail}`;
  const line = (input: string) => `  Field required [type=missing, input_value=${input}, input_type=dict]`;
  const url = '    For further information visit https://errors.pydantic.dev/2.12/v/missing';
  const event = (input: string, o: { type?: string; first?: string } = {}) =>
    JSON.stringify({
      type: 'error',
      error: { type: o.type ?? 'internal_error', message: [o.first ?? '2 validation errors for ChatCompletionStreamResponse', 'model', line(input), url, 'choices', line(input), url].join('\n') },
    });
  it("is the converter's error for a 400 whose message starts \"da\" (the rank check's), and nothing else", () => {
    expect(refusesEngineRankConverted(event(cut('da', "am': None, 'code': 400}}")))).toBe(true);
    // vLLM's "Internal server error" (a GenerationError, 500): an engine failure, charged as one.
    expect(refusesEngineRankConverted(event(cut('In', "am': None, 'code': 500}}")))).toBe(false);
    // Another 400 (its message starts otherwise).
    expect(refusesEngineRankConverted(event(cut('Th', "am': None, 'code': 400}}")))).toBe(false);
    // The right cut inside another error type or another class's validation text.
    expect(refusesEngineRankConverted(event(cut('da', "am': None, 'code': 400}}"), { type: 'invalid_request_error' }))).toBe(false);
    expect(refusesEngineRankConverted(event(cut('da', "am': None, 'code': 400}}"), { first: '2 validation errors for ChatMessage' }))).toBe(false);
    // The text echoed inside a longer message (a client's field value): not the whole shape.
    const echoed = JSON.stringify({ type: 'error', error: { type: 'internal_error', message: `bad stop: ${line(cut('da', "am': None, 'code': 400}}"))}` } });
    expect(refusesEngineRankConverted(echoed)).toBe(false);
    expect(refusesEngineRankConverted('not json')).toBe(false);
  });
});
