// The lease agent under the platform's waitUntil rule, which Miniflare does not enforce: work a
// request left in `waitUntil` is cancelled 30 s after its response ("Use event.waitUntil() to
// delay cancellation for another 30 seconds or until the promise passed to waitUntil() completes",
// developers.cloudflare.com/workers/platform/limits/#duration). Emulated on a virtual clock: every
// timer belongs to the request whose code (or promise continuation) set it, tracked with
// AsyncLocalStorage; at the request's response end + 30 s its timers are dropped and never fire,
// so its loops stop wherever they were, flags and all. Through a 70 s coordinator outage (calls
// hang: the worst case, only timeouts end them), releases and renewals must resume afterwards.

import { AsyncLocalStorage } from 'node:async_hooks';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { AcquireRequest, AcquireResult, SettleBatch, SettleResult } from '../../../src/coordinator/types';
import { LOOP_BUDGET_MS, LeaseAgent, type AgentTimers, type LeaseClient, type LeaseTimings } from '../../../src/proxy/lease-agent';

// The configuration defaults (src/config.ts DEFAULTS).
const T: LeaseTimings = { leaseTtlMs: 30_000, renewIntervalMs: 10_000, releaseFlushMs: 100, acquireTimeoutMs: 250, coordinatorRetryMs: 2_000 };
const WAIT_UNTIL_MS = 30_000;

const request = new AsyncLocalStorage<string>();

/** A virtual clock whose timers die with their request's waitUntil, 30 s after its response. */
class Platform implements AgentTimers {
  now = 1_000_000;
  #seq = 0;
  readonly #timers = new Map<number, { at: number; fn: () => void; owner: string | undefined }>();
  readonly #cancelAt = new Map<string, number>();
  readonly cancelled = new Set<string>();
  /** Timers of a request still pending when its waitUntil was cancelled (a loop that outlived 30 s). */
  readonly cut: string[] = [];

  setTimeout = (fn: () => void, ms: number): unknown => {
    const owner = request.getStore();
    if (owner !== undefined && this.cancelled.has(owner)) return 0;
    const id = ++this.#seq;
    this.#timers.set(id, { at: this.now + Math.max(0, ms), fn, owner });
    return id;
  };
  clearTimeout = (h: unknown): void => {
    this.#timers.delete(h as number);
  };

  /** `req`'s response is complete: what it left in waitUntil is cancelled 30 s from now. */
  responseEnded(req: string): void {
    this.#cancelAt.set(req, this.now + WAIT_UNTIL_MS);
  }

  /** Cut `req`'s waitUntil work now. */
  cancelNow(req: string): void {
    this.#cancelAt.set(req, this.now);
  }

  async advance(ms: number): Promise<void> {
    const end = this.now + ms;
    for (;;) {
      await drain();
      let next: { at: number; cancel?: string; id?: number } | null = null;
      for (const [req, at] of this.#cancelAt) if (at <= end && (!next || at < next.at)) next = { at, cancel: req };
      for (const [id, x] of this.#timers) if (x.at <= end && (!next || x.at < next.at)) next = { at: x.at, id };
      if (!next) break;
      this.now = Math.max(this.now, next.at);
      if (next.cancel !== undefined) {
        this.#cancelAt.delete(next.cancel);
        this.cancelled.add(next.cancel);
        for (const [id, x] of this.#timers) {
          if (x.owner !== next.cancel) continue;
          this.#timers.delete(id);
          this.cut.push(next.cancel);
        }
        continue;
      }
      const x = this.#timers.get(next.id!)!;
      this.#timers.delete(next.id!);
      if (x.owner === undefined) x.fn();
      else request.run(x.owner, x.fn);
    }
    this.now = end;
    await drain();
  }
}

async function drain(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
}

/** A coordinator that can go down: then every call hangs (no answer, no error). */
class Coordinator implements LeaseClient {
  down = false;
  n = 0;
  readonly settles: { at: number; batch: SettleBatch }[] = [];
  readonly acquired: { at: number; req: AcquireRequest }[] = [];
  constructor(private readonly p: Platform) {}
  acquire(req: AcquireRequest): Promise<AcquireResult> {
    if (this.down) return new Promise(() => {});
    this.acquired.push({ at: this.p.now, req });
    return Promise.resolve({ ok: true, leaseId: `l${++this.n}`, replica: { id: 'r1', url: 'https://a.example.com', auth: 'none' }, spilled: false, steps: 1, deadline: this.p.now + T.leaseTtlMs, epoch: 'e1' });
  }
  release(): Promise<unknown> {
    return this.down ? new Promise(() => {}) : Promise.resolve({ released: true });
  }
  settle(_pool: string, batch: SettleBatch): Promise<SettleResult> {
    if (this.down) return new Promise(() => {});
    this.settles.push({ at: this.p.now, batch });
    return Promise.resolve({ epoch: 'e1', released: batch.releases.length, renewed: batch.renew?.length ?? 0, restored: 0, gone: [], deadline: this.p.now + T.leaseTtlMs });
  }
  releasedAfter(at: number): string[] {
    return this.settles.filter((s) => s.at >= at).flatMap((s) => s.batch.releases.map((r) => r.id));
  }
  renewalsAfter(at: number): { at: number; ids: string[] }[] {
    return this.settles.filter((s) => s.at >= at && s.batch.renew).map((s) => ({ at: s.at, ids: s.batch.renew!.map((l) => l.id) }));
  }
}

/** One request of the Worker: acquires and holds a lease; `finish` releases it and ends the response. */
async function start(p: Platform, agent: LeaseAgent, c: Coordinator, name: string): Promise<{ id: string; finish: () => void }> {
  const waitUntil = (x: Promise<unknown>) => void x.catch(() => {});
  // Right after an outage the isolate's breaker may still be open (coordinatorRetryMs): such a
  // request would be routed open; the next one, a moment later, asks again.
  let out = await request.run(name, () => agent.acquire(c, { pool: 'p', key: 1, keyKind: 'header', tenant: 't' }, T, waitUntil));
  for (let i = 0; i < 10 && out.kind === 'unreachable' && out.why === 'breaker'; i++) {
    await p.advance(500);
    out = await request.run(name, () => agent.acquire(c, { pool: 'p', key: 1, keyKind: 'header', tenant: 't' }, T, waitUntil));
  }
  if (out.kind !== 'reply' || !out.result.ok) throw new Error(`${name}: no lease (${out.kind})`);
  const r = out.result;
  request.run(name, () => waitUntil(agent.hold(c, 'p', { id: r.leaseId, replica: r.replica.id, tenant: 't', startedAt: p.now, spilled: false, deadline: r.deadline }, T)));
  return {
    id: r.leaseId,
    finish: () => {
      request.run(name, () => agent.release(c, 'p', r.leaseId, 't', { status: 200 }, T, waitUntil));
      p.responseEnded(name);
    },
  };
}

describe('LeaseAgent with waitUntil cancelled 30 s after the response', () => {
  afterEach(() => vi.restoreAllMocks());

  it('through a 70 s coordinator outage, releases and renewals resume and no loop outlives its request by 30 s', async () => {
    const p = new Platform();
    const agent = new LeaseAgent(() => p.now, p);
    const c = new Coordinator(p);
    // A long stream, live for the whole test: its lease must stay renewed.
    const stream = await start(p, agent, c, 'stream');
    const short = [await start(p, agent, c, 'r1'), await start(p, agent, c, 'r2'), await start(p, agent, c, 'r3')];
    await p.advance(500);

    c.down = true;
    const outageStart = p.now;
    // Requests finish during the outage at 0.5 s, 15 s and 25 s in: their releases cannot land, and
    // each keeps the pool's flush work going past the first one's 30 s.
    short[0]!.finish();
    await p.advance(14_500);
    short[1]!.finish();
    await p.advance(10_000);
    short[2]!.finish();
    // Requests routed open meanwhile (the breaker) would call noteFallback; none here: the worst case.
    await p.advance(45_500);
    expect(p.now - outageStart).toBe(70_000);
    c.down = false;
    const back = p.now;

    // After the outage: a new request comes, finishes; its release goes out without another acquire.
    const q = await start(p, agent, c, 'q');
    await p.advance(1_000);
    q.finish();
    await p.advance(1_000);
    expect(c.releasedAfter(back)).toContain(q.id);

    // The stream's lease is renewed again, once per interval, for as long as the stream lives.
    await p.advance(30_000);
    const renewals = c.renewalsAfter(back);
    expect(renewals.length).toBeGreaterThanOrEqual(3);
    for (const r of renewals) expect(r.ids).toContain(stream.id);
    expect(renewals.at(-1)!.at).toBeGreaterThan(p.now - T.renewIntervalMs - 1_000);

    // Every loop a finished request left stopped within the budget: nothing was cut at 30 s.
    expect(p.cancelled).toEqual(new Set(['r1', 'r2', 'r3', 'q']));
    expect(p.cut).toEqual([]);
    expect(LOOP_BUDGET_MS).toBeLessThan(WAIT_UNTIL_MS);
    expect(agent.stats()[0]).toMatchObject({ held: 1, pending: 0 });

    stream.finish();
    await p.advance(1_000);
    expect(c.releasedAfter(back)).toContain(stream.id);
  });

  it('with no live stream to carry them, releases after the outage still go out (the loop cut at 30 s does not hold the pool)', async () => {
    const p = new Platform();
    const agent = new LeaseAgent(() => p.now, p);
    const c = new Coordinator(p);
    const short = [await start(p, agent, c, 'r1'), await start(p, agent, c, 'r2'), await start(p, agent, c, 'r3')];
    c.down = true;
    short[0]!.finish();
    await p.advance(15_000);
    short[1]!.finish();
    await p.advance(10_000);
    short[2]!.finish();
    await p.advance(45_000);
    c.down = false;
    const back = p.now;
    const q = await start(p, agent, c, 'q');
    q.finish();
    await p.advance(1_000);
    expect(c.releasedAfter(back)).toEqual([q.id]);
    expect(p.cut).toEqual([]);
    expect(agent.stats()[0]).toMatchObject({ held: 0, pending: 0 });
  });

  it('a renewal cut mid-call (carried by a finished request\'s flush loop) does not stop renewals', async () => {
    // The live stream's loop wakes a little after the renew time (its spread at the top), so the
    // flush loop of a request that ended just before takes the renewal along with its release.
    vi.spyOn(Math, 'random').mockReturnValue(0.99);
    const p = new Platform();
    const agent = new LeaseAgent(() => p.now, p);
    const c = new Coordinator(p);
    const stream = await start(p, agent, c, 'stream');
    const f = await start(p, agent, c, 'f');
    await p.advance(T.renewIntervalMs - T.releaseFlushMs);
    c.down = true;
    f.finish();
    await p.advance(T.releaseFlushMs + 5);
    // f's settle (release + renewal) hangs; f's waitUntil is cut now, as it would be at 30 s.
    p.cancelNow('f');
    await p.advance(5_000);
    c.down = false;
    const back = p.now;
    await p.advance(2 * T.renewIntervalMs);
    const renewals = c.renewalsAfter(back);
    expect(renewals.length).toBeGreaterThanOrEqual(2);
    for (const r of renewals) expect(r.ids).toEqual([stream.id]);
    // f's release rode along with the first of them (its mark expired with the cut call's timeout).
    expect(c.releasedAfter(back)).toEqual([f.id]);
  });

  it('a loop cut mid-call (its request cancelled while the settle hung) is taken over: its marks expire', async () => {
    const p = new Platform();
    const agent = new LeaseAgent(() => p.now, p);
    const c = new Coordinator(p);
    const a = await start(p, agent, c, 'a');
    c.down = true;
    a.finish();
    // The flush loop is in its first settle (hanging) when the request's waitUntil is cut: here at
    // once, as if the runtime were evicting the isolate's request early (the harshest case).
    await p.advance(150);
    p.cancelNow('a');
    await p.advance(60_000);
    c.down = false;
    const back = p.now;
    const b = await start(p, agent, c, 'b');
    // b's acquire carried nothing of a (expired: the coordinator reaped it); b's own release lands.
    b.finish();
    await p.advance(1_000);
    expect(c.releasedAfter(back)).toEqual([b.id]);
    expect(agent.counters.loopsTakenOver).toBeGreaterThanOrEqual(1);
  });

  it('a held lease whose request was cancelled before its release stops being renewed after one TTL', async () => {
    const p = new Platform();
    const agent = new LeaseAgent(() => p.now, p);
    const c = new Coordinator(p);
    const live = await start(p, agent, c, 'live');
    const lost = await start(p, agent, c, 'lost');
    // 'lost' never releases (its finally never ran): its renew loop is cut with the request.
    p.responseEnded('lost');
    await p.advance(WAIT_UNTIL_MS + T.leaseTtlMs + 2 * T.renewIntervalMs);
    const last = c.renewalsAfter(0).at(-1)!;
    expect(last.ids).toEqual([live.id]);
    expect(agent.heldByReplica('p')).toEqual({ r1: 1 });
    expect(agent.counters.leasesOrphaned).toBe(1);
    void lost;
  });
});
