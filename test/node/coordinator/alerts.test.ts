import { describe, expect, it } from 'vitest';
import {
  createHotKeyState,
  emptyImbalanceState,
  evaluateHotKeys,
  evaluateImbalance,
  hotKeyId,
  imbalanceThreshold,
  median,
  recordHotKey,
  topHotKeys,
  type HotKeyState,
  type ImbalanceOptions,
  type ImbalanceState,
} from '../../../src/coordinator/alerts.js';
import { seededRandom } from '../../../src/core/random.js';

const MIN = 60_000;

// The core's seeded source, so the traffic is the same on every run.
const rng = seededRandom;
const hex8 = (r: () => number): string => Math.floor(r() * 0x1_0000_0000).toString(16).padStart(8, '0');

describe('median and threshold', () => {
  it('median of odd and even counts', () => {
    expect(median([5, 1, 3])).toBe(3);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(median([])).toBeNaN();
  });
  it('threshold = max(factor × median, median + offset)', () => {
    expect(imbalanceThreshold(0)).toBe(4); // idle pool: the offset rules
    expect(imbalanceThreshold(2)).toBe(6);
    expect(imbalanceThreshold(4)).toBe(8); // equal
    expect(imbalanceThreshold(10)).toBe(20); // busy pool: the factor rules
    expect(imbalanceThreshold(10, { factor: 3, offset: 1 })).toBe(30);
    expect(imbalanceThreshold(10, { factor: 1, offset: 1 })).toBe(11);
  });
  it('rejects nonsense options', () => {
    expect(() => imbalanceThreshold(1, { factor: 0.5 })).toThrow(RangeError);
    expect(() => imbalanceThreshold(1, { holdMs: -1 })).toThrow(/holdMs/);
    expect(() => imbalanceThreshold(1, { offset: NaN })).toThrow(/offset/);
  });
});

describe('evaluateImbalance', () => {
  // Scrape every 15 s for `minutes`, with `waiting(t)` giving the pool's readings.
  function drive(start: number, minutes: number, waiting: (t: number) => Record<string, number>, state: ImbalanceState = emptyImbalanceState(), options?: ImbalanceOptions) {
    const events: { type: string; replica: string; at: number; reason?: string }[] = [];
    let s = state;
    let alerts: ReturnType<typeof evaluateImbalance>['alerts'] = [];
    for (let t = start; t <= start + minutes * MIN; t += 15_000) {
      const r = evaluateImbalance(s, { now: t, waiting: waiting(t) }, options);
      s = r.state;
      alerts = r.alerts;
      for (const e of r.events) events.push({ type: e.type, replica: e.replica, at: e.at, ...(e.reason ? { reason: e.reason } : {}) });
    }
    return { state: s, alerts, events };
  }
  const pool = (hot: number) => ({ a: 2, b: 3, c: 1, d: 2, e: hot });

  it('raises only after the queue stayed above the threshold for 10 minutes', () => {
    // median of {2,3,1,2,20} = 2 → threshold 6; e at 20 is above from t = 0.
    const nine = drive(0, 9.75, () => pool(20));
    expect(nine.events).toEqual([]);
    expect(nine.alerts).toEqual([]);
    const ten = drive(0, 10, () => pool(20));
    expect(ten.events).toEqual([{ type: 'raised', replica: 'e', at: 10 * MIN }]);
    expect(ten.alerts).toEqual([{ kind: 'queue_imbalance', replica: 'e', raisedAt: 10 * MIN, aboveSince: 0, waiting: 20, threshold: 6, median: 2 }]);
  });

  it('a dip below the threshold restarts the hold', () => {
    const r = drive(0, 15, (t) => pool(t === 8 * MIN ? 5 : 20));
    expect(r.events).toEqual([]);
    expect(r.alerts).toEqual([]);
    const longer = drive(0, 20, (t) => pool(t === 8 * MIN ? 5 : 20));
    expect(longer.events).toEqual([{ type: 'raised', replica: 'e', at: 18 * MIN + 15_000 }]);
  });

  it('clears on recovery after the clear delay, and a blip during clearing restarts it', () => {
    const up = drive(0, 10, () => pool(20));
    expect(up.alerts).toHaveLength(1);
    // Recovers at 11 min; back above for one scrape at 11.5 min; stays down after.
    const down = drive(10 * MIN + 15_000, 5, (t) => pool(t < 11 * MIN || t === 11.5 * MIN ? 20 : 2), up.state);
    expect(down.events).toEqual([{ type: 'cleared', replica: 'e', at: 11.5 * MIN + 15_000 + MIN, reason: 'recovered' }]);
    expect(down.alerts).toEqual([]);
    // It was above for 30 s only in between: no new alert.
    expect(Object.values(down.state.replicas).every((r) => r.raisedAt === null)).toBe(true);
  });

  it('clearMs 0 clears on the first good reading', () => {
    const up = drive(0, 10, () => pool(20), undefined, { clearMs: 0 });
    const r = evaluateImbalance(up.state, { now: 10 * MIN + 15_000, waiting: pool(2) }, { clearMs: 0 });
    expect(r.events.map((e) => e.type)).toEqual(['cleared']);
    expect(r.alerts).toEqual([]);
  });

  it('median over the replicas with data: missing, NaN and negative readings are left out', () => {
    // With data: a=0, b=0, c=0, e=9 → median 0, threshold 4. d reports NaN, f is absent.
    const r = drive(0, 10, () => ({ a: 0, b: 0, c: 0, d: NaN, e: 9, g: -1 }));
    expect(r.alerts.map((a) => [a.replica, a.median, a.threshold])).toEqual([['e', 0, 4]]);
  });

  it('the factor rules in a busy pool, the offset in an idle one', () => {
    // median 10 → threshold 20: 19 never alerts, 21 does.
    expect(drive(0, 12, () => ({ a: 10, b: 10, c: 10, d: 19 })).alerts).toEqual([]);
    expect(drive(0, 12, () => ({ a: 10, b: 10, c: 10, d: 21 })).alerts.map((a) => a.replica)).toEqual(['d']);
    // median 1 → threshold 5: 2 × median alone would have fired at 3.
    expect(drive(0, 12, () => ({ a: 1, b: 1, c: 1, d: 5 })).alerts).toEqual([]);
    expect(drive(0, 12, () => ({ a: 1, b: 1, c: 1, d: 6 })).alerts.map((a) => a.replica)).toEqual(['d']);
  });

  it('options are honoured', () => {
    const r = drive(0, 2, () => ({ a: 1, b: 1, c: 1, d: 4 }), undefined, { factor: 3, offset: 0, holdMs: MIN });
    expect(r.events).toEqual([{ type: 'raised', replica: 'd', at: MIN }]);
  });

  it('a uniformly loaded pool never alerts, however busy', () => {
    expect(drive(0, 30, () => ({ a: 50, b: 52, c: 49, d: 51 })).events).toEqual([]);
  });

  it('a replica that stops reporting keeps its alert until stale, then clears with no_data', () => {
    const up = drive(0, 10, () => pool(20));
    const { e: _gone, ...rest } = pool(20);
    const r1 = evaluateImbalance(up.state, { now: 11 * MIN, waiting: rest });
    expect(r1.alerts.map((a) => a.replica)).toEqual(['e']);
    expect(r1.events).toEqual([]);
    const r2 = evaluateImbalance(r1.state, { now: 15 * MIN, waiting: rest });
    expect(r2.events).toMatchObject([{ type: 'cleared', replica: 'e', reason: 'no_data' }]);
    expect(r2.alerts).toEqual([]);
    expect(Object.keys(r2.state.replicas)).not.toContain('e');
  });

  it('a gap longer than staleMs restarts the hold', () => {
    const r1 = evaluateImbalance(emptyImbalanceState(), { now: 0, waiting: pool(20) });
    const r2 = evaluateImbalance(r1.state, { now: 20 * MIN, waiting: pool(20) });
    expect(r2.events).toEqual([]);
    expect(r2.state.replicas['e']!.aboveSince).toBe(20 * MIN);
  });

  it('does not modify its input and its state is plain JSON', () => {
    const up = drive(0, 10, () => pool(20));
    const before = JSON.stringify(up.state);
    const next = evaluateImbalance(up.state, { now: 11 * MIN, waiting: pool(1) });
    expect(JSON.stringify(up.state)).toBe(before);
    const revived = JSON.parse(JSON.stringify(next.state)) as ImbalanceState;
    expect(evaluateImbalance(revived, { now: 12 * MIN, waiting: pool(1) })).toEqual(evaluateImbalance(next.state, { now: 12 * MIN, waiting: pool(1) }));
  });
});

describe('hot-key detector (Space-Saving over rotating one-minute sketches)', () => {
  function feed(state: HotKeyState, start: number, n: number, durationMs: number, key: (i: number) => [string, string]): HotKeyState {
    for (let i = 0; i < n; i++) {
      const [kind, hash] = key(i);
      recordHotKey(state, start + Math.floor((i * durationMs) / n), kind, hash);
    }
    return state;
  }

  it('finds a 25 % key among 10 000 random keys with k = 64', () => {
    const r = rng(1);
    const s = createHotKeyState({ capacity: 64 });
    feed(s, 0, 10_000, 4 * MIN, () => (r() < 0.25 ? ['session', 'c0ffee42'] : ['prefix', hex8(r)]));
    const now = 4 * MIN + 30_000;
    const res = evaluateHotKeys(s, now);
    expect(res.total).toBe(10_000);
    expect(res.alerts).toHaveLength(1);
    const a = res.alerts[0]!;
    expect([a.kind, a.keyKind, a.keyHash, a.raisedAt]).toEqual(['hot_key', 'session', 'c0ffee42', now]);
    expect(a.share).toBeGreaterThan(0.23);
    expect(a.share).toBeLessThan(0.27);
    expect(a.guaranteed).toBeLessThanOrEqual(a.count);
    expect(res.events).toEqual([{ type: 'raised', keyKind: 'session', keyHash: 'c0ffee42', at: now, share: a.share }]);
    // Never the raw key: the alert carries only the kind and the 8-hex-digit hash.
    expect(Object.keys(a).sort()).toEqual(['count', 'guaranteed', 'keyHash', 'keyKind', 'kind', 'raisedAt', 'share', 'total']);
  });

  it('the count bounds bracket the true count (Space-Saving guarantee)', () => {
    const r = rng(7);
    const s = createHotKeyState({ capacity: 64, buckets: 1, windowMs: 10 * MIN });
    const truth = new Map<string, number>();
    feed(s, 0, 20_000, MIN, () => {
      // Zipf-ish: a few heavy keys and a long tail.
      const x = r();
      const h = x < 0.5 ? (Math.floor(x * 20)).toString(16).padStart(8, '0') : hex8(r);
      truth.set(h, (truth.get(h) ?? 0) + 1);
      return ['tenant', h];
    });
    const { keys } = topHotKeys(s, MIN, 64);
    for (const k of keys) {
      const t = truth.get(k.keyHash) ?? 0;
      expect(k.guaranteed).toBeLessThanOrEqual(t);
      expect(k.count).toBeGreaterThanOrEqual(t);
    }
    // Every key above N/k is monitored.
    for (const [h, t] of truth) if (t > 20_000 / 64) expect(keys.some((k) => k.keyHash === h)).toBe(true);
  });

  it('does not alert for uniform traffic', () => {
    const r = rng(2);
    const s = createHotKeyState();
    feed(s, 0, 10_000, 5 * MIN, () => ['prefix', hex8(r)]);
    const res = evaluateHotKeys(s, 5 * MIN);
    expect(res.alerts).toEqual([]);
    expect(res.events).toEqual([]);
    // Even a few hundred tenants with equal shares stay far below 20 %.
    const s2 = createHotKeyState();
    feed(s2, 0, 10_000, 5 * MIN, (i) => ['tenant', (i % 300).toString(16).padStart(8, '0')]);
    expect(evaluateHotKeys(s2, 5 * MIN).alerts).toEqual([]);
  });

  it('needs the minimum count', () => {
    const s = createHotKeyState();
    feed(s, 0, 40, MIN, () => ['session', 'deadbeef']);
    expect(evaluateHotKeys(s, MIN).alerts).toEqual([]);
    feed(s, MIN, 20, 1000, () => ['session', 'deadbeef']);
    expect(evaluateHotKeys(s, MIN + 1000).alerts.map((a) => a.keyHash)).toEqual(['deadbeef']);
    expect(evaluateHotKeys(s, MIN + 1000, { minCount: 100 }).alerts).toEqual([]);
  });

  it('ages out: the hot key clears once its minutes leave the window, and is cleared once', () => {
    const r = rng(3);
    const s = createHotKeyState();
    feed(s, 0, 5_000, 2 * MIN, () => (r() < 0.3 ? ['session', 'aaaaaaaa'] : ['prefix', hex8(r)]));
    let res = evaluateHotKeys(s, 2 * MIN);
    expect(res.alerts.map((a) => a.keyHash)).toEqual(['aaaaaaaa']);
    let state = res.state;
    // Then only uniform traffic for 6 minutes.
    feed(state, 2 * MIN, 6_000, 6 * MIN, () => ['prefix', hex8(r)]);
    const cleared: string[] = [];
    for (let t = 3 * MIN; t <= 8 * MIN; t += 15_000) {
      res = evaluateHotKeys(state, t);
      state = res.state;
      for (const e of res.events) cleared.push(`${e.type}:${e.keyHash}`);
    }
    expect(cleared).toEqual(['cleared:aaaaaaaa']);
    expect(res.alerts).toEqual([]);
    expect(topHotKeys(state, 8 * MIN).keys.some((k) => k.keyHash === 'aaaaaaaa')).toBe(false);
  });

  it('a raised alert keeps its raisedAt across evaluations', () => {
    const s = createHotKeyState();
    feed(s, 0, 100, 1000, () => ['session', '0000abcd']);
    const r1 = evaluateHotKeys(s, 1000);
    feed(r1.state, 2000, 100, 1000, () => ['session', '0000abcd']);
    const r2 = evaluateHotKeys(r1.state, 3000);
    expect(r2.events).toEqual([]);
    expect(r2.alerts[0]!.raisedAt).toBe(1000);
  });

  it('is bounded: at most buckets × capacity keys, whatever the traffic', () => {
    const r = rng(4);
    const s = createHotKeyState({ capacity: 16, buckets: 5 });
    feed(s, 0, 50_000, 60 * MIN, () => ['prefix', hex8(r)]);
    expect(s.buckets.length).toBeLessThanOrEqual(5);
    for (const b of s.buckets) {
      expect(b.keys.length).toBeLessThanOrEqual(16);
      expect(new Set(b.keys).size).toBe(b.keys.length);
      expect(b.counts.length).toBe(b.keys.length);
      expect(b.errors.length).toBe(b.keys.length);
      expect(b.counts.reduce((x, y) => x + y, 0)).toBe(b.total); // Space-Saving conserves the stream length
    }
  });

  it('rejects keys that are not (kind, 8 hex digits), and never stores them', () => {
    const s = createHotKeyState();
    recordHotKey(s, 0, 'session', 'user@example.com');
    recordHotKey(s, 0, 'session', 'abc');
    recordHotKey(s, 0, '__proto__', 'deadbeef');
    recordHotKey(s, 0, 'session', 'DEADBEEF');
    expect(s.rejected).toBe(3);
    expect(hotKeyId('session', 'DEADBEEF')).toBe('session:deadbeef');
    expect(JSON.stringify(s)).not.toContain('example.com');
  });

  it('state is plain JSON and survives a round trip', () => {
    const r = rng(5);
    const s = createHotKeyState();
    feed(s, 0, 3_000, 3 * MIN, () => (r() < 0.4 ? ['tenant', '12345678'] : ['prefix', hex8(r)]));
    const revived = JSON.parse(JSON.stringify(s)) as HotKeyState;
    expect(evaluateHotKeys(revived, 3 * MIN)).toEqual(evaluateHotKeys(s, 3 * MIN));
    recordHotKey(revived, 3 * MIN, 'tenant', '12345678');
    expect(topHotKeys(revived, 3 * MIN).total).toBe(3_001);
  });

  it('evaluateHotKeys does not modify its input', () => {
    const s = createHotKeyState();
    feed(s, 0, 200, 10 * MIN, () => ['session', 'feedface']);
    const before = JSON.stringify(s);
    evaluateHotKeys(s, 10 * MIN);
    expect(JSON.stringify(s)).toBe(before);
  });

  it('rejects nonsense configuration', () => {
    expect(() => createHotKeyState({ capacity: 0 })).toThrow(RangeError);
    expect(() => createHotKeyState({ buckets: 1.5 })).toThrow(/buckets/);
    expect(() => evaluateHotKeys(createHotKeyState(), 0, { threshold: 0 })).toThrow(/threshold/);
  });
});
