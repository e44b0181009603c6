// Fail-open routing (lease protocol v2): when a pool's coordinator cannot be reached in time, the
// Worker picks the replica itself with the pure core, by consistent hashing over the replica set
// and health the coordinator last sent this isolate (or the configured replicas before any
// reply), with the load bound applied to this isolate's own open requests only. Same ring as the
// coordinator's (same members, weights and points per weight), so a key goes to the same home
// replica as it would through the coordinator. Pure bookkeeping; no I/O.

import { buildRing, createStrategy, pickReplica, type ReplicaView, type Ring, type Strategy } from '../core/index.js';
import type { PoolRuntime } from '../config.js';
import type { PoolView } from '../coordinator/types.js';
import type { LeasedReplica } from './early-connect.js';

/** Consistent hashing with a bound over this isolate's open requests (HAProxy factor 1.25). */
const OPEN_STRATEGY: Strategy = createStrategy('bounded-hash:1.25');
const OPEN_FALLBACK: Strategy = createStrategy('least-load');

export interface OpenPick {
  replica: LeasedReplica;
  spilled: boolean;
}

export class FailOpenRouter {
  readonly #rings = new Map<string, { version: string; ring: Ring }>();
  /** This isolate's requests under way per pool and replica, routed open. */
  readonly #open = new Map<string, Map<string, number>>();
  readonly #tenants = new Map<string, Map<string, number>>();

  /**
   * Pick for a request whose coordinator is unreachable. Healthy, non-draining replicas first; when
   * the last known view has none, any replica of it (the view may be stale; a failed attempt is
   * retried elsewhere as usual). Null only when the pool has no replica at all.
   */
  pick(pool: PoolRuntime, view: PoolView | null, key: number | null, exclude: readonly string[], random: () => number): OpenPick | null {
    const v = view ?? seedView(pool);
    if (v.replicas.length === 0) return null;
    let cached = this.#rings.get(pool.name);
    if (!cached || cached.version !== v.version) {
      cached = { version: v.version, ring: buildRing(v.replicas.map((r) => ({ id: r.id, weight: r.weight })), pool.pointsPerWeight) };
      this.#rings.set(pool.name, cached);
    }
    const open = this.#open.get(pool.name);
    const views = (ignoreHealth: boolean): ReplicaView[] =>
      v.replicas.map((r) => ({ id: r.id, weight: r.weight, inFlight: open?.get(r.id) ?? 0, healthy: ignoreHealth || r.healthy, draining: ignoreHealth ? false : r.draining }));
    const ctx = { ring: cached.ring, key, exclude: exclude.length > 0 ? new Set(exclude) : undefined, random };
    let res = pickReplica(OPEN_STRATEGY, OPEN_FALLBACK, { ...ctx, replicas: views(false) });
    if (!res.ok) res = pickReplica(OPEN_STRATEGY, OPEN_FALLBACK, { ...ctx, replicas: views(true) });
    if (!res.ok) return null;
    const r = v.replicas[res.index]!;
    return { replica: { id: r.id, url: r.url, auth: r.auth }, spilled: res.spilled };
  }

  /** Count an open request on `replica` (and for `tenant`) until the returned function is called. */
  enter(pool: string, replica: string, tenant: string): () => void {
    const inc = (outer: Map<string, Map<string, number>>, k: string, d: number) => {
      let m = outer.get(pool);
      if (!m) outer.set(pool, (m = new Map()));
      const n = (m.get(k) ?? 0) + d;
      if (n > 0) m.set(k, n);
      else m.delete(k);
    };
    inc(this.#open, replica, 1);
    inc(this.#tenants, tenant, 1);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      inc(this.#open, replica, -1);
      inc(this.#tenants, tenant, -1);
    };
  }

  /** This isolate's open requests of `tenant` in `pool`: its cap is held per isolate while open. */
  tenantOpen(pool: string, tenant: string): number {
    return this.#tenants.get(pool)?.get(tenant) ?? 0;
  }
}

/** Before any coordinator reply: the configured replicas, all presumed healthy. */
function seedView(pool: PoolRuntime): PoolView {
  return { version: 'config', replicas: pool.replicas.map((r) => ({ id: r.id, url: r.url, auth: r.auth, weight: r.weight, healthy: true, draining: r.draining })) };
}
