import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig, parseConfig, replicaUrlProblem } from '../../../src/config.js';

const pool = (over: Record<string, unknown> = {}) => ({
  name: 'chat',
  models: ['m'],
  replicas: [{ id: 'r1', url: 'https://a.example.com', auth: 'bearer:KEY' }],
  ...over,
});

function errorOf(raw: unknown): string {
  try {
    parseConfig(raw);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

describe('configuration', () => {
  it('fills defaults and builds strategies and key sources', () => {
    const c = parseConfig({ pools: [pool()] });
    const p = c.poolByName.get('chat')!;
    expect(p.strategyImpl.name).toBe('prefix-aware:1.25:3');
    expect(p.strategyImpl.usesPrefix).toBe(true);
    expect(p.fallbackImpl.name).toBe('least-load');
    expect(p.keySources.map((k) => k.kind)).toEqual(['header', 'body', 'tenant', 'prefix']);
    expect(c.maxBodyBytes).toBe(2 * 1024 * 1024);
    expect(c.maxRetries).toBe(2);
    expect(c.firstTokenTimeoutMs).toBe(60_000);
    expect(p.replicas[0]!.weight).toBe(1);
    expect(c.poolByModel.get('m')).toBe(p);
  });

  it('firstTokenTimeoutMs: its old name firstByteTimeoutMs still sets it; the new name wins when both are set', () => {
    expect(parseConfig({ pools: [pool()], firstByteTimeoutMs: 7_000 }).firstTokenTimeoutMs).toBe(7_000);
    expect(parseConfig({ pools: [pool()], firstTokenTimeoutMs: 9_000, firstByteTimeoutMs: 7_000 }).firstTokenTimeoutMs).toBe(9_000);
    expect(() => parseConfig({ pools: [pool()], firstTokenTimeoutMs: 5 })).toThrow(/firstTokenTimeoutMs/);
  });

  it('accepts a JSON string and caches the parse per value', () => {
    const raw = JSON.stringify({ pools: [pool()] });
    expect(loadConfig(raw)).toBe(loadConfig(raw));
  });

  it('routes a model listed by two pools to the first', () => {
    const c = parseConfig({ pools: [pool(), pool({ name: 'extraction', strategy: 'least-load' })] });
    expect(c.poolByModel.get('m')!.name).toBe('chat');
  });

  it.each([
    [{ pools: [pool({ strategy: 'bounded-hash:50' })] }, 'ROUTER_CONFIG.pools.0.strategy'],
    [{ pools: [pool({ strategy: 'nope' })] }, 'unknown strategy'],
    [{ pools: [pool({ fallback: 'hash' })] }, 'ROUTER_CONFIG.pools.0.fallback'],
    [{ pools: [pool({ keys: ['cookie:x'] })] }, 'ROUTER_CONFIG.pools.0.keys.0'],
    [{ pools: [pool({ replicas: [{ id: 'r1', url: 'http://10.0.0.5:8000' }] })] }, 'ROUTER_CONFIG.pools.0.replicas.0.url'],
    [{ pools: [pool({ replicas: [{ id: 'r1', url: 'https://u:p@a.example.com' }] })] }, 'credentials'],
    [{ pools: [pool({ replicas: [{ id: 'r1', url: 'https://a.example.com', weight: 0 }] })] }, 'replicas.0.weight'],
    [{ pools: [pool({ replicas: [{ id: 'r1', url: 'https://a.example.com', auth: 'password:X' }] })] }, 'replicas.0.auth'],
    [{ pools: [pool({ replicas: [{ id: 'r1', url: 'https://a.example.com' }, { id: 'r1', url: 'https://b.example.com' }] })] }, 'duplicate replica id'],
    [{ pools: [pool(), pool()] }, 'duplicate pool'],
    [{ pools: [pool()], defaultPool: 'missing' }, 'ROUTER_CONFIG.defaultPool'],
    [{ pools: [] }, 'ROUTER_CONFIG.pools'],
    ['{not json', 'not valid JSON'],
    [undefined, 'not set'],
  ])('names the bad field (%#)', (raw, needle) => {
    expect(errorOf(raw)).toContain(needle);
  });

  it.each([
    ['https://vllm.example.com', null],
    ['http://127.0.0.1:9001', null],
    ['http://localhost:8000', null],
    ['http://vllm.example.com', 'https'],
    ['https://169.254.169.254', 'private'],
    ['https://10.1.2.3', 'private'],
    ['https://192.168.0.1', 'private'],
    ['https://[fe80::1]', 'private'],
    ['https://metadata.google.internal', 'private'],
    ['https://0xa9fea9fe', 'private'], // normalised by the URL parser to 169.254.169.254
    ['ftp://a.example.com', 'https'],
    ['https://a.example.com/?x=1', 'query'],
    ['not a url', 'not a URL'],
  ])('replica URL %s', (url, problem) => {
    const p = replicaUrlProblem(url);
    if (problem === null) expect(p).toBeNull();
    else expect(p).toContain(problem);
  });
});

describe('engine and keyless endpoints', () => {
  it('defaults to vLLM, which serves every keyless API; other engines serve their own lists', () => {
    const c = parseConfig({ pools: [pool(), pool({ name: 'sg', engine: 'sglang' }), pool({ name: 'll', engine: 'llamacpp' })] });
    expect(c.poolByName.get('chat')!.engine).toBe('vllm');
    expect([...c.poolByName.get('chat')!.keylessApis]).toEqual(['embeddings', 'rerank', 'score', 'tokenize', 'detokenize']);
    expect([...c.poolByName.get('sg')!.keylessApis]).toEqual(['embeddings', 'rerank', 'tokenize', 'detokenize']);
    expect([...c.poolByName.get('ll')!.keylessApis]).toEqual(['embeddings', 'rerank', 'detokenize']);
  });

  it("salts stay on for SGLang: it honours cache_salt (sgl-project/sglang#10317, #23300), so every engine's default is tenant (issue #26 item 4)", () => {
    const c = parseConfig({ pools: [pool(), pool({ name: 'sg', engine: 'sglang' }), pool({ name: 'll', engine: 'llamacpp' })] });
    expect(c.poolByName.get('chat')!.cacheSalt).toBe('tenant');
    expect(c.poolByName.get('sg')!.cacheSalt).toBe('tenant');
  });

  it('an endpoint list overrides the engine\'s (an empty one makes a chat-only pool)', () => {
    const c = parseConfig({ pools: [pool({ endpoints: [] }), pool({ name: 'emb', engine: 'llamacpp', endpoints: ['embeddings'] })] });
    expect(c.poolByName.get('chat')!.keylessApis.size).toBe(0);
    expect([...c.poolByName.get('emb')!.keylessApis]).toEqual(['embeddings']);
  });

  it('names a bad engine or endpoint', () => {
    expect(errorOf({ pools: [pool({ engine: 'tgi' })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.engine/);
    expect(errorOf({ pools: [pool({ endpoints: ['embeddings', 'chat'] })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.endpoints\.1/);
    expect(errorOf({ pools: [pool({ endpoints: 'embeddings' })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.endpoints/);
  });
});

describe('prefix-aware limits (#17)', () => {
  it('caps the index at what fits in an isolate and refuses a balance factor ≤ 1.0, naming the field', () => {
    expect(parseConfig({ pools: [pool()] }).pools[0]!.prefixIndexMaxEntries).toBe(1 << 19);
    expect(parseConfig({ pools: [pool({ prefixIndexMaxEntries: 1 << 19 })] }).pools[0]!.prefixIndexMaxEntries).toBe(1 << 19);
    expect(() => parseConfig({ pools: [pool({ prefixIndexMaxEntries: (1 << 19) + 1 })] })).toThrow(/prefixIndexMaxEntries.*isolate/);
    expect(() => parseConfig({ pools: [pool({ strategy: 'bounded-hash:1.0' })] })).toThrow(/strategy.*must be > 1/);
    expect(() => parseConfig({ pools: [pool({ strategy: 'prefix-aware:100' })] })).toThrow(/strategy.*1\.0/);
  });
});

describe('dataParallelPinning (#17)', () => {
  it('is on unless set false, and refused as true on a pool whose engine is not vLLM', () => {
    expect(parseConfig({ pools: [pool()] }).pools[0]!.dataParallelPinning).toBeUndefined();
    expect(parseConfig({ pools: [pool({ dataParallelPinning: false })] }).pools[0]!.dataParallelPinning).toBe(false);
    expect(parseConfig({ pools: [pool({ engine: 'sglang', dataParallelPinning: false })] }).pools[0]!.dataParallelPinning).toBe(false);
    expect(errorOf({ pools: [pool({ engine: 'sglang', dataParallelPinning: true })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.dataParallelPinning: pins vLLM's/);
    expect(errorOf({ pools: [pool({ dataParallelPinning: 'yes' })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.dataParallelPinning/);
    // The rank header is the router's alone: a pool cannot forward a client's copy.
    expect(errorOf({ pools: [pool({ forwardHeaders: ['X-Data-Parallel-Rank'] })] })).toMatch(/forwardHeaders.*may never be forwarded/);
    // Nor vLLM's priority header (it overrides the fenced body `priority`), nor the raw session id
    // (it goes upstream only as the per-tenant HMAC): issue #26 item 4.
    expect(errorOf({ pools: [pool({ forwardHeaders: ['X-Vllm-Priority'] })] })).toMatch(/forwardHeaders.*may never be forwarded/);
    expect(errorOf({ pools: [pool({ forwardHeaders: ['x-session-id'] })] })).toMatch(/forwardHeaders.*may never be forwarded/);
    expect(errorOf({ pools: [pool({ forwardHeaders: ['X-Smg-Routing-Key'] })] })).toMatch(/forwardHeaders.*may never be forwarded/);
  });
});

// Review of #17: dataParallelPinning = true where nothing can pin (only prefix-aware pools pin
// engines, coordinator/dp-engines.ts) is a clear configuration error, not silently ignored.
describe('dataParallelPinning on a pool that cannot pin', () => {
  it('is refused as true on a strategy without prefix matching, allowed as false or unset', () => {
    expect(errorOf({ pools: [pool({ strategy: 'bounded-hash:1.25', dataParallelPinning: true })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.dataParallelPinning: .*prefix-aware/);
    expect(parseConfig({ pools: [pool({ strategy: 'bounded-hash:1.25', dataParallelPinning: false })] }).pools[0]!.dataParallelPinning).toBe(false);
    expect(parseConfig({ pools: [pool({ strategy: 'least-load' })] }).pools[0]!.dataParallelPinning).toBeUndefined();
    expect(parseConfig({ pools: [pool({ strategy: 'prefix-aware', dataParallelPinning: true })] }).pools[0]!.dataParallelPinning).toBe(true);
  });
});

describe('flowControl (#29)', () => {
  it('defaults: on, tokens, three bands with normal the default', () => {
    const f = parseConfig({ pools: [pool()] }).pools[0]!.flowControl;
    expect(f.enabled).toBe(true);
    expect(f.fairness).toBe('tokens');
    expect(f.bands.map((b) => b.name)).toEqual(['high', 'normal', 'low']);
    expect(f.bands[1]!.maxQueueMs).toBe(30_000);
    expect(f.defaultBand).toBe('normal');
    const g = parseConfig({ pools: [pool({ flowControl: { enabled: false } })] }).pools[0]!.flowControl;
    expect(g.enabled).toBe(false);
    expect(g.bands).toHaveLength(3);
  });

  it('names the bad field: an unknown default band, a duplicate band, an unknown key', () => {
    expect(errorOf({ pools: [pool({ flowControl: { defaultBand: 'gold' } })] })).toMatch(/defaultBand.*"gold" is not one of the bands/s);
    expect(errorOf({ pools: [pool({ flowControl: { bands: [{ name: 'a', maxQueueMs: 10, maxQueueLength: 1 }, { name: 'a', maxQueueMs: 10, maxQueueLength: 1 }], defaultBand: 'a' } })] })).toMatch(/duplicate band "a"/);
    expect(errorOf({ pools: [pool({ flowControl: { fairnes: 'tokens' } })] })).toMatch(/fairnes/);
    expect(errorOf({ pools: [pool({ flowControl: { preemptStreams: true } })] })).toMatch(/preemptStreams.*set preempt: true/s);
    expect(parseConfig({ pools: [pool({ flowControl: { preempt: true, preemptStreams: true } })] }).pools[0]!.flowControl.preemptStreams).toBe(true);
    expect(errorOf({ pools: [pool({ flowControl: { fairness: 'bytes' } })] })).toMatch(/fairness/);
    const bands = (h: number[]) => h.map((headroom, i) => ({ name: `b${i}`, maxQueueMs: 10, maxQueueLength: 1, headroom }));
    expect(errorOf({ pools: [pool({ flowControl: { bands: bands([0, 2, 1]), defaultBand: 'b0' } })] })).toMatch(/bands.*2.*headroom.*at least the band above's \(2\)/s);
    expect(parseConfig({ pools: [pool({ flowControl: { bands: bands([0, 1, 1]), defaultBand: 'b0' } })] }).pools[0]!.flowControl.bands[2]!.headroom).toBe(1);
  });
});
