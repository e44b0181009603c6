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
});
