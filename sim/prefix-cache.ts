// One replica's paged KV cache with automatic prefix caching, after vLLM v1
// (docs.vllm.ai/en/latest/design/prefix_caching): full 16-token blocks identified by their
// chained hash, reuse only on a leading run of cached blocks, reference counts for blocks held
// by running requests, and an LRU queue of free cached blocks that is evicted from its head.
// A finished request's blocks enter the queue in reverse order, so a prompt's tail is evicted
// before its head (the tail hashes more tokens and is less likely to be shared). Pure, no I/O.
//
// Capacity accounting: cached entries (held or free) plus private blocks (output tokens and
// anything that could not be cached) never exceed `capacity`, except for a forced admission
// (one request bigger than the whole cache on an otherwise idle replica).

export interface Admission {
  /** Leading prompt blocks found in the cache. */
  readonly hits: number;
  /** Leading prompt blocks now held in the cache by this request (release needs it). */
  readonly pinned: number;
}

export class PrefixCache {
  readonly capacity: number;
  private readonly slotOf = new Map<number, number>();
  private ids: Int32Array;
  private refs: Int32Array;
  private prev: Int32Array;
  private next: Int32Array;
  private used = 0; // slots ever handed out
  private head = -1; // LRU end of the free queue (evicted first)
  private tail = -1;
  /** Entries with a reference count above zero. */
  private held = 0;
  /** Blocks held by running requests outside the cache (outputs, uncacheable remainders). */
  private extra = 0;
  /** Blocks evicted so far. */
  evictions = 0;

  constructor(capacityBlocks: number) {
    if (!(capacityBlocks >= 1)) throw new RangeError(`cache capacity must be ≥ 1 block, got ${capacityBlocks}`);
    this.capacity = capacityBlocks;
    const initial = Math.min(capacityBlocks, 1 << 14);
    this.ids = new Int32Array(initial);
    this.refs = new Int32Array(initial);
    this.prev = new Int32Array(initial);
    this.next = new Int32Array(initial);
  }

  /** Cached entries (held or free). */
  get size(): number {
    return this.slotOf.size;
  }

  /** Blocks in use by running requests (held entries plus private blocks). */
  get inUse(): number {
    return this.held + this.extra;
  }

  has(id: number): boolean {
    return this.slotOf.has(id);
  }

  /** Leading run of `blocks[0, limit)` present in the cache; no side effects (no LRU touch). */
  match(blocks: Int32Array, limit: number): number {
    let h = 0;
    while (h < limit && this.slotOf.has(blocks[h]!)) h++;
    return h;
  }

  /**
   * Admit a request: look up the leading run of `blocks[0, limit)`, hold those blocks, insert
   * the rest of the prompt's blocks (evicting LRU free blocks), and reserve `totalBlocks`
   * (prompt plus output) in all. Returns null, changing nothing, when that does not fit
   * beside the running requests, unless `force`.
   */
  admit(blocks: Int32Array, limit: number, totalBlocks: number, force = false): Admission | null {
    const slotOf = this.slotOf;
    let h = 0;
    let revived = 0; // hits that are free now and become held
    while (h < limit) {
      const s = slotOf.get(blocks[h]!);
      if (s === undefined) break;
      if (this.refs[s] === 0) revived++;
      h++;
    }
    const need = revived + (totalBlocks - h);
    if (!force && need > this.capacity - this.held - this.extra) return null;

    for (let i = 0; i < h; i++) this.hold(slotOf.get(blocks[i]!)!);
    // Reserve the output blocks first so the inserts below evict to make room for them too.
    this.extra += totalBlocks - blocks.length;
    let pinned = h;
    for (let i = h; i < blocks.length; i++) {
      const id = blocks[i]!;
      const s = slotOf.get(id);
      if (s !== undefined) {
        this.hold(s);
      } else {
        const slot = this.allocate();
        if (slot < 0) break; // everything is held: the rest stays private to this request
        this.ids[slot] = id;
        this.refs[slot] = 1;
        this.held++;
        slotOf.set(id, slot);
      }
      pinned++;
    }
    this.extra += blocks.length - pinned;
    return { hits: h, pinned };
  }

  /** A request finished: drop its hold on `blocks[0, pinned)` (tail first) and its private blocks. */
  release(blocks: Int32Array, pinned: number, totalBlocks: number): void {
    this.extra -= totalBlocks - pinned;
    for (let i = pinned - 1; i >= 0; i--) {
      const s = this.slotOf.get(blocks[i]!);
      if (s === undefined) throw new Error(`released block ${blocks[i]} is not cached`);
      if (--this.refs[s]! === 0) {
        this.held--;
        this.append(s);
      }
    }
  }

  private hold(s: number): void {
    if (this.refs[s]!++ === 0) {
      this.held++;
      this.unlink(s);
    }
  }

  /** A slot for a new entry: unused capacity first, else evict the LRU free entry; -1 if none. */
  private allocate(): number {
    if (this.slotOf.size + this.extra < this.capacity) {
      if (this.used === this.ids.length) this.grow();
      return this.used++;
    }
    const s = this.head;
    if (s < 0) return -1;
    this.unlink(s);
    this.slotOf.delete(this.ids[s]!);
    this.evictions++;
    return s;
  }

  private grow(): void {
    const n = Math.min(this.capacity, this.ids.length * 2);
    const resize = (a: Int32Array) => {
      const b = new Int32Array(n);
      b.set(a);
      return b;
    };
    this.ids = resize(this.ids);
    this.refs = resize(this.refs);
    this.prev = resize(this.prev);
    this.next = resize(this.next);
  }

  private append(s: number): void {
    this.prev[s] = this.tail;
    this.next[s] = -1;
    if (this.tail >= 0) this.next[this.tail] = s;
    else this.head = s;
    this.tail = s;
  }

  private unlink(s: number): void {
    const p = this.prev[s]!;
    const n = this.next[s]!;
    if (p >= 0) this.next[p] = n;
    else this.head = n;
    if (n >= 0) this.prev[n] = p;
    else this.tail = p;
  }

  /** Ids of free cached blocks in eviction order (LRU first); for tests. */
  evictionOrder(): number[] {
    const out: number[] = [];
    for (let s = this.head; s >= 0; s = this.next[s]!) out.push(this.ids[s]!);
    return out;
  }
}
