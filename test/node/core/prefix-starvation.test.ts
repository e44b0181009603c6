// `prefix-aware` after a shared prompt changes (#17): following a prefix must never leave a
// healthy replica idle while others queue. The three scenarios of the issue, each of which
// starved replicas before the load window (prefix-aware.ts doc comment), and the guarantee as a
// property over random prompt switches, loads and weights.
//
// Model: sessions share a system prompt of SYS blocks, then carry their own blocks, growing by
// 1-3 blocks a turn. The index records a request when it finishes (as the coordinator does on
// a successful release); "loaded" requests stay in flight for 4-12 picks.
import { describe, expect, it } from 'vitest';
import { hashString } from '../../../src/core/hash.js';
import { matchPrefix, PrefixIndex, PrefixMatchScratch } from '../../../src/core/prefix-index.js';
import { seededRandom } from '../../../src/core/random.js';
import { buildRing, type Ring } from '../../../src/core/ring.js';
import { createPrefixAware, createStrategy, DEFAULT_FOLLOW_SPREAD, DEFAULT_FOLLOW_SPREAD_SHARE, type PickContext, type Strategy } from '../../../src/core/strategies/index.js';
import type { RandomSource, ReplicaView } from '../../../src/core/types.js';
import { ok, ringOf, views } from '../../helpers/core-fixtures.js';

const SYS = 24; // blocks of the system prompt (≈ 1,500 tokens)

/** A system prompt's blocks; `shared` leading blocks are common to every prompt (a template header). */
function systemPrompt(tag: number, shared = 1): number[] {
  return Array.from({ length: SYS }, (_, i) => (i < shared ? 0x5100 + i : ((tag * 0x9e3779b1) ^ (i * 0x85ebca6b)) >>> 0));
}

interface Fleet {
  readonly ring: Ring;
  readonly index: PrefixIndex;
  readonly load: Int32Array;
  readonly random: RandomSource;
  /** Requests in flight: finish at pick number `at`, then are recorded. */
  readonly pending: { at: number; r: number; blocks: Uint32Array }[];
  t: number;
  /** When the index learns a route: at the pick (the coordinator before #17) or when it finishes (now). */
  readonly recordAt: 'pick' | 'finish';
  readonly scratch: PrefixMatchScratch;
}

function fleet(recordAt: Fleet['recordAt'], n = 8, seed = 7, ring: Ring = ringOf(new Array(n).fill(1))): Fleet {
  return { ring, index: new PrefixIndex(), load: new Int32Array(ring.size), random: seededRandom(seed), pending: [], t: 0, recordAt, scratch: new PrefixMatchScratch() };
}

/** Finish what is due: in-flight − 1, and the index learns the prompt (record on success). */
function settle(f: Fleet, all = false): void {
  for (let i = f.pending.length - 1; i >= 0; i--) {
    const p = f.pending[i]!;
    if (all || p.at <= f.t) {
      f.load[p.r]!--;
      if (f.recordAt === 'finish') f.index.recordRoute(f.ring.ids[p.r]!, p.blocks);
      f.pending.splice(i, 1);
    }
  }
}

/** One pick; `hold` picks in flight (0: finishes at once). Returns the replica index. */
function route(f: Fleet, strat: Strategy, key: number, blocks: Uint32Array, hold: number): number {
  // As the coordinator and the simulator match: blocks, staleness and recent routes.
  const prefixMatch = matchPrefix(f.index, f.ring.ids, blocks, f.scratch, key);
  const replicas = views(f.ring, f.load);
  const r = ok(strat.pick({ ring: f.ring, replicas, key, random: f.random, prefixMatch }));
  f.load[r.index]!++;
  if (f.recordAt === 'pick') f.index.recordRoute(f.ring.ids[r.index]!, blocks, key);
  f.pending.push({ at: f.t + hold, r: r.index, blocks });
  f.t++;
  settle(f);
  return r.index;
}

/** `requests` picks over `sessions` interleaved multi-turn sessions on `prompt`; returns per-replica counts. */
function runSessions(f: Fleet, strat: Strategy, prompt: number[], sessions: number, requests: number, loaded: boolean, tag: string): Int32Array {
  const counts = new Int32Array(f.ring.size);
  const live = Array.from({ length: sessions }, (_, s) => ({ key: hashString(`${tag}-${s}`), blocks: [...prompt], turns: 0 }));
  let seq = 1;
  let spawned = 1;
  for (let t = 0; t < requests; t++) {
    if (spawned < live.length && f.random() < 0.25) spawned++;
    let s = live[Math.floor(f.random() * spawned)]!;
    if (s.turns >= 6) s = live.find((x) => x.turns < 6) ?? s;
    const add = 1 + Math.floor(f.random() * 3);
    for (let k = 0; k < add; k++) s.blocks.push((hashString(tag) ^ Math.imul(seq++, 2654435761)) >>> 0);
    s.turns++;
    const hold = loaded ? 4 + Math.floor(f.random() * 9) : 0;
    counts[route(f, strat, s.key, Uint32Array.from(s.blocks), hold)]!++;
  }
  return counts;
}

const minShare = (counts: Int32Array) => Math.min(...counts) / (counts.reduce((a, b) => a + b, 0) / counts.length);

describe.each(['pick', 'finish'] as const)('prefix-aware: no starvation after a shared prompt changes (index recorded at %s)', (recordAt) => {
  const strat = createStrategy('prefix-aware');

  it('a system-prompt switch on 8 replicas: every replica gets ≥ half the mean of the 2,500 requests after it', () => {
    const f = fleet(recordAt);
    runSessions(f, strat, systemPrompt(1), 300, 1500, true, 'old');
    settle(f, true);
    const after = runSessions(f, strat, systemPrompt(2), 500, 2500, true, 'new');
    expect(Math.min(...after), `per replica after the switch: ${Array.from(after).join(' ')}`).toBeGreaterThan(0);
    expect(minShare(after), `per replica after the switch: ${Array.from(after).join(' ')}`).toBeGreaterThanOrEqual(0.5);
  });

  it('r0-r3 at 3 in flight holding the new prompt, r4-r7 idle: new sessions go to the idle ones', () => {
    const f = fleet(recordAt);
    runSessions(f, strat, systemPrompt(1), 300, 1500, false, 'old');
    // r0-r3 hold the new prompt (one session each), and stay at 3 in flight.
    const fresh = systemPrompt(2);
    for (let r = 0; r < 4; r++) f.index.recordRoute(f.ring.ids[r]!, Uint32Array.from([...fresh, 0xabc0 + r]));
    const counts = new Int32Array(8);
    for (let s = 0; s < 200; s++) {
      const blocks = Uint32Array.from([...fresh, (0x7000 + s * 7919) >>> 0, (0x9000 + s * 104729) >>> 0]);
      const matched = f.index.matchAll(f.ring.ids, blocks);
      const replicas = views(f.ring, [3, 3, 3, 3, 0, 0, 0, 0]);
      const prefixMatch = { blocks: blocks.length, matched, stale: f.index.staleAll(f.ring.ids) };
      const r = ok(strat.pick({ ring: f.ring, replicas, key: hashString(`new-${s}`), random: f.random, prefixMatch }));
      counts[r.index]!++;
      f.index.recordRoute(f.ring.ids[r.index]!, blocks);
    }
    // Before: 200 of 200 to r0-r3. Now r4-r7 stop holding the shared base down once the pool's
    // last 4 × 8 routes missed them (stale), new sessions gain nothing on r0-r3, and the idle ones take them.
    expect(counts[4]! + counts[5]! + counts[6]! + counts[7]!, Array.from(counts).join(' ')).toBeGreaterThanOrEqual(150);
    // With the tighter window S = 2, r0-r3 at 3 are outside it from the first pick.
    const tight = createStrategy('prefix-aware:1.25:3:2:0.25');
    const h = fleet(recordAt);
    runSessions(h, tight, systemPrompt(1), 300, 1500, false, 'old');
    for (let r = 0; r < 4; r++) h.index.recordRoute(h.ring.ids[r]!, Uint32Array.from([...fresh, 0xabc0 + r]));
    let onBusy = 0;
    for (let s = 0; s < 200; s++) {
      const blocks = Uint32Array.from([...fresh, (0x7000 + s * 7919) >>> 0]);
      const prefixMatch = { blocks: blocks.length, matched: h.index.matchAll(h.ring.ids, blocks), stale: h.index.staleAll(h.ring.ids) };
      const r = ok(tight.pick({ ring: h.ring, replicas: views(h.ring, [3, 3, 3, 3, 0, 0, 0, 0]), key: hashString(`t-${s}`), random: h.random, prefixMatch }));
      if (r.index < 4) onBusy++;
      h.index.recordRoute(h.ring.ids[r.index]!, blocks);
    }
    expect(onBusy).toBe(0);
    // And once loads move (requests held for a few picks), every replica takes a fair share.
    const g = fleet(recordAt, 8, 9);
    runSessions(g, strat, systemPrompt(1), 300, 1500, false, 'old');
    for (let r = 0; r < 4; r++) g.index.recordRoute(g.ring.ids[r]!, Uint32Array.from([...fresh, 0xabc0 + r]));
    for (let r = 0; r < 4; r++) for (let k = 0; k < 3; k++) g.load[r]!++, g.pending.push({ at: 1e9, r, blocks: Uint32Array.from(fresh) });
    const moving = runSessions(g, strat, fresh, 200, 200, true, 'new');
    for (let r = 4; r < 8; r++) expect(moving[r]!, Array.from(moving).join(' ')).toBeGreaterThanOrEqual(200 / 8 / 2);
  });

  it('a wholly new prompt (nothing shared with the old one) starves no replica', () => {
    const f = fleet(recordAt);
    runSessions(f, strat, systemPrompt(1), 300, 1500, true, 'old');
    settle(f, true);
    const after = runSessions(f, strat, systemPrompt(3, 0), 500, 2500, true, 'other');
    expect(minShare(after), Array.from(after).join(' ')).toBeGreaterThanOrEqual(0.5);
  });

  it('an idle fleet (every request done before the next) still spreads sessions', () => {
    const f = fleet(recordAt);
    runSessions(f, strat, systemPrompt(1), 300, 1500, false, 'old');
    const after = runSessions(f, strat, systemPrompt(2), 400, 2000, false, 'new');
    expect(Math.min(...after), Array.from(after).join(' ')).toBeGreaterThan(0);
  });
});

describe('prefix-aware: the no-starvation guarantee as a property', () => {
  // Guarantee (prefix-aware.ts): every pick goes to a usable replica r with
  //   inFlight(r) / w_r ≤ ℓ_min + followSpread + followSpreadShare × ℓ_min,
  // ℓ_min the lowest in-flight per unit weight among usable replicas, whatever the index says.
  it('holds over random prompt switches, loads, weights, health and exclusions (seeded)', () => {
    const rand = seededRandom(0x17);
    for (const spec of [{}, { followSpread: 0 }, { followSpread: 4, followSpreadShare: 0.5 }, { balanceFactor: 2, slack: 0 }, { balanceFactor: Infinity, slack: 0 }, { underShare: 1 }, { underShare: 0 }]) {
      const strat = createPrefixAware(spec);
      const S = spec.followSpread ?? DEFAULT_FOLLOW_SPREAD;
      const rho = spec.followSpreadShare ?? DEFAULT_FOLLOW_SPREAD_SHARE;
      for (let world = 0; world < 30; world++) {
        const n = 2 + Math.floor(rand() * 14);
        const ring = buildRing(Array.from({ length: n }, (_, i) => ({ id: `r${i}`, weight: 1 + Math.floor(rand() * 4) })));
        const index = new PrefixIndex({ defaultCapacity: 200 + Math.floor(rand() * 2000) });
        const scratch = new PrefixMatchScratch();
        const load = Array.from({ length: n }, () => Math.floor(rand() * 6));
        let prompt = systemPrompt(world * 100, Math.floor(rand() * 3));
        for (let t = 0; t < 300; t++) {
          if (rand() < 0.05) prompt = systemPrompt(world * 100 + t, Math.floor(rand() * 3)); // a prompt switch
          const blocks = Uint32Array.from([...prompt.slice(0, Math.floor(rand() * SYS) + 1), ...Array.from({ length: Math.floor(rand() * 30) }, () => (rand() * 2 ** 32) >>> 0)]);
          // Loads drift: a pick adds one, random finishes take some away; sometimes a burst lands on a few replicas.
          for (let i = 0; i < n; i++) if (load[i]! > 0 && rand() < 0.2) load[i]!--;
          if (rand() < 0.05) load[Math.floor(rand() * n)]! += Math.floor(rand() * 10);
          const patch: Record<number, Partial<ReplicaView>> = {};
          for (let i = 0; i < n; i++) if (rand() < 0.05) patch[i] = rand() < 0.5 ? { healthy: false } : { draining: true };
          const replicas = views(ring, load, patch);
          const exclude = rand() < 0.2 ? new Set([`r${Math.floor(rand() * n)}`]) : undefined;
          const how = rand();
          const prefixMatch = how < 0.5 ? matchPrefix(index, ring.ids, blocks, scratch) : { blocks: blocks.length, matched: index.matchAll(ring.ids, blocks), stale: how < 0.75 ? index.staleAll(ring.ids) : undefined };
          const ctx: PickContext = { ring, replicas, key: (rand() * 2 ** 32) >>> 0, exclude, random: rand, prefixMatch };
          const res = strat.pick(ctx);
          const usable = replicas.filter((x) => x.healthy && !x.draining && !exclude?.has(x.id));
          if (usable.length === 0) {
            expect(res.ok).toBe(false);
            continue;
          }
          const p = ok(res);
          const minLoad = Math.min(...usable.map((x) => x.inFlight / x.weight));
          const c = replicas[p.index]!;
          expect(usable).toContain(c);
          expect(c.inFlight / c.weight, `world ${world} pick ${t}: loads ${load.join(',')}`).toBeLessThanOrEqual(minLoad + S + rho * minLoad + 1e-9);
          load[p.index]!++;
          if (rand() < 0.8) index.recordRoute(c.id, blocks);
        }
      }
    }
  });
});

describe('prefix-aware: seeding a starved replica', () => {
  it('a new session on a shared prompt goes to a replica with no route among the last 16 × R; a continuation does not', () => {
    const ring = ringOf(new Array(4).fill(1));
    const index = new PrefixIndex();
    const tools = Array.from({ length: 20 }, (_, i) => 0x7700 + i);
    // r0 holds the tool list, r1 another one (both busy); r2, r3 got one route each long ago.
    for (let r = 2; r < 4; r++) index.recordRoute(ring.ids[r]!, Uint32Array.of(0x100 * r));
    for (let k = 0; k < 70; k++) {
      index.recordRoute(ring.ids[0]!, Uint32Array.from([...tools, 0x9000 + k]));
      index.recordRoute(ring.ids[1]!, Uint32Array.from([0x6600, 0x6601, 0x6602, 0xc000 + k]));
    }
    expect(Array.from(index.staleAll(ring.ids))).toEqual([0, 0, 2, 2]);
    const strat = createStrategy('prefix-aware');
    const pick = (blocks: Uint32Array, key: number) =>
      ok(strat.pick({ ring, replicas: views(ring, [0, 0, 0, 0]), key, random: () => 0.5, prefixMatch: { blocks: blocks.length, matched: index.matchAll(ring.ids, blocks), stale: index.staleAll(ring.ids) } }));
    // A new session: the tool list (20 blocks) plus 8 of its own = 71% of the request → seeded.
    const fresh = Uint32Array.from([...tools, ...Array.from({ length: 8 }, (_, i) => 0xa000 + i)]);
    expect([2, 3]).toContain(pick(fresh, 12345).index);
    // A continuation of r0's session (its 21 blocks of 22 = 95%) stays on r0.
    const cont = Uint32Array.from([...tools, 0x9000 + 69, 0xbeef]);
    expect(pick(cont, 12345).index).toBe(0);
    // seedBelow 0 turns seeding off.
    const off = createPrefixAware({ seedBelow: 0 });
    expect(ok(off.pick({ ring, replicas: views(ring, [0, 0, 0, 0]), key: 12345, random: () => 0.5, prefixMatch: { blocks: fresh.length, matched: index.matchAll(ring.ids, fresh), stale: index.staleAll(ring.ids) } })).index).toBe(0);
  });
});

// Light load (every request done before the next, nothing queues): the window never binds, so
// without a further rule the replicas holding a popular tenant's system prompt keep its new
// sessions while the rest share the small tenants' traffic (the simulator's multi-tenant and
// skewed classes at their own rates: 0.47 and 0.43 of the mean on the emptiest replica).
describe('prefix-aware: under-served replicas at light load', () => {
  /** 8 tenants, tenant 0 with 60% of the sessions; sessions of 1-4 turns; returns requests per replica. */
  function tenants(strat: Strategy, withRecent: boolean, seed: number): Int32Array {
    const ring = ringOf(new Array(8).fill(1));
    const index = new PrefixIndex();
    const scratch = new PrefixMatchScratch();
    const rand = seededRandom(seed);
    const prompts = Array.from({ length: 8 }, (_, t) => systemPrompt(0x40 + t, 0));
    const counts = new Int32Array(8);
    const load = new Array(8).fill(0);
    let seq = 1;
    for (let s = 0; counts.reduce((a, b) => a + b, 0) < 3000; s++) {
      const tenant = rand() < 0.6 ? 0 : 1 + Math.floor(rand() * 7);
      const blocks = [...prompts[tenant]!];
      const turns = 1 + Math.floor(rand() * 4);
      for (let turn = 0; turn < turns; turn++) {
        for (let k = 0; k < 4; k++) blocks.push((0xd00d0000 + seq++) >>> 0);
        const b = Uint32Array.from(blocks);
        const key = hashString(`tenant-${tenant}-session-${s}`);
        const prefixMatch = withRecent ? matchPrefix(index, ring.ids, b, scratch, key) : { blocks: b.length, matched: index.matchAll(ring.ids, b), stale: index.staleAll(ring.ids) };
        const p = ok(strat.pick({ ring, replicas: views(ring, load), key, random: rand, prefixMatch }));
        counts[p.index]!++;
        index.recordRoute(ring.ids[p.index]!, b, key);
      }
    }
    return counts;
  }

  it('every replica gets at least half the mean; without recent route counts (the rule before) one does not', () => {
    const strat = createStrategy('prefix-aware');
    for (const seed of [1, 2, 3]) {
      const now = tenants(strat, true, seed);
      expect(minShare(now), `seed ${seed}: ${Array.from(now).join(' ')}`).toBeGreaterThanOrEqual(0.5);
    }
    const before = tenants(strat, false, 1);
    expect(minShare(before), Array.from(before).join(' ')).toBeLessThan(0.5);
    // underShare 0 turns the preference off, even with the counts.
    const off = tenants(createPrefixAware({ underShare: 0 }), true, 1);
    expect(minShare(off), Array.from(off).join(' ')).toBeLessThan(0.5);
  });

  it('property: a pick that is not a continuation goes to an under-served replica when one is open among the least loaded', () => {
    const rand = seededRandom(0x5eed);
    const strat = createPrefixAware({});
    let checked = 0;
    for (let world = 0; world < 40; world++) {
      const n = 2 + Math.floor(rand() * 10);
      const ring = buildRing(Array.from({ length: n }, (_, i) => ({ id: `r${i}`, weight: 1 + Math.floor(rand() * 3) })));
      const index = new PrefixIndex();
      const scratch = new PrefixMatchScratch();
      const prompt = systemPrompt(world, 0);
      // A skewed history: most routes to a few replicas.
      const hot = 1 + Math.floor(rand() * Math.max(1, n - 1));
      for (let k = 0; k < 20 * n; k++) {
        const r = rand() < 0.85 ? Math.floor(rand() * hot) : Math.floor(rand() * n);
        index.recordRoute(ring.ids[r]!, Uint32Array.from([...prompt.slice(0, 4 + Math.floor(rand() * (SYS - 4))), (rand() * 2 ** 32) >>> 0]));
      }
      for (let t = 0; t < 30; t++) {
        const load = Array.from({ length: n }, () => Math.floor(rand() * 3));
        const replicas = views(ring, load);
        // A new session: the shared prompt plus as many blocks of its own (≈ 50%, below seedBelow).
        const blocks = Uint32Array.from([...prompt, ...Array.from({ length: SYS }, () => (rand() * 2 ** 32) >>> 0)]);
        const m = matchPrefix(index, ring.ids, blocks, scratch);
        const W = replicas.reduce((a, r) => a + r.weight, 0);
        const minLoad = Math.min(...replicas.map((r) => r.inFlight / r.weight));
        const routes = m.recent!.reduce((a, b) => a + b, 0); // every replica is usable here
        const under = replicas.map((r, i) => m.recent![i]! < (0.5 * routes * r.weight) / W);
        const calmUnder = replicas.some((r, i) => under[i] && r.inFlight / r.weight <= minLoad);
        const p = ok(strat.pick({ ring, replicas, key: (rand() * 2 ** 32) >>> 0, random: rand, prefixMatch: m }));
        if (calmUnder) {
          checked++;
          expect(under[p.index], `world ${world} pick ${t}: recent ${Array.from(m.recent!).join(',')}, loads ${load.join(',')}`).toBe(true);
          expect(replicas[p.index]!.inFlight / replicas[p.index]!.weight).toBeLessThanOrEqual(minLoad);
        }
      }
    }
    expect(checked).toBeGreaterThan(100);
  });
});

describe('prefix-aware: fair shares are of the usable replicas\' routes', () => {
  it('routes to a replica now down do not make the others look under-served', () => {
    const ring = ringOf([1, 1, 1, 1]);
    const index = new PrefixIndex();
    const scratch = new PrefixMatchScratch();
    const shared = systemPrompt(0x77, 0);
    // r0 took 60 of the pool's last 64 routes and is now down; r1-r3 got the other 4, r3 holds the shared prompt.
    for (let k = 0; k < 60; k++) index.recordRoute(ring.ids[0]!, Uint32Array.of(0x10000 + k));
    index.recordRoute(ring.ids[1]!, Uint32Array.of(0x20000));
    index.recordRoute(ring.ids[2]!, Uint32Array.of(0x20001));
    index.recordRoute(ring.ids[3]!, Uint32Array.from(shared));
    index.recordRoute(ring.ids[3]!, Uint32Array.from([...shared, 0x30000]));
    const blocks = Uint32Array.from([...shared, 0x40000, 0x40001]);
    const prefixMatch = matchPrefix(index, ring.ids, blocks, scratch, 0xabcdef); // a new session key
    const replicas = views(ring, [0, 0, 0, 0], { 0: { healthy: false } });
    // Of the 4 routes the usable replicas got, nobody's fair share reaches 4: no one is
    // under-served, and the new session follows the shared prompt to r3 (with the down
    // replica's 60 counted, r1 and r2 would have looked starved and taken it).
    const p = ok(createStrategy('prefix-aware').pick({ ring, replicas, key: 0xabcdef, random: () => 0.5, prefixMatch }));
    expect(p.replica).toBe(ring.ids[3]);
  });
});
