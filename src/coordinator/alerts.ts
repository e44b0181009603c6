// Alert logic for a pool: a replica whose waiting queue stays far above the pool's median,
// and a single routing key carrying too large a share of the pool's requests. Pure: no I/O,
// the clock is a parameter, and all state is plain JSON the Durable Object may persist.

// ---- Queue imbalance --------------------------------------------------------------------
//
//   median    = median of `waiting` over the replicas with data this round
//               (the mean of the two middle values for an even count)
//   threshold = max(factor × median, median + offset)            (defaults 2 and 4)
//   above(r)  ⇔ waiting(r) > threshold
//
// A replica raises once it has been above for `holdMs` (default 10 min) and clears once it
// has been at or below for `clearMs` (default 1 min). The clear delay is the hysteresis: a
// queue hovering around the threshold would otherwise raise and clear on every scrape once it
// has qualified. Set `clearMs` to 0 to clear on the first good reading.
//
// Both the factor and the offset are needed: the factor alone fires on 1 vs 3 waiting in an
// idle pool, the offset alone ignores a pool where the median itself is large.
// Note: with two replicas the median is their mean, so the threshold is ≥ the larger value and
// this rule cannot fire; it needs three or more replicas with data.
//
// Time only counts while a replica keeps reporting: a replica missing from an evaluation keeps
// its state; one not seen for `staleMs` is dropped (an active alert clears with `no_data`), and
// a reading after a gap longer than `staleMs` restarts its hold.

export interface ImbalanceOptions {
  readonly factor?: number;
  readonly offset?: number;
  readonly holdMs?: number;
  readonly clearMs?: number;
  readonly staleMs?: number;
}

export const IMBALANCE_DEFAULTS = {
  factor: 2,
  offset: 4,
  holdMs: 10 * 60_000,
  clearMs: 60_000,
  staleMs: 5 * 60_000,
} as const satisfies Required<ImbalanceOptions>;

export interface ImbalanceReplicaState {
  /** When it first went above the threshold in the current streak; null when not above. */
  readonly aboveSince: number | null;
  /** When it first went back at or below while raised; null otherwise. */
  readonly belowSince: number | null;
  /** When the alert was raised; null when not active. */
  readonly raisedAt: number | null;
  readonly lastSeen: number;
  readonly waiting: number;
  readonly threshold: number;
  readonly median: number;
}

export interface ImbalanceState {
  readonly replicas: Readonly<Record<string, ImbalanceReplicaState>>;
}

export interface ImbalanceAlert {
  readonly kind: 'queue_imbalance';
  readonly replica: string;
  readonly raisedAt: number;
  readonly aboveSince: number;
  readonly waiting: number;
  readonly threshold: number;
  readonly median: number;
}

export interface ImbalanceEvent {
  readonly type: 'raised' | 'cleared';
  readonly replica: string;
  readonly at: number;
  /** Why it cleared: the queue came down, or the replica stopped reporting. */
  readonly reason?: 'recovered' | 'no_data';
  readonly waiting: number;
  readonly threshold: number;
  readonly median: number;
}

export interface ImbalanceInput {
  readonly now: number;
  /** Replica id → `vllm:num_requests_waiting`. Non-finite or negative values count as no data. */
  readonly waiting: Readonly<Record<string, number>>;
}

export interface ImbalanceResult {
  readonly state: ImbalanceState;
  readonly alerts: ImbalanceAlert[];
  readonly events: ImbalanceEvent[];
}

export function emptyImbalanceState(): ImbalanceState {
  return { replicas: {} };
}

export function resolveImbalanceOptions(options: ImbalanceOptions = {}): Required<ImbalanceOptions> {
  const o = { ...IMBALANCE_DEFAULTS, ...stripUndefined(options) };
  if (!(o.factor >= 1) || !Number.isFinite(o.factor)) throw new RangeError(`imbalance factor must be a finite number ≥ 1, got ${o.factor}`);
  for (const k of ['offset', 'holdMs', 'clearMs', 'staleMs'] as const) {
    if (!(o[k] >= 0) || !Number.isFinite(o[k])) throw new RangeError(`imbalance ${k} must be a finite number ≥ 0, got ${o[k]}`);
  }
  return o;
}

/** Median of the values (mean of the two middle ones for an even count); NaN when empty. */
export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

export function imbalanceThreshold(med: number, options: ImbalanceOptions = {}): number {
  const o = resolveImbalanceOptions(options);
  return Math.max(o.factor * med, med + o.offset);
}

/** One evaluation round over a pool. Returns a new state; the input state is not modified. */
export function evaluateImbalance(state: ImbalanceState, input: ImbalanceInput, options: ImbalanceOptions = {}): ImbalanceResult {
  const o = resolveImbalanceOptions(options);
  const { now } = input;
  const readings = new Map<string, number>();
  for (const id of Object.keys(input.waiting)) {
    const v = input.waiting[id];
    if (v !== undefined && Number.isFinite(v) && v >= 0) readings.set(id, v);
  }
  const med = median([...readings.values()]);
  const threshold = Math.max(o.factor * med, med + o.offset);

  const replicas: Record<string, ImbalanceReplicaState> = Object.create(null) as Record<string, ImbalanceReplicaState>;
  const alerts: ImbalanceAlert[] = [];
  const events: ImbalanceEvent[] = [];

  // Replicas with no reading this round: keep them frozen until stale.
  for (const id of Object.keys(state.replicas)) {
    if (readings.has(id)) continue;
    const r = state.replicas[id]!;
    if (now - r.lastSeen >= o.staleMs) {
      if (r.raisedAt !== null) {
        events.push({ type: 'cleared', replica: id, at: now, reason: 'no_data', waiting: r.waiting, threshold: r.threshold, median: r.median });
      }
      continue;
    }
    replicas[id] = r;
    if (r.raisedAt !== null) alerts.push(toAlert(id, r));
  }

  for (const [id, waiting] of readings) {
    let prev: ImbalanceReplicaState | undefined = Object.prototype.hasOwnProperty.call(state.replicas, id) ? state.replicas[id] : undefined;
    if (prev !== undefined && now - prev.lastSeen > o.staleMs) {
      // A long gap: what happened in between is unknown, so the hold starts over. An active
      // alert stays up until a reading says otherwise.
      prev = { ...prev, aboveSince: null, belowSince: null };
    }
    const above = waiting > threshold;
    let aboveSince = prev?.aboveSince ?? null;
    let belowSince = prev?.belowSince ?? null;
    let raisedAt = prev?.raisedAt ?? null;

    if (above) {
      aboveSince ??= now;
      belowSince = null;
      if (raisedAt === null && now - aboveSince >= o.holdMs) {
        raisedAt = now;
        events.push({ type: 'raised', replica: id, at: now, waiting, threshold, median: med });
      }
    } else {
      aboveSince = null;
      if (raisedAt !== null) {
        belowSince ??= now;
        if (now - belowSince >= o.clearMs) {
          events.push({ type: 'cleared', replica: id, at: now, reason: 'recovered', waiting, threshold, median: med });
          raisedAt = null;
          belowSince = null;
        }
      } else {
        belowSince = null;
      }
    }

    const next: ImbalanceReplicaState = { aboveSince, belowSince, raisedAt, lastSeen: now, waiting, threshold, median: med };
    replicas[id] = next;
    if (raisedAt !== null) alerts.push(toAlert(id, next));
  }

  alerts.sort((a, b) => (a.replica < b.replica ? -1 : a.replica > b.replica ? 1 : 0));
  return { state: { replicas: { ...replicas } }, alerts, events };
}

function toAlert(replica: string, r: ImbalanceReplicaState): ImbalanceAlert {
  return {
    kind: 'queue_imbalance',
    replica,
    raisedAt: r.raisedAt!,
    // While clearing, the streak above has ended; report when the alert went up.
    aboveSince: r.aboveSince ?? r.raisedAt!,
    waiting: r.waiting,
    threshold: r.threshold,
    median: r.median,
  };
}

// ---- Hot routing key --------------------------------------------------------------------
//
// Space-Saving (Metwally, Agrawal, El Abbadi, "Efficient Computation of Frequent and Top-k
// Elements in Data Streams", ICDT 2005): k counters; a monitored key increments its counter;
// an unmonitored key replaces the key with the smallest count m and takes count m + 1 with
// error m. Every key with true frequency > N/k is monitored, and for each monitored key
//   count − error ≤ true count ≤ count.
// The window is `buckets` sketches of `windowMs / buckets` each (default 5 × 1 min); a sketch
// is dropped as a whole when its minute leaves the window, so old traffic ages out, and the
// live ones are merged by summing per key (Agarwal et al., "Mergeable Summaries", PODS 2012):
// a key absent from a full sketch may have been counted there up to that sketch's minimum.
// The newest sketch is partial, so the window holds between windowMs − windowMs/buckets and
// windowMs of traffic.
//
//   share(key) = guaranteed(key) / N,  guaranteed = Σ (count − error) over the live sketches
//   hot(key)  ⇔ share(key) > threshold (default 0.2) and guaranteed(key) ≥ minCount (default 50)
//
// Alerting on the guaranteed lower bound means no false alarm from sketch overcounting; the
// price is that a key within N/k of the threshold (1.6 % of N at k = 64) may be missed.
// Keys are `(kind, 8-hex-digit hash)`: the raw routing key never reaches this module.

export interface HotKeyConfig {
  /** Counters per sketch (k). Default 64. */
  readonly capacity: number;
  /** Window length, ms. Default 5 min. */
  readonly windowMs: number;
  /** Sketches per window. Default 5 (one per minute). */
  readonly buckets: number;
}

export const HOT_KEY_DEFAULTS = {
  capacity: 64,
  windowMs: 5 * 60_000,
  buckets: 5,
  threshold: 0.2,
  minCount: 50,
} as const;

/**
 * One Space-Saving sketch: parallel arrays (slot i monitors `keys[i]` with `counts[i]` and
 * `errors[i]`), at most `capacity` slots. Arrays keep it plain JSON and make the scan for
 * the minimum a tight loop over numbers.
 */
export interface HotKeyBucket {
  /** Bucket start, ms, a multiple of the bucket length. */
  readonly start: number;
  total: number;
  readonly keys: string[];
  readonly counts: number[];
  readonly errors: number[];
}

/** Plain JSON; safe to persist in Durable Object storage. Bounded: buckets × capacity keys. */
export interface HotKeyState {
  readonly config: HotKeyConfig;
  /** Oldest first. */
  readonly buckets: HotKeyBucket[];
  /** Key → when its alert was raised. */
  readonly active: Record<string, number>;
  /** Inputs ignored because the kind or hash was not of the expected form. */
  rejected: number;
}

export function createHotKeyState(config: Partial<HotKeyConfig> = {}): HotKeyState {
  const c: HotKeyConfig = {
    capacity: config.capacity ?? HOT_KEY_DEFAULTS.capacity,
    windowMs: config.windowMs ?? HOT_KEY_DEFAULTS.windowMs,
    buckets: config.buckets ?? HOT_KEY_DEFAULTS.buckets,
  };
  if (!Number.isInteger(c.capacity) || c.capacity < 1 || c.capacity > 4096) throw new RangeError(`hot-key capacity must be an integer in [1, 4096], got ${c.capacity}`);
  if (!Number.isInteger(c.buckets) || c.buckets < 1 || c.buckets > 60) throw new RangeError(`hot-key buckets must be an integer in [1, 60], got ${c.buckets}`);
  if (!Number.isFinite(c.windowMs) || c.windowMs < c.buckets) throw new RangeError(`hot-key windowMs must be a finite number ≥ buckets, got ${c.windowMs}`);
  return { config: c, buckets: [], active: {}, rejected: 0 };
}

const KEY_KIND = /^[a-z][a-z0-9_-]{0,31}$/;
const KEY_HASH = /^[0-9a-f]{8}$/;

export function bucketMs(config: HotKeyConfig): number {
  return Math.floor(config.windowMs / config.buckets);
}

/** The id a key is counted under: `kind:hash`, the hash in lower case. null if malformed. */
export function hotKeyId(keyKind: string, keyHash: string): string | null {
  const hash = typeof keyHash === 'string' ? keyHash.toLowerCase() : '';
  if (typeof keyKind !== 'string' || !KEY_KIND.test(keyKind) || !KEY_HASH.test(hash)) return null;
  return `${keyKind}:${hash}`;
}

/**
 * Counts one request for `(keyKind, keyHash)` at `now`. MUTATES `state` in place and returns
 * it: this runs once per request, and copying k × buckets counters each time would be the
 * only cost. O(1) for a monitored key, O(k) over a number array for a new one.
 * Every other function in this module leaves its input alone.
 */
export function recordHotKey(state: HotKeyState, now: number, keyKind: string, keyHash: string): HotKeyState {
  const id = hotKeyId(keyKind, keyHash);
  if (id === null || !Number.isFinite(now)) {
    state.rejected++;
    return state;
  }
  const len = bucketMs(state.config);
  const start = Math.floor(now / len) * len;
  const buckets = state.buckets;
  let bucket = buckets[buckets.length - 1];
  if (bucket === undefined || start > bucket.start) {
    bucket = { start, total: 0, keys: [], counts: [], errors: [] };
    buckets.push(bucket);
    // Drop what left the window; a clock that went back counts into the newest bucket.
    const oldest = start - (state.config.buckets - 1) * len;
    let drop = 0;
    while (drop < buckets.length && buckets[drop]!.start < oldest) drop++;
    if (drop > 0) buckets.splice(0, drop);
  }
  spaceSavingAdd(bucket, id, state.config.capacity);
  return state;
}

// key → slot, per bucket object; rebuilt on first use after the state is revived from JSON.
const slotIndex = new WeakMap<HotKeyBucket, Map<string, number>>();

function indexOf(bucket: HotKeyBucket): Map<string, number> {
  let idx = slotIndex.get(bucket);
  if (idx === undefined || idx.size !== bucket.keys.length) {
    idx = new Map(bucket.keys.map((k, i) => [k, i]));
    slotIndex.set(bucket, idx);
  }
  return idx;
}

function spaceSavingAdd(bucket: HotKeyBucket, id: string, capacity: number): void {
  bucket.total++;
  const idx = indexOf(bucket);
  const slot = idx.get(id);
  if (slot !== undefined) {
    bucket.counts[slot]!++;
    return;
  }
  const { keys, counts, errors } = bucket;
  if (keys.length < capacity) {
    idx.set(id, keys.length);
    keys.push(id);
    counts.push(1);
    errors.push(0);
    return;
  }
  let min = 0;
  for (let i = 1; i < counts.length; i++) if (counts[i]! < counts[min]!) min = i;
  const m = counts[min]!;
  idx.delete(keys[min]!);
  idx.set(id, min);
  keys[min] = id;
  counts[min] = m + 1;
  errors[min] = m;
}

export interface HotKeyEstimate {
  readonly keyKind: string;
  readonly keyHash: string;
  /** Upper bound on its requests in the window. */
  readonly count: number;
  /** Lower bound on its requests in the window. */
  readonly guaranteed: number;
  /** guaranteed / total. */
  readonly share: number;
}

/** Live buckets at `now`, oldest first (non-mutating). */
function liveBuckets(state: HotKeyState, now: number): HotKeyBucket[] {
  const len = bucketMs(state.config);
  const oldest = Math.floor(now / len) * len - (state.config.buckets - 1) * len;
  return state.buckets.filter((b) => b.start >= oldest);
}

/** The window's merged estimates, by guaranteed count (then id), highest first, and the total. */
export function topHotKeys(state: HotKeyState, now: number, limit = 10): { total: number; keys: HotKeyEstimate[] } {
  const live = liveBuckets(state, now);
  let total = 0;
  const merged = new Map<string, { count: number; guaranteed: number }>();
  for (const b of live) {
    total += b.total;
    for (let i = 0; i < b.keys.length; i++) {
      const id = b.keys[i]!;
      const count = b.counts[i]!;
      const error = b.errors[i]!;
      const m = merged.get(id);
      if (m === undefined) merged.set(id, { count, guaranteed: count - error });
      else {
        m.count += count;
        m.guaranteed += count - error;
      }
    }
  }
  // A key missing from a full sketch may have been counted there up to that sketch's minimum.
  for (const b of live) {
    if (b.keys.length < state.config.capacity) continue;
    const min = Math.min(...b.counts);
    const present = new Set(b.keys);
    for (const [id, m] of merged) if (!present.has(id)) m.count += min;
  }
  const keys: HotKeyEstimate[] = [];
  for (const [id, m] of merged) {
    const sep = id.lastIndexOf(':');
    keys.push({ keyKind: id.slice(0, sep), keyHash: id.slice(sep + 1), count: m.count, guaranteed: m.guaranteed, share: total > 0 ? m.guaranteed / total : 0 });
  }
  keys.sort((a, b) => b.guaranteed - a.guaranteed || b.count - a.count || (a.keyKind + a.keyHash < b.keyKind + b.keyHash ? -1 : 1));
  return { total, keys: keys.slice(0, Math.max(0, limit)) };
}

export interface HotKeyOptions {
  /** Share of the window's requests above which a key is hot. Default 0.2. */
  readonly threshold?: number;
  /** Guaranteed requests a key needs in the window before it can be hot. Default 50. */
  readonly minCount?: number;
}

export interface HotKeyAlert {
  readonly kind: 'hot_key';
  readonly keyKind: string;
  readonly keyHash: string;
  readonly raisedAt: number;
  readonly share: number;
  readonly guaranteed: number;
  readonly count: number;
  readonly total: number;
}

export interface HotKeyEvent {
  readonly type: 'raised' | 'cleared';
  readonly keyKind: string;
  readonly keyHash: string;
  readonly at: number;
  readonly share: number;
}

export interface HotKeyResult {
  readonly state: HotKeyState;
  readonly alerts: HotKeyAlert[];
  readonly events: HotKeyEvent[];
  readonly total: number;
}

/**
 * Which keys are hot over the window ending at `now`. Returns a new state (with stale buckets
 * dropped and the set of active alerts updated); the input state is not modified. A key
 * clears as soon as it is no longer hot: the window itself smooths the signal.
 */
export function evaluateHotKeys(state: HotKeyState, now: number, options: HotKeyOptions = {}): HotKeyResult {
  const threshold = options.threshold ?? HOT_KEY_DEFAULTS.threshold;
  const minCount = options.minCount ?? HOT_KEY_DEFAULTS.minCount;
  if (!(threshold > 0 && threshold <= 1)) throw new RangeError(`hot-key threshold must be in (0, 1], got ${threshold}`);
  if (!(minCount >= 0) || !Number.isFinite(minCount)) throw new RangeError(`hot-key minCount must be a finite number ≥ 0, got ${minCount}`);

  // A key can exceed a share s only if it holds one of the top ⌊1/s⌋ guaranteed counts.
  const { total, keys } = topHotKeys(state, now, Math.ceil(1 / threshold) + 1);
  const hot = keys.filter((k) => k.share > threshold && k.guaranteed >= minCount);

  const active: Record<string, number> = {};
  const alerts: HotKeyAlert[] = [];
  const events: HotKeyEvent[] = [];
  for (const k of hot) {
    const id = `${k.keyKind}:${k.keyHash}`;
    const had = Object.prototype.hasOwnProperty.call(state.active, id);
    const since = had ? state.active[id]! : now;
    if (!had) events.push({ type: 'raised', keyKind: k.keyKind, keyHash: k.keyHash, at: now, share: k.share });
    active[id] = since;
    alerts.push({ kind: 'hot_key', keyKind: k.keyKind, keyHash: k.keyHash, raisedAt: since, share: k.share, guaranteed: k.guaranteed, count: k.count, total });
  }
  const shares = new Map(keys.map((k) => [`${k.keyKind}:${k.keyHash}`, k.share]));
  for (const id of Object.keys(state.active)) {
    if (Object.prototype.hasOwnProperty.call(active, id)) continue;
    const sep = id.lastIndexOf(':');
    events.push({ type: 'cleared', keyKind: id.slice(0, sep), keyHash: id.slice(sep + 1), at: now, share: shares.get(id) ?? 0 });
  }

  const buckets = liveBuckets(state, now).map((b) => ({ start: b.start, total: b.total, keys: [...b.keys], counts: [...b.counts], errors: [...b.errors] }));
  return { state: { config: state.config, buckets, active, rejected: state.rejected }, alerts, events, total };
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  const out: Partial<T> = {};
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] !== undefined) out[k] = o[k];
  return out;
}
