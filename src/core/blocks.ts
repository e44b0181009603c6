// Chained block hashes of the canonical prompt, the unit of the prefix index. Pure: hashes
// the text handed in; one reused scratch buffer, no I/O.
//
// The prompt (`canonicalPrompt(body)`, the same canonical form the `prefix` routing key
// hashes) is UTF-8 encoded and cut into full blocks of `blockBytes` bytes. Each block's hash
// covers everything before it:
//
//   h_0 = murmur3(block_0, seed = BLOCK_SEED)
//   h_i = murmur3(block_i, seed = h_{i−1})
//
// so two prompts share h_0..h_{k−1} exactly when (up to 32-bit collisions) they share their
// first k blocks, and a change inside block k changes h_k and every hash after it. A
// trailing partial block is not hashed: vLLM caches full blocks only, and a partial block
// never matches the full block the next turn will carry.
//
// Why 256 bytes (≈ 64 tokens at ~4 bytes per token of English or code): vLLM caches in
// 16-token blocks; a router block 4× coarser keeps the index 4× smaller and the per-pick walk
// 4× shorter, while still resolving one turn of a conversation (a user turn plus an answer is
// typically hundreds of tokens). What is lost: up to one router block (≈ 64 tokens, or
// 255 bytes) of a match at the point where two prompts diverge, which the replica's own
// 16-token cache does reuse, and the byte/token ratio drifts with language (CJK text is ~3
// bytes a character, so 256 bytes is fewer tokens). Matching is a routing hint, not an
// accounting: the replica still reports what it really reused.
//
// At most `maxBlocks` blocks are hashed (default 512 = 128 KiB ≈ 32K tokens): the
// encoder stops at the cap, so the cost per request is bounded whatever the prompt size.

import { murmur3 } from './hash.js';
import { canonicalPrompt } from './keys.js';

/** Router block size in UTF-8 bytes (≈ 64 tokens; 4 vLLM blocks of 16 tokens). */
export const DEFAULT_BLOCK_BYTES = 256;
/** Blocks hashed per request (512 × 256 B = 128 KiB). */
export const DEFAULT_MAX_BLOCKS = 512;
/** Tokens a router block stands for, for converting a replica's KV capacity into router blocks. */
export const DEFAULT_BLOCK_TOKENS = 64;
/** Seed of the first block; any fixed value works, this one only has to never change. */
export const BLOCK_SEED = 0x70726678; // "prfx"

export interface BlockHashOptions {
  /** Block size in UTF-8 bytes, ≥ 16. Default 256. */
  readonly blockBytes?: number;
  /** Most blocks hashed, ≥ 0. Default 512. */
  readonly maxBlocks?: number;
  /**
   * Mixed into the first block's seed: the tenant where the engine's cache is salted per tenant
   * (keys.ts `namespaceSeed`), so the index never counts another tenant's blocks as a match the
   * engine could not hit. Default: none (BLOCK_SEED alone).
   */
  readonly seed?: number;
}

const encoder = new TextEncoder();
let scratch = new Uint8Array(DEFAULT_BLOCK_BYTES * DEFAULT_MAX_BLOCKS);

function resolve(options: BlockHashOptions | undefined): { blockBytes: number; maxBlocks: number } {
  const blockBytes = options?.blockBytes ?? DEFAULT_BLOCK_BYTES;
  const maxBlocks = options?.maxBlocks ?? DEFAULT_MAX_BLOCKS;
  if (!Number.isInteger(blockBytes) || blockBytes < 16) throw new RangeError(`blockBytes must be an integer ≥ 16, got ${blockBytes}`);
  if (!Number.isInteger(maxBlocks) || maxBlocks < 0) throw new RangeError(`maxBlocks must be an integer ≥ 0, got ${maxBlocks}`);
  return { blockBytes, maxBlocks };
}

/** Chained hashes of the full blocks of `bytes[0, length)`, at most `maxBlocks`. */
export function blockHashesOfBytes(bytes: Uint8Array, options?: BlockHashOptions, length = bytes.length): Uint32Array {
  const { blockBytes, maxBlocks } = resolve(options);
  const count = Math.min(maxBlocks, Math.floor(length / blockBytes));
  const out = new Uint32Array(count);
  let h = options?.seed === undefined ? BLOCK_SEED : (BLOCK_SEED ^ options.seed) >>> 0;
  for (let i = 0, at = 0; i < count; i++, at += blockBytes) {
    h = murmur3(bytes, h, at, at + blockBytes);
    out[i] = h;
  }
  return out;
}

/** Chained hashes of the full blocks of the UTF-8 text, at most `maxBlocks`; the encoder stops at the cap. */
export function blockHashes(text: string, options?: BlockHashOptions): Uint32Array {
  const { blockBytes, maxBlocks } = resolve(options);
  const limit = blockBytes * maxBlocks;
  // encodeInto stops at the buffer's end (never splitting a character), so size it to the cap
  // or to the worst case of 3 bytes per UTF-16 code unit, whichever is smaller.
  const need = Math.min(limit, text.length * 3);
  if (need > scratch.length) scratch = new Uint8Array(need);
  const view = scratch.length > limit ? scratch.subarray(0, limit) : scratch;
  const { written } = encoder.encodeInto(text, view);
  return blockHashesOfBytes(view, { blockBytes, maxBlocks, seed: options?.seed }, written);
}

/** Block hashes of a parsed OpenAI request body (chat, completion), over `canonicalPrompt(body)`. */
export function promptBlockHashes(body: unknown, options?: BlockHashOptions): Uint32Array {
  return blockHashes(canonicalPrompt(body), options);
}
