// Flow control in the simulator (issue #29): the router's edge queue, as the pool coordinator
// keeps it (src/coordinator/queue.ts), over the same pure queue (src/core/fair-queue.ts): when no
// replica is below `maxInFlightPerReplica` a request waits here, in its band, fair-shared between
// tenants by weight, and is admitted the moment a slot frees to the replica the strategy picks
// then; past its band's wait or length it is refused (as the router's 429/503). Also the
// per-tenant figures and the table that set a run with flow control beside one without. Pure: no
// I/O; the engine (engine.ts) drives it with virtual times.

import { activeWeightOf, DEFAULT_QUEUE_BANDS, FairQueue, heldBackByReserve, overShareBothWays, preemptionVictim, RecentShares, requestCost, type FairnessUnit, type PlaceOutcome, type QueueBand, type QueueEntry } from '../src/core/index.js';
import { markdownTable } from './format.js';
import { percentile } from './stats.js';

/** A tenant's record as far as flow control reads it (src/http/tenant-records.ts `weight`, `priority`). */
export interface SimTenant {
  readonly weight?: number;
  /** Band name; default the pool's `defaultBand`. */
  readonly band?: string;
}

export interface FlowControlOptions {
  /** The per-replica bound the queue keeps (the pool's `maxInFlightPerReplica`). */
  readonly maxInFlightPerReplica: number;
  readonly bands?: readonly QueueBand[];
  readonly fairness?: FairnessUnit;
  readonly defaultBand?: string;
  /** By tenant id (the trace's tenant; requests without one are tenant `-`). */
  readonly tenants?: Readonly<Record<string, SimTenant>>;
  /** Free slots kept for tenants below their fair share (the pool's `flowControl.shareReserve`; default 0). */
  readonly shareReserve?: number;
  /** Take a slot back before its first token for a tenant below its share (the pool's `flowControl.preempt`; default false). */
  readonly preempt?: boolean;
  /** Also pause streams past their first token, continued later (the pool's `flowControl.preemptStreams`; implies preempt). */
  readonly preemptStreams?: boolean;
}

/** A request in flight before its first token, as preemption may take it (the engine's view). */
export interface SimPreemptCandidate {
  readonly index: number;
  readonly tenant: string;
  readonly band: number;
  /** When it was admitted (virtual ms). */
  readonly at: number;
}


/** The pool's slots as the queue needs them: free now, and in all (the usable replicas' bounds). */
export interface Slots {
  readonly free: number;
  readonly capacity: number;
}

/** What the engine asks the edge queue; one per run. */
export class EdgeQueue {
  readonly cap: number;
  private readonly queue: FairQueue<number>;
  private readonly defaultBand: number;
  private readonly fairness: FairnessUnit;
  private readonly tenants: Readonly<Record<string, SimTenant>>;
  private readonly shareReserve: number;
  readonly preempt: boolean;
  readonly preemptStreams: boolean;
  /** Slots taken back for a tenant below its share (the coordinator's `preempted`), streams paused included. */
  preempted = 0;
  /** Of those, streams paused past their first token (preemptStreams). */
  paused = 0;
  /** Per tenant: its requests admitted and not finished (the coordinator's tenantInFlight). */
  private readonly inFlight = new Map<string, number>();
  /** Each tenant's share of the recent admissions (the coordinator's queue book `recent`). */
  private readonly recent = new RecentShares();

  constructor(o: FlowControlOptions) {
    if (!Number.isInteger(o.maxInFlightPerReplica) || o.maxInFlightPerReplica < 1) throw new RangeError(`maxInFlightPerReplica must be a positive integer, got ${o.maxInFlightPerReplica}`);
    this.cap = o.maxInFlightPerReplica;
    this.queue = new FairQueue<number>(o.bands ?? DEFAULT_QUEUE_BANDS);
    const name = o.defaultBand ?? 'normal';
    this.defaultBand = this.queue.bandIndex(name);
    if (this.defaultBand < 0) throw new RangeError(`default band "${name}" is not one of ${this.queue.bands.map((b) => b.name).join(', ')}`);
    this.fairness = o.fairness ?? 'tokens';
    this.tenants = o.tenants ?? {};
    this.shareReserve = o.shareReserve ?? 0;
    this.preemptStreams = o.preemptStreams === true;
    this.preempt = o.preempt === true || this.preemptStreams;
    if (!Number.isInteger(this.shareReserve) || this.shareReserve < 0) throw new RangeError(`shareReserve must be a non-negative integer, got ${o.shareReserve}`);
    for (const [t, rec] of Object.entries(this.tenants)) {
      if (rec.band !== undefined && this.queue.bandIndex(rec.band) < 0) throw new RangeError(`tenant ${t}: band "${rec.band}" is not one of ${this.queue.bands.map((b) => b.name).join(', ')}`);
    }
  }

  get size(): number {
    return this.queue.size;
  }

  /** The band a tenant's requests wait in. */
  bandOf(tenant: string): number {
    const b = this.tenants[tenant]?.band;
    return b === undefined ? this.defaultBand : this.queue.bandIndex(b);
  }

  /**
   * The band of one request: the one the trace recorded for it when this queue has it (the router
   * log's `band`), else its tenant's. Counts recorded bands this queue does not have.
   */
  requestBand(tenant: string, recorded: string | null | undefined): number {
    if (recorded != null && this.queue.bandIndex(recorded) < 0) this.unknownBands++;
    return this.bandFor(tenant, recorded);
  }

  /** requestBand without counting. */
  bandFor(tenant: string, recorded: string | null | undefined): number {
    const i = recorded != null ? this.queue.bandIndex(recorded) : -1;
    return i >= 0 ? i : this.bandOf(tenant);
  }

  /** Requests whose recorded band is not one of this queue's (queued in their tenant's). */
  unknownBands = 0;

  bandName(band: number): string {
    return this.queue.bands[band]!.name;
  }

  /**
   * Queue request `index`; returns the indexes refused by it (the arrival itself when its band is
   * full, or another tenant's newest entry it pushed out).
   */
  enqueue(index: number, tenant: string, promptTokens: number, outputTokens: number, now: number, band?: string | null, first = false): number[] {
    const r = this.queue.enqueue({ id: String(index), tenant, band: this.requestBand(tenant, band), cost: requestCost(this.fairness, promptTokens, outputTokens), weight: this.tenants[tenant]?.weight ?? 1, item: index, first }, now);
    return r.ok ? r.shed.map((e) => e.item) : [index];
  }

  /**
   * Whether a request of `tenant` in `band` may take a slot now, as the coordinator decides it
   * (src/coordinator/queue.ts acquireOrWait and place): 'full' while no more than its band's
   * `headroom` slots are free (kept for the bands above), 'blocked' while only the share reserve is
   * free and the tenant already holds its fair share (core heldBackByReserve), else 'ok'.
   */
  admits(tenant: string, band: number, slots: Slots, now: number): 'ok' | 'full' | 'blocked' {
    const headroom = this.queue.bands[band]!.headroom ?? 0;
    if (slots.capacity > 0 && headroom > 0 && slots.free <= headroom) return 'full';
    if (this.shareReserve > 0 && slots.free <= this.shareReserve && heldBackByReserve({ free: slots.free, reserve: this.shareReserve, ...this.shareOf(tenant, (this.inFlight.get(tenant) ?? 0) + 1, slots.capacity, now) })) return 'blocked';
    return 'ok';
  }

  /** What `tenant`'s fair share is judged by, as the coordinator's queue.ts shareOf: `load` against its share of `capacity` among the active tenants, and its share of the recent admissions. */
  private shareOf(tenant: string, load: number, capacity: number, now: number) {
    const weight = this.tenants[tenant]?.weight ?? 1;
    const recent = this.recent.read(tenant, now);
    const activeWeight = activeWeightOf(tenant, weight, this.queue.tenantWeights(), [this.inFlight.keys(), recent.tenants], (t) => this.tenants[t]?.weight ?? 1);
    return { load, weight, activeWeight, capacity, recentShare: recent.share };
  }

  /**
   * Preemption (src/coordinator/queue.ts preemptFor): the request to take a slot back from for a
   * waiting request of `tenant` in `band`, with every slot taken: null unless `tenant` is below its
   * share (core overShareBothWays with this request) and a candidate of another tenant over its
   * share, in the same band or a lower one, is there (core preemptionVictim: the youngest).
   */
  victim(tenant: string, band: number, candidates: readonly SimPreemptCandidate[], slots: Slots, now: number): number | null {
    if (!this.preempt || slots.free > 0 || candidates.length === 0) return null;
    const over = (t: string, load: number) => overShareBothWays(this.shareOf(t, load, slots.capacity, now));
    if (over(tenant, (this.inFlight.get(tenant) ?? 0) + 1)) return null;
    const overShare = new Map<string, boolean>();
    const v = preemptionVictim(
      tenant,
      band,
      candidates.map((c) => {
        let o = overShare.get(c.tenant);
        if (o === undefined) overShare.set(c.tenant, (o = over(c.tenant, this.inFlight.get(c.tenant) ?? 0)));
        return { id: String(c.index), tenant: c.tenant, band: c.band, at: c.at, overShare: o };
      }),
    );
    return v === null ? null : Number(v.id);
  }

  /** A request of `tenant` was admitted to a replica at `now` (straight through or from the queue). */
  admitted(tenant: string, now: number): void {
    this.inFlight.set(tenant, (this.inFlight.get(tenant) ?? 0) + 1);
    this.recent.note(tenant, now);
  }

  /** A request of `tenant` admitted earlier finished. */
  finished(tenant: string): void {
    const n = (this.inFlight.get(tenant) ?? 0) - 1;
    if (n > 0) this.inFlight.set(tenant, n);
    else this.inFlight.delete(tenant);
  }

  /**
   * Offer waiting requests, in admission order, to `place` (true: admitted) until it refuses one;
   * a request its band's headroom or the share reserve holds back is not offered (admits).
   */
  drain(place: (index: number) => boolean, slots: () => Slots, now: number): number[] {
    return this.queue
      .drain((e: QueueEntry<number>): PlaceOutcome => {
        const a = this.admits(e.tenant, e.band, slots(), now);
        if (a !== 'ok') return a;
        return place(e.item) ? 'placed' : 'full';
      })
      .map((e) => e.item);
  }

  /** Requests whose band's wait ran out by `now` (refused). */
  expire(now: number): number[] {
    return this.queue.expire(now).map((e) => e.item);
  }

  /** When the next wait runs out (Infinity: none waiting). */
  nextDeadline(): number {
    return this.queue.nextDeadline();
  }
}

/** One tenant's figures in one run. */
export interface TenantResult {
  readonly tenant: string;
  readonly band: string;
  readonly weight: number;
  readonly requests: number;
  readonly refused: number;
  /** Output tokens of its served requests ÷ everyone's. */
  readonly outputShare: number;
  readonly ttftP50Ms: number;
  readonly ttftP99Ms: number;
  /** Wait at the edge (0 for a request that went straight through). */
  readonly queueWaitP50Ms: number;
  readonly queueWaitP99Ms: number;
}

/** A run's flow-control figures: the edge queue's waits and refusals, per tenant. */
export interface FlowResult {
  /** False for a run without flow control (every wait 0, nothing refused). */
  readonly enabled: boolean;
  readonly maxInFlightPerReplica: number | null;
  /** Requests that waited at the edge at all. */
  readonly queued: number;
  readonly refused: number;
  /** Over every served request (0 for those that did not wait). */
  readonly queueWaitMs: { readonly p50: number; readonly p99: number; readonly max: number };
  /** Over the requests that waited. */
  readonly queuedWaitMs: { readonly p50: number; readonly p99: number };
  readonly tenants: readonly TenantResult[];
  /** Slots taken back before a first token for a tenant below its share (preempt). */
  readonly preempted: number;
  /** Of those, streams paused past their first token (preemptStreams). */
  readonly paused: number;
}

/**
 * The per-tenant and queue figures from per-request arrays (NaN TTFT: refused; wait 0: straight
 * through). `tenantOf(i)` names request i's tenant.
 */
export function flowResult(o: {
  enabled: boolean;
  cap: number | null;
  tenantOf: (i: number) => string;
  bandOf: (tenant: string) => string;
  weightOf: (tenant: string) => number;
  ttftMs: Float64Array;
  waitMs: Float64Array;
  refused: Uint8Array;
  outputTokens: (i: number) => number;
  preempted?: number;
  paused?: number;
}): FlowResult {
  const n = o.ttftMs.length;
  const by = new Map<string, number[]>();
  for (let i = 0; i < n; i++) {
    const t = o.tenantOf(i);
    let l = by.get(t);
    if (!l) by.set(t, (l = []));
    l.push(i);
  }
  let totalOut = 0;
  for (let i = 0; i < n; i++) if (!o.refused[i]) totalOut += o.outputTokens(i);
  const served: number[] = [];
  const waited: number[] = [];
  let refused = 0;
  for (let i = 0; i < n; i++) {
    if (o.refused[i]) {
      refused++;
      continue;
    }
    served.push(o.waitMs[i]!);
    if (o.waitMs[i]! > 0) waited.push(o.waitMs[i]!);
  }
  const tenants: TenantResult[] = [...by.entries()]
    .sort((a, b) => b[1].length - a[1].length || (a[0] < b[0] ? -1 : 1))
    .map(([tenant, idx]) => {
      const ok = idx.filter((i) => !o.refused[i]);
      const out = ok.reduce((a, i) => a + o.outputTokens(i), 0);
      return {
        tenant,
        band: o.bandOf(tenant),
        weight: o.weightOf(tenant),
        requests: idx.length,
        refused: idx.length - ok.length,
        outputShare: totalOut > 0 ? out / totalOut : NaN,
        ttftP50Ms: percentile(ok.map((i) => o.ttftMs[i]!), 0.5),
        ttftP99Ms: percentile(ok.map((i) => o.ttftMs[i]!), 0.99),
        queueWaitP50Ms: percentile(ok.map((i) => o.waitMs[i]!), 0.5),
        queueWaitP99Ms: percentile(ok.map((i) => o.waitMs[i]!), 0.99),
      };
    });
  return {
    enabled: o.enabled,
    maxInFlightPerReplica: o.cap,
    queued: waited.length,
    refused,
    queueWaitMs: { p50: percentile(served, 0.5), p99: percentile(served, 0.99), max: served.length ? Math.max(...served) : NaN },
    queuedWaitMs: { p50: percentile(waited, 0.5), p99: percentile(waited, 0.99) },
    tenants,
    preempted: o.preempted ?? 0,
    paused: o.paused ?? 0,
  };
}

/** `a=3,b=1` → weights; `hi=high,batch=low` → bands. Throws naming the bad item. */
export function parseTenantList(spec: string, kind: 'weight' | 'band'): Record<string, SimTenant> {
  const out: Record<string, SimTenant> = {};
  for (const item of spec.split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^([^=]+)=(.+)$/.exec(item);
    if (!m) throw new RangeError(`"${item}": expected tenant=${kind === 'weight' ? 'weight' : 'band'}`);
    const [, tenant, value] = m;
    if (kind === 'weight') {
      const w = Number(value);
      if (!Number.isFinite(w) || w < 1) throw new RangeError(`"${item}": a weight is a number ≥ 1`);
      out[tenant!] = { ...out[tenant!], weight: w };
    } else out[tenant!] = { ...out[tenant!], band: value! };
  }
  return out;
}

/** Merge weight and band lists by tenant. */
export function mergeTenants(...lists: Readonly<Record<string, SimTenant>>[]): Record<string, SimTenant> {
  const out: Record<string, SimTenant> = {};
  for (const l of lists) for (const [t, r] of Object.entries(l)) out[t] = { ...out[t], ...r };
  return out;
}

const secs = (ms: number) => (Number.isFinite(ms) ? (ms / 1000).toFixed(ms < 10_000 ? 2 : 1) : '-');
const pct = (x: number) => (Number.isFinite(x) ? (x * 100).toFixed(1) : '-');

interface Row {
  readonly strategy: string;
  readonly ttftMs: { readonly p50: number; readonly p99: number };
  readonly flow: FlowResult;
}

/** Per strategy: today (the replicas' own FIFO queues) beside flow control (the edge queue). */
export function flowTable(pairs: readonly { today: Row; flow: Row }[]): string {
  const head = ['strategy', 'run', 'TTFT p50 s', 'p99 s', 'queued at the edge', 'edge wait p50 / p99 s (of those queued)', 'refused'];
  const rows: string[][] = [];
  for (const { today, flow } of pairs) {
    rows.push([today.strategy, 'today (no edge queue)', secs(today.ttftMs.p50), secs(today.ttftMs.p99), '-', '-', '-']);
    const f = flow.flow;
    rows.push([flow.strategy, `flow control, ${f.maxInFlightPerReplica} per replica${f.preempted > 0 ? `, ${f.preempted} preempted${f.paused > 0 ? ` (${f.paused} streams paused)` : ''}` : ''}`, secs(flow.ttftMs.p50), secs(flow.ttftMs.p99), String(f.queued), `${secs(f.queuedWaitMs.p50)} / ${secs(f.queuedWaitMs.p99)}`, String(f.refused)]);
  }
  return markdownTable(head, rows, 2);
}

/** Per tenant (the busiest first, at most `limit`): share of output tokens and TTFT p99, today against flow control. */
export function tenantTable(today: FlowResult, flow: FlowResult, limit = 12): string {
  const head = ['tenant', 'band', 'weight', 'requests', 'output share % today / flow', 'TTFT p99 s today / flow', 'edge wait p99 s', 'refused'];
  const byTenant = new Map(today.tenants.map((t) => [t.tenant, t]));
  const rows = flow.tenants.slice(0, limit).map((f) => {
    const t = byTenant.get(f.tenant);
    return [f.tenant, f.band, String(f.weight), String(f.requests), `${pct(t?.outputShare ?? NaN)} / ${pct(f.outputShare)}`, `${secs(t?.ttftP99Ms ?? NaN)} / ${secs(f.ttftP99Ms)}`, secs(f.queueWaitP99Ms), String(f.refused)];
  });
  return markdownTable(head, rows, 2);
}
