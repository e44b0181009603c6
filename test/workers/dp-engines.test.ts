// Data-parallel engines kept apart in the coordinator (#17, src/coordinator/dp-engines.ts): a
// replica whose /metrics names two engines gets one index slot per engine, each sized from that
// engine's own free KV plus the router's prompts in flight on it; a request is pinned to the
// engine holding its prefix (the lease says which: `dpRank`); a failure takes back only that
// engine's entries; a restart (counters down) or a replica marked down clears every slot.
// /metrics and /health are answered by a stub fetch inside the object.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import { loadConfig } from '../../src/config';
import { blockHashes } from '../../src/core/blocks';
import { anchorLength, type PrefixIndex } from '../../src/core/prefix-index';
import { engineSlotId } from '../../src/coordinator/dp-engines';
import { withOriginFetch } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
const freshStub = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`dp-${crypto.randomUUID()}`));
const inDO = <R>(stub: Stub, fn: (i: PoolCoordinator) => R | Promise<R>) => runInDurableObject<PoolCoordinator, R>(stub, fn);
const req = (over: Partial<AcquireRequest>): AcquireRequest => ({ pool: 'prefix', key: 1, keyKind: 'header', ...over });
const pool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('prefix')!;
const perSlot = (i: PoolCoordinator) => (i as unknown as { state: { prefixIndex: PrefixIndex } }).state.prefixIndex.stats().perReplica;

function ok(r: AcquireResult): Extract<AcquireResult, { ok: true }> {
  if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
  return r;
}

/** Routing keys spread over the ring (a key is a 32-bit hash). */
const spread = (k: number) => Math.imul(k + 1, 0x9e3779b1) >>> 0;
const doc = (tag: string) => Array.from({ length: 40 }, (_, k) => `${tag} paragraph ${k} of a prompt long enough to fill blocks; `).join('');

/**
 * vLLM V1 /metrics with one label set per engine (counters per engine, as vLLM labels them);
 * every engine's cache_config_info carries the server's total blocks (vllm/v1/engine/utils.py
 * wait_for_engine_startup sums the engines), so the engines of one server are sized alike.
 */
function metrics(queries: number, engines: { blocks: number; usage: number }[]): string {
  const total = engines.reduce((s, e) => s + e.blocks, 0);
  return engines
    .map((e, k) => {
      const l = `engine="${k}",model_name="m"`;
      return [
        `vllm:prefix_cache_queries_total{${l}} ${queries}`,
        `vllm:prefix_cache_hits_total{${l}} ${Math.floor(queries / 2)}`,
        `vllm:kv_cache_usage_perc{${l}} ${e.usage}`,
        `vllm:cache_config_info{block_size="16",${l},num_gpu_blocks="${total}"} 1.0`,
        `vllm:num_requests_running{${l}} 0`,
        `vllm:num_requests_waiting{${l}} 0`,
      ].join('\n');
    })
    .join('\n') + '\n';
}

const scrape = (i: PoolCoordinator, body: (host: string) => string) => withOriginFetch((u) => new Response(body(u.hostname)), () => i.scrapeMetrics(pool()));

// Engine 0: 8,000 blocks at 62.5% used = 3,000 free × 16 / 64 = 750 router blocks; engine 1:
// 8,000 at 25% used = 6,000 free = 1,500 (each label says the server's 16,000). Summed, the
// replica would have been one cache of 2,250.
const TWO = [
  { blocks: 8_000, usage: 0.625 },
  { blocks: 8_000, usage: 0.25 },
];

describe('data-parallel engines', () => {
  it('one slot per engine, each sized by its own free KV plus the router prompts in flight on it', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix'); // binds the object to its pool
      await scrape(i, () => metrics(100, TWO));
      const blocks = blockHashes(doc('dp'), { maxBlocks: 512 });
      const a = ok(i.acquire(req({ key: 5, blocks })));
      expect(a.replica.dpRank === 0 || a.replica.dpRank === 1).toBe(true);
      const rank = a.replica.dpRank!;
      const mine = engineSlotId(a.replica.id, rank);
      const other = engineSlotId(a.replica.id, 1 - rank);
      let slots = perSlot(i);
      expect(slots[mine]!.entries).toBe(anchorLength(blocks.length));
      expect(slots[other]?.entries ?? 0).toBe(0);
      expect(slots[a.replica.id]).toBeUndefined();
      // In flight: its prompt counts on its engine's slot only.
      await scrape(i, () => metrics(200, TWO));
      slots = perSlot(i);
      const own = [750, 1_500];
      expect(slots[mine]!.capacity).toBe(own[rank]! + anchorLength(blocks.length));
      expect(slots[other]!.capacity).toBe(own[1 - rank]);
      const snap = i.snapshot('prefix')!.replicas.find((r) => r.id === a.replica.id)!;
      expect(snap.engines!.map((e) => [e.rank, e.engine, e.inFlight])).toEqual([
        [0, '0', rank === 0 ? 1 : 0],
        [1, '1', rank === 1 ? 1 : 0],
      ]);
      expect(snap.engines![rank]!.indexEntries).toBe(anchorLength(blocks.length));
      i.release(a.leaseId, { status: 200 });
      await scrape(i, () => metrics(300, TWO));
      expect(perSlot(i)[mine]!.capacity).toBe(own[rank]);
      // The session's next turn: same replica, same engine, its whole prefix matched.
      const longer = blockHashes(doc('dp') + doc('turn 2'), { maxBlocks: 512 });
      const b = ok(i.acquire(req({ key: 5, blocks: longer })));
      expect([b.replica.id, b.replica.dpRank, b.matchedBlocks]).toEqual([a.replica.id, rank, anchorLength(blocks.length)]);
      // It fails: only what it added on that engine is taken back.
      i.release(b.leaseId, { status: 502 });
      expect(perSlot(i)[mine]!.entries).toBe(anchorLength(blocks.length));
      // An API vLLM cannot pin (its Responses endpoint ignores the rank): no rank, and no slot
      // records a route whose engine vLLM's balancer chooses.
      const before = JSON.stringify(perSlot(i));
      const c = ok(i.acquire(req({ key: 5, blocks: longer, pinEngine: false })));
      expect(c.replica.id).toBe(a.replica.id);
      expect(c.replica.dpRank).toBeUndefined();
      expect(JSON.stringify(perSlot(i))).toBe(before);
      i.release(c.leaseId, { status: 200 });
      expect(JSON.stringify(perSlot(i))).toBe(before);
    });
  });

  it('a single-engine replica is not pinned; a restart or a replica marked down clears every engine slot', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix'); // binds the object to its pool
      const ids = pool().replicas.map((r) => r.id);
      const dpId = ids[0]!;
      // One replica with two engines, the others with one.
      await scrape(i, (host) => metrics(100, host.startsWith(dpId) ? TWO : [TWO[1]!]));
      const held = new Map<string, number>();
      for (let k = 0; k < 16; k++) {
        const blocks = blockHashes(doc(`s${k}`), { maxBlocks: 512 });
        const l = ok(i.acquire(req({ key: spread(k), blocks })));
        if (l.replica.id === dpId) expect(l.replica.dpRank).toBeDefined();
        else expect(l.replica.dpRank).toBeUndefined();
        i.release(l.leaseId, { status: 200 });
        const slot = l.replica.dpRank === undefined ? l.replica.id : engineSlotId(l.replica.id, l.replica.dpRank);
        held.set(slot, (held.get(slot) ?? 0) + anchorLength(blocks.length));
      }
      const dpSlots = [engineSlotId(dpId, 0), engineSlotId(dpId, 1)];
      for (const s of dpSlots) held.set(s, held.get(s) ?? 0);
      expect(dpSlots.reduce((n, s) => n + held.get(s)!, 0)).toBeGreaterThan(0);
      // vLLM restarted (its counters went down on every engine): both slots empty, the others kept.
      await scrape(i, (host) => (host.startsWith(dpId) ? metrics(3, TWO) : metrics(400, [TWO[1]!])));
      let slots = perSlot(i);
      for (const s of dpSlots) expect(slots[s]?.entries ?? 0).toBe(0);
      for (const [s, n] of held) if (!dpSlots.includes(s)) expect(slots[s]!.entries).toBe(n);
      // Fill both engines again, then the replica fails its health checks (fall: 2): both cleared.
      for (const rank of [0, 1]) {
        for (let k = 0; k < 40; k++) {
          const l = ok(i.acquire(req({ key: spread(1000 + 40 * rank + k), blocks: blockHashes(doc(`h${rank}-${k}`), { maxBlocks: 512 }) })));
          i.release(l.leaseId, { status: 200 });
        }
      }
      slots = perSlot(i);
      expect(dpSlots.some((s) => (slots[s]?.entries ?? 0) > 0)).toBe(true);
      // Both failed checks inside one window of the fake answer: the object's own alarm may run a
      // health round between them (a loaded machine), and with the real origin's 200 it would reset
      // the fall count (seen in a full run under load).
      await withOriginFetch(
        (u) => new Response('', { status: u.hostname.startsWith(dpId) ? 503 : 200 }),
        async () => {
          for (let k = 0; k < 2; k++) await i.checkHealth(pool());
        },
      );
      slots = perSlot(i);
      for (const s of dpSlots) expect(slots[s]?.entries ?? 0).toBe(0);
      // It may come back with other engines: nothing is pinned there until a scrape names them.
      expect(i.snapshot('prefix')!.replicas.find((r) => r.id === dpId)!.engines).toBeUndefined();
    });
  });

  it('a replica moved to another URL or removed and added again is unpinned until its next scrape names its engines', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix'); // binds the object to its pool
      const ids = pool().replicas.map((r) => r.id);
      const dpId = ids[0]!;
      const only = { exclude: ids.filter((x) => x !== dpId) };
      const blocks = blockHashes(doc('moved'), { maxBlocks: 512 });
      await scrape(i, () => metrics(100, TWO));
      const a = ok(i.acquire(req({ key: spread(1), blocks, ...only })));
      expect(a.replica.dpRank).toBeDefined();
      i.release(a.leaseId, { status: 200 });
      const url = pool().replicas[0]!.url;
      expect(i.upsertReplica('prefix', { id: dpId, url: url.replace('://', '://moved-'), auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
      const b = ok(i.acquire(req({ key: spread(1), blocks, ...only })));
      expect(b.replica.dpRank).toBeUndefined();
      expect(b.matchedBlocks).toBe(-1); // what the old engines held is forgotten
      i.release(b.leaseId, { status: 200 });
      await scrape(i, () => metrics(200, TWO));
      const c = ok(i.acquire(req({ key: spread(1), blocks, ...only })));
      expect(c.replica.dpRank).toBeDefined();
      i.release(c.leaseId, { status: 200 });
      // vLLM refused the rank (its engines changed since the scrape): unpinned until the next scrape.
      const e = ok(i.acquire(req({ key: spread(1), blocks, ...only })));
      expect(e.replica.dpRank).toBeDefined();
      i.release(e.leaseId, { status: 400, rankRefused: true });
      expect(i.snapshot('prefix')!.replicas.find((r) => r.id === dpId)!.engines).toBeUndefined();
      const f = ok(i.acquire(req({ key: spread(1), blocks, ...only })));
      expect(f.replica.dpRank).toBeUndefined();
      i.release(f.leaseId, { status: 200 });
      await scrape(i, () => metrics(300, TWO));
      expect(i.snapshot('prefix')!.replicas.find((r) => r.id === dpId)!.engines).toHaveLength(2);
      expect(i.removeReplica('prefix', dpId).ok).toBe(true);
      expect(i.upsertReplica('prefix', { id: dpId, url, auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
      const d = ok(i.acquire(req({ key: spread(1), blocks, ...only })));
      expect(d.replica.dpRank).toBeUndefined();
      i.release(d.leaseId, { status: 200 });
    });
  });

  it('a pool that is not prefix-aware pins nothing: vLLM\'s balancer, which sees every client, places its requests', async () => {
    await inDO(freshStub(), async (i) => {
      const chat = loadConfig(env.ROUTER_CONFIG).poolByName.get('chat')!;
      i.snapshot('chat');
      await withOriginFetch(() => new Response(metrics(100, TWO)), () => i.scrapeMetrics(chat));
      for (const r of i.snapshot('chat')!.replicas) expect(r.engines).toBeUndefined();
      const l = ok(i.acquire({ pool: 'chat', key: spread(3), keyKind: 'header' }));
      expect(l.replica.dpRank).toBeUndefined();
      i.release(l.leaseId, { status: 200 });
    });
  });
});
