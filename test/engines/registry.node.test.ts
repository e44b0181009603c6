// src/engines/index.ts: which keyless APIs each engine serves and the origin path for each.
import { describe, expect, it } from 'vitest';
import { engineApiPath, engineApis } from '../../src/engines/index.js';

describe('engines', () => {
  it('vLLM keeps the path the client called (it serves every alias)', () => {
    for (const p of ['/v1/rerank', '/rerank', '/v2/rerank']) expect(engineApiPath('vllm', 'rerank', p)).toBe(p);
    expect(engineApiPath('vllm', 'tokenize', '/tokenize')).toBe('/tokenize');
  });

  it('SGLang and llama.cpp get their own rerank path whatever alias was called', () => {
    for (const e of ['sglang', 'llamacpp'] as const) for (const p of ['/v1/rerank', '/rerank', '/v2/rerank']) expect(engineApiPath(e, 'rerank', p)).toBe('/v1/rerank');
    expect(engineApiPath('sglang', 'detokenize', '/detokenize')).toBe('/detokenize');
  });

  it('lists in KEYLESS_APIS order, leaving out what an engine serves in another shape', () => {
    expect(engineApis('vllm')).toEqual(['embeddings', 'rerank', 'score', 'tokenize', 'detokenize']);
    expect(engineApis('sglang')).not.toContain('score');
    expect(engineApis('llamacpp')).toEqual(['embeddings', 'rerank', 'detokenize']);
  });
});
