// The simulator's flow control (sim/flow-control.ts over src/core/fair-queue.ts, driven by
// sim/engine.ts): the per-replica bound holds, waiting happens at the edge in fair shares and
// bands, a tenant alone keeps the whole pool, and the run without it is today's. Invariants on a
// virtual clock, not timings.
import { describe, expect, it } from 'vitest';

import { simulate, type SimConfig } from '../../../sim/engine.js';
import { EdgeQueue, mergeTenants, parseTenantList, type FlowControlOptions } from '../../../sim/flow-control.js';
import { resolveProfile } from '../../../sim/profile.js';
import { parseKeySpec, parseTrace, routingKey, type Trace } from '../../../sim/trace.js';

/** Requests of `tenant` every `gapMs` from `fromMs` for `count`, each its own session and prefix. */
function stream(tenant: string, fromMs: number, gapMs: number, count: number, prompt = 512, output = 64): string[] {
  return Array.from({ length: count }, (_, i) => {
    const id = `${tenant}-${i}`;
    // Own block ids per request: no prefix reuse muddles the timing.
    const base = [...id].reduce((a, c) => (a * 31 + c.charCodeAt(0)) >>> 0, 7) % 1_000_000;
    return JSON.stringify({ timestamp: fromMs + i * gapMs, input_length: prompt, output_length: output, hash_ids: Array.from({ length: prompt / 16 }, (_, j) => base * 64 + j), session: id, tenant, block_tokens: 16 });
  });
}

function trace(...streams: string[][]): Trace {
  const lines = streams.flat().sort((a, b) => (JSON.parse(a) as { timestamp: number }).timestamp - (JSON.parse(b) as { timestamp: number }).timestamp);
  return parseTrace(lines.join('\n'), 'flow-test');
}

// A small replica: 4 sequences at once, so a few requests per second overload it.
const PROFILE = resolveProfile({ maxRunning: 4 });

function run(t: Trace, flowControl?: FlowControlOptions, over: Partial<SimConfig> = {}) {
  const keys = t.requests.map((r) => routingKey(r, parseKeySpec('session')));
  return simulate(t, { strategy: 'bounded-hash:1.25', replicas: 2, keys, seed: 3, profile: PROFILE, flowControl, ...over });
}

const tenantOf = (r: ReturnType<typeof run>, id: string) => r.flow.tenants.find((t) => t.tenant === id)!;
/** The same trace with flow control work-conserving and with one slot kept (shareReserve 1). */
const withAndWithoutReserve = (t: Trace) => ({ conserving: run(t, { maxInFlightPerReplica: 4 }), reserve: run(t, { maxInFlightPerReplica: 4, shareReserve: 1 }) });

describe('simulator flow control', () => {
  it('without it, the run is today\'s: nothing waits at the edge, nothing is refused', () => {
    const r = run(trace(stream('a', 0, 20, 200), stream('b', 0, 200, 20)));
    expect(r.flow.enabled).toBe(false);
    expect(r.flow.queued).toBe(0);
    expect(r.flow.refused).toBe(0);
    expect(r.ttftByRequest.every(Number.isFinite)).toBe(true);
    // Overloaded: the replicas' own queues held more than their 4 slots.
    expect(r.inFlight.peak).toBeGreaterThan(4);
  });

  it('keeps every replica at or under the bound; the rest waits at the edge and is admitted as slots free', () => {
    const r = run(trace(stream('a', 0, 20, 200), stream('b', 0, 200, 20)), { maxInFlightPerReplica: 4 });
    expect(r.flow.enabled).toBe(true);
    expect(r.inFlight.peak).toBe(4);
    expect(r.flow.queued).toBeGreaterThan(50);
    // Every request either got its first token or was refused by its band's wait or length.
    const served = Array.from(r.ttftByRequest).filter(Number.isFinite).length;
    expect(served + r.flow.refused).toBe(r.requests);
  });

  it('the light tenant no longer waits behind the heavy one\'s burst', () => {
    const t = trace(stream('heavy', 0, 20, 300), stream('light', 100, 400, 15));
    const today = run(t);
    const flow = run(t, { maxInFlightPerReplica: 4 });
    expect(tenantOf(flow, 'light').refused).toBe(0);
    expect(tenantOf(flow, 'light').ttftP99Ms).toBeLessThan(tenantOf(today, 'light').ttftP99Ms / 3);
    // The heavy tenant is the one who waits.
    expect(tenantOf(flow, 'heavy').queueWaitP99Ms).toBeGreaterThan(tenantOf(flow, 'light').queueWaitP99Ms);
  });

  it('shares a backlogged pool by weight (3:1) when both tenants send the same', () => {
    // Both far above the pool's rate for long; short waits, so what is served is what was admitted.
    const bands = [{ name: 'normal', maxQueueMs: 2_000, maxQueueLength: 1_000 }];
    const t = trace(stream('w3', 0, 10, 1_500), stream('w1', 5, 10, 1_500));
    const equal = run(t, { maxInFlightPerReplica: 4, bands });
    expect(tenantOf(equal, 'w3').outputShare).toBeGreaterThan(0.45);
    expect(tenantOf(equal, 'w3').outputShare).toBeLessThan(0.55);
    const weighted = run(t, { maxInFlightPerReplica: 4, bands, tenants: { w3: { weight: 3 } } });
    expect(tenantOf(weighted, 'w3').weight).toBe(3);
    expect(tenantOf(weighted, 'w3').outputShare).toBeGreaterThan(0.7);
    expect(tenantOf(weighted, 'w3').outputShare).toBeLessThan(0.8);
  });

  it('what a request costs its tenant: tokens share the engines\' work, requests share the count (issue #29: which is fairer)', () => {
    // Both far above the pool's rate; big's requests are 8× small's in prompt and output.
    const bands = [{ name: 'normal', maxQueueMs: 2_000, maxQueueLength: 1_000 }];
    const t = trace(stream('big', 0, 10, 1_500, 2_048, 256), stream('small', 5, 10, 1_500, 256, 32));
    const served = (r: ReturnType<typeof run>, id: string) => tenantOf(r, id).requests - tenantOf(r, id).refused;
    const tokenShare = (r: ReturnType<typeof run>) => (served(r, 'big') * 8) / (served(r, 'big') * 8 + served(r, 'small'));
    const byTokens = run(t, { maxInFlightPerReplica: 4, bands, fairness: 'tokens' });
    const byRequests = run(t, { maxInFlightPerReplica: 4, bands, fairness: 'requests' });
    // By tokens: each tenant gets about half of the tokens served, so small is served ~8× the requests.
    expect(tokenShare(byTokens)).toBeGreaterThan(0.4);
    expect(tokenShare(byTokens)).toBeLessThan(0.6);
    expect(served(byTokens, 'small')).toBeGreaterThan(served(byTokens, 'big') * 5);
    // By requests: about as many requests each, so big takes ~8/9 of the tokens.
    expect(served(byRequests, 'small') / served(byRequests, 'big')).toBeGreaterThan(0.8);
    expect(served(byRequests, 'small') / served(byRequests, 'big')).toBeLessThan(1.25);
    expect(tokenShare(byRequests)).toBeGreaterThan(0.8);
  });

  it('admits the high band first', () => {
    const t = trace(stream('batch', 0, 15, 400), stream('chat', 50, 300, 20));
    const tenants = { chat: { band: 'high' }, batch: { band: 'low' } };
    const r = run(t, { maxInFlightPerReplica: 4, tenants });
    expect(tenantOf(r, 'chat').band).toBe('high');
    expect(tenantOf(r, 'chat').refused).toBe(0);
    expect(tenantOf(r, 'chat').queueWaitP99Ms).toBeLessThan(tenantOf(r, 'batch').queueWaitP99Ms / 5);
  });

  it('queues a request in the band its trace line recorded (the router log\'s band), else its tenant\'s', () => {
    const recorded = (lines: string[], band: string) => lines.map((l) => JSON.stringify({ ...(JSON.parse(l) as object), band }));
    const t = trace(stream('batch', 0, 15, 400), recorded(stream('chat', 50, 300, 20), 'high'));
    expect(t.requests.filter((r) => r.band === 'high')).toHaveLength(20);
    const r = run(t, { maxInFlightPerReplica: 4, tenants: { batch: { band: 'low' } } });
    expect(tenantOf(r, 'chat').queueWaitP99Ms).toBeLessThan(tenantOf(r, 'batch').queueWaitP99Ms / 5);
    // The router's own log line carries it too.
    const log = parseTrace(JSON.stringify({ type: 'request', ts: 1, promptTokens: 100, completionTokens: 5, tenant: 'x', band: 'low', keyKind: 'none', blocks: [] }), 'log');
    expect(log.requests[0]!.band).toBe('low');
    // A band this queue does not have: the tenant's, counted.
    const q = new EdgeQueue({ maxInFlightPerReplica: 1 });
    expect(q.requestBand('x', 'vip')).toBe(q.bandOf('x'));
    expect(q.unknownBands).toBe(1);
  });

  it('is work-conserving: a tenant alone is served as fast as without the queue when the bound is the engine\'s slots', () => {
    const t = trace(stream('solo', 0, 30, 200));
    const today = run(t);
    const flow = run(t, { maxInFlightPerReplica: 4 });
    expect(flow.flow.refused).toBe(0);
    // The same output over a span within a few percent (only the placement differs).
    expect(flow.spanMs).toBeLessThan(today.spanMs * 1.05);
  });

  it('the share reserve: the light tenant\'s requests start at once, the heavy one waits; a tenant alone is never held back', () => {
    const { conserving, reserve } = withAndWithoutReserve(trace(stream('heavy', 0, 20, 300), stream('light', 100, 400, 15)));
    // Work-conserving, the light tenant waits for the next slot the heavy one frees.
    expect(tenantOf(conserving, 'light').queueWaitP99Ms).toBeGreaterThan(0);
    expect(tenantOf(reserve, 'light').queueWaitP99Ms).toBe(0);
    expect(tenantOf(reserve, 'light').refused).toBe(0);
    expect(tenantOf(reserve, 'heavy').queueWaitP99Ms).toBeGreaterThan(0);
    const solo = trace(stream('solo', 0, 30, 200));
    expect(run(solo, { maxInFlightPerReplica: 4, shareReserve: 1 }).spanMs).toBe(run(solo, { maxInFlightPerReplica: 4 }).spanMs);
  });

  it('the share reserve counts a light tenant between its requests: its next one still finds the kept slot', () => {
    // One request every 2 s, each done well before the next: never in flight or waiting when it arrives.
    const { conserving, reserve } = withAndWithoutReserve(trace(stream('heavy', 0, 5, 3_000), stream('light', 1_000, 2_000, 7)));
    expect(tenantOf(conserving, 'light').queueWaitP50Ms).toBeGreaterThan(0);
    // Only its first request waits (nothing told the pool about light before it).
    expect(tenantOf(reserve, 'light').queueWaitP50Ms).toBe(0);
    // The price: one slot of eight kept while light is about; heavy keeps most of its throughput.
    const served = (r: ReturnType<typeof run>) => tenantOf(r, 'heavy').requests - tenantOf(r, 'heavy').refused;
    expect(served(reserve)).toBeGreaterThan(served(conserving) * 0.8);
  });

  it('preemption: a light tenant\'s request takes the slot of the heavy one\'s youngest still in prefill; the heavy one still gets everything served', () => {
    // Long prompts (in prefill a good part of their time), light requests two at a time.
    const light = [...stream('light', 100, 600, 12, 512, 16), ...stream('light2', 110, 600, 12, 512, 16).map((l) => l.replace('"tenant":"light2"', '"tenant":"light"'))];
    const t = trace(stream('heavy', 0, 20, 300, 4_096, 32), light);
    const conserving = run(t, { maxInFlightPerReplica: 4 });
    const preempt = run(t, { maxInFlightPerReplica: 4, preempt: true });
    expect(conserving.flow.preempted).toBe(0);
    expect(preempt.flow.preempted).toBeGreaterThan(0);
    // Light's requests mostly no longer wait for a heavy request to end (its median wait: 0). Its
    // tail does not shrink as much: the slot taken back is on a replica whose prefill compute the
    // other requests there share (the model's chunked-prefill budget), and two light requests in a
    // row may find one victim in prefill between them.
    expect(tenantOf(conserving, 'light').queueWaitP50Ms).toBeGreaterThan(50);
    expect(tenantOf(preempt, 'light').queueWaitP50Ms).toBe(0);
    expect(tenantOf(preempt, 'light').refused).toBe(0);
    // The bound holds; every request is served or refused; heavy loses only the prefills taken back.
    expect(preempt.inFlight.peak).toBeLessThanOrEqual(4);
    const served = (r: ReturnType<typeof run>) => Array.from(r.ttftByRequest).filter(Number.isFinite).length;
    expect(served(preempt) + preempt.flow.refused).toBe(preempt.requests);
    const heavyServed = (r: ReturnType<typeof run>) => tenantOf(r, 'heavy').requests - tenantOf(r, 'heavy').refused;
    expect(heavyServed(preempt)).toBeGreaterThan(heavyServed(conserving) * 0.9);
    // A tenant alone is never preempted.
    const solo = trace(stream('solo', 0, 30, 200));
    expect(run(solo, { maxInFlightPerReplica: 4, preempt: true }).flow.preempted).toBe(0);
  });

  it('preemptStreams: with the heavy tenant\'s requests past their first token, its youngest stream is paused for the light one and continued to its whole answer', () => {
    // Short prompts, long answers: the heavy requests are decoding most of their time.
    const t = trace(stream('heavy', 0, 100, 40, 64, 128), stream('light', 100, 400, 10, 64, 16));
    const firstToken = run(t, { maxInFlightPerReplica: 4, preempt: true });
    const streams = run(t, { maxInFlightPerReplica: 4, preemptStreams: true });
    expect(streams.flow.paused).toBeGreaterThan(0);
    expect(streams.flow.preempted).toBeGreaterThanOrEqual(streams.flow.paused);
    expect(firstToken.flow.paused).toBe(0);
    // Before the first token alone finds few victims here; pausing streams gives light its slot at once.
    expect(tenantOf(firstToken, 'light').queueWaitP50Ms).toBeGreaterThan(0);
    expect(tenantOf(streams, 'light').queueWaitP50Ms).toBe(0);
    expect(tenantOf(streams, 'light').queueWaitP99Ms).toBeLessThan(tenantOf(firstToken, 'light').queueWaitP99Ms);
    // The bound holds, every request is served or refused, and every answer is whole: the engines
    // produced at least every served request's output (the paused segments' tokens are not redone).
    expect(streams.inFlight.peak).toBeLessThanOrEqual(4);
    const served = (r: ReturnType<typeof run>) => Array.from(r.ttftByRequest).filter(Number.isFinite).length;
    expect(served(streams) + streams.flow.refused).toBe(streams.requests);
    expect(streams.flow.refused).toBe(0);
    expect(firstToken.flow.refused).toBe(0);
    const out = (r: ReturnType<typeof run>) => r.perReplica.reduce((a, x) => a + x.outputTokens, 0);
    // 40 × 128 + 10 × 16: the paused answers' tokens produced once, none lost or repeated.
    expect(out(streams)).toBe(40 * 128 + 10 * 16);
    expect(out(firstToken)).toBe(out(streams));
  });

  it('a band\'s headroom keeps slots for the bands above: the high band never waits', () => {
    const t = trace(stream('batch', 0, 15, 400), stream('chat', 50, 300, 20));
    const tenants = { chat: { band: 'high' }, batch: { band: 'low' } };
    const bands = [
      { name: 'high', maxQueueMs: 30_000, maxQueueLength: 1_000 },
      { name: 'normal', maxQueueMs: 30_000, maxQueueLength: 1_000 },
      { name: 'low', maxQueueMs: 10_000, maxQueueLength: 500, headroom: 1 },
    ];
    const without = run(t, { maxInFlightPerReplica: 4, tenants });
    const kept = run(t, { maxInFlightPerReplica: 4, tenants, bands });
    expect(tenantOf(without, 'chat').queueWaitP99Ms).toBeGreaterThan(0);
    expect(tenantOf(kept, 'chat').queueWaitP99Ms).toBe(0);
    // Low traffic alone uses all but the one kept slot: 7 of the 8.
    const peakTotal = (r: ReturnType<typeof run>) => Math.max(...r.load.tMs.map((_, k) => r.load.inFlight.reduce((a, rep) => a + (rep[k] ?? 0), 0)));
    const alone = trace(stream('batch', 0, 15, 400));
    expect(peakTotal(run(alone, { maxInFlightPerReplica: 4, tenants }))).toBe(8);
    expect(peakTotal(run(alone, { maxInFlightPerReplica: 4, tenants, bands }))).toBe(7);
  });

  it('is deterministic', () => {
    const t = trace(stream('a', 0, 20, 200), stream('b', 0, 150, 30));
    const a = run(t, { maxInFlightPerReplica: 4, tenants: { b: { weight: 2 } } });
    const b = run(t, { maxInFlightPerReplica: 4, tenants: { b: { weight: 2 } } });
    expect({ ...a, wallMs: 0 }).toEqual({ ...b, wallMs: 0 });
  });

  it('refuses bad settings with the field named', () => {
    expect(() => new EdgeQueue({ maxInFlightPerReplica: 0 })).toThrow(/maxInFlightPerReplica/);
    expect(() => new EdgeQueue({ maxInFlightPerReplica: 4, defaultBand: 'vip' })).toThrow(/default band "vip"/);
    expect(() => new EdgeQueue({ maxInFlightPerReplica: 4, shareReserve: -1 })).toThrow(/shareReserve/);
    expect(() => new EdgeQueue({ maxInFlightPerReplica: 4, tenants: { a: { band: 'vip' } } })).toThrow(/tenant a: band "vip"/);
    expect(() => run(trace(stream('a', 0, 20, 10)), { maxInFlightPerReplica: 4 }, { shards: 2 })).toThrow(/one coordinator/);
    expect(mergeTenants(parseTenantList('a=3,b=1', 'weight'), parseTenantList('a=high', 'band'))).toEqual({ a: { weight: 3, band: 'high' }, b: { weight: 1 } });
    expect(() => parseTenantList('a=0.5', 'weight')).toThrow(/≥ 1/);
    expect(() => parseTenantList('a', 'band')).toThrow(/tenant=band/);
  });
});
