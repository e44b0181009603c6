// The mock's automatic prefix cache: 16-token blocks keyed by chained hashes, LRU eviction,
// reference counts for blocks held by running sequences. In-memory, no I/O.
//
// Modelled on vLLM V1's KVCacheManager: a block's hash covers its tokens and the hash of the
// block before it, so a hit on block i implies blocks 0..i-1 hit too; only full blocks are cached;
// a block referenced by a running sequence is never evicted; freed blocks go back to the LRU queue
// tail-first, so a prompt's head outlives its tail.

import { createHash } from 'node:crypto';

/**
 * The chain's start for a request's `cache_salt`: vLLM puts the salt among the first block's extra
 * hash keys (generate_block_hash_extra_keys in vllm/v1/core/kv_cache_utils.py: `[request.cache_salt]
 * if start_token_idx == 0`), and the chain carries it into every later block. No salt: ''.
 */
export function saltParent(salt: string | undefined): string {
  return salt === undefined ? '' : `salt\u0000${salt}`;
}

/** Chained block hashes: hash_i = sha256(hash_{i-1} ‖ text_i), truncated to 64 bits. */
export function chainBlockHashes(blocks: readonly string[], parent = ''): string[] {
  const out = new Array<string>(blocks.length);
  let prev = parent;
  for (let i = 0; i < blocks.length; i++) {
    prev = createHash('sha256').update(prev).update('\u0000').update(blocks[i]!).digest('hex').slice(0, 16);
    out[i] = prev;
  }
  return out;
}

export class PrefixCache {
  // Map iteration order is the LRU order: first = least recently used.
  private readonly blocks = new Map<string, { refs: number }>();
  private held = 0;
  evictions = 0;

  constructor(readonly capacity: number) {}

  get size(): number {
    return this.blocks.size;
  }

  /** Blocks referenced by at least one running sequence. */
  get heldBlocks(): number {
    return this.held;
  }

  /** Length of the leading run of `hashes` that is cached (looks, does not touch). */
  matchPrefix(hashes: readonly string[], limit = hashes.length): number {
    let n = 0;
    while (n < limit && this.blocks.has(hashes[n]!)) n++;
    return n;
  }

  /**
   * Reference `hashes[from..]` in order, inserting the missing ones (evicting unreferenced LRU
   * blocks when full). Stops at the first block that cannot be placed because every block is held:
   * the chain is broken there anyway. Returns the new count of held blocks (`from` + placed).
   */
  acquire(hashes: readonly string[], from: number): number {
    let i = from;
    for (; i < hashes.length; i++) {
      const h = hashes[i]!;
      const entry = this.blocks.get(h);
      if (entry) {
        if (entry.refs++ === 0) this.held++;
        continue;
      }
      if (this.blocks.size >= this.capacity && !this.evictOne()) break;
      this.blocks.set(h, { refs: 1 });
      this.held++;
    }
    return i;
  }

  /** Drop one reference from each of `hashes` (a prefix previously acquired), tail first. */
  release(hashes: readonly string[]): void {
    for (let i = hashes.length - 1; i >= 0; i--) {
      const h = hashes[i]!;
      const entry = this.blocks.get(h);
      // A reset while sequences run leaves them holding hashes that are gone or re-inserted: skip.
      if (!entry || entry.refs === 0) continue;
      if (--entry.refs === 0) this.held--;
      // Re-insert: most recently used goes last; the head is re-inserted last, so it is evicted last.
      this.blocks.delete(h);
      this.blocks.set(h, entry);
    }
  }

  clear(): void {
    this.blocks.clear();
    this.held = 0;
    this.evictions = 0;
  }

  private evictOne(): boolean {
    for (const [h, entry] of this.blocks) {
      if (entry.refs === 0) {
        this.blocks.delete(h);
        this.evictions++;
        return true;
      }
    }
    return false;
  }
}
