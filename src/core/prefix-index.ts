// Approximate per-replica prefix index: which block hashes (see blocks.ts) were recently sent
// to each replica, LRU-bounded per replica to an estimate of its KV capacity. Pure, in-memory
// soft state held by the coordinator and the simulator; nothing is persisted.
//
// Layout (typed arrays, no per-entry objects, so a million entries cost ≤ 48 MB and no GC):
//   - one record per distinct block hash in a chained hash table, carrying a bitset of the
//     replicas holding it, so one walk over the request's blocks matches every replica at once
//     (a block every replica holds, like a shared system prompt, is one lookup, not R);
//   - one node per (block, replica) pair, on that replica's doubly linked LRU list (head =
//     most recent) and on the block's list of holders.
// `recordRoute` touches the request's blocks in reverse order, so the first block is the most
// recently used and eviction takes a prompt's tail first: what survives is always a prefix,
// as in vLLM, which frees a finished request's blocks tail first.
//
// Anchors: past the first `denseBlocks` (16) blocks, only a few positions per doubling of the
// prompt length are indexed (`anchorsPerDoubling`, 4): prompt lengths L = 1..16, 20, 24, 28,
// 32, 40, 48, 56, 64, 80, … , 448, 512, i.e. 37 of a 512-block prompt's blocks. Block hashes
// are chained, so holding the block at position L − 1 means holding all L leading blocks: a
// match is exact at anchors and reported as the longest matched anchor's L, at most 25% short
// of the true match past 16 blocks (1,024 tokens) and exact below. Each anchor entry stands for
// the blocks since the previous anchor, and counts that many against the replica's capacity,
// so capacities stay in blocks. Why: a new 512-block prompt was 512 inserts and evictions in a
// full index (≈ 0.5 µs each, 250-330 µs an acquire at 64 replicas); with anchors it is 37, and
// a warm prompt's walk is 37 lookups instead of 512. `denseBlocks: Infinity` indexes every block.
//
// Bounds: replica r keeps at most cap_r entries, where cap_r is its configured capacity
// (`setCapacity`, e.g. from vllm:cache_config_info, see `capacityInBlocks`) or the default,
// scaled down by maxEntries / Σ capacity when the capacities add up to more than the global
// cap, so the total never exceeds `maxEntries`.

import { KeyHomes } from './key-homes.js';

export { MAX_KEY_HOMES } from './key-homes.js';
import type { PrefixMatch } from './strategies/strategy.js';

/** Per-replica capacity when none is known: 8192 blocks × 64 tokens = 512K tokens of KV. */
export const DEFAULT_REPLICA_CAPACITY_BLOCKS = 8192;
/**
 * A replica is stale for the shared base after this many routes per known replica without one
 * of its own: a fair share is one route in R, so a replica that gets its share is stale with
 * probability ≈ e^−4 ≈ 2% at any moment (and then only raises the base for one pick).
 */
export const DEFAULT_STALE_ROUTES_PER_REPLICA = 4;
/**
 * Starved (staleAll's 2): no route among the last 16 × R. A replica getting its fair share is
 * starved with probability ≈ e^−16; prefix-aware then seeds it with the next new session on a
 * shared prompt (prefix-aware.ts).
 */
export const STARVED_ROUTES_PER_REPLICA = 16;
/** Slots are below 2^16 (slot()), so a key home packs its slot's generation (mod 2^16) above them. */
const SLOT_SPAN = 0x10000;
/**
 * The most (block, replica) entries one pool's index may be configured for: what fits in a
 * Workers isolate (128 MB, shared by the Worker's code and every Durable Object it hosts)
 * next to other pools' indexes. Worst case per entry at ≤ 64 replicas, every entry its own
 * block: 20 B of node, 24 B of block record, ≤ 8 B of hash bucket = 52 B, so 2^19 entries are
 * ≤ 27 MB and four pools' indexes fit in an isolate with room for everything else. Entries
 * count blocks (anchors stand for several), so the real footprint is usually far lower.
 */
export const MAX_INDEX_ENTRIES = 1 << 19;
/** Global cap on entries by default: the isolate cap (64 replicas × the default 8,192 blocks). */
export const DEFAULT_MAX_ENTRIES = MAX_INDEX_ENTRIES;

/** Blocks indexed one by one before anchors thin out (16 × 64 tokens = 1,024 tokens). */
export const DEFAULT_DENSE_BLOCKS = 16;
/** Anchors per doubling of the prompt length past the dense part (a power of two). */
export const DEFAULT_ANCHORS_PER_DOUBLING = 4;

/**
 * The longest anchor length ≤ n: what a match of n leading blocks is reported as (n itself up
 * to `denseBlocks`, then at most 25% less with the defaults).
 */
export function anchorLength(n: number, denseBlocks = DEFAULT_DENSE_BLOCKS, anchorsPerDoubling = DEFAULT_ANCHORS_PER_DOUBLING): number {
  if (n <= denseBlocks) return Math.max(0, n);
  const k = 31 - Math.clz32(n);
  const step = Math.max(1, (1 << k) / anchorsPerDoubling);
  const floor = n - (n % step);
  // Below the first anchor of this doubling (only when denseBlocks is not a power of two): the dense part's end.
  return Math.max(floor, Math.min(n, denseBlocks));
}

/**
 * A request's match against an index, as prefix-aware reads it (strategy.ts `PrefixMatch`):
 * matched blocks, staleness and recent routes per replica of `ids`, and with its routing `key`
 * where that key last went (`keyHome`), written into `scratch`'s
 * buffers (resized to `ids`) and its `result` object, so a hot caller allocates nothing per pick.
 * The result is valid until the next call with the same scratch.
 */
export function matchPrefix(index: PrefixIndex, ids: readonly string[], blocks: ArrayLike<number>, scratch: PrefixMatchScratch, key?: number | null): PrefixMatch {
  if (scratch.matched.length !== ids.length) {
    scratch.matched = new Int32Array(ids.length);
    scratch.stale = new Uint8Array(ids.length);
    scratch.recent = new Int32Array(ids.length);
  }
  index.matchAll(ids, blocks, scratch.matched);
  index.staleAll(ids, scratch.stale, DEFAULT_STALE_ROUTES_PER_REPLICA, scratch.recent);
  // One object, one shape whether or not there is a key (the pick's reads stay monomorphic and
  // an acquire allocates nothing here).
  const out = scratch.result;
  out.blocks = blocks.length;
  out.matched = scratch.matched;
  out.stale = scratch.stale;
  out.recent = scratch.recent;
  out.keyHome = key === undefined || key === null ? undefined : index.keyHomeIn(ids, key);
  return out;
}

export class PrefixMatchScratch {
  matched = new Int32Array(0);
  stale = new Uint8Array(0);
  recent = new Int32Array(0);
  /** What `matchPrefix` returns, rewritten by each call. */
  readonly result: { blocks: number; matched: Int32Array; stale: Uint8Array; recent: Int32Array; keyHome: number | undefined } = {
    blocks: 0,
    matched: this.matched,
    stale: this.stale,
    recent: this.recent,
    keyHome: undefined,
  };
}

export interface PrefixIndexOptions {
  /** Leading blocks indexed one by one (≥ 1; Infinity: every block). Default 16. */
  readonly denseBlocks?: number;
  /** Anchors per doubling of the length after them (a power of two ≥ 1). Default 4. */
  readonly anchorsPerDoubling?: number;
  /** Capacity in router blocks of a replica with no `setCapacity`. Default 8192. */
  readonly defaultCapacity?: number;
  /** Global cap on entries across replicas. Default 2^20. */
  readonly maxEntries?: number;
}

export interface PrefixIndexStats {
  /** Blocks the index believes held, summed over replicas (each anchor entry counts the blocks it stands for). */
  readonly entries: number;
  /** Live (anchor block, replica) nodes: what the memory is spent on. */
  readonly nodes: number;
  /** Distinct block hashes held (each with a bitset of its replicas). */
  readonly blocks: number;
  readonly replicas: number;
  readonly perReplica: Readonly<Record<string, { readonly entries: number; readonly capacity: number }>>;
  /** Bytes held by the typed arrays (the index's memory, within a few percent). */
  readonly approxBytes: number;
  readonly maxEntries: number;
  /** Entries evicted by the LRU bounds since creation. */
  readonly evictions: number;
}

/**
 * KV capacity of a vLLM replica in router blocks: num_gpu_blocks × block_size tokens, divided
 * by the tokens a router block stands for (vllm:cache_config_info carries both labels).
 */
export function capacityInBlocks(numGpuBlocks: number, vllmBlockSize: number, routerBlockTokens = 64): number {
  if (!(numGpuBlocks > 0) || !(vllmBlockSize > 0) || !(routerBlockTokens > 0)) throw new RangeError('capacityInBlocks: arguments must be positive');
  return Math.max(1, Math.floor((numGpuBlocks * vllmBlockSize) / routerBlockTokens));
}

const NIL = -1;
const MIN_POOL = 1024;
// Block record fields; the record of block b starts at b × stride.
const HASH = 0;
const CHAIN = 1; // next block record in the same bucket (or in the free list)
const FIRST = 2; // first (block, replica) node of this block (NIL: record is free); siblings chain through nodeSibling
const SUCC = 3; // the record of the block that followed this one in the last recorded route (a hint)
const BITS = 4; // bitset of the replica slots holding the block, `words` 32-bit words

/** Fibonacci hashing of the block hash into a power-of-two table (dense ids from a simulator spread too). */
function bucketOf(h: number, shift: number): number {
  return Math.imul(h, 0x9e3779b1) >>> shift;
}

export class PrefixIndex {
  readonly maxEntries: number;
  readonly defaultCapacity: number;
  readonly denseBlocks: number;
  readonly anchorsPerDoubling: number;

  // Anchor positions (0-based block indexes, ascending), the blocks each stands for, and
  // anchorsBelow[n] = anchors at positions < n; grown on demand to the longest request seen.
  private anchorPos = new Int32Array(0);
  private anchorWeight = new Int32Array(0);
  private anchorsBelow = new Int32Array(1);
  // Block records (one per distinct block hash) and the hash table over them.
  private words = 1;
  private stride = BITS + 1;
  private blk: Int32Array;
  private blkAllocated = 0;
  private blkFree = NIL;
  private blkLive = 0;
  private buckets: Int32Array;
  private shift: number;

  // Nodes: one per (block, replica) pair, on the replica's LRU list and the block's sibling list.
  private nodeBlock: Int32Array;
  private nodeReplica: Uint16Array;
  private nodePrev: Int32Array;
  private nodeNext: Int32Array;
  private nodeSibling: Int32Array;
  /** Blocks node x stands for (its anchor's weight). */
  private nodeWeight: Uint16Array;
  private nodeAllocated = 0;
  private nodeFree = NIL;
  private live = 0;
  private liveBlocks = 0;
  private evicted = 0;

  // Replica slots.
  private readonly slotOf = new Map<string, number>();
  private slotIds: (string | null)[] = [];
  private freeSlots: number[] = [];
  private head: number[] = [];
  private tail: number[] = [];
  private count: number[] = [];
  private configured: (number | undefined)[] = [];
  private limit: number[] = [];
  private slotVersion = 0;
  /** Routes recorded so far, and the number of the last one per slot (for `staleAll`). */
  private routes = 0;
  private lastRoute: number[] = [];
  /**
   * The last routes' slots, oldest first from `recentHead` (a ring of `recentBuf.length`), at
   * most STARVED_ROUTES_PER_REPLICA × (replicas known) of them, and how many of them went to
   * each slot (`recentCount`): `staleAll`'s `recent` output, exact over that window.
   */
  private recentBuf = new Uint16Array(128);
  private recentHead = 0;
  private recentLen = 0;
  private recentCount: number[] = [];
  /** Routing key → generation and slot of its last route (key-homes.ts: a bounded table). */
  private readonly keyHomes = new KeyHomes();
  /**
   * Per slot, how many times it was freed: a key home is stored as generation × 2^16 + slot and
   * read back only while the generation still matches, so dropping a replica forgets its key
   * homes in O(1) instead of scanning all 2^15 of them (a hostile origin can make the coordinator
   * drop engine slots on every scrape).
   */
  private slotGen: number[] = [];

  // matchAll scratch and its id → slot cache.
  private matchScratch = new Int32Array(32);
  private alive = new Uint32Array(1);
  private resolved = new Int32Array(64);
  private cachedIds: readonly string[] | null = null;
  private cachedVersion = -1;
  private cachedSlots = new Int32Array(0);

  constructor(options: PrefixIndexOptions = {}) {
    this.maxEntries = options.maxEntries ?? DEFAULT_MAX_ENTRIES;
    this.defaultCapacity = options.defaultCapacity ?? DEFAULT_REPLICA_CAPACITY_BLOCKS;
    if (!Number.isInteger(this.maxEntries) || this.maxEntries < 1) throw new RangeError(`maxEntries must be a positive integer, got ${this.maxEntries}`);
    if (!Number.isInteger(this.defaultCapacity) || this.defaultCapacity < 1) throw new RangeError(`defaultCapacity must be a positive integer, got ${this.defaultCapacity}`);
    const size = Math.min(MIN_POOL, this.maxEntries);
    this.blk = new Int32Array(size * this.stride);
    const bits = Math.max(4, Math.ceil(Math.log2(size)));
    this.buckets = new Int32Array(1 << bits).fill(NIL);
    this.shift = 32 - bits;
    this.nodeBlock = new Int32Array(size);
    this.nodeReplica = new Uint16Array(size);
    this.nodePrev = new Int32Array(size);
    this.nodeNext = new Int32Array(size);
    this.nodeSibling = new Int32Array(size);
    this.nodeWeight = new Uint16Array(size);
    this.denseBlocks = options.denseBlocks ?? DEFAULT_DENSE_BLOCKS;
    this.anchorsPerDoubling = options.anchorsPerDoubling ?? DEFAULT_ANCHORS_PER_DOUBLING;
    if (!(this.denseBlocks >= 1) || (this.denseBlocks !== Infinity && !Number.isInteger(this.denseBlocks))) throw new RangeError(`denseBlocks must be an integer ≥ 1 or Infinity, got ${this.denseBlocks}`);
    const apd = this.anchorsPerDoubling;
    if (!Number.isInteger(apd) || apd < 1 || (apd & (apd - 1)) !== 0) throw new RangeError(`anchorsPerDoubling must be a power of two ≥ 1, got ${apd}`);
  }

  /** Is block position i (0-based) an anchor? */
  isAnchor(i: number): boolean {
    const len = i + 1;
    if (len <= this.denseBlocks) return true;
    const k = 31 - Math.clz32(len);
    const step = Math.max(1, (1 << k) / this.anchorsPerDoubling);
    return len % step === 0;
  }

  /** Make the anchor tables cover requests of n blocks; returns the anchors below n. */
  private anchorsFor(n: number): number {
    if (n < this.anchorsBelow.length) return this.anchorsBelow[n]!;
    const size = Math.max(n + 1, this.anchorsBelow.length * 2);
    const below = new Int32Array(size);
    const pos: number[] = [];
    for (let i = 0; i < size - 1; i++) {
      below[i] = pos.length;
      if (this.isAnchor(i)) pos.push(i);
    }
    below[size - 1] = pos.length;
    this.anchorsBelow = below;
    this.anchorPos = Int32Array.from(pos);
    this.anchorWeight = Int32Array.from(pos, (p, j) => Math.min(0xffff, p - (j === 0 ? -1 : pos[j - 1]!)));
    return below[n]!;
  }

  /** Set a replica's KV capacity in router blocks (undefined: back to the default). Trims at once if it shrank. */
  setCapacity(replica: string, blocks: number | undefined): void {
    if (blocks !== undefined && (!Number.isInteger(blocks) || blocks < 1)) throw new RangeError(`capacity of ${replica} must be a positive integer, got ${blocks}`);
    const s = this.slot(replica);
    this.configured[s] = blocks;
    this.recomputeLimits();
  }

  /**
   * Touch (or insert) the request's blocks for the replica it was routed to, and remember that
   * its routing key `key` (when given) went there (`keyHomeOf`).
   */
  recordRoute(replica: string, blocks: ArrayLike<number>, key?: number | null): void {
    if (blocks.length === 0) return;
    const s = this.slot(replica);
    this.countRoute(s, key);
    const n = this.anchorsFor(blocks.length);
    const pos = this.anchorPos;
    const wt = this.anchorWeight;
    // Resolve the records front to back along the successor hints (a repeat of a known prompt
    // then never probes the table), then touch back to front: block 0 ends up most recent, so
    // eviction trims prompts from the tail. A record resolved here can be freed by an eviction
    // during the touches; touch re-checks it.
    if (this.resolved.length < n) this.resolved = new Int32Array(Math.max(n, this.resolved.length * 2));
    const rec = this.resolved;
    let prev = NIL;
    for (let i = 0; i < n; i++) {
      const h = blocks[pos[i]!]! | 0;
      let b = prev === NIL ? NIL : this.blk[prev * this.stride + SUCC]!;
      if (b === NIL || !this.isLive(b, h)) b = this.findBlock(h);
      rec[i] = prev = b;
    }
    let next = NIL;
    for (let i = n - 1; i >= 0; i--) {
      const b = this.touch(s, blocks[pos[i]!]! | 0, rec[i]!, wt[i]!);
      if (b === NIL) continue;
      if (next !== NIL) this.blk[b * this.stride + SUCC] = next;
      next = b;
    }
  }

  /**
   * Take back what one route added: the replica's entries for blocks[from, n), the blocks it did
   * not hold before that route (`from` = its match at pick time). The coordinator records a
   * route at pick time, as vLLM caches a prompt once its prefill is done, long before the
   * stream ends, and retracts it when the request fails (pool-coordinator.ts `release`).
   */
  forget(replica: string, blocks: ArrayLike<number>, from = 0): number {
    const s = this.slotOf.get(replica);
    if (s === undefined) return 0;
    const w = BITS + (s >>> 5);
    const bit = 1 << (s & 31);
    let removed = 0;
    const n = this.anchorsFor(blocks.length);
    for (let j = this.anchorsFor(Math.max(0, Math.min(from, blocks.length))); j < n; j++) {
      const b = this.findBlock(blocks[this.anchorPos[j]!]! | 0);
      if (b === NIL || (this.blk[b * this.stride + w]! & bit) === 0) continue;
      let x = this.blk[b * this.stride + FIRST]!;
      while (this.nodeReplica[x] !== s) x = this.nodeSibling[x]!;
      this.unlink(s, x);
      this.count[s]! -= this.nodeWeight[x]!;
      this.removeNode(x);
      removed += this.anchorWeight[j]!;
    }
    return removed;
  }

  /** Leading blocks of the request the replica holds (stops at the first miss). */
  matchLength(replica: string, blocks: ArrayLike<number>): number {
    const s = this.slotOf.get(replica);
    if (s === undefined) return 0;
    const w = BITS + (s >>> 5);
    const bit = 1 << (s & 31);
    const n = this.anchorsFor(blocks.length);
    const pos = this.anchorPos;
    let j = 0;
    for (; j < n; j++) {
      const b = this.findBlock(blocks[pos[j]!]! | 0);
      if (b === NIL || (this.blk[b * this.stride + w]! & bit) === 0) break;
    }
    return j === 0 ? 0 : pos[j - 1]! + 1;
  }

  /**
   * Matched leading blocks for every replica in `ids` (ring order) in one walk over the
   * request's blocks: out[i] is the match of ids[i], or −1 when the index holds nothing for
   * ids[i] (new, dropped or never routed to). Each block is one hash lookup and a bitset AND
   * over the replicas still matching; the walk stops when none is left.
   */
  matchAll(ids: readonly string[], blocks: ArrayLike<number>, out: Int32Array = new Int32Array(ids.length)): Int32Array {
    const slots = this.slotsFor(ids);
    const n = this.anchorsFor(blocks.length);
    const pos = this.anchorPos;
    // Matched through anchor j − 1: its length (0 before the first).
    const full = n === 0 ? 0 : pos[n - 1]! + 1;
    const words = this.words;
    const stride = this.stride;
    const m = this.matchScratch;
    const alive = this.alive;
    alive.fill(0);
    let any = 0;
    for (let i = 0; i < slots.length; i++) {
      const s = slots[i]!;
      if (s < 0 || this.count[s] === 0) continue;
      m[s] = full;
      alive[s >>> 5]! |= 1 << (s & 31);
      any = 1;
    }
    const blk = this.blk;
    let prev = NIL;
    // Once a single replica is still matching (a continuation turn, past the shared blocks),
    // the walk only tests that replica's bit.
    let single = -1;
    let singleWord = 0;
    let singleBit = 0;
    for (let i = 0; i < n && any !== 0; i++) {
      const h = blocks[pos[i]!]! | 0;
      // Follow the successor hint of the previous block first: a continuation turn walks records
      // allocated together, in order, instead of probing the table at random.
      let b = prev === NIL ? NIL : blk[prev * stride + SUCC]!;
      if (b === NIL || blk[b * stride + HASH] !== h || blk[b * stride + FIRST] === NIL) b = this.findBlock(h);
      prev = b;
      if (single >= 0) {
        if (b === NIL || (blk[b * stride + singleWord]! & singleBit) === 0) {
          m[single] = i === 0 ? 0 : pos[i - 1]! + 1;
          break;
        }
        continue;
      }
      const off = b * stride + BITS;
      any = 0;
      let count = 0;
      for (let w = 0; w < words; w++) {
        const a = alive[w]!;
        if (a === 0) continue;
        const keep = b === NIL ? 0 : a & blk[off + w]!;
        let drop = a & ~keep;
        while (drop !== 0) {
          const low = drop & -drop;
          m[(w << 5) + 31 - Math.clz32(low)] = i === 0 ? 0 : pos[i - 1]! + 1;
          drop ^= low;
        }
        alive[w] = keep;
        if (keep !== 0) {
          any = 1;
          count += (keep & (keep - 1)) === 0 ? 1 : 2;
          singleWord = w;
        }
      }
      if (count === 1) {
        singleBit = alive[singleWord]!;
        single = (singleWord << 5) + 31 - Math.clz32(singleBit);
        singleWord += BITS;
      }
    }
    for (let i = 0; i < ids.length; i++) {
      const s = slots[i]!;
      out[i] = s < 0 || this.count[s] === 0 ? -1 : m[s]!;
    }
    return out;
  }

  /**
   * Which of `ids` had no route recorded among the last `perReplica × (replicas known)` routes
   * of the pool (out[i] = 1), or are unknown (1 too). prefix-aware leaves them out of the shared
   * base: what a replica that gets no traffic held when it last got some says nothing about the
   * prompt everyone shares now (a system prompt replaced since), and counting it would let the
   * replicas that saw the new prompt first pull every new session (prefix-aware.ts).
   */
  staleAll(ids: readonly string[], out: Uint8Array = new Uint8Array(ids.length), perReplica = DEFAULT_STALE_ROUTES_PER_REPLICA, recent?: Int32Array): Uint8Array {
    const known = Math.max(1, this.slotOf.size);
    const horizon = this.routes - perReplica * known;
    const starved = this.routes - STARVED_ROUTES_PER_REPLICA * known;
    const slots = this.slotsFor(ids);
    for (let i = 0; i < ids.length; i++) {
      const s = slots[i]!;
      out[i] = s < 0 ? 1 : this.lastRoute[s]! <= starved ? 2 : this.lastRoute[s]! <= horizon ? 1 : 0;
      if (recent !== undefined) recent[i] = s < 0 ? 0 : this.recentCount[s]!;
    }
    return out;
  }

  /**
   * How many routes the `recent` counts of `staleAll` cover: the pool's last routes, at most
   * STARVED_ROUTES_PER_REPLICA × (replicas known); the counts add up to it.
   */
  recentRoutes(): number {
    return this.recentLen;
  }

  /**
   * A route to `replica` that adds no blocks: a data-parallel replica's request vLLM's own
   * balancer places on one of its engines (an API the router cannot pin), so no engine slot may
   * hold its prompt. It still counts among the recent routes and as its key's home (`replica`:
   * any slot of that replica), or the replica would look under-served (prefix-aware.ts) to every
   * such request it takes.
   */
  noteRoute(replica: string, key?: number | null): void {
    this.countRoute(this.slot(replica), key);
  }

  /**
   * One route to slot `s` (with or without blocks): its last route number, the recent window,
   * and that routing key `key` (when given) last went there (key-homes.ts: bounded, the older
   * of a set first).
   */
  private countRoute(s: number, key: number | null | undefined): void {
    this.lastRoute[s] = ++this.routes;
    this.pushRecent(s);
    if (key !== undefined && key !== null) this.keyHomes.set(key, (this.slotGen[s]! % SLOT_SPAN) * SLOT_SPAN + s);
  }

  /** The live slot a key home names, or −1 (unknown key, or its slot was freed since). */
  private homeSlot(key: number): number {
    const v = this.keyHomes.get(key);
    if (v < 0) return -1;
    const s = v % SLOT_SPAN;
    return (v - s) / SLOT_SPAN === this.slotGen[s]! % SLOT_SPAN ? s : -1;
  }

  /** Position in `ids` of the replica routing key `key` was last recorded to, −1 when not remembered or not in `ids`. */
  keyHomeIn(ids: readonly string[], key: number): number {
    const s = this.homeSlot(key);
    if (s < 0) return -1;
    const slots = this.slotsFor(ids);
    for (let i = 0; i < slots.length; i++) if (slots[i] === s) return i;
    return -1;
  }

  /** The replica routing key `key` was last recorded to (recordRoute), if it is still remembered. */
  keyHomeOf(key: number): string | undefined {
    const s = this.homeSlot(key);
    return s < 0 ? undefined : (this.slotIds[s] ?? undefined);
  }

  /** Forget a replica (removed from the pool, or its cache was reset by a restart). */
  dropReplica(replica: string): void {
    const s = this.slotOf.get(replica);
    if (s === undefined) return;
    for (let x = this.head[s]!; x !== NIL; ) {
      const next = this.nodeNext[x]!;
      this.removeNode(x);
      x = next;
    }
    this.slotOf.delete(replica);
    this.dropRecent(s);
    this.slotGen[s]!++; // its key homes are no longer read (homeSlot)
    this.slotIds[s] = null;
    this.head[s] = this.tail[s] = NIL;
    this.count[s] = 0;
    this.configured[s] = undefined;
    this.freeSlots.push(s);
    this.slotVersion++;
    this.recomputeLimits();
  }

  /** Replica ids the index holds entries or a capacity for. */
  replicas(): string[] {
    return [...this.slotOf.keys()];
  }

  stats(): PrefixIndexStats {
    const perReplica: Record<string, { entries: number; capacity: number }> = {};
    for (const [id, s] of this.slotOf) perReplica[id] = { entries: this.count[s]!, capacity: this.limit[s]! };
    const approxBytes =
      this.blk.byteLength +
      this.buckets.byteLength +
      this.nodeBlock.byteLength +
      this.nodeReplica.byteLength +
      this.nodePrev.byteLength +
      this.nodeNext.byteLength +
      this.nodeSibling.byteLength +
      this.nodeWeight.byteLength +
      this.matchScratch.byteLength +
      this.slotIds.length * 64;
    return { entries: this.liveBlocks, nodes: this.live, blocks: this.blkLive, replicas: this.slotOf.size, perReplica, approxBytes, maxEntries: this.maxEntries, evictions: this.evicted };
  }

  // ---------------------------------------------------------------------------------------

  /** Append slot `s` to the recent window, dropping the oldest routes beyond its length. */
  private pushRecent(s: number): void {
    const limit = STARVED_ROUTES_PER_REPLICA * Math.max(1, this.slotOf.size);
    let buf = this.recentBuf;
    while (this.recentLen >= limit) {
      this.recentCount[buf[this.recentHead]!]!--;
      this.recentHead = this.recentHead + 1 === buf.length ? 0 : this.recentHead + 1;
      this.recentLen--;
    }
    if (this.recentLen === buf.length) {
      const next = new Uint16Array(buf.length * 2);
      for (let k = 0; k < this.recentLen; k++) next[k] = buf[(this.recentHead + k) % buf.length]!;
      this.recentBuf = buf = next;
      this.recentHead = 0;
    }
    buf[(this.recentHead + this.recentLen) % buf.length] = s;
    this.recentLen++;
    this.recentCount[s]!++;
  }

  /** Remove slot `s`'s routes from the recent window (the slot is being freed for reuse). */
  private dropRecent(s: number): void {
    const buf = this.recentBuf;
    let kept = 0;
    for (let k = 0; k < this.recentLen; k++) {
      const v = buf[(this.recentHead + k) % buf.length]!;
      if (v !== s) buf[(this.recentHead + kept++) % buf.length] = v;
    }
    this.recentLen = kept;
    this.recentCount[s] = 0;
  }

  private slot(replica: string): number {
    let s = this.slotOf.get(replica);
    if (s !== undefined) return s;
    s = this.freeSlots.pop();
    if (s === undefined) {
      s = this.slotIds.length;
      if (s > 0xffff) throw new RangeError('the prefix index holds at most 65536 replicas');
      this.slotIds.push(null);
      this.head.push(NIL);
      this.tail.push(NIL);
      this.count.push(0);
      this.configured.push(undefined);
      this.limit.push(0);
      this.lastRoute.push(0);
      this.recentCount.push(0);
      this.slotGen.push(0);
      if (this.matchScratch.length <= s) {
        const next = new Int32Array(this.matchScratch.length * 2);
        next.set(this.matchScratch);
        this.matchScratch = next;
      }
      if (s >= this.words * 32) this.widen(this.words * 2);
    }
    this.slotOf.set(replica, s);
    this.slotIds[s] = replica;
    this.lastRoute[s] = this.routes;
    this.slotVersion++;
    this.recomputeLimits();
    return s;
  }

  private slotsFor(ids: readonly string[]): Int32Array {
    if (ids === this.cachedIds && this.cachedVersion === this.slotVersion) return this.cachedSlots;
    const slots = new Int32Array(ids.length);
    for (let i = 0; i < ids.length; i++) slots[i] = this.slotOf.get(ids[i]!) ?? -1;
    this.cachedIds = ids;
    this.cachedVersion = this.slotVersion;
    this.cachedSlots = slots;
    return slots;
  }

  /** cap_r = configured or default, scaled by maxEntries / Σ when the sum exceeds the global cap. */
  private recomputeLimits(): void {
    let sum = 0;
    for (const [, s] of this.slotOf) sum += this.configured[s] ?? this.defaultCapacity;
    const scale = sum > this.maxEntries ? this.maxEntries / sum : 1;
    for (const [, s] of this.slotOf) {
      const lim = Math.max(1, Math.floor((this.configured[s] ?? this.defaultCapacity) * scale));
      this.limit[s] = lim;
      while (this.count[s]! > lim) this.evictTail(s);
    }
  }

  private findBlock(h: number): number {
    const blk = this.blk;
    const stride = this.stride;
    for (let b = this.buckets[bucketOf(h, this.shift)]!; b !== NIL; b = blk[b * stride + CHAIN]!) {
      if (blk[b * stride + HASH] === h) return b;
    }
    return NIL;
  }

  /** Record b holds hash h (a hint or an earlier lookup is still valid). */
  private isLive(b: number, h: number): boolean {
    return this.blk[b * this.stride + HASH] === h && this.blk[b * this.stride + FIRST] !== NIL;
  }

  /** Touch or insert (h, s) standing for `weight` blocks; `hint` is the record found for h earlier, or NIL. Returns the block's record (NIL: it cannot fit). */
  private touch(s: number, h: number, hint: number, weight: number): number {
    const w = BITS + (s >>> 5);
    const bit = 1 << (s & 31);
    let b = hint !== NIL && this.isLive(hint, h) ? hint : this.findBlock(h);
    if (b !== NIL && (this.blk[b * this.stride + w]! & bit) !== 0) {
      let x = this.blk[b * this.stride + FIRST]!;
      while (this.nodeReplica[x] !== s) x = this.nodeSibling[x]!;
      if (this.head[s] !== x) {
        this.unlink(s, x);
        this.pushHead(s, x);
      }
      return b;
    }
    // Block b lacks replica s, so evicting s's tail never frees b. The per-replica limits sum
    // to at most maxEntries (and nodes ≤ blocks), so this keeps the pool within the global cap.
    if (weight > this.limit[s]!) return NIL;
    while (this.count[s]! + weight > this.limit[s]!) this.evictTail(s);
    if (b === NIL) b = this.allocBlock(h);
    const x = this.allocNode();
    const off = b * this.stride;
    this.nodeBlock[x] = b;
    this.nodeReplica[x] = s;
    this.nodeSibling[x] = this.blk[off + FIRST]!;
    this.nodeWeight[x] = weight;
    this.blk[off + FIRST] = x;
    this.blk[off + w]! |= bit;
    this.pushHead(s, x);
    this.count[s]! += weight;
    this.liveBlocks += weight;
    this.live++;
    return b;
  }

  private evictTail(s: number): void {
    const x = this.tail[s]!;
    if (x === NIL) return;
    this.unlink(s, x);
    this.count[s]! -= this.nodeWeight[x]!;
    this.removeNode(x);
    this.evicted++;
  }

  /** Take node x off its block (freeing the block when it was the last holder) and free it; the LRU list is the caller's. */
  private removeNode(x: number): void {
    const b = this.nodeBlock[x]!;
    const s = this.nodeReplica[x]!;
    const off = b * this.stride;
    const first = this.blk[off + FIRST]!;
    if (first === x) this.blk[off + FIRST] = this.nodeSibling[x]!;
    else {
      let y = first;
      while (this.nodeSibling[y] !== x) y = this.nodeSibling[y]!;
      this.nodeSibling[y] = this.nodeSibling[x]!;
    }
    this.blk[off + BITS + (s >>> 5)]! &= ~(1 << (s & 31));
    if (this.blk[off + FIRST] === NIL) this.freeBlock(b);
    this.nodeSibling[x] = this.nodeFree;
    this.nodeFree = x;
    this.liveBlocks -= this.nodeWeight[x]!;
    this.live--;
  }

  private pushHead(s: number, x: number): void {
    const h = this.head[s]!;
    this.nodePrev[x] = NIL;
    this.nodeNext[x] = h;
    if (h !== NIL) this.nodePrev[h] = x;
    else this.tail[s] = x;
    this.head[s] = x;
  }

  private unlink(s: number, x: number): void {
    const p = this.nodePrev[x]!;
    const n = this.nodeNext[x]!;
    if (p !== NIL) this.nodeNext[p] = n;
    else this.head[s] = n;
    if (n !== NIL) this.nodePrev[n] = p;
    else this.tail[s] = p;
  }

  private allocNode(): number {
    if (this.nodeFree !== NIL) {
      const x = this.nodeFree;
      this.nodeFree = this.nodeSibling[x]!;
      return x;
    }
    if (this.nodeAllocated === this.nodeBlock.length) {
      const size = Math.min(this.maxEntries, this.nodeBlock.length * 2);
      if (size === this.nodeBlock.length) throw new Error('prefix index: node pool full (limits exceed maxEntries)');
      this.nodeBlock = grown(this.nodeBlock, new Int32Array(size));
      this.nodeReplica = grown(this.nodeReplica, new Uint16Array(size));
      this.nodePrev = grown(this.nodePrev, new Int32Array(size));
      this.nodeNext = grown(this.nodeNext, new Int32Array(size));
      this.nodeSibling = grown(this.nodeSibling, new Int32Array(size));
      this.nodeWeight = grown(this.nodeWeight, new Uint16Array(size));
    }
    return this.nodeAllocated++;
  }

  private allocBlock(h: number): number {
    let b: number;
    if (this.blkFree !== NIL) {
      b = this.blkFree;
      this.blkFree = this.blk[b * this.stride + CHAIN]!;
    } else {
      if (this.blkAllocated * this.stride === this.blk.length) this.growBlocks();
      b = this.blkAllocated++;
    }
    const off = b * this.stride;
    const bucket = bucketOf(h, this.shift);
    this.blk[off + HASH] = h;
    this.blk[off + FIRST] = NIL;
    this.blk[off + SUCC] = NIL;
    this.blk[off + CHAIN] = this.buckets[bucket]!;
    this.buckets[bucket] = b;
    this.blkLive++;
    return b;
  }

  private freeBlock(b: number): void {
    const stride = this.stride;
    const bucket = bucketOf(this.blk[b * stride + HASH]!, this.shift);
    let y = this.buckets[bucket]!;
    if (y === b) this.buckets[bucket] = this.blk[b * stride + CHAIN]!;
    else {
      while (this.blk[y * stride + CHAIN] !== b) y = this.blk[y * stride + CHAIN]!;
      this.blk[y * stride + CHAIN] = this.blk[b * stride + CHAIN]!;
    }
    // Its bitset is all zero again (every holder was removed).
    this.blk[b * stride + CHAIN] = this.blkFree;
    this.blkFree = b;
    this.blkLive--;
  }

  /** Double the block records (up to maxEntries) and rehash; only called when every record is live. */
  private growBlocks(): void {
    const cap = this.blk.length / this.stride;
    const size = Math.min(this.maxEntries, cap * 2);
    if (size === cap) throw new Error('prefix index: block pool full');
    this.blk = grown(this.blk, new Int32Array(size * this.stride));
    const bits = Math.max(4, Math.ceil(Math.log2(size)));
    this.buckets = new Int32Array(1 << bits).fill(NIL);
    this.shift = 32 - bits;
    const stride = this.stride;
    for (let b = 0; b < this.blkAllocated; b++) {
      const bucket = bucketOf(this.blk[b * stride + HASH]!, this.shift);
      this.blk[b * stride + CHAIN] = this.buckets[bucket]!;
      this.buckets[bucket] = b;
    }
  }

  /** Room for 32 × `words` replica slots in every block's bitset. */
  private widen(words: number): void {
    const oldStride = this.stride;
    const stride = BITS + words;
    const cap = this.blk.length / oldStride;
    const next = new Int32Array(cap * stride);
    for (let b = 0; b < this.blkAllocated; b++) {
      for (let k = 0; k < oldStride; k++) next[b * stride + k] = this.blk[b * oldStride + k]!;
    }
    this.blk = next;
    this.words = words;
    this.stride = stride;
    this.alive = new Uint32Array(words);
  }
}

function grown<T extends Int32Array | Uint16Array>(from: T, to: T): T {
  to.set(from);
  return to;
}
