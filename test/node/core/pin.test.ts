// The pin constraint (core/strategies/pin.ts): a pinned pick returns its replica whatever the
// strategy and its load bound say, fails rather than picking another, and serves a draining one.
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random.js';
import { buildRing } from '../../../src/core/ring.js';
import { createStrategy, pickReplica, type PickContext } from '../../../src/core/strategies/index.js';
import type { ReplicaView } from '../../../src/core/types.js';

const view = (id: string, more: Partial<ReplicaView> = {}): ReplicaView => ({ id, weight: 1, inFlight: 0, healthy: true, draining: false, ...more });

function ctx(replicas: ReplicaView[], more: Partial<PickContext> = {}): PickContext {
  return { ring: buildRing(replicas.map((r) => ({ id: r.id, weight: r.weight }))), replicas, key: 12345, random: seededRandom(1), ...more };
}

describe('pin', () => {
  const strategies = ['bounded-hash:1.25', 'prefix-aware', 'hash', 'least-load', 'round-robin'].map(createStrategy);
  const fallback = createStrategy('least-load');

  it('every strategy returns the pinned replica, even far over its load bound', () => {
    const replicas = [view('a'), view('b', { inFlight: 500 }), view('c')];
    for (const s of strategies) {
      const r = pickReplica(s, fallback, ctx(replicas, { pin: 'b' }));
      expect(r, s.name).toMatchObject({ ok: true, replica: 'b', index: 1, spilled: false });
    }
  });

  it('a draining replica still takes its pinned requests', () => {
    expect(pickReplica(strategies[0]!, fallback, ctx([view('a'), view('b', { draining: true })], { pin: 'b' }))).toMatchObject({ ok: true, replica: 'b' });
  });

  it('an unhealthy or excluded pinned replica fails; it never falls back to another', () => {
    const replicas = [view('a'), view('b', { healthy: false }), view('c')];
    for (const s of strategies) {
      expect(pickReplica(s, fallback, ctx(replicas, { pin: 'b' }))).toEqual({ ok: false, reason: 'pinned_replica_unavailable' });
      expect(pickReplica(s, fallback, ctx([view('a'), view('b')], { pin: 'b', exclude: new Set(['b']) }))).toEqual({ ok: false, reason: 'pinned_replica_unavailable' });
    }
  });

  it('a pinned replica no longer in the pool fails as gone', () => {
    expect(pickReplica(strategies[0]!, fallback, ctx([view('a'), view('c')], { pin: 'b' }))).toEqual({ ok: false, reason: 'pinned_replica_gone' });
  });
});
