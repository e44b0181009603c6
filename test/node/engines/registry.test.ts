// src/engines/index.ts, the registry: which keyless APIs each engine serves and the origin path for
// each, and what the registry assumes of its profiles.
import { describe, expect, it } from 'vitest';
import { ENGINE_PROFILES, engineApiPath, engineApis, ENGINES, hitRateSource } from '../../../src/engines/index.js';
import { ENGINE_CONTROL_FIELDS, engineFieldProblem } from '../../../src/engines/request-fields.js';

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

  it('names each engine once, in the order scrapes are matched (vLLM first, the default)', () => {
    expect(ENGINES).toEqual(['vllm', 'sglang', 'llamacpp']);
    expect(new Set(ENGINE_PROFILES.map((p) => p.name)).size).toBe(ENGINE_PROFILES.length);
  });

  it('gives every hit-rate generation to one engine only (hitRateSource looks them up by name)', () => {
    const all = ENGINE_PROFILES.flatMap((p) => Object.keys(p.hitRateSources));
    expect(new Set(all).size).toBe(all.length);
    expect(all).not.toContain('none');
    expect(hitRateSource('v0-gauge')).toBe('gauge');
    expect(hitRateSource('sglang-gauge')).toBe('gauge');
    expect(hitRateSource('llamacpp-tokens')).toBe('counters');
    expect(hitRateSource('none')).toBeNull();
  });

  it('fences every engine\'s control fields, in registry order, each once', () => {
    expect(Object.keys(ENGINE_CONTROL_FIELDS)).toEqual([
      'priority', 'kv_transfer_params', 'ec_transfer_params', 'vllm_xargs', 'logits_processors', 'chat_template', 'mm_processor_kwargs', 'media_io_kwargs', 'guided_decoding_backend', 'data_parallel_rank',
      'rid', 'bootstrap_host', 'bootstrap_port', 'bootstrap_room', 'custom_logit_processor', 'return_hidden_states', 'session_params', 'extra_key', 'lora_path', 'routed_dp_rank', 'disagg_prefill_dp_rank',
      'id_slot',
    ]);
    for (const p of ENGINE_PROFILES) for (const f of Object.keys(p.controlFields)) expect(engineFieldProblem(f), `${p.name}: ${f}`).toBeNull();
    expect(engineFieldProblem('temperature')).toMatch(/not an engine control field/);
  });
});
