// LeaseMemory: what early connect guesses from (src/proxy/early-connect.ts). Pure bookkeeping:
// keyed picks only, bounded in size, stale after the TTL, forgotten on failure, and no guesses
// for a tenant the coordinator just refused for its in-flight cap.

import { describe, expect, it } from 'vitest';
import { LeaseMemory, sameReplica } from '../../../src/proxy/early-connect.js';

const A = { id: 'a', url: 'https://a.test', auth: 'bearer:K' };
const B = { id: 'b', url: 'https://b.test', auth: 'bearer:K' };
const session = (hash: number) => ({ kind: 'header' as const, hash });
const none = { kind: 'none' as const, hash: null };

describe('LeaseMemory', () => {
  it('guesses the replica a key was last leased on, per pool and key kind', () => {
    const m = new LeaseMemory();
    expect(m.guess('chat', session(1), 't', 0)).toBeNull();
    m.remember('chat', session(1), A, 0);
    expect(m.guess('chat', session(1), 't', 10)).toEqual(A);
    expect(m.guess('batch', session(1), 't', 10)).toBeNull();
    expect(m.guess('chat', { kind: 'tenant', hash: 1 }, 't', 10)).toBeNull();
    expect(m.guess('chat', session(2), 't', 10)).toBeNull();
    m.remember('chat', session(1), B, 20);
    expect(m.guess('chat', session(1), 't', 30)).toEqual(B);
  });

  it('never guesses without a key', () => {
    const m = new LeaseMemory();
    m.remember('chat', none, A, 0);
    expect(m.size).toBe(0);
    expect(m.guess('chat', none, 't', 0)).toBeNull();
  });

  it('keeps its own copy of the replica', () => {
    const m = new LeaseMemory();
    const r = { ...A };
    m.remember('chat', session(1), r, 0);
    r.url = 'https://elsewhere.test';
    expect(m.guess('chat', session(1), 't', 0)).toEqual(A);
  });

  it('drops a pick older than the TTL', () => {
    const m = new LeaseMemory({ ttlMs: 1000 });
    m.remember('chat', session(1), A, 0);
    expect(m.guess('chat', session(1), 't', 1000)).toEqual(A);
    expect(m.guess('chat', session(1), 't', 1001)).toBeNull();
    expect(m.size).toBe(0);
  });

  it('forgets a key on request, and stays bounded by evicting the least recently leased', () => {
    const m = new LeaseMemory({ maxEntries: 3 });
    for (let k = 1; k <= 3; k++) m.remember('chat', session(k), A, k);
    m.remember('chat', session(1), B, 4); // key 1 is now the most recent
    m.remember('chat', session(4), A, 5); // evicts key 2
    expect(m.size).toBe(3);
    expect(m.guess('chat', session(2), 't', 6)).toBeNull();
    expect(m.guess('chat', session(1), 't', 6)).toEqual(B);
    m.forget('chat', session(1));
    expect(m.guess('chat', session(1), 't', 6)).toBeNull();
    for (let k = 0; k < 1000; k++) m.remember('chat', session(100 + k), A, 10 + k);
    expect(m.size).toBe(3);
  });

  it('makes no guess for a tenant refused for its cap until the cooldown ends, in that pool only', () => {
    const m = new LeaseMemory({ tenantCooldownMs: 5000 });
    m.remember('chat', session(1), A, 0);
    m.remember('batch', session(1), A, 0);
    m.tenantLimited('chat', 'greedy', 100);
    expect(m.guess('chat', session(1), 'greedy', 200)).toBeNull();
    expect(m.guess('chat', session(1), 'greedy', 5099)).toBeNull();
    expect(m.guess('chat', session(1), 'other', 200)).toEqual(A);
    expect(m.guess('batch', session(1), 'greedy', 200)).toEqual(A);
    expect(m.guess('chat', session(1), 'greedy', 5100)).toEqual(A);
  });

  it('makes no guess while the tenant already has more than its cap under way in this isolate', () => {
    const m = new LeaseMemory();
    m.remember('chat', session(1), A, 0);
    const leaves = [m.enter('chat', 'capped'), m.enter('chat', 'capped')];
    expect(m.guess('chat', session(1), 'capped', 1, 2)).toEqual(A); // 2 under way, this one included
    leaves.push(m.enter('chat', 'capped'));
    expect(m.active('chat', 'capped')).toBe(3);
    expect(m.guess('chat', session(1), 'capped', 1, 2)).toBeNull();
    expect(m.guess('chat', session(1), 'capped', 1)).toEqual(A); // no cap, no limit
    expect(m.guess('batch', session(1), 'capped', 1, 2)).toBeNull(); // nothing remembered there
    leaves[0]!();
    leaves[0]!(); // idempotent
    expect(m.active('chat', 'capped')).toBe(2);
    expect(m.guess('chat', session(1), 'capped', 1, 2)).toEqual(A);
    leaves[1]!();
    leaves[2]!();
    expect(m.active('chat', 'capped')).toBe(0);
  });

  it('forgetReplica drops every key on that replica at that address, in that pool only', () => {
    const m = new LeaseMemory();
    m.remember('chat', session(1), A, 0);
    m.remember('chat', session(2), A, 0);
    m.remember('chat', session(3), B, 0);
    m.remember('batch', session(1), A, 0);
    m.forgetReplica('chat', { ...A, url: 'https://elsewhere.test' }); // another address: not this entry
    expect(m.size).toBe(4);
    m.forgetReplica('chat', A);
    expect(m.guess('chat', session(1), 't', 1)).toBeNull();
    expect(m.guess('chat', session(2), 't', 1)).toBeNull();
    expect(m.guess('chat', session(3), 't', 1)).toEqual(B);
    expect(m.guess('batch', session(1), 't', 1)).toEqual(A);
  });

  it('sameReplica compares id, address and credentials reference', () => {
    expect(sameReplica(A, { ...A })).toBe(true);
    expect(sameReplica(A, B)).toBe(false);
    expect(sameReplica(A, { ...A, url: 'https://moved.test' })).toBe(false);
    expect(sameReplica(A, { ...A, auth: 'bearer:OTHER' })).toBe(false);
  });

  it("keeps the data-parallel engine a key was pinned to: the early request goes to that engine, another engine is a miss", () => {
    const m = new LeaseMemory();
    m.remember('chat', session(7), { ...A, dpRank: 1 }, 0);
    const g = m.guess('chat', session(7), 't', 1)!;
    expect(g.dpRank).toBe(1);
    expect(sameReplica(g, { ...A, dpRank: 1 })).toBe(true);
    expect(sameReplica(g, { ...A, dpRank: 0 })).toBe(false);
    expect(sameReplica(g, A)).toBe(false);
    // A replica not confirmed is forgotten whichever engine each key was pinned to.
    m.remember('chat', session(8), { ...A, dpRank: 0 }, 0);
    m.forgetReplica('chat', A);
    expect(m.guess('chat', session(7), 't', 2)).toBeNull();
    expect(m.guess('chat', session(8), 't', 2)).toBeNull();
  });
});
