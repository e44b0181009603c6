// The sharded coordinator of the simulator (sim/shards.ts): key ranges, one shard equal
// to the plain router, load-blind strategies unaffected, and every shard's view back at zero.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { simulate, type SimConfig } from '../../../sim/engine.js';
import { mulberry32 } from '../../../sim/rng.js';
import { createSimRouter } from '../../../sim/router.js';
import { shardOfKey } from '../../../sim/shards.js';
import { parseKeySpec, parseTrace, routingKey } from '../../../sim/trace.js';

const trace = parseTrace(readFileSync(join(import.meta.dirname, '../../fixtures/mooncake-excerpt.jsonl'), 'utf8'), 'mooncake-excerpt');
const keys = trace.requests.map((r) => routingKey(r, parseKeySpec('prefix:2blocks')));
const run = (over: Partial<SimConfig>) => simulate(trace, { strategy: 'bounded-hash:1.25', replicas: 8, keys, timeScale: 4, ...over });

describe('sharded coordinator (simulator)', () => {
  it('splits the 32-bit key space into S equal ranges', () => {
    expect(shardOfKey(0, 4)).toBe(0);
    expect(shardOfKey(0x3fffffff, 4)).toBe(0);
    expect(shardOfKey(0x40000000, 4)).toBe(1);
    expect(shardOfKey(0xffffffff, 4)).toBe(3);
    expect(shardOfKey(-1, 16)).toBe(15);
  });

  it('one shard is the plain router; hash (load-blind) places the same with any number of shards', () => {
    const plain = run({});
    const one = run({ shards: 1 });
    expect(one.tokenHitRate).toBe(plain.tokenHitRate);
    expect(one.ttftMs).toEqual(plain.ttftMs);
    const h1 = run({ strategy: 'hash' });
    const h8 = run({ strategy: 'hash', shards: 8 });
    expect(h8.perReplica.map((r) => r.requests)).toEqual(h1.perReplica.map((r) => r.requests));
    expect(h8.tokenHitRate).toBe(h1.tokenHitRate);
  });

  it('each shard counts only what it placed, and every placement is released', () => {
    const r = createSimRouter('bounded-hash:1.25', ['a', 'b'], { random: mulberry32(1), shards: 2 });
    const blocks = new Int32Array(0);
    // Two keys in shard 0, both homed wherever the ring says; shard 1 sees none of them.
    const low = (i: number) => ({ key: i, blocks, promptTokens: 1, nowMs: 0, index: i });
    const picks = [0, 1, 2, 3].map((i) => {
      const p = r.route(low(i), [0, 0]);
      if (!p.ok) throw new Error('no pick');
      r.observe(low(i), p.index);
      return p.index;
    });
    // Four requests over two replicas under factor 1.25: the shard's own cap keeps them split.
    expect(picks.filter((x) => x === 0).length).toBe(2);
    // A request in the other shard sees an empty pool: it lands on its home without spilling.
    const high = { key: 0xfffffff0, blocks, promptTokens: 1, nowMs: 0, index: 9 };
    const hp = r.route(high, [2, 2]);
    expect(hp.ok && !hp.spilled).toBe(true);
    for (const i of [0, 1, 2, 3]) r.release!(i);
    r.release!(0); // a second release changes nothing
    const again = r.route(low(5), [0, 0]);
    expect(again.ok && !again.spilled).toBe(true);
  });

  it('runs a whole trace with shards and reports it', () => {
    const s = run({ shards: 4 });
    expect(s.strategy).toBe('bounded-hash:1.25 ×4 shards');
    expect(s.requests).toBe(trace.requests.length);
    expect(s.perReplica.reduce((a, r) => a + r.requests, 0)).toBe(trace.requests.length);
  });
});
