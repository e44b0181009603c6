// Consistent-hash ring over replica ids and weights. Pure: built from plain data, no I/O.
//
// Each replica gets `pointsPerWeight × weight / g` points (g: the weights' greatest common
// divisor; fewer per weight past MAX_RING_POINTS), hash(`${id}#${i}`). Points live in a
// sorted Uint32Array with a parallel array of owner indexes; lookup is a binary search for
// the first point ≥ the key's hash, wrapping to 0. The ring is immutable: callers rebuild it
// only when membership or weight ratios change (see `ringSignature`).

import { hashString } from './hash.js';

export const DEFAULT_POINTS_PER_WEIGHT = 160;
const RADIX_BITS = 12;

function radixStarts(points: Uint32Array): Uint32Array {
  const buckets = 1 << RADIX_BITS;
  const starts = new Uint32Array(buckets + 1);
  let j = 0;
  for (let b = 0; b <= buckets; b++) {
    // Points are sorted: advance to the first whose bucket is ≥ b.
    while (j < points.length && points[j]! >>> (32 - RADIX_BITS) < b) j++;
    starts[b] = j;
  }
  return starts;
}

export interface RingMember {
  readonly id: string;
  readonly weight: number;
}

export class Ring {
  /** Member ids, in the order given to `buildRing`; owner indexes refer to this order. */
  readonly ids: readonly string[];
  readonly weights: readonly number[];
  /** Sorted point hashes. */
  readonly points: Uint32Array;
  /** owners[i] is the member index owning points[i]. */
  readonly owners: Uint16Array;
  readonly signature: string;

  /**
   * starts[b] = first point whose top RADIX_BITS bits are ≥ b (b in 0..2^RADIX_BITS): `locate`
   * binary-searches only its key's bucket, a few points instead of log2(points) steps over the
   * whole array (10,240 points at 64 replicas: 2.5 per bucket).
   */
  private readonly starts: Uint32Array;

  constructor(ids: string[], weights: number[], points: Uint32Array, owners: Uint16Array, signature: string, starts?: Uint32Array) {
    this.ids = ids;
    this.weights = weights;
    this.points = points;
    this.owners = owners;
    this.signature = signature;
    this.starts = starts ?? radixStarts(points);
  }

  /** The radix table, shared by a ring rebuilt with the same points. */
  get radix(): Uint32Array {
    return this.starts;
  }

  get size(): number {
    return this.ids.length;
  }

  /** Index of the first point whose hash is ≥ `hash`, wrapping to 0 past the last point. */
  locate(hash: number): number {
    const pts = this.points;
    const h = hash >>> 0;
    const b = h >>> (32 - RADIX_BITS);
    let lo = this.starts[b]!;
    let hi = this.starts[b + 1]!;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (pts[mid]! < h) lo = mid + 1;
      else hi = mid;
    }
    return lo === pts.length ? 0 : lo;
  }

  /** Member index of the key's home replica (the first point clockwise), or -1 for an empty ring. */
  home(hash: number): number {
    if (this.points.length === 0) return -1;
    return this.owners[this.locate(hash)]!;
  }
}

/**
 * Most points a ring holds (2^17: 512 KiB of points and 256 KiB of owners). 256 replicas at the
 * default 160 points each are 40,960; past the cap (large weights on many replicas) the points
 * per weight are scaled down so Σ points ≤ the cap, keeping build time and memory bounded
 * whatever an admin writes. Envoy caps its ring the same way (maximum_ring_size).
 */
export const MAX_RING_POINTS = 1 << 17;

function gcd(a: number, b: number): number {
  while (b !== 0) [a, b] = [b, a % b];
  return a;
}

interface Geometry {
  /** Weights divided by their greatest common divisor (2, 4, 6 → 1, 2, 3: the same ring). */
  readonly reduced: number[];
  /** Points per reduced weight after the MAX_RING_POINTS cap. */
  readonly perWeight: number;
  readonly signature: string;
}

function geometry(members: readonly RingMember[], pointsPerWeight: number): Geometry {
  if (members.length > 0xffff) throw new RangeError('a ring holds at most 65535 members');
  if (!Number.isInteger(pointsPerWeight) || pointsPerWeight < 1) throw new RangeError(`pointsPerWeight must be a positive integer, got ${pointsPerWeight}`);
  let g = 0;
  for (const m of members) {
    if (!Number.isInteger(m.weight) || m.weight < 1) throw new RangeError(`weight of ${m.id} must be a positive integer`);
    g = gcd(m.weight, g);
  }
  const reduced = members.map((m) => m.weight / (g || 1));
  let sum = 0;
  for (const w of reduced) sum += w;
  const perWeight = sum * pointsPerWeight > MAX_RING_POINTS ? Math.max(1, Math.floor(MAX_RING_POINTS / sum)) : pointsPerWeight;
  // The points depend only on (id, reduced weight) and the points per weight: that is the signature.
  let signature = `${perWeight}`;
  for (let i = 0; i < members.length; i++) signature += `|${members[i]!.id}*${reduced[i]}`;
  return { reduced, perWeight, signature };
}

/**
 * A string that changes exactly when the ring's points change: membership, or weights up to a
 * common factor (draining, health and in-flight counts are not part of it). Compare it to skip
 * rebuilds; `buildRing(members, ppw, previous)` does that itself.
 */
export function ringSignature(members: readonly RingMember[], pointsPerWeight = DEFAULT_POINTS_PER_WEIGHT): string {
  return geometry(members, pointsPerWeight).signature;
}

/**
 * Build the ring of `members`. With `previous`, its points are reused when the signature is the
 * same (an admin PATCH that only drains, or weights scaled by a common factor): no hashing and
 * no sort, only a new `weights` list when the weights differ.
 */
export function buildRing(members: readonly RingMember[], pointsPerWeight = DEFAULT_POINTS_PER_WEIGHT, previous?: Ring): Ring {
  const geo = geometry(members, pointsPerWeight);
  if (previous !== undefined && previous.signature === geo.signature) {
    if (members.every((m, i) => previous.weights[i] === m.weight)) return previous;
    return new Ring(previous.ids as string[], members.map((m) => m.weight), previous.points, previous.owners, geo.signature, previous.radix);
  }
  let total = 0;
  for (const w of geo.reduced) total += w * geo.perWeight;
  const hashes = new Uint32Array(total);
  const ownersUnsorted = new Uint16Array(total);
  let n = 0;
  members.forEach((m, idx) => {
    const count = geo.reduced[idx]! * geo.perWeight;
    for (let i = 0; i < count; i++) {
      hashes[n] = hashString(`${m.id}#${i}`);
      ownersUnsorted[n] = idx;
      n++;
    }
  });
  // Sort point indexes by hash, ties by owner id so the result never depends on insertion order.
  const order = new Uint32Array(total);
  for (let i = 0; i < total; i++) order[i] = i;
  const ids = members.map((m) => m.id);
  order.sort((a, b) => hashes[a]! - hashes[b]! || (ids[ownersUnsorted[a]!]! < ids[ownersUnsorted[b]!]! ? -1 : 1));
  const points = new Uint32Array(total);
  const owners = new Uint16Array(total);
  for (let i = 0; i < total; i++) {
    points[i] = hashes[order[i]!]!;
    owners[i] = ownersUnsorted[order[i]!]!;
  }
  return new Ring(ids, members.map((m) => m.weight), points, owners, geo.signature);
}
