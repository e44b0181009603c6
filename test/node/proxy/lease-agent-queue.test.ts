// The lease agent's queued acquires (flow control, #29): a call with a queue ticket may stay open
// for its band's maxQueueMs on top of acquireTimeoutMs; a queued call that fails or outlives that is
// `lost` (a retriable 503), never `unreachable` (no breaker, no fail-open); an aborted client sends
// cancelQueued for its ticket and a lease that lands afterwards goes straight back.

import { describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, SettleBatch, SettleResult } from '../../../src/coordinator/types';
import { LeaseAgent, type LeaseClient, type LeaseTimings } from '../../../src/proxy/lease-agent';

const T: LeaseTimings = { leaseTtlMs: 10_000, renewIntervalMs: 5_000, releaseFlushMs: 30, acquireTimeoutMs: 50, coordinatorRetryMs: 5_000 };
const QUEUED: AcquireRequest = { pool: 'p', key: null, keyKind: 'none', tenant: 't', queue: { ticket: 'tk', band: 'normal', cost: 1, weight: 1 } };
const LEASE: AcquireResult = { ok: true, leaseId: 'l1', replica: { id: 'r1', url: 'http://127.0.0.1:1', auth: 'none' }, spilled: false, steps: 0, deadline: Date.now() + 10_000, queuedMs: 120, band: 'normal' };

/** A coordinator whose acquire answers when the test says (a queued call), or fails. */
class SlowCoordinator implements LeaseClient {
  answer!: (r: AcquireResult) => void;
  fail!: (e: Error) => void;
  cancels: string[] = [];
  releases: string[] = [];
  acquires = 0;
  acquire(): Promise<AcquireResult> {
    this.acquires++;
    return new Promise((res, rej) => {
      this.answer = res;
      this.fail = rej;
    });
  }
  async release(id: string): Promise<unknown> {
    this.releases.push(id);
    return {};
  }
  async cancelQueued(_pool: string, ticket: string): Promise<unknown> {
    this.cancels.push(ticket);
    return { cancelled: true };
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('LeaseAgent: queued acquires', () => {
  it('waits past acquireTimeoutMs for a queued answer (up to maxQueueMs more)', async () => {
    const agent = new LeaseAgent();
    const c = new SlowCoordinator();
    const out = agent.acquire(c, QUEUED, T, () => {}, { maxQueueMs: 10_000 });
    await sleep(T.acquireTimeoutMs * 3);
    c.answer(LEASE);
    expect(await out).toEqual({ kind: 'reply', result: LEASE });
    expect(agent.isOpen('p')).toBe(false);
    // It waited in the queue: early connect stays off for this pool for a while.
    expect(agent.recentlyQueued('p')).toBe(true);
  });

  it('without a ticket the usual timeout holds (unreachable, breaker open)', async () => {
    const agent = new LeaseAgent();
    const c = new SlowCoordinator();
    const out = await agent.acquire(c, { ...QUEUED, queue: undefined }, T, () => {}, { maxQueueMs: 10_000 });
    expect(out).toMatchObject({ kind: 'unreachable', why: 'timeout' });
    expect(agent.isOpen('p')).toBe(true);
  });

  it('a queued call that fails after waiting is lost, not unreachable: no breaker', async () => {
    const agent = new LeaseAgent();
    const c = new SlowCoordinator();
    const out = agent.acquire(c, QUEUED, T, () => {}, { maxQueueMs: 10_000 });
    await sleep(T.acquireTimeoutMs * 2);
    c.fail(new Error('Durable Object reset'));
    expect(await out).toMatchObject({ kind: 'lost' });
    expect(agent.isOpen('p')).toBe(false);
  });

  it('a queued call past maxQueueMs + acquireTimeoutMs is lost; a lease that lands later goes back', async () => {
    const agent = new LeaseAgent();
    const c = new SlowCoordinator();
    const pending: Promise<unknown>[] = [];
    const out = await agent.acquire(c, QUEUED, T, (p) => pending.push(p), { maxQueueMs: 20 });
    expect(out).toMatchObject({ kind: 'lost' });
    expect(agent.isOpen('p')).toBe(false);
    c.answer(LEASE);
    await Promise.all(pending);
    await Promise.all(pending);
    expect(agent.counters.lateAcquires).toBe(1);
  });

  it('the client going away cancels the ticket at once', async () => {
    const agent = new LeaseAgent();
    const c = new SlowCoordinator();
    const abort = new AbortController();
    const pending: Promise<unknown>[] = [];
    const out = agent.acquire(c, QUEUED, T, (p) => pending.push(p), { maxQueueMs: 10_000, signal: abort.signal });
    await sleep(5);
    abort.abort();
    expect(await out).toEqual({ kind: 'cancelled' });
    expect(c.cancels).toEqual(['tk']);
    expect(agent.counters.rpcs.cancelQueued).toBe(1);
    expect(agent.isOpen('p')).toBe(false);
    // The coordinator admitted it just before the cancel arrived: the lease is released, not kept.
    c.answer(LEASE);
    await Promise.all(pending);
    await Promise.all(pending);
    expect(agent.counters.lateAcquires).toBe(1);
    expect(c.releases).toEqual(['l1']);
  });

  it('while the pool queues, a release goes out at once instead of waiting releaseFlushMs for an acquire', async () => {
    // A flush window of a minute: only the queueing rule can get the release out within the poll's bound.
    const T2: LeaseTimings = { ...T, releaseFlushMs: 60_000, renewIntervalMs: 120_000, leaseTtlMs: 240_000 };
    const agent = new LeaseAgent();
    const settles: SettleBatch[] = [];
    const c = new SlowCoordinator() as SlowCoordinator & { settle(pool: string, b: SettleBatch): Promise<SettleResult> };
    c.settle = async (_pool, b) => {
      settles.push(b);
      return { epoch: 'e', released: b.releases.length, renewed: 0, restored: 0, gone: [], deadline: Date.now() + 1_000 };
    };
    const pending: Promise<unknown>[] = [];
    const out = agent.acquire(c, QUEUED, T2, (p) => pending.push(p), { maxQueueMs: 10_000 });
    c.answer(LEASE);
    expect((await out).kind).toBe('reply');
    expect(agent.recentlyQueued('p')).toBe(true);
    agent.release(c, 'p', 'l1', 't', { status: 200 }, T2, (p) => pending.push(p));
    for (let i = 0; i < 500 && settles.length === 0; i++) await sleep(10);
    expect(settles.map((b) => b.releases.map((r) => r.id)), 'the release settled without waiting releaseFlushMs').toEqual([['l1']]);
    await Promise.all(pending);
  });
});
