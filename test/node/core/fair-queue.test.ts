// The fair queue (issue #29): weighted shares by cost, FIFO within a tenant, strict priority between
// bands, work conservation, bounds (length, shedding, deadlines), and the Retry-After helpers.
import { describe, expect, it } from 'vitest';
import { activeWeightOf, DEFAULT_QUEUE_BANDS, DrainRate, FairQueue, heldBackByReserve, isOverShare, MAX_RETRY_AFTER_MS, overShareBothWays, preemptionVictim, RecentShares, requestCost, retryAfterMs, type PreemptionCandidate, type QueueBand } from '../../../src/core/fair-queue.js';
import { seededRandom } from '../../../src/core/random.js';

const BANDS: QueueBand[] = [
  { name: 'high', maxQueueMs: 1_000, maxQueueLength: 100 },
  { name: 'normal', maxQueueMs: 1_000, maxQueueLength: 100 },
  { name: 'low', maxQueueMs: 500, maxQueueLength: 100 },
];

/**
 * Two or more tenants keep `backlog` requests waiting each (costs drawn from `costOf`), one slot
 * frees at a time and the queue fills it; returns each tenant's share of the cost admitted.
 */
function shares(weights: Record<string, number>, rounds: number, costOf: () => number, backlog = 20): Record<string, number> {
  const q = new FairQueue<null>([{ name: 'normal', maxQueueMs: 1e12, maxQueueLength: 10_000 }]);
  const served: Record<string, number> = {};
  let seq = 0;
  const top = () => {
    for (const [t, w] of Object.entries(weights)) while (q.queuedOf(t) < backlog) q.enqueue({ id: `r${seq++}`, tenant: t, band: 0, cost: costOf(), weight: w, item: null }, seq);
  };
  for (let i = 0; i < rounds; i++) {
    top();
    let slots = 1;
    q.drain((e) => {
      if (slots === 0) return 'full';
      slots--;
      served[e.tenant] = (served[e.tenant] ?? 0) + e.cost;
      return 'placed';
    });
  }
  const total = Object.values(served).reduce((a, b) => a + b, 0);
  return Object.fromEntries(Object.keys(weights).map((t) => [t, (served[t] ?? 0) / total]));
}

describe('FairQueue shares', () => {
  it('a steady tenant that starts waiting behind a burst goes at the next slot, not behind the burst', () => {
    const q = new FairQueue<null>(BANDS);
    for (let i = 0; i < 8; i++) q.enqueue({ id: `n${i}`, tenant: 'N', band: 1, cost: 100, weight: 1, item: null }, i);
    // N was admitted a few requests while it waited: its counter is above 0.
    for (let i = 0; i < 3; i++) q.admit(q.peek()!.id);
    q.enqueue({ id: 'q0', tenant: 'Q', band: 1, cost: 100, weight: 1, item: null }, 100);
    // Q is lifted to N's counter (no banked credit) and wins the tie on its shorter backlog.
    expect(q.counterOf('Q')).toBe(q.counterOf('N'));
    expect(q.peek()!.id).toBe('q0');
    q.admit('q0');
    expect(q.peek()!.tenant).toBe('N');
  });

  it('two tenants with equal weights get 50 ± 5% of the cost admitted (varied costs)', () => {
    const rnd = seededRandom(29);
    const s = shares({ a: 1, b: 1 }, 4_000, () => 100 + Math.floor(rnd() * 1_900));
    expect(s.a).toBeGreaterThan(0.45);
    expect(s.a).toBeLessThan(0.55);
  });

  it('weights 3:1 give 75 ± 5% to the heavier tenant', () => {
    const rnd = seededRandom(7);
    const s = shares({ a: 3, b: 1 }, 4_000, () => 100 + Math.floor(rnd() * 1_900));
    expect(s.a).toBeGreaterThan(0.7);
    expect(s.a).toBeLessThan(0.8);
  });

  it('shares are by cost, not by count: a tenant of large requests is admitted fewer of them', () => {
    const q = new FairQueue<null>(BANDS);
    for (let i = 0; i < 50; i++) {
      q.enqueue({ id: `big${i}`, tenant: 'big', band: 1, cost: 1_000, weight: 1, item: null }, i);
      q.enqueue({ id: `small${i}`, tenant: 'small', band: 1, cost: 100, weight: 1, item: null }, i);
    }
    const count: Record<string, number> = { big: 0, small: 0 };
    let slots = 22;
    q.drain((e) => {
      if (slots-- === 0) return 'full';
      count[e.tenant]!++;
      return 'placed';
    });
    // 2 big (2000) against 20 small (2000): equal cost, 10× the count.
    expect(count).toEqual({ big: 2, small: 20 });
  });

  it('a tenant that comes back after waiting nothing banks no credit (lifted to the floor)', () => {
    const q = new FairQueue<null>(BANDS);
    for (let i = 0; i < 30; i++) q.enqueue({ id: `a${i}`, tenant: 'a', band: 1, cost: 10, weight: 1, item: null }, i);
    let slots = 20;
    q.drain(() => (slots-- === 0 ? 'full' : 'placed'));
    expect(q.counterOf('a')).toBe(200);
    q.enqueue({ id: 'b0', tenant: 'b', band: 1, cost: 10, weight: 1, item: null }, 100);
    expect(q.counterOf('b')).toBe(200);
    // Tied counters: the shorter backlog (b: 5 waiting, a: 10) goes first, then they alternate.
    const order: string[] = [];
    for (let i = 1; i < 5; i++) q.enqueue({ id: `b${i}`, tenant: 'b', band: 1, cost: 10, weight: 1, item: null }, 100 + i);
    slots = 6;
    q.drain((e) => {
      if (slots-- === 0) return 'full';
      order.push(e.tenant);
      return 'placed';
    });
    expect(order).toEqual(['b', 'a', 'b', 'a', 'b', 'a']);
  });
});

describe('FairQueue order', () => {
  it('is FIFO within a tenant', () => {
    const q = new FairQueue<number>(BANDS);
    const rnd = seededRandom(3);
    for (let i = 0; i < 60; i++) q.enqueue({ id: `r${i}`, tenant: `t${i % 3}`, band: 1, cost: 1 + Math.floor(rnd() * 50), weight: 1 + (i % 2), item: i }, i);
    const seen: Record<string, number[]> = {};
    q.drain((e) => {
      (seen[e.tenant] ??= []).push(e.item);
      return 'placed';
    });
    expect(Object.values(seen).flat()).toHaveLength(60);
    for (const items of Object.values(seen)) expect(items).toEqual([...items].sort((a, b) => a - b));
  });

  it('a resuming entry (first) goes ahead of its own tenant\'s others, not ahead of another tenant\'s turn', () => {
    const q = new FairQueue<string>(BANDS);
    q.enqueue({ id: 'a1', tenant: 'a', band: 1, cost: 1, weight: 1, item: 'a1' }, 1);
    q.enqueue({ id: 'a2', tenant: 'a', band: 1, cost: 1, weight: 1, item: 'a2' }, 2);
    q.enqueue({ id: 'b1', tenant: 'b', band: 1, cost: 1, weight: 1, item: 'b1' }, 3);
    q.enqueue({ id: 'a0', tenant: 'a', band: 1, cost: 1, weight: 1, item: 'a0', first: true }, 4);
    const order: string[] = [];
    q.drain((e) => {
      order.push(e.item);
      return 'placed';
    });
    expect(order.filter((x) => x.startsWith('a'))).toEqual(['a0', 'a1', 'a2']);
    expect(order.indexOf('b1')).toBeLessThan(order.indexOf('a1'));
  });

  it('admits a higher band first, whatever the counters say', () => {
    const q = new FairQueue<null>(BANDS);
    for (let i = 0; i < 5; i++) q.enqueue({ id: `low${i}`, tenant: 'n', band: 2, cost: 1, weight: 1, item: null }, i);
    for (let i = 0; i < 5; i++) q.enqueue({ id: `norm${i}`, tenant: 'n', band: 1, cost: 1, weight: 1, item: null }, 10 + i);
    for (let i = 0; i < 5; i++) q.enqueue({ id: `high${i}`, tenant: 'h', band: 0, cost: 1_000, weight: 1, item: null }, 20 + i);
    const bands: number[] = [];
    q.drain((e) => {
      bands.push(e.band);
      return 'placed';
    });
    expect(bands).toEqual([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
    expect(q.size).toBe(0);
  });

  it('is work-conserving: a tenant alone takes every free slot', () => {
    const q = new FairQueue<null>(BANDS);
    for (let i = 0; i < 10; i++) q.enqueue({ id: `a${i}`, tenant: 'a', band: 1, cost: 500, weight: 1, item: null }, i);
    let slots = 8;
    const placed = q.drain(() => (slots-- > 0 ? 'placed' : 'full'));
    expect(placed).toHaveLength(8);
    expect(q.size).toBe(2);
  });

  it('a blocked entry holds back only its own tenant', () => {
    const q = new FairQueue<null>(BANDS);
    q.enqueue({ id: 'pinned', tenant: 'p', band: 0, cost: 1, weight: 1, item: null }, 0);
    q.enqueue({ id: 'p2', tenant: 'p', band: 0, cost: 1, weight: 1, item: null }, 1);
    q.enqueue({ id: 'free', tenant: 'f', band: 1, cost: 1, weight: 1, item: null }, 2);
    const placed = q.drain((e) => (e.tenant === 'p' ? 'blocked' : 'placed'));
    expect(placed.map((e) => e.id)).toEqual(['free']);
    // FIFO: p's second request did not jump its first.
    expect(q.get('pinned')).toBeDefined();
    expect(q.get('p2')).toBeDefined();
  });

  it('a dropped entry is removed without charging its tenant', () => {
    const q = new FairQueue<null>(BANDS);
    q.enqueue({ id: 'a0', tenant: 'a', band: 1, cost: 50, weight: 1, item: null }, 0);
    q.enqueue({ id: 'b0', tenant: 'b', band: 1, cost: 50, weight: 1, item: null }, 1);
    let first = true;
    q.drain(() => {
      if (first) {
        first = false;
        return 'dropped';
      }
      return 'full';
    });
    expect(q.get('a0')).toBeUndefined();
    expect(q.counterOf('a')).toBe(0);
    expect(q.size).toBe(1);
  });
});

describe('FairQueue bounds', () => {
  it('refuses an arrival to a full band (queue_full) and takes it into another band', () => {
    const q = new FairQueue<null>([{ name: 'x', maxQueueMs: 100, maxQueueLength: 2 }, { name: 'y', maxQueueMs: 100, maxQueueLength: 2 }]);
    expect(q.enqueue({ id: 'a', tenant: 't', band: 0, cost: 1, weight: 1, item: null }, 0).ok).toBe(true);
    expect(q.enqueue({ id: 'b', tenant: 'u', band: 0, cost: 1, weight: 1, item: null }, 0).ok).toBe(true);
    expect(q.enqueue({ id: 'c', tenant: 'v', band: 0, cost: 1, weight: 1, item: null }, 0)).toEqual({ ok: false, reason: 'queue_full' });
    expect(q.enqueue({ id: 'd', tenant: 'v', band: 1, cost: 1, weight: 1, item: null }, 0).ok).toBe(true);
  });

  it("sheds a burst's newest entry so a tenant with little waiting gets in", () => {
    const q = new FairQueue<null>([{ name: 'x', maxQueueMs: 100, maxQueueLength: 4 }]);
    for (let i = 0; i < 4; i++) q.enqueue({ id: `n${i}`, tenant: 'noisy', band: 0, cost: 1, weight: 1, item: null }, i);
    const r = q.enqueue({ id: 'q0', tenant: 'quiet', band: 0, cost: 1, weight: 1, item: null }, 5);
    expect(r.ok).toBe(true);
    expect(r.ok && r.shed.map((e) => e.id)).toEqual(['n3']);
    // The noisy tenant itself cannot push its own out, nor can quiet once it is no lighter.
    expect(q.enqueue({ id: 'n9', tenant: 'noisy', band: 0, cost: 1, weight: 1, item: null }, 6).ok).toBe(false);
    expect(q.enqueue({ id: 'q1', tenant: 'quiet', band: 0, cost: 1, weight: 1, item: null }, 6).ok).toBe(true);
    expect(q.enqueue({ id: 'q2', tenant: 'quiet', band: 0, cost: 1, weight: 1, item: null }, 6).ok).toBe(false);
    expect(q.size).toBe(4);
  });

  it('expires entries at their band deadline; nextDeadline says when', () => {
    const q = new FairQueue<null>(BANDS);
    q.enqueue({ id: 'low', tenant: 'a', band: 2, cost: 1, weight: 1, item: null }, 0);
    q.enqueue({ id: 'norm', tenant: 'a', band: 1, cost: 1, weight: 1, item: null }, 0);
    expect(q.nextDeadline()).toBe(500);
    expect(q.expire(499)).toEqual([]);
    expect(q.expire(500).map((e) => e.id)).toEqual(['low']);
    expect(q.nextDeadline()).toBe(1_000);
    expect(q.expire(1_000).map((e) => e.id)).toEqual(['norm']);
    expect(q.nextDeadline()).toBe(Infinity);
  });

  it('counts what waits ahead of a band, and forgets the counters once empty', () => {
    const q = new FairQueue<null>(BANDS);
    q.enqueue({ id: 'h', tenant: 'a', band: 0, cost: 5, weight: 1, item: null }, 0);
    q.enqueue({ id: 'n', tenant: 'b', band: 1, cost: 5, weight: 1, item: null }, 0);
    q.enqueue({ id: 'l', tenant: 'c', band: 2, cost: 5, weight: 1, item: null }, 0);
    expect([q.aheadOf(0), q.aheadOf(1), q.aheadOf(2)]).toEqual([1, 2, 3]);
    q.admit('h');
    expect(q.counterOf('a')).toBe(5);
    q.remove('n');
    q.remove('l');
    expect(q.counterOf('a')).toBe(0);
  });

  it('refuses a duplicate id and an unknown band', () => {
    const q = new FairQueue<null>(DEFAULT_QUEUE_BANDS);
    q.enqueue({ id: 'x', tenant: 'a', band: 1, cost: 1, weight: 1, item: null }, 0);
    expect(() => q.enqueue({ id: 'x', tenant: 'a', band: 1, cost: 1, weight: 1, item: null }, 0)).toThrow(/already/);
    expect(() => q.enqueue({ id: 'y', tenant: 'a', band: 9, cost: 1, weight: 1, item: null }, 0)).toThrow(/band/);
    expect(q.bandIndex('normal')).toBe(1);
  });

  it('a NaN or negative cost or weight cannot make a tenant free', () => {
    const q = new FairQueue<null>(BANDS);
    q.enqueue({ id: 'a', tenant: 'a', band: 1, cost: Number.NaN, weight: -3, item: null }, 0);
    q.enqueue({ id: 'b', tenant: 'a', band: 1, cost: -10, weight: 1, item: null }, 0);
    q.drain(() => 'placed');
    expect(q.size).toBe(0);
    const e = new FairQueue<null>(BANDS).enqueue({ id: 'c', tenant: 'a', band: 1, cost: -1, weight: Number.NaN, item: null }, 0);
    expect(e.ok && e.entry.cost > 0 && e.entry.weight).toBe(1);
  });
});

describe('share, cost and Retry-After helpers', () => {
  it('isOverShare: load above capacity × weight / Σ weights', () => {
    expect(isOverShare({ load: 5, weight: 1, activeWeight: 2, capacity: 8 })).toBe(true);
    expect(isOverShare({ load: 4, weight: 1, activeWeight: 2, capacity: 8 })).toBe(false);
    expect(isOverShare({ load: 6, weight: 3, activeWeight: 4, capacity: 8 })).toBe(false);
    // Alone: the whole pool is its share.
    expect(isOverShare({ load: 8, weight: 1, activeWeight: 0, capacity: 8 })).toBe(false);
  });

  it('heldBackByReserve: only the reserve free and the tenant at its share; never a tenant alone, never the whole pool', () => {
    const base = { reserve: 2, weight: 1, activeWeight: 2, capacity: 16 };
    // Holds 8 of 16 with another tenant active: its 9th waits while only the 2 kept are free.
    expect(heldBackByReserve({ ...base, free: 2, load: 9 })).toBe(true);
    expect(heldBackByReserve({ ...base, free: 1, load: 9 })).toBe(true);
    // More than the reserve free: it goes.
    expect(heldBackByReserve({ ...base, free: 3, load: 9 })).toBe(false);
    // Below its share (the light tenant the reserve is for): it takes a kept slot.
    expect(heldBackByReserve({ ...base, free: 1, load: 5 })).toBe(false);
    // Alone in the pool: its share is the pool.
    expect(heldBackByReserve({ ...base, free: 1, load: 15, activeWeight: 1 })).toBe(false);
    // Its weight is its share: 3 of 4 weights is 12 of 16 slots.
    expect(heldBackByReserve({ ...base, free: 2, load: 12, weight: 3, activeWeight: 4 })).toBe(false);
    expect(heldBackByReserve({ ...base, free: 2, load: 13, weight: 3, activeWeight: 4 })).toBe(true);
    // No reserve: work-conserving.
    expect(heldBackByReserve({ ...base, reserve: 0, free: 1, load: 15 })).toBe(false);
    // A reserve as large as the pool keeps at most capacity − 1: the last slot of a 2-slot pool is held, not both.
    expect(heldBackByReserve({ reserve: 5, weight: 1, activeWeight: 2, capacity: 2, free: 2, load: 2 })).toBe(false);
    expect(heldBackByReserve({ reserve: 5, weight: 1, activeWeight: 2, capacity: 2, free: 1, load: 2 })).toBe(true);
  });

  it('overShareBothWays: over its share of the slots and of the recent admissions; the slots alone without a recent share', () => {
    const base = { weight: 1, activeWeight: 2, capacity: 16, load: 9 };
    expect(overShareBothWays({ ...base, recentShare: 0.6 })).toBe(true);
    expect(overShareBothWays({ ...base, recentShare: 0.5 })).toBe(false);
    expect(overShareBothWays({ ...base, load: 8, recentShare: 0.9 })).toBe(false);
    expect(overShareBothWays(base)).toBe(true);
    // What the reserve holds back is exactly this, once only the kept slots are free.
    for (const recentShare of [0.3, 0.5, 0.7, undefined]) for (const load of [4, 8, 9, 15]) expect(heldBackByReserve({ ...base, load, recentShare, reserve: 1, free: 1 })).toBe(overShareBothWays({ ...base, load, recentShare }));
  });

  it('preemptionVictim: the youngest request of another tenant over its share, in the same band or a lower one', () => {
    const c = (id: string, tenant: string, at: number, o: Partial<PreemptionCandidate> = {}): PreemptionCandidate => ({ id, tenant, band: 1, at, overShare: true, ...o });
    // The youngest: likely still in prefill, the least work lost.
    expect(preemptionVictim('q', 1, [c('n1', 'n', 100), c('n2', 'n', 300), c('n3', 'n', 200)])?.id).toBe('n2');
    // Never the waiter's own tenant, never a tenant within its share.
    expect(preemptionVictim('q', 1, [c('q1', 'q', 500), c('m1', 'm', 400, { overShare: false }), c('n1', 'n', 100)])?.id).toBe('n1');
    // A higher band (index 0) is never taken from for a lower one; a lower band (2) is.
    expect(preemptionVictim('q', 1, [c('h1', 'h', 500, { band: 0 })])).toBeNull();
    expect(preemptionVictim('q', 1, [c('h1', 'h', 500, { band: 0 }), c('l1', 'l', 100, { band: 2 })])?.id).toBe('l1');
    expect(preemptionVictim('q', 1, [])).toBeNull();
  });

  it('heldBackByReserve with recentShare: a light tenant over its slots for a moment is not held; a heavy one is', () => {
    const base = { reserve: 1, weight: 1, activeWeight: 2, capacity: 16, free: 1, load: 9 };
    // 9 of 16 slots, but 40 % of the recent admissions against a share of 50 %: its burst, not its rate.
    expect(heldBackByReserve({ ...base, recentShare: 0.4 })).toBe(false);
    expect(heldBackByReserve({ ...base, recentShare: 0.5 })).toBe(false);
    expect(heldBackByReserve({ ...base, recentShare: 0.6 })).toBe(true);
    // Below its share of the slots: never held, whatever its rate.
    expect(heldBackByReserve({ ...base, load: 5, recentShare: 0.9 })).toBe(false);
    // Weighted: 3 of 4 weights is a share of 75 %.
    expect(heldBackByReserve({ ...base, weight: 3, activeWeight: 4, load: 13, recentShare: 0.7 })).toBe(false);
    expect(heldBackByReserve({ ...base, weight: 3, activeWeight: 4, load: 13, recentShare: 0.8 })).toBe(true);
  });

  it('activeWeightOf: each tenant once, waiting ones by their entries\' weight, the others by weightOf', () => {
    const weights: Record<string, number> = { a: 3, b: 2, c: 5 };
    const weightOf = (t: string) => weights[t] ?? 1;
    // a itself (1 as asked, not 3), b waiting with weight 4 (its entry's), c in flight and lately (5 once), d lately (1).
    expect(activeWeightOf('a', 1, new Map([['b', 4], ['a', 9]]), [['c', 'a'], ['c', 'd']], weightOf)).toBe(1 + 4 + 5 + 1);
    expect(activeWeightOf('a', 2, [], [], weightOf)).toBe(2);
  });

  it('RecentShares: shares of recent admissions, decaying, bounded', () => {
    const r = new RecentShares(1_000, 3);
    expect(r.read('a', 0).share).toBeUndefined();
    for (let i = 0; i < 30; i++) r.note('a', i * 10);
    for (let i = 0; i < 10; i++) r.note('b', i * 30);
    expect(r.read('a', 300).share).toBeCloseTo(0.75, 1);
    expect(r.read('b', 300).share).toBeCloseTo(0.25, 1);
    expect(r.read('c', 300).share).toBe(0);
    // b keeps sending, a stopped: within a few time constants the shares follow.
    for (let t = 300; t < 5_000; t += 30) r.note('b', t);
    expect(r.read('b', 5_000).share).toBeGreaterThan(0.99);
    // Gone quiet for long: dropped, nothing left.
    expect(r.read('b', 60_000).share).toBeUndefined();
    // At most maxTenants kept: the least recent goes.
    for (const t of ['x', 'y', 'z', 'w']) r.note(t, 100_000);
    expect(r.read('x', 100_000).share).toBe(0);
    expect(r.read('w', 100_000).share).toBeCloseTo(1 / 3, 5);
    expect(r.read('w', 100_000).tenants).toEqual(['y', 'z', 'w']);
  });

  it('requestCost: tokens or one per request', () => {
    expect(requestCost('tokens', 300, 200)).toBe(500);
    expect(requestCost('tokens', Number.NaN, 0)).toBe(1);
    expect(requestCost('requests', 300, 200)).toBe(1);
  });

  it('DrainRate measures slots freed per second over its window', () => {
    const d = new DrainRate(10);
    expect(d.perSecond(0)).toBe(0);
    for (let i = 0; i < 50; i++) d.note(i * 100);
    expect(d.perSecond(4_999)).toBe(5);
    expect(d.perSecond(12_000)).toBe(2); // seconds 3-4 are still in the window
    expect(d.perSecond(100_000)).toBe(0);
  });

  it('retryAfterMs: the queue ahead at the drain rate, within [1 s, 60 s]', () => {
    expect(retryAfterMs(9, 5, 7_000)).toBe(2_000);
    expect(retryAfterMs(0, 100, 7_000)).toBe(1_000);
    expect(retryAfterMs(10_000, 1, 7_000)).toBe(MAX_RETRY_AFTER_MS);
    expect(retryAfterMs(3, 0, 7_000)).toBe(7_000);
  });
});
