// The Worker's half of lease protocol v2 (src/proxy/lease-agent.ts) against a fake coordinator:
// releases ride on the next acquire or go out together after releaseFlushMs, one renewal per
// interval carries every live lease, a failed delivery is retried, a new coordinator epoch gets
// the leases renewed at once. Real timers with small intervals.

import { describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, SettleBatch, SettleResult } from '../../../src/coordinator/types';
import { LeaseAgent, type LeaseClient, type LeaseTimings } from '../../../src/proxy/lease-agent';

// A lease TTL far above the intervals: a timer delayed by a loaded machine must not expire a lease mid-test.
const T: LeaseTimings = { leaseTtlMs: 10_000, renewIntervalMs: 100, releaseFlushMs: 30, acquireTimeoutMs: 100, coordinatorRetryMs: 50 };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

class FakeCoordinator implements LeaseClient {
  acquires: AcquireRequest[] = [];
  settles: SettleBatch[] = [];
  releases: string[] = [];
  epoch = 'e1';
  failSettles = 0;
  n = 0;
  async acquire(req: AcquireRequest): Promise<AcquireResult> {
    this.acquires.push(req);
    const settled = req.settle ? this.result(req.settle) : undefined;
    return { ok: true, leaseId: `l${++this.n}`, replica: { id: 'r1', url: 'http://127.0.0.1:1', auth: 'none' }, spilled: false, steps: 1, deadline: Date.now() + T.leaseTtlMs, epoch: this.epoch, ...(settled ? { settled } : {}) };
  }
  async release(id: string): Promise<unknown> {
    this.releases.push(id);
    return { released: true };
  }
  async settle(_pool: string, batch: SettleBatch): Promise<SettleResult> {
    if (this.failSettles > 0) {
      this.failSettles--;
      throw new Error('overloaded');
    }
    this.settles.push(batch);
    return this.result(batch);
  }
  result(batch: SettleBatch): SettleResult {
    return { epoch: this.epoch, released: batch.releases.length, renewed: batch.renew?.length ?? 0, restored: 0, gone: [], deadline: Date.now() + T.leaseTtlMs };
  }
}

async function take(agent: LeaseAgent, c: LeaseClient, pending: Promise<unknown>[], tenant = 't', t: LeaseTimings = T) {
  const out = await agent.acquire(c, { pool: 'p', key: 1, keyKind: 'header', tenant }, t, (p) => pending.push(p));
  if (out.kind !== 'reply' || !out.result.ok) throw new Error('no lease');
  const r = out.result;
  pending.push(agent.hold(c, 'p', { id: r.leaseId, replica: r.replica.id, tenant, startedAt: Date.now(), spilled: false, deadline: r.deadline }, t));
  return r.leaseId;
}

describe('LeaseAgent', () => {
  it('a release rides on the next acquire when one comes within releaseFlushMs', async () => {
    // A flush window of 1 s (and no renewal due within it): the next acquire comes well inside it
    // however slow the machine, and the last release still goes out on its own soon enough.
    const T1: LeaseTimings = { ...T, leaseTtlMs: 20_000, renewIntervalMs: 10_000, releaseFlushMs: 1_000 };
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    const pending: Promise<unknown>[] = [];
    const a = await take(agent, c, pending, 't', T1);
    agent.release(c, 'p', a, 't', { status: 200 }, T1, (p) => pending.push(p));
    const b = await take(agent, c, pending, 't', T1);
    expect(c.acquires[1]!.settle?.releases.map((r) => r.id)).toEqual([a]);
    agent.release(c, 'p', b, 't', { status: 200 }, T1, (p) => pending.push(p));
    await Promise.all(pending);
    // b had no acquire after it: one settle call carried it.
    expect(c.settles.map((s) => s.releases.map((r) => r.id))).toEqual([[b]]);
    expect(agent.counters.rpcs).toEqual({ acquire: 2, settle: 1 });
  });

  it('releases of many requests go out together in one call', async () => {
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    const pending: Promise<unknown>[] = [];
    const ids = [];
    for (let i = 0; i < 5; i++) ids.push(await take(agent, c, pending));
    for (const id of ids) agent.release(c, 'p', id, 't', { status: 200 }, T, (p) => pending.push(p));
    await Promise.all(pending);
    expect(c.settles).toHaveLength(1);
    expect(c.settles[0]!.releases.map((r) => r.id).sort()).toEqual([...ids].sort());
  });

  it('one renewal per interval carries every live lease, however many requests hold them', async () => {
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    const pending: Promise<unknown>[] = [];
    const ids = [];
    const started = Date.now();
    for (let i = 0; i < 6; i++) ids.push(await take(agent, c, pending));
    // Wait for two renewals (a loaded machine may delay the timers), then: no more than one per
    // interval of the time that really passed (timers never fire early), each carrying all six.
    const deadline = Date.now() + 15_000;
    while (c.settles.filter((s) => s.renew).length < 2) {
      if (Date.now() > deadline) throw new Error(`two renewals not seen within 15 s: ${c.settles.length} settles`);
      await sleep(10);
    }
    const renewals = c.settles.filter((s) => s.renew);
    expect(renewals.length).toBeLessThanOrEqual(Math.floor((Date.now() - started) / T.renewIntervalMs) + 1);
    for (const r of renewals) expect(r.renew!.map((l) => l.id).sort()).toEqual([...ids].sort());
    expect(renewals[0]!.renew![0]).toMatchObject({ replica: 'r1', tenant: 't' });
    for (const id of ids) agent.release(c, 'p', id, 't', { status: 200 }, T, (p) => pending.push(p));
    await Promise.all(pending);
  });

  it('a failed settle is retried until the release is delivered', async () => {
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    c.failSettles = 2;
    const pending: Promise<unknown>[] = [];
    const a = await take(agent, c, pending);
    agent.release(c, 'p', a, 't', { status: 200 }, T, (p) => pending.push(p));
    await Promise.all(pending);
    expect(c.settles.map((s) => s.releases.map((r) => r.id))).toEqual([[a]]);
    expect(agent.counters.releasesRetried).toBe(2);
    expect(agent.stats()[0]).toMatchObject({ pending: 0, held: 0 });
  });

  it('a coordinator without settle gets releases one by one, retried on failure', async () => {
    const agent = new LeaseAgent();
    let fails = 1;
    const released: string[] = [];
    const c: LeaseClient = {
      acquire: async () => ({ ok: true, leaseId: 'x1', replica: { id: 'r1', url: 'http://127.0.0.1:1', auth: 'none' }, spilled: false, steps: 1, deadline: Date.now() + 30_000 }),
      release: async (id) => {
        if (fails-- > 0) throw new Error('reset');
        released.push(id);
      },
    };
    const pending: Promise<unknown>[] = [];
    const id = await take(agent, c, pending);
    agent.release(c, 'p', id, 't', { status: 200 }, T, (p) => pending.push(p));
    await Promise.all(pending);
    expect(released).toEqual(['x1']);
  });

  it('a new coordinator epoch (restart) gets every live lease renewed at once', async () => {
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    const pending: Promise<unknown>[] = [];
    const held = [await take(agent, c, pending), await take(agent, c, pending)];
    const before = c.settles.length;
    c.epoch = 'e2';
    await take(agent, c, pending);
    await sleep(10);
    const after = c.settles.slice(before).filter((s) => s.renew);
    expect(after.length).toBeGreaterThanOrEqual(1);
    expect(after[0]!.renew!.map((l) => l.id)).toEqual(expect.arrayContaining(held));
    expect(agent.heldByReplica('p')).toEqual({ r1: 3 });
    for (const id of [...held, `l${c.n}`]) agent.release(c, 'p', id, 't', { status: 200 }, T, (p) => pending.push(p));
    await Promise.all(pending);
  });

  it('an acquire that fails opens the breaker for coordinatorRetryMs and puts its releases back', async () => {
    // A breaker open for 10 s: the acquire right after the failure meets it however slow the machine.
    const TB: LeaseTimings = { ...T, coordinatorRetryMs: 10_000 };
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    const pending: Promise<unknown>[] = [];
    const a = await take(agent, c, pending, 't', TB);
    agent.release(c, 'p', a, 't', { status: 200 }, TB, (p) => pending.push(p));
    const broken: LeaseClient = { acquire: () => Promise.reject(new Error('down')), release: c.release.bind(c), settle: c.settle.bind(c) };
    const out = await agent.acquire(broken, { pool: 'p', key: 1, keyKind: 'header' }, TB, (p) => pending.push(p));
    expect(out).toMatchObject({ kind: 'unreachable', why: 'error' });
    expect(agent.isOpen('p')).toBe(true);
    expect(await agent.acquire(c, { pool: 'p', key: 1, keyKind: 'header' }, TB, (p) => pending.push(p))).toMatchObject({ kind: 'unreachable', why: 'breaker' });
    await Promise.all(pending);
    // The release went out anyway, in a settle.
    expect(c.settles.flatMap((s) => s.releases.map((r) => r.id))).toEqual([a]);
  });

  it('fallbacks are reported as a running total, on their own when no call comes along', async () => {
    const agent = new LeaseAgent();
    const c = new FakeCoordinator();
    const pending: Promise<unknown>[] = [];
    agent.noteFallback('p', c, T, (p) => pending.push(p));
    agent.noteFallback('p', c, T, (p) => pending.push(p));
    expect(pending).toHaveLength(1); // one report loop per isolate and pool
    await Promise.all(pending);
    const reports = c.settles.filter((x) => x.fallbacks);
    expect(reports).toHaveLength(1);
    expect(reports[0]!.fallbacks!.total).toBe(2);
    expect(agent.stats()[0]).toMatchObject({ fallbacksUnreported: 0 });
  });
});
