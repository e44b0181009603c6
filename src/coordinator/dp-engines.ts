// Data-parallel engines of a vLLM replica kept apart in the prefix index: one index slot per
// engine core, each sized from that engine's own KV capacity, the engine a request is pinned to,
// and the rank sent upstream (docs/operations.md, "Data-parallel engines"). Pure: no I/O; the
// coordinator holds one `DpEngines` per replica and one `EngineMatcher` per pool.
//
// What vLLM reports and which engine labels its rank header can address: engines/vllm.ts
// (`rankedEngines`, with the sources); per-engine KV capacity: engines/vllm.ts `vllmKvCapacity`
// and engines/kv-capacity.ts.
//
// Slots: a single-engine replica's slot is its id, as before; a pinned replica's are
// `<id>#dp<rank>` ('#' cannot occur in a replica id, config.ts). A replica is pinned only when
// its scrape names two or more engines with contiguous integer labels, the pool is vLLM and
// prefix-aware (only the prefix index says where a prompt is), pinning is not turned off and the pool's slots stay within MAX_POOL_ENGINE_SLOTS; otherwise
// its engines stay one slot (summed capacity), since the router cannot say which engine vLLM's
// own balancer chose. On a pinned replica, a request its API cannot pin (vLLM's Responses
// endpoint ignores the header) adds no blocks to any slot (none knows where vLLM put it) but
// counts as a route to the replica (PrefixIndex.noteRoute: its recent share, the key's home).

import { chooseEngine } from '../core/engine-choice.js';
import { matchPrefix, PrefixMatchScratch, type PrefixIndex, type PrefixIndexStats, type PrefixMatch } from '../core/index.js';
import type { EngineSnapshot } from './types.js';
import { engineIndexCapacityOf, indexCapacityOf, type KvCapacity } from '../engines/kv-capacity.js';
import { rankedEngines } from '../engines/vllm.js';

/**
 * Index slots a pool gives its replicas in all before it stops pinning more of them: what the
 * index's memory bound assumes (prefix-index.ts MAX_INDEX_ENTRIES: ≤ 64 replica slots, two
 * bitset words per block). An origin reporting hundreds of engines must not widen every block
 * record of the pool's index; a replica that does not fit stays one slot, unpinned.
 */
export const MAX_POOL_ENGINE_SLOTS = 64;

export interface DpEngines {
  /** Index slot ids in rank order: `[replicaId]` for one slot, `<replicaId>#dp<rank>` per engine when pinned. */
  readonly slots: readonly string[];
  /** Each slot's `engine` label (`['']` for one slot). */
  readonly labels: readonly string[];
  /** Requests are pinned to an engine (the rank header is sent). */
  readonly pinned: boolean;
  /** The router's leases in flight per slot, and their prompt blocks (router blocks). */
  readonly leases: number[];
  readonly leaseBlocks: number[];
  /** Each slot's index capacity from the last scrape, null until known. */
  readonly capacity: (number | null)[];
}

export function singleEngine(replicaId: string): DpEngines {
  return { slots: [replicaId], labels: [''], pinned: false, leases: [0], leaseBlocks: [0], capacity: [null] };
}

export function engineSlotId(replicaId: string, rank: number): string {
  return `${replicaId}#dp${rank}`;
}

export interface EngineScrape {
  /** The replica's engines after this scrape (the same object when the layout did not change). */
  readonly dp: DpEngines;
  /** Slots of the old layout to drop from the index (the engines changed: what they held is unknown). */
  readonly dropped: readonly string[];
}

/**
 * Fold one scrape into a replica's engines: rebuild the slots when the set of engines changed
 * (a restart with another --data-parallel-size, pinning turned on or off), and size each slot:
 * a pinned engine's from its own free blocks plus the router's prompts in flight on it
 * (`engineIndexCapacityOf`), a single slot as the whole replica (`indexCapacityOf`, with
 * `replicaLeaseBlocks`). An unknown capacity keeps the previous one. `slotBudget`: the slots this
 * replica may have (`slotBudget()`); more engines than that stay one slot.
 */
export function applyEngineScrape(current: DpEngines, replicaId: string, kv: KvCapacity | null, pin: boolean, replicaLeaseBlocks: number, slotBudget = MAX_POOL_ENGINE_SLOTS): EngineScrape {
  const ranked = pin ? rankedEngines(kv) : null;
  const labels = ranked !== null && ranked.length <= slotBudget ? ranked : null;
  // A scrape naming no engine (no cache_config_info: a partial or truncated /metrics) says
  // nothing about them: a pinned layout and what its slots hold stay.
  const unknown = pin && kv === null && current.pinned;
  const same = unknown || (labels === null ? !current.pinned : current.pinned && sameLabels(current.labels, labels));
  let dp = current;
  if (!same) {
    dp =
      labels === null
        ? singleEngine(replicaId)
        : { slots: labels.map((_, i) => engineSlotId(replicaId, i)), labels, pinned: true, leases: labels.map(() => 0), leaseBlocks: labels.map(() => 0), capacity: labels.map(() => null) };
  }
  if (dp.pinned) {
    for (let i = 0; i < dp.labels.length; i++) {
      const e = kv?.engines.find((x) => x.engine === dp.labels[i]);
      if (e) dp.capacity[i] = engineIndexCapacityOf(e, dp.leaseBlocks[i]);
    }
  } else {
    dp.capacity[0] = indexCapacityOf(kv, replicaLeaseBlocks) ?? dp.capacity[0] ?? null;
  }
  return { dp, dropped: same ? [] : current.slots };
}

function sameLabels(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** Give the index every known slot capacity of `dp`. */
export function pushCapacities(index: PrefixIndex, dp: DpEngines): void {
  for (let i = 0; i < dp.slots.length; i++) {
    const c = dp.capacity[i];
    if (c !== null && c !== undefined) index.setCapacity(dp.slots[i]!, c);
  }
}

/** Drop these slots from the index (a replica down, restarted, removed or moved; a layout replaced), and `also`. */
export function dropEngines(index: PrefixIndex | null, slots: readonly string[], also?: string): void {
  if (!index) return;
  for (const s of slots) index.dropReplica(s);
  if (also !== undefined && !slots.includes(also)) index.dropReplica(also);
}

/** A lease's engine: the replica's engines object it was counted on, and the slot position. */
export interface EngineLease {
  readonly dp: DpEngines;
  readonly slot: number;
}

/** Count a lease on (+1) or off (−1) its engine; a lease of an engine layout since replaced changes nothing. */
export function countEngineLease(lease: EngineLease, current: DpEngines, blocks: number, sign: 1 | -1): void {
  if (lease.dp !== current) return;
  const i = lease.slot;
  current.leases[i] = Math.max(0, current.leases[i]! + sign);
  current.leaseBlocks[i] = Math.max(0, current.leaseBlocks[i]! + sign * blocks);
}

/**
 * The pool's prefix match over replicas when some have several slots: one match over every
 * slot, then per replica the best match over its engines, the freshest staleness (a replica is
 * stale for the shared base only when each of its engines is), the recent routes to all its
 * engines, and the replica whose engine the routing key last went to. With no pinned replica it
 * is the plain per-replica match (`matchPrefix`). Keeps the per-engine matches of the last call
 * for `pick`.
 */
export class EngineMatcher {
  private ids: readonly string[] | null = null;
  private dps: DpEngines[] = [];
  private flat: string[] = [];
  private start = new Int32Array(1);
  private direct = true;
  /** The per-slot match of the last call (`pick` reads its per-engine matches). */
  private readonly scratch = new PrefixMatchScratch();

  /**
   * `replicas` in ring order (`ids`). The layout (which slots each replica has) is rebuilt when
   * `ids` is another array or after `invalidate()`, not checked per call: the coordinator calls
   * `invalidate()` whenever a replica object or its engines change.
   */
  match(index: PrefixIndex, ids: readonly string[], replicas: readonly { readonly dp: DpEngines }[], blocks: ArrayLike<number>, out: PrefixMatchScratch, key?: number | null): PrefixMatch {
    if (ids !== this.ids) this.layout(ids, replicas);
    if (this.direct) return matchPrefix(index, ids, blocks, out, key);
    // Every slot at once, then per replica: the best match over its engines, the freshest
    // staleness, the routes to all of them, and the replica of the key's last slot.
    const flat = matchPrefix(index, this.flat, blocks, this.scratch, key);
    if (out.matched.length !== ids.length) {
      out.matched = new Int32Array(ids.length);
      out.stale = new Uint8Array(ids.length);
      out.recent = new Int32Array(ids.length);
    }
    let keyHome = flat.keyHome === undefined ? undefined : -1;
    for (let i = 0; i < ids.length; i++) {
      let m = -1;
      let st = 255;
      let routes = 0;
      for (let j = this.start[i]!; j < this.start[i + 1]!; j++) {
        if (flat.matched[j]! > m) m = flat.matched[j]!;
        if (flat.stale![j]! < st) st = flat.stale![j]!;
        routes += flat.recent![j]!;
        if (flat.keyHome === j) keyHome = i;
      }
      out.matched[i] = m;
      out.stale[i] = st;
      out.recent[i] = routes;
    }
    const res = out.result;
    res.blocks = blocks.length;
    res.matched = out.matched;
    res.stale = out.stale;
    res.recent = out.recent;
    res.keyHome = keyHome;
    return res;
  }

  /** The replicas' engines changed (a scrape, an admin change, a reload): rebuild the layout on the next `match`. */
  invalidate(): void {
    this.ids = null;
  }

  /** The engine for replica `i` (ring order) of the last `match`, or null when it is not pinned there. */
  pick(i: number, dp: DpEngines, key: number): { slot: number; matched: number } | null {
    if (!dp.pinned || this.direct || this.dps[i] !== dp) return null;
    const matched = this.scratch.matched.subarray(this.start[i]!, this.start[i + 1]!);
    const slot = chooseEngine({ matched, leases: dp.leases, key });
    return { slot, matched: matched[slot]! };
  }

  private layout(ids: readonly string[], replicas: readonly { readonly dp: DpEngines }[]): void {
    this.ids = ids;
    this.dps = replicas.map((r) => r.dp);
    this.direct = this.dps.every((d) => !d.pinned);
    this.flat = this.dps.flatMap((d) => d.slots);
    this.start = new Int32Array(ids.length + 1);
    for (let i = 0; i < ids.length; i++) this.start[i + 1] = this.start[i]! + (this.dps[i]?.slots.length ?? 0);
  }
}

/** Each engine's slot as the snapshot shows it (`stats`: the index's, when there is one). */
export function engineSnapshots(dp: DpEngines, stats: PrefixIndexStats | null): EngineSnapshot[] {
  return dp.slots.map((slot, i) => ({ rank: i, engine: dp.labels[i]!, inFlight: dp.leases[i]!, indexEntries: stats?.perReplica[slot]?.entries ?? 0, indexCapacity: dp.capacity[i] ?? null }));
}

/** The slots `r` may use: MAX_POOL_ENGINE_SLOTS less every other replica's. */
export function slotBudget(replicas: readonly { readonly dp: DpEngines }[], r: { readonly dp: DpEngines }): number {
  let others = 0;
  for (const x of replicas) if (x !== r) others += x.dp.slots.length;
  return MAX_POOL_ENGINE_SLOTS - others;
}
