// The discrete-event loop: replays a trace's arrivals on a virtual clock, routes each one
// through `router.ts` (the `src/core` pick) and steps the modelled replicas. Pure: no I/O,
// no wall clock in the model (only `wallMs` reports how long the run took).
//
// Ordering at one instant t: steps ending at t finish first (their requests leave the
// in-flight counts), then a scale event at t, then arrivals at t are routed in trace order,
// then every replica with work and no running step starts one. So the same trace and seed
// always give the same result, and every strategy sees the same arrivals.

import { LEASE_MEMORY_DEFAULTS } from '../src/proxy/early-connect.js';
import { MAX_PREEMPTIONS } from '../src/core/index.js';
import { EdgeQueue, flowResult, type FlowControlOptions, type FlowResult } from './flow-control.js';
import { ReplicaModel, createSeq, type Seq } from './replica.js';
import { DEFAULT_PROFILE, type ReplicaProfile } from './profile.js';
import { createSimRouter } from './router.js';
import { mulberry32 } from './rng.js';
import { mean, percentile } from './stats.js';
import { KV_BLOCK_TOKENS, lookupLimit, routingKey, type Trace } from './trace.js';

const SESSION_KEY = { kind: 'session' } as const;
import { ROUTER_BLOCK_WIDTH } from './prefix-router.js';
import { anchorLength, DEFAULT_MAX_BLOCKS } from '../src/core/index.js';

const ROUTER_BLOCK_TOKENS = ROUTER_BLOCK_WIDTH * KV_BLOCK_TOKENS;

export interface ScaleEvent {
  readonly kind: 'add' | 'remove';
  /** Virtual time of the event (after time compression), ms. */
  readonly atMs: number;
}

/** `add@600s`, `remove@90000ms`, `add@10m`. */
export function parseScaleEvent(spec: string): ScaleEvent {
  const m = /^(add|remove)@(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(spec.trim());
  if (!m) throw new RangeError(`--scale-event "${spec}": expected add@<time> or remove@<time>, e.g. add@600s`);
  const unit = m[3] ?? 's';
  const v = Number(m[2]);
  return { kind: m[1] as 'add' | 'remove', atMs: unit === 'ms' ? v : unit === 'm' ? v * 60_000 : v * 1000 };
}

export interface SimConfig {
  /** Strategy spec as `createStrategy` takes it. */
  readonly strategy: string;
  readonly replicas: number;
  /** Routing key hash per request (same order as `trace.requests`), null for keyless. */
  readonly keys: readonly (number | null)[];
  /** Arrival times are divided by this (> 1 compresses time and raises load). Default 1. */
  readonly timeScale?: number;
  readonly seed?: number;
  readonly profile?: ReplicaProfile;
  readonly fallback?: string;
  /** Coordinator shards, each placing by its own in-flight view (sim/shards.ts). Default 1. */
  readonly shards?: number;
  /**
   * Worker isolates the requests are spread over (uniformly at random, seeded) for the early-connect
   * figures: each remembers only the leases it took. Default 1. Routing is not affected.
   */
  readonly isolates?: number;
  readonly scaleEvent?: ScaleEvent;
  /** Window before and after a scale event for the TTFT comparison, virtual ms. Default 300 s. */
  readonly scaleWindowMs?: number;
  /** Points in the per-replica load time series. Default 240. */
  readonly loadSamples?: number;
  readonly onProgress?: (done: number, total: number) => void;
  /**
   * Virtual ms between scrapes of each replica's free KV, which size prefix-aware's index as
   * the coordinator sizes it (pool-coordinator.ts, kv-capacity.ts). Default 5,000 (the pool's
   * default scrape interval); 0: the index keeps the replica's whole KV as its capacity.
   */
  readonly scrapeEveryMs?: number;
  /**
   * The router's edge queue (issue #29, sim/flow-control.ts): no replica takes more than
   * `maxInFlightPerReplica`; the rest wait at the edge in fair shares and bands, and are admitted
   * as slots free. Unset: today's routing, every request straight to a replica (its own FIFO queue).
   */
  readonly flowControl?: FlowControlOptions;
}

export interface ReplicaResult {
  readonly id: string;
  readonly requests: number;
  readonly tokenHitRate: number;
  readonly outputTokens: number;
  readonly busyFraction: number;
  readonly meanInFlight: number;
  readonly peakInFlight: number;
  readonly evictions: number;
}

export interface ScaleResult {
  readonly event: string;
  readonly atMs: number;
  /** Share of the trace's distinct keys whose home replica changed (NaN for keyless strategies). */
  readonly keysMoved: number;
  readonly windowMs: number;
  readonly p95TtftBeforeMs: number;
  readonly p95TtftAfterMs: number;
  readonly hitRateBefore: number;
  readonly hitRateAfter: number;
}

export interface SimResult {
  readonly strategy: string;
  readonly replicas: number;
  readonly requests: number;
  readonly timeScale: number;
  readonly promptTokens: number;
  readonly cachedTokens: number;
  readonly tokenHitRate: number;
  readonly ttftMs: { readonly p50: number; readonly p95: number; readonly p99: number; readonly mean: number };
  /** Output tokens over the run span (first arrival to last finish), per replica. */
  readonly outputTokensPerSecPerReplica: number;
  /** Output tokens per second a replica was busy (what the GPU time bought). */
  readonly outputTokensPerBusySec: number;
  readonly meanBusyFraction: number;
  readonly spanMs: number;
  readonly inFlight: { readonly peak: number; readonly maxMean: number; readonly mean: number };
  readonly requestsPerReplica: { readonly max: number; readonly mean: number };
  /** Share of keyed requests that went past their home replica. */
  readonly spillRate: number;
  /**
   * Early connect (src/proxy/early-connect.ts) as `isolates` Worker isolates sharing the requests
   * would have done it (one: an isolate that saw every request): shares of keyed requests whose
   * key had a lease within the memory's TTL, and the pick confirmed (hit) or moved (miss, an
   * origin request started and cancelled). Zero for a strategy that ignores keys (the router does
   * not guess for one either).
   */
  readonly earlyConnect: { readonly hitRate: number; readonly missRate: number };
  readonly keyedShare: number;
  /** Fewest requests any replica got, as a share of the mean (goal ≥ 0.5: no starved replica). */
  readonly minRequestShare: number;
  /**
   * prefix-aware: the index's predicted hit rate against the replica model's, over the requests
   * it matched (predicted = the matched router blocks × 64 tokens, capped at what vLLM can reuse):
   * Σ predicted / Σ prompt, Σ cached / Σ prompt, and the mean of |predicted − cached| / prompt
   * per request. null for strategies without an index.
   */
  readonly indexTracking: {
    readonly requests: number;
    readonly predictedHitRate: number;
    readonly modelHitRate: number;
    /** The model's hits as the index can see them: whole 64-token router blocks, the first 512, floored to an anchor (prefix-index.ts). */
    readonly visibleHitRate: number;
    readonly meanAbsError: number;
    /** Mean |predicted − visible| / prompt: the index's own drift, without its resolution limits. */
    readonly meanAbsErrorVisible: number;
  } | null;
  readonly perReplica: readonly ReplicaResult[];
  readonly load: { readonly tMs: readonly number[]; readonly inFlight: readonly (readonly number[])[] };
  readonly scale: ScaleResult | null;
  /** Edge-queue waits, refusals and per-tenant shares (all zero waits without flow control). */
  readonly flow: FlowResult;
  /** NaN for a request flow control refused. */
  readonly ttftByRequest: Float64Array;
  readonly wallMs: number;
}

export function simulate(trace: Trace, config: SimConfig): SimResult {
  const wall0 = performance.now();
  const reqs = trace.requests;
  const n = reqs.length;
  const scale = config.timeScale ?? 1;
  if (!(scale > 0)) throw new RangeError(`time scale must be > 0, got ${scale}`);
  if (!Number.isInteger(config.replicas) || config.replicas < 1) throw new RangeError(`replicas must be a positive integer, got ${config.replicas}`);
  if (config.keys.length !== n) throw new RangeError('one key per request is required');
  const profile = config.profile ?? DEFAULT_PROFILE;
  const random = mulberry32(config.seed ?? 1);

  const ttft = new Float64Array(n).fill(NaN);
  const flow = config.flowControl ? new EdgeQueue(config.flowControl) : null;
  if (flow !== null && (config.shards ?? 1) > 1) throw new RangeError('flow control is modelled for one coordinator (no --shards)');
  /** Per request: its wait at the edge, and whether flow control refused it. */
  const waitMs = new Float64Array(n);
  const refused = new Uint8Array(n);
  /** A slot freed (or a replica joined) since the queue was last drained. */
  let freed = false;
  let lastFinish = 0;
  /** Per replica: prompt blocks (16-token) of the requests in flight on it, as the coordinator's leases know them. */
  const leaseBlocks: number[] = [];
  /** Flow control's preemption: the requests admitted and not finished (seq → request index, when admitted), and how often each gave its slot back. */
  const running = new Map<Seq, { k: number; at: number }>();
  const preemptions = new Uint8Array(n);
  /** A paused stream's continuation (preemptStreams): never preempted again, as the router's continuation attempts. */
  const resumed = new Uint8Array(n);
  const onFinish = (s: Seq) => {
    running.delete(s);
    if (s.finishMs > lastFinish) lastFinish = s.finishMs;
    leaseBlocks[s.replica] = (leaseBlocks[s.replica] ?? 0) - s.req.blocks.length;
    flow?.finished(s.req.tenant ?? '-');
    router.release?.(s.req.index);
    freed = true;
  };
  const reps: ReplicaModel[] = [];
  for (let i = 0; i < config.replicas; i++) reps.push(new ReplicaModel(`r${i}`, profile, onFinish));
  let memberIdx = reps.map((_, i) => i);
  const router = createSimRouter(config.strategy, reps.map((r) => r.id), { random, fallback: config.fallback, shards: config.shards, kvCapacityBlocks: profile.kvCapacityBlocks });

  const arrival = (i: number) => reqs[i]!.arrivalMs / scale;
  const lastArrival = n > 0 ? arrival(n - 1) : 0;
  const samples = config.loadSamples ?? 240;
  const sampleEvery = lastArrival > 0 ? lastArrival / samples : 1000;
  const sampleT: number[] = [];
  const sampleLoad: number[][] = [];
  let nextSample = 0;

  const seqs: Seq[] = new Array(n);
  const predicted = new Int32Array(n).fill(-1);
  let keyed = 0;
  let spilled = 0;
  const isolates = config.isolates ?? 1;
  if (!Number.isInteger(isolates) || isolates < 1) throw new RangeError(`isolates must be a positive integer, got ${isolates}`);
  // Its own random source, so the isolate draw leaves the core's (tie breaks) untouched.
  const isolateRandom = mulberry32(((config.seed ?? 1) ^ 0x5bd1e995) >>> 0);
  // Per isolate: key → the replica it was last leased on, and when (LeaseMemory in early-connect.ts).
  const lastLeases = Array.from({ length: isolates }, () => new Map<number, { replica: number; at: number }>());
  let earlyHits = 0;
  let earlyMisses = 0;
  let pendingScale = config.scaleEvent ?? null;
  let scaleInfo: { event: string; atMs: number; keysMoved: number } | null = null;
  const progressEvery = Math.max(1, Math.floor(n / 200));
  const scrapeEvery = config.scrapeEveryMs ?? 5_000;
  let nextScrape = scrapeEvery > 0 && router.scrapeKv !== undefined && Number.isFinite(profile.kvCapacityBlocks) ? 0 : Infinity;

  let i = 0;
  for (;;) {
    const tA = i < n ? arrival(i) : Infinity;
    let tS = Infinity;
    for (const r of reps) if (r.stepEnd < tS) tS = r.stepEnd;
    const tE = pendingScale !== null ? pendingScale.atMs : Infinity;
    const tQ = flow !== null ? flow.nextDeadline() : Infinity;
    const t = Math.min(tA, tS, tE, tQ);
    if (t === Infinity) break;
    while (nextSample <= t && nextSample <= lastArrival) {
      sampleT.push(nextSample);
      sampleLoad.push(reps.map((r) => r.inFlight));
      nextSample += sampleEvery;
    }
    if (tS === t) for (const r of reps) if (r.stepEnd === t) r.endStep(t);
    if (tE === t && pendingScale !== null) {
      scaleInfo = applyScale(pendingScale);
      pendingScale = null;
    }
    if (t >= nextScrape) {
      // As the coordinator: free KV from the usage gauge, plus the prompts of its own requests in
      // flight there (recorded at pick, pinned or about to be), never more than the whole KV.
      for (const m of memberIdx) {
        const c = reps[m]!.cache;
        router.scrapeKv!(reps[m]!.id, Math.min(c.capacity, c.capacity - c.inUse + (leaseBlocks[m] ?? 0)));
      }
      nextScrape = t + scrapeEvery;
    }
    if (flow !== null) {
      // Waits that ran out are refused; then freed slots go to the queue, before new arrivals.
      for (const k of flow.expire(t)) refused[k] = 1;
      if (freed && flow.size > 0) flow.drain((k) => place(k, t), slots, t);
    }
    freed = false;
    while (i < n && arrival(i) === t) {
      const req = reqs[i]!;
      seqs[i] = createSeq(req, t);
      if (flow === null) {
        if (!place(i, t)) throw new Error(`no replica for request ${i}`);
      } else if (flow.size > 0 || flow.admits(req.tenant ?? '-', flow.bandFor(req.tenant ?? '-', req.band), slots(), t) !== 'ok' || !place(i, t)) {
        // Behind the ones already waiting (the queue decides who goes next), held back by its
        // band's headroom or the share reserve, or no slot free.
        for (const k of flow.enqueue(i, req.tenant ?? '-', req.promptTokens, req.outputTokens, t, req.band)) refused[k] = 1;
        // Free slots with requests waiting: those waiting are held back (headroom, reserve), and
        // the newcomer may not be (as the coordinator drains, then picks, on each acquire).
        if (slots().free > 0) flow.drain((k) => place(k, t), slots, t);
        else if (flow.preempt && !refused[i]) preemptFor(i, t);
      }
      i++;
      if (config.onProgress && i % progressEvery === 0) config.onProgress(i, n);
    }
    for (const r of reps) if (!r.busy && r.hasWork) r.startStep(t);
  }
  config.onProgress?.(n, n);

  /**
   * Flow control's preemption (src/coordinator/queue.ts preemptFor): request `k` waits with every
   * slot taken; when its tenant is below its share, the youngest request of a tenant over its share
   * still before its first token (or, with preemptStreams, a stream past it) gives its slot back:
   * it leaves its replica (its prefill so far lost, or paused with the tokens it produced), the
   * freed slot goes to the queue's next request, and it queues again (its TTFT still counts from
   * its arrival).
   */
  function preemptFor(k: number, t: number): void {
    const req = reqs[k]!;
    const tenant = req.tenant ?? '-';
    const candidates = [];
    // Before its first token: still waiting or in prefill, or in the step whose end emits it; with
    // preemptStreams, a stream past it too (once: a continuation is never preempted).
    const beforeFirst = (s: Seq) => Number.isNaN(s.ttftMs) || s.arrivalMs + s.ttftMs > t;
    for (const [s, r] of running) if ((beforeFirst(s) || (flow!.preemptStreams && s.req.outputTokens > 1)) && !resumed[r.k] && preemptions[r.k]! < MAX_PREEMPTIONS) candidates.push({ index: r.k, tenant: s.req.tenant ?? '-', band: flow!.bandFor(s.req.tenant ?? '-', s.req.band), at: r.at });
    const v = flow!.victim(tenant, flow!.bandFor(tenant, req.band), candidates, slots(), t);
    if (v === null) return;
    const seq = seqs[v]!;
    if (beforeFirst(seq)) {
      // Its prefill so far is lost; it queues again as it arrived.
      if (reps[seq.replica]!.abort(seq, t)) giveBack(v, seq, createSeq(seq.req, seq.arrivalMs), t);
      return;
    }
    // A stream paused past its first token (flowControl.preemptStreams, proxy/continue-step.ts): it
    // leaves its replica with the tokens it produced; its continuation (the prompt and the answer
    // so far, prefilled again; the rest of the answer to generate) keeps its first segment's TTFT.
    const produced = reps[seq.replica]!.pause(seq, t);
    if (produced < 0) return;
    const cont = createSeq({ ...seq.req, promptTokens: seq.req.promptTokens + produced, outputTokens: seq.req.outputTokens - produced }, seq.arrivalMs);
    cont.ttftMs = seq.ttftMs;
    resumed[v] = 1;
    flow!.paused++;
    giveBack(v, seq, cont, t);
  }

  /**
   * Request `v` gave its slot back (`seq` left its replica): the slot goes to the queue's next
   * request, and `next` (the request again, or its continuation) waits ahead of its tenant's other
   * requests, as the router's acquire with `resume`.
   */
  function giveBack(v: number, seq: Seq, next: Seq, t: number): void {
    running.delete(seq);
    leaseBlocks[seq.replica] = (leaseBlocks[seq.replica] ?? 0) - seq.req.blocks.length;
    flow!.finished(seq.req.tenant ?? '-');
    router.release?.(seq.req.index);
    preemptions[v]!++;
    flow!.preempted++;
    seqs[v] = next;
    flow!.drain((x) => place(x, t), slots, t);
    for (const x of flow!.enqueue(v, next.req.tenant ?? '-', next.req.promptTokens, next.req.outputTokens, t, next.req.band, true)) refused[x] = 1;
    if (slots().free > 0) flow!.drain((x) => place(x, t), slots, t);
  }

  /** The pool's slots under flow control's bound: free now, and in all (the replicas taking requests). */
  function slots(): { free: number; capacity: number } {
    const cap = flow!.cap;
    let free = 0;
    for (const m of memberIdx) free += Math.max(0, cap - reps[m]!.inFlight);
    return { free, capacity: cap * memberIdx.length };
  }

  /**
   * Route request `k` (arrived earlier or now) at `t` and hand it to its replica; false when flow
   * control is on and every replica is at its bound.
   */
  function place(k: number, t: number): boolean {
    const req = reqs[k]!;
    const seq = seqs[k]!;
    const key = config.keys[k]!;
    const input = { key, blocks: req.blocks, promptTokens: req.promptTokens, nowMs: t, index: req.index, sessionKey: key !== null && key === routingKey(req, SESSION_KEY) };
    const pick = router.route(input, memberIdx.map((m) => reps[m]!.inFlight), flow?.cap);
    if (!pick.ok) {
      if (flow !== null) return false;
      throw new Error(`no replica for request ${k}: ${pick.reason}`);
    }
    // A paused stream's continuation: its wait and the router's prediction are its first segment's.
    if (!resumed[k]) waitMs[k] = t - seq.arrivalMs;
    router.observe(input, pick.index);
    if (router.lastMatchedBlocks !== undefined && !resumed[k]) predicted[k] = router.lastMatchedBlocks();
    if (key !== null) {
      keyed++;
      if (pick.spilled) spilled++;
    }
    const target = memberIdx[pick.index]!;
    if (key !== null && router.strategy.keyed) {
      const lastLease = lastLeases[Math.floor(isolateRandom() * isolates)]!;
      const prev = lastLease.get(key);
      if (prev !== undefined && t - prev.at <= LEASE_MEMORY_DEFAULTS.ttlMs) {
        if (prev.replica === target) earlyHits++;
        else earlyMisses++;
      }
      // As forward.ts: a bounded-hash spill is forgotten (the key's home is likely back next
      // time); prefix-aware's picks follow its index, so they are remembered.
      if (pick.spilled && router.strategy.usesPrefix !== true) lastLease.delete(key);
      else lastLease.set(key, { replica: target, at: t });
    }
    seq.replica = target;
    if (flow?.preempt) running.set(seq, { k, at: t });
    flow?.admitted(req.tenant ?? '-', t);
    leaseBlocks[target] = (leaseBlocks[target] ?? 0) + req.blocks.length;
    reps[target]!.enqueue(seq, t);
    return true;
  }

  function applyScale(ev: ScaleEvent): { event: string; atMs: number; keysMoved: number } {
    if (ev.kind === 'add') {
      const r = new ReplicaModel(`r${reps.length}`, profile, onFinish);
      reps.push(r);
      memberIdx = [...memberIdx, reps.length - 1];
      freed = true;
    } else {
      if (memberIdx.length <= 1) throw new RangeError('cannot remove the last replica');
      // The removed replica finishes what it holds but gets nothing new (drain, then out).
      memberIdx = memberIdx.slice(0, -1);
    }
    const distinct = new Set<number>();
    for (const k of config.keys) if (k !== null) distinct.add(k);
    const homes = new Map<number, string | null>();
    for (const k of distinct) homes.set(k, router.homeOf(k));
    router.setMembers(memberIdx.map((m) => reps[m]!.id));
    let moved = 0;
    for (const k of distinct) if (router.homeOf(k) !== homes.get(k)) moved++;
    // Keys only mean something to keyed strategies; the others reshuffle nothing.
    const keysMoved = router.strategy.keyed && distinct.size > 0 ? moved / distinct.size : NaN;
    return { event: `${ev.kind}@${ev.atMs / 1000}s`, atMs: ev.atMs, keysMoved };
  }

  // Aggregate.
  let prompt = 0;
  let cached = 0;
  let out = 0;
  let busy = 0;
  for (const r of reps) {
    prompt += r.promptTokens;
    cached += r.cachedTokens;
    out += r.outputTokens;
    busy += r.busyMs;
  }
  for (let k = 0; k < n; k++) ttft[k] = seqs[k]!.ttftMs;
  const span = Math.max(lastFinish, lastArrival);
  const means = reps.map((r) => r.meanInFlight(span));
  const perReplica: ReplicaResult[] = reps.map((r, k) => ({
    id: r.id,
    requests: r.requests,
    tokenHitRate: r.promptTokens > 0 ? r.cachedTokens / r.promptTokens : 0,
    outputTokens: r.outputTokens,
    busyFraction: span > 0 ? r.busyMs / span : 0,
    meanInFlight: means[k]!,
    peakInFlight: r.peakInFlight,
    evictions: r.cache.evictions,
  }));
  const counts = reps.map((r) => r.requests);
  let tracking: SimResult['indexTracking'] = null;
  if (router.lastMatchedBlocks !== undefined) {
    let tp = 0, tc = 0, tv = 0, tpr = 0, err = 0, errV = 0, m = 0;
    const visibleMax = DEFAULT_MAX_BLOCKS * ROUTER_BLOCK_TOKENS;
    for (let k = 0; k < n; k++) {
      // A paused stream's continuation replaced its seq: its prediction was for the first segment.
      if (predicted[k]! < 0 || resumed[k]) continue;
      const s = seqs[k]!;
      const limitTokens = lookupLimit(s.req.promptTokens, s.req.blocks.length) * KV_BLOCK_TOKENS;
      const p = Math.min(predicted[k]! * ROUTER_BLOCK_TOKENS, limitTokens);
      tp += p;
      tc += s.cachedTokens;
      const v = anchorLength(Math.floor(Math.min(s.cachedTokens, visibleMax) / ROUTER_BLOCK_TOKENS)) * ROUTER_BLOCK_TOKENS;
      tv += v;
      tpr += s.req.promptTokens;
      err += Math.abs(p - s.cachedTokens) / s.req.promptTokens;
      errV += Math.abs(p - v) / s.req.promptTokens;
      m++;
    }
    tracking = {
      requests: m,
      predictedHitRate: tpr > 0 ? tp / tpr : NaN,
      modelHitRate: tpr > 0 ? tc / tpr : NaN,
      visibleHitRate: tpr > 0 ? tv / tpr : NaN,
      meanAbsError: m > 0 ? err / m : NaN,
      meanAbsErrorVisible: m > 0 ? errV / m : NaN,
    };
  }

  let scaleResult: ScaleResult | null = null;
  if (scaleInfo !== null) {
    const w = config.scaleWindowMs ?? 300_000;
    const before: number[] = [];
    const after: number[] = [];
    let pb = 0, cb = 0, pa = 0, ca = 0;
    for (let k = 0; k < n; k++) {
      const s = seqs[k]!;
      if (s.arrivalMs >= scaleInfo.atMs - w && s.arrivalMs < scaleInfo.atMs) {
        before.push(s.ttftMs);
        pb += s.req.promptTokens;
        cb += s.cachedTokens;
      } else if (s.arrivalMs >= scaleInfo.atMs && s.arrivalMs < scaleInfo.atMs + w) {
        after.push(s.ttftMs);
        pa += s.req.promptTokens;
        ca += s.cachedTokens;
      }
    }
    scaleResult = {
      ...scaleInfo,
      windowMs: w,
      p95TtftBeforeMs: percentile(before, 0.95),
      p95TtftAfterMs: percentile(after, 0.95),
      hitRateBefore: pb > 0 ? cb / pb : NaN,
      hitRateAfter: pa > 0 ? ca / pa : NaN,
    };
  }

  return {
    strategy: router.name,
    replicas: config.replicas,
    requests: n,
    timeScale: scale,
    promptTokens: prompt,
    cachedTokens: cached,
    tokenHitRate: prompt > 0 ? cached / prompt : 0,
    ttftMs: { p50: percentile(ttft, 0.5), p95: percentile(ttft, 0.95), p99: percentile(ttft, 0.99), mean: mean(ttft) },
    outputTokensPerSecPerReplica: span > 0 ? out / (span / 1000) / config.replicas : 0,
    outputTokensPerBusySec: busy > 0 ? out / (busy / 1000) : 0,
    meanBusyFraction: span > 0 ? busy / span / reps.length : 0,
    spanMs: span,
    inFlight: { peak: Math.max(...reps.map((r) => r.peakInFlight)), maxMean: Math.max(...means), mean: mean(means) },
    requestsPerReplica: { max: Math.max(...counts), mean: mean(counts) },
    spillRate: keyed > 0 ? spilled / keyed : 0,
    earlyConnect: { hitRate: keyed > 0 ? earlyHits / keyed : 0, missRate: keyed > 0 ? earlyMisses / keyed : 0 },
    keyedShare: n > 0 ? keyed / n : 0,
    minRequestShare: mean(counts) > 0 ? Math.min(...counts) / mean(counts) : NaN,
    indexTracking: tracking,
    perReplica,
    load: { tMs: sampleT, inFlight: reps.map((_, k) => sampleLoad.map((row) => row[k] ?? 0)) },
    scale: scaleResult,
    flow: flowResult({
      enabled: flow !== null,
      cap: flow?.cap ?? null,
      tenantOf: (k) => reqs[k]!.tenant ?? '-',
      bandOf: (tenant) => (flow !== null ? flow.bandName(flow.bandOf(tenant)) : '-'),
      weightOf: (tenant) => config.flowControl?.tenants?.[tenant]?.weight ?? 1,
      ttftMs: ttft,
      waitMs,
      refused,
      outputTokens: (k) => reqs[k]!.outputTokens,
      preempted: flow?.preempted ?? 0,
      paused: flow?.paused ?? 0,
    }),
    ttftByRequest: ttft,
    wallMs: performance.now() - wall0,
  };
}
