// What the coordinator's pick reads, kept between acquires (issue #17): the replica views the core
// picks over and the pool totals (core load-bound.ts RunningTotals: Σ in-flight kept running, the
// usable weight sums cached per version), so an acquire neither builds one view per replica nor
// walks them all for the load bound. No I/O; the coordinator tells it what changed.
//
// Two kinds of change:
// - `moved(r)`: r's load moved (a lease taken, released, expired or restored; its engine queue
//   scraped). Its view and Σ in-flight follow in O(1); if it crossed the pool's per-replica cap
//   (its view turns draining or back) that is a usability change, as below.
// - `invalidate()`: membership, health, draining, a weight or the ring changed. The next pick
//   rebuilds every view and recomputes the totals from them (a resync: nothing kept survives it).
// Health also changes with time alone (a passive exclusion ends at passiveDownUntil): the views
// are rebuilt once the clock reaches the earliest such end seen at the last build.

import { RunningTotals, type ReplicaView } from '../core/index.js';
import type { PoolRuntime } from '../config.js';

/** The fields of a coordinator replica its view is made of. */
export interface PickReplica {
  readonly id: string;
  readonly weight: number;
  readonly draining: boolean;
  readonly inFlight: number;
  readonly activeUp: boolean;
  readonly passiveDownUntil: number;
  readonly vllm: { readonly waiting: number | null };
}

export type PickSignal = Pick<PoolRuntime, 'loadSignal' | 'maxInFlightPerReplica'>;

type View = { -readonly [K in keyof ReplicaView]: ReplicaView[K] };

/** The core's view of one replica; `ignorePassive` counts a passively excluded replica as healthy. */
export function replicaView(r: PickReplica, now: number, pool: PickSignal, ignorePassive = false): ReplicaView {
  return { id: r.id, weight: r.weight, inFlight: loadOf(r, pool), healthy: r.activeUp && (ignorePassive || now >= r.passiveDownUntil), draining: drainingOf(r, pool) };
}

/** inflight+waiting also counts the replica's own engine queue that other clients put there. */
function loadOf(r: PickReplica, pool: PickSignal): number {
  return pool.loadSignal === 'inflight+waiting' ? r.inFlight + queueOf(r.vllm.waiting) : r.inFlight;
}

/** Most queued requests an origin's /metrics is believed: far above any real engine's queue. */
const MAX_QUEUE = 1 << 20;

/**
 * The origin's queue as a whole number in [0, MAX_QUEUE]: a negative one would make the replica
 * look emptier than idle (it would take every request), and a huge or fractional one would break
 * the exact running Σ in-flight (1e20 + 5 − 1e20 = 0 in floating point).
 */
function queueOf(waiting: number | null): number {
  return waiting !== null && waiting > 0 ? Math.min(MAX_QUEUE, Math.round(waiting)) : 0;
}

/** A replica at the pool's per-replica cap takes nothing new: all there = saturated (spill). */
function drainingOf(r: PickReplica, pool: PickSignal): boolean {
  const cap = pool.maxInFlightPerReplica;
  return r.draining || (cap !== undefined && r.inFlight >= cap);
}

export class PickState<R extends PickReplica> {
  /** Σ view in-flight over the members and their usable weight sums: describes `views` exactly. */
  readonly totals = new RunningTotals();
  private version = 0;
  private built = -1;
  private builtAt = 0;
  private views: View[] = [];
  private byReplica = new Map<R, View>();
  private signal: PickSignal = { loadSignal: 'inflight' };
  /** The earliest passive exclusion still ahead at the last build: health changes then. */
  private edge = Infinity;

  /** Membership, health, draining, a weight or the ring changed: rebuild before the next pick. */
  invalidate(): void {
    this.version++;
  }

  /** r's in-flight count or engine queue moved: its view and Σ in-flight follow. */
  moved(r: R): void {
    if (this.built !== this.version) return; // the next pick rebuilds from scratch anyway
    const v = this.byReplica.get(r);
    if (v === undefined) return; // not a member (removed; its streams still end)
    if (drainingOf(r, this.signal) !== v.draining) {
      this.invalidate();
      return;
    }
    const load = loadOf(r, this.signal);
    this.totals.add(load - v.inFlight);
    v.inFlight = load;
  }

  /**
   * The views to pick over (in `replicas` order, as the ring's ids) with `totals` describing
   * them. Valid until the next change the coordinator reports; the core only reads them.
   */
  current(replicas: readonly R[], pool: PickSignal, now: number): readonly ReplicaView[] {
    if (now >= this.edge || now < this.builtAt || pool.loadSignal !== this.signal.loadSignal || pool.maxInFlightPerReplica !== this.signal.maxInFlightPerReplica) this.invalidate();
    if (this.built !== this.version) this.build(replicas, pool, now);
    return this.views;
  }

  private build(replicas: readonly R[], pool: PickSignal, now: number): void {
    this.signal = { loadSignal: pool.loadSignal, maxInFlightPerReplica: pool.maxInFlightPerReplica };
    this.views = new Array<View>(replicas.length);
    this.byReplica.clear();
    let used = 0;
    let edge = Infinity;
    for (let i = 0; i < replicas.length; i++) {
      const r = replicas[i]!;
      const v = replicaView(r, now, this.signal) as View;
      this.views[i] = v;
      this.byReplica.set(r, v);
      used += v.inFlight;
      if (r.passiveDownUntil > now && r.passiveDownUntil < edge) edge = r.passiveDownUntil;
    }
    this.totals.used = used;
    this.totals.refresh(this.views, this.version);
    this.edge = edge;
    this.builtAt = now;
    this.built = this.version;
  }
}
