// Consistent-hash ring over replica ids and weights. Pure: built from plain data, no I/O.
//
// Each replica gets `pointsPerWeight × weight` points, hash(`${id}#${i}`). Points live in a
// sorted Uint32Array with a parallel array of owner indexes; lookup is a binary search for
// the first point ≥ the key's hash, wrapping to 0. The ring is immutable: callers rebuild it
// only when membership or weights change (see `ringSignature`).

import { hashString } from './hash.js';

export const DEFAULT_POINTS_PER_WEIGHT = 160;

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

  constructor(ids: string[], weights: number[], points: Uint32Array, owners: Uint16Array, signature: string) {
    this.ids = ids;
    this.weights = weights;
    this.points = points;
    this.owners = owners;
    this.signature = signature;
  }

  get size(): number {
    return this.ids.length;
  }

  /** Index of the first point whose hash is ≥ `hash`, wrapping to 0 past the last point. */
  locate(hash: number): number {
    const pts = this.points;
    const h = hash >>> 0;
    let lo = 0;
    let hi = pts.length;
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

/** A string that changes exactly when membership or weights change; compare it to skip rebuilds. */
export function ringSignature(members: readonly RingMember[], pointsPerWeight = DEFAULT_POINTS_PER_WEIGHT): string {
  return `${pointsPerWeight}|` + members.map((m) => `${m.id}*${m.weight}`).join('|');
}

export function buildRing(members: readonly RingMember[], pointsPerWeight = DEFAULT_POINTS_PER_WEIGHT): Ring {
  if (members.length > 0xffff) throw new RangeError('a ring holds at most 65535 members');
  let total = 0;
  for (const m of members) {
    if (!Number.isInteger(m.weight) || m.weight < 1) throw new RangeError(`weight of ${m.id} must be a positive integer`);
    total += m.weight * pointsPerWeight;
  }
  const hashes = new Uint32Array(total);
  const ownersUnsorted = new Uint16Array(total);
  let n = 0;
  members.forEach((m, idx) => {
    const count = m.weight * pointsPerWeight;
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
  return new Ring(ids, members.map((m) => m.weight), points, owners, ringSignature(members, pointsPerWeight));
}
