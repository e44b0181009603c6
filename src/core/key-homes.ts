// Which replica slot each routing key last went to, in a fixed table: 2-way set-associative,
// the older of a set's two entries replaced first, no allocation after the first write. Pure.
//
// prefix-aware asks it whether a session's key went to the replica holding the best match (a
// continuation) or is new (prefix-index.ts `keyHomeIn`). A Map kept in LRU order cost an
// allocation per new key once full (every delete + set leaves a hole V8 compacts by copying
// the table), which showed as GC time in the coordinator's hot path. Here a key that loses its
// entry to two more recent keys of its set is forgotten early: its session's next turn then
// looks new, which matters only while some replica is under-served (it may be seeded there
// once). With 2^15 entries and a few thousand live sessions that is rare.

/** Entries in a table (a power of two): 2^15 × 12 B = 384 KB, allocated on the first write. */
export const MAX_KEY_HOMES = 1 << 15;

export class KeyHomes {
  private keys = new Uint32Array(0);
  private vals = new Uint32Array(0);
  /** Last write per entry; 0 = empty. */
  private stamps = new Uint32Array(0);
  private clock = 0;
  private readonly setMask: number;

  constructor(readonly capacity = MAX_KEY_HOMES) {
    if (!Number.isInteger(Math.log2(capacity)) || capacity < 2) throw new RangeError(`capacity must be a power of two ≥ 2, got ${capacity}`);
    this.setMask = capacity / 2 - 1;
  }

  /** The value last stored for `key`, or −1. */
  get(key: number): number {
    if (this.stamps.length === 0) return -1;
    const k = key >>> 0;
    const i = this.setOf(k);
    if (this.stamps[i] !== 0 && this.keys[i] === k) return this.vals[i]!;
    if (this.stamps[i + 1] !== 0 && this.keys[i + 1] === k) return this.vals[i + 1]!;
    return -1;
  }

  /** Store `value` (a uint32) for `key`, replacing the older entry of its set when both are taken. */
  set(key: number, value: number): void {
    if (this.stamps.length === 0) {
      this.keys = new Uint32Array(this.capacity);
      this.vals = new Uint32Array(this.capacity);
      this.stamps = new Uint32Array(this.capacity);
    }
    const k = key >>> 0;
    const i = this.setOf(k);
    const st = this.stamps;
    let w: number;
    if (st[i] !== 0 && this.keys[i] === k) w = i;
    else if (st[i + 1] !== 0 && this.keys[i + 1] === k) w = i + 1;
    else w = st[i]! <= st[i + 1]! ? i : i + 1;
    if (this.clock === 0xffffffff) {
      // Four billion writes: restart the clock, keeping each set's order as well as it can.
      for (let j = 0; j < st.length; j++) if (st[j] !== 0) st[j] = 1;
      this.clock = 1;
    }
    this.keys[w] = k;
    this.vals[w] = value >>> 0;
    st[w] = ++this.clock;
  }

  /** Entries in use. */
  size(): number {
    let n = 0;
    for (let j = 0; j < this.stamps.length; j++) if (this.stamps[j] !== 0) n++;
    return n;
  }

  private setOf(k: number): number {
    return ((Math.imul(k ^ (k >>> 16), 0x45d9f3b) >>> 0) & this.setMask) * 2;
  }
}
