// Replica model parameters (one vLLM replica of an 8B model on one H100 80 GB) and their
// defaults; docs/simulator.md derives every number. Pure, except `loadProfile` reads a file.

import { readFileSync } from 'node:fs';

export interface ReplicaProfile {
  /** KV cache size in 16-token blocks (Llama-3.1-8B bf16 on H100 80 GB at 0.9 utilisation: ~28k). */
  readonly kvCapacityBlocks: number;
  /** Cap on running sequences (vLLM `max_num_seqs`). */
  readonly maxRunning: number;
  /** Tokens per engine step, decode and prefill together (vLLM `max_num_batched_tokens`, chunked prefill). */
  readonly maxBatchedTokens: number;
  /** Prefill throughput for short contexts, tokens/s. */
  readonly prefillTokensPerSec: number;
  /** Context length at which attention doubles a prefill token's cost (FLOPs of attention = FLOPs of the weights). */
  readonly prefillAttentionTokens: number;
  /** Fixed cost of one engine step: reading the weights plus launch overhead, ms. */
  readonly stepBaseMs: number;
  /** Extra step cost per sequence in the batch, ms. */
  readonly stepPerSeqMs: number;
  /** Extra decode step cost per 1000 tokens of KV read by the decoding sequences, ms. */
  readonly kvReadMsPerKToken: number;
}

export const DEFAULT_PROFILE: ReplicaProfile = Object.freeze({
  kvCapacityBlocks: 28_000,
  maxRunning: 256,
  maxBatchedTokens: 8192,
  prefillTokensPerSec: 20_000,
  prefillAttentionTokens: 32_768,
  stepBaseMs: 7,
  stepPerSeqMs: 0.02,
  kvReadMsPerKToken: 0.06,
});

const KEYS = Object.keys(DEFAULT_PROFILE) as (keyof ReplicaProfile)[];

/** Merge a partial profile over the defaults; every field must be a positive number (capacity may be Infinity). */
export function resolveProfile(partial: Partial<Record<string, unknown>> = {}): ReplicaProfile {
  const out: Record<string, number> = { ...DEFAULT_PROFILE };
  for (const [k, v] of Object.entries(partial)) {
    if (k.startsWith('$') || k === 'comment') continue;
    if (!KEYS.includes(k as keyof ReplicaProfile)) throw new RangeError(`profile: unknown field "${k}" (known: ${KEYS.join(', ')})`);
    const n = v === 'inf' || v === 'Infinity' ? Infinity : v;
    if (typeof n !== 'number' || !(n >= 0)) throw new RangeError(`profile: ${k} must be a number ≥ 0, got ${JSON.stringify(v)}`);
    out[k] = n;
  }
  for (const k of ['kvCapacityBlocks', 'maxRunning', 'maxBatchedTokens', 'prefillTokensPerSec', 'prefillAttentionTokens'] as const) {
    if (!(out[k]! > 0)) throw new RangeError(`profile: ${k} must be > 0`);
  }
  return out as unknown as ReplicaProfile;
}

export function loadProfile(path: string): ReplicaProfile {
  return resolveProfile(JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>);
}
