// A settle is retried until it lands (src/quota/settle-outbox.ts): failed calls are retried with
// backoff within the request's waitUntil budget, then carried, in one call, by the tenant's next
// settle from the isolate; a call the platform cut (it never answers) blocks nothing once its
// timeout has passed. A fake meter that counts each id once, as the TenantMeter does. Real timers,
// small budgets.

import { describe, expect, it } from 'vitest';
import { SettleOutbox, type SettleMeter } from '../../../src/quota/settle-outbox';
import type { SettleRequest, SettleResult } from '../../../src/quota/tenant-meter';

class FakeMeter implements SettleMeter {
  fail = 0;
  hang = false;
  calls: SettleRequest[] = [];
  readonly counted = new Map<string, number>();
  async settle(req: SettleRequest): Promise<SettleResult> {
    if (this.hang) return new Promise(() => {});
    this.calls.push(req);
    if (this.fail > 0) {
      this.fail--;
      throw new Error('meter unreachable');
    }
    for (const r of [...(req.earlier ?? []), req]) if (!this.counted.has(r.id!)) this.counted.set(r.id!, r.used);
    return { at: Date.now() };
  }
  tokens(): number {
    return [...this.counted.values()].reduce((a, b) => a + b, 0);
  }
}

const req = (id: string, used = 10, tenant = 't'): SettleRequest & { id: string } => ({ id, tenant, model: 'm', charged: used, used, limited: false, usage: { promptTokens: used - 1, cachedTokens: 0, completionTokens: 1 } });

describe('SettleOutbox', () => {
  it('a settle whose meter fails twice lands on the third call, and says so to its caller', async () => {
    const box = new SettleOutbox();
    const meter = new FakeMeter();
    meter.fail = 2;
    const pending: Promise<unknown>[] = [];
    const results: unknown[] = [];
    box.deliver(meter, req('a', 42), (p) => pending.push(p), (r) => results.push(r));
    await Promise.all(pending);
    expect(meter.calls.map((c) => c.id)).toEqual(['a', 'a', 'a']);
    expect(meter.tokens()).toBe(42);
    expect(results).toHaveLength(1);
    expect(box.backlog('t')).toBe(0);
    expect(box.counters).toMatchObject({ delivered: 1, failedCalls: 2, dropped: 0 });
  });

  it('past its budget a settle waits in the outbox; the tenant\'s next settle carries it in one call; nothing is counted twice', async () => {
    const box = new SettleOutbox({ budgetMs: 400, callTimeoutMs: 100 });
    const meter = new FakeMeter();
    meter.fail = 1_000;
    const pending: Promise<unknown>[] = [];
    box.deliver(meter, req('a', 5), (p) => pending.push(p));
    box.deliver(meter, req('b', 7), (p) => pending.push(p));
    await Promise.all(pending);
    expect(box.backlog('t')).toBe(2);
    expect(meter.tokens()).toBe(0);
    meter.fail = 0;
    const calls = meter.calls.length;
    box.deliver(meter, req('c', 11), (p) => pending.push(p));
    await Promise.all(pending);
    expect(meter.calls.length - calls).toBe(1);
    const last = meter.calls.at(-1)!;
    expect([last.id, ...(last.earlier ?? []).map((r) => r.id).sort()]).toEqual(['c', 'a', 'b']);
    expect(meter.tokens()).toBe(23);
    expect(box.backlog('t')).toBe(0);
  });

  it('a call that never answers (cut with its request) holds nothing once its timeout passed', async () => {
    const box = new SettleOutbox({ budgetMs: 300, callTimeoutMs: 100 });
    const meter = new FakeMeter();
    meter.hang = true;
    const pending: Promise<unknown>[] = [];
    box.deliver(meter, req('a', 3), (p) => pending.push(p));
    await Promise.all(pending);
    expect(box.backlog('t')).toBe(1);
    meter.hang = false;
    box.deliver(meter, req('b', 4), (p) => pending.push(p));
    await Promise.all(pending);
    expect(meter.tokens()).toBe(7);
    expect(box.backlog('t')).toBe(0);
  });

  it('a retry of a settle that did land (its answer lost) is counted once by the meter', async () => {
    const box = new SettleOutbox();
    const meter = new FakeMeter();
    let lose = 1;
    const lossy: SettleMeter = {
      settle: async (r) => {
        const res = await meter.settle(r);
        if (lose-- > 0) throw new Error('answer lost');
        return res;
      },
    };
    const pending: Promise<unknown>[] = [];
    box.deliver(lossy, req('a', 9), (p) => pending.push(p));
    await Promise.all(pending);
    expect(meter.calls).toHaveLength(2);
    expect(meter.tokens()).toBe(9);
  });

  it('settles of one tenant within the window go in one call; the newest asking for an allowance gets the answer', async () => {
    const box = new SettleOutbox({ windowMs: 100 });
    const meter = new FakeMeter();
    const pending: Promise<unknown>[] = [];
    const results: string[] = [];
    for (let i = 0; i < 50; i++) box.deliver(meter, { ...req(`s${i}`, 2), wantAllowance: i === 30 }, (p) => pending.push(p), () => results.push(`s${i}`));
    box.deliver(meter, req('other', 1, 'u'), (p) => pending.push(p));
    await Promise.all(pending);
    expect(meter.calls).toHaveLength(2); // one per tenant
    const call = meter.calls.find((c) => c.tenant === 't')!;
    expect(call.id).toBe('s30');
    expect(call.earlier).toHaveLength(49);
    expect(results).toEqual(['s30']);
    expect(meter.tokens()).toBe(101);
    expect(box.counters).toMatchObject({ delivered: 51, calls: 2 });
  });

  it('a settle after the window goes in the next call: about one call per tenant per window', async () => {
    const box = new SettleOutbox({ windowMs: 60 });
    const meter = new FakeMeter();
    const pending: Promise<unknown>[] = [];
    const t0 = Date.now();
    let n = 0;
    while (Date.now() - t0 < 400) {
      box.deliver(meter, req(`r${n++}`, 1), (p) => pending.push(p));
      await new Promise((r) => setTimeout(r, 5));
    }
    await Promise.all(pending);
    expect(meter.tokens()).toBe(n);
    expect(box.backlog('t')).toBe(0);
    // 400 ms at one call per 60 ms window: ~7, far under one per settle.
    expect(meter.calls.length).toBeLessThanOrEqual(Math.ceil(400 / 60) + 2);
    expect(n).toBeGreaterThan(meter.calls.length * 3);
  });

  it('a full batch does not wait for the window', async () => {
    const box = new SettleOutbox({ windowMs: 10_000, budgetMs: 20_000 });
    const meter = new FakeMeter();
    const pending: Promise<unknown>[] = [];
    const t0 = Date.now();
    for (let i = 0; i < 200; i++) box.deliver(meter, req(`f${i}`, 1), (p) => pending.push(p));
    await Promise.race([pending.at(-1), new Promise((r) => setTimeout(r, 2_000))]);
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(meter.calls).toHaveLength(1);
    expect(meter.tokens()).toBe(200);
  });

  it('memory is bounded across tenants: past the isolate\'s bound the oldest backlog is dropped and counted', async () => {
    const box = new SettleOutbox({ budgetMs: 300, callTimeoutMs: 50, windowMs: 10, maxTotal: 10 });
    const meter = new FakeMeter();
    meter.fail = 1_000;
    const pending: Promise<unknown>[] = [];
    for (let i = 0; i < 12; i++) box.deliver(meter, req(`m${i}`, 1, `t${i % 3}`), (p) => pending.push(p));
    expect(box.size()).toBe(10);
    expect(box.counters.dropped).toBe(2);
    await Promise.all(pending);
    expect(box.size()).toBe(10);
    meter.fail = 0;
    for (const t of ['t0', 't1', 't2']) box.deliver(meter, req(`last-${t}`, 1, t), (p) => pending.push(p));
    await Promise.all(pending);
    expect(box.size()).toBe(0);
    // The three last pushed out t0's whole backlog (m6, m9, then last-t0): 15 settles, 5 dropped.
    expect(meter.tokens()).toBe(10);
    expect(box.counters).toMatchObject({ delivered: 10, dropped: 5 });
  });
});

