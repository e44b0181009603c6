// Review of #17's data-parallel scrape (src/coordinator/scrape.ts scrapeOne,
// dp-engines.ts applyEngineScrape): a scrape answers after an await, so the replica it started
// for may have been removed or moved to another origin by then; what that answer says must not
// land on the index or on the replica's new origin. And a scrape that names no engine at all
// (no vllm:cache_config_info: a truncated or partial /metrics) says nothing about the engines:
// it must not unpin the replica and drop what its engines hold.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import { loadConfig } from '../../src/config';
import { blockHashes } from '../../src/core/blocks';
import type { PrefixIndex } from '../../src/core/prefix-index';
import { engineSlotId } from '../../src/coordinator/dp-engines';
import { expireLeases } from '../../src/coordinator/leases';
import type { PoolState } from '../../src/coordinator/state';
import { withOriginFetch } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
const freshStub = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`dp-race-${crypto.randomUUID()}`));
const inDO = <R>(stub: Stub, fn: (i: PoolCoordinator) => R | Promise<R>) => runInDurableObject<PoolCoordinator, R>(stub, fn);
const req = (over: Partial<AcquireRequest>): AcquireRequest => ({ pool: 'prefix', key: 1, keyKind: 'header', ...over });
const pool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('prefix')!;
const perSlot = (i: PoolCoordinator) => (i as unknown as { state: { prefixIndex: PrefixIndex } }).state.prefixIndex.stats().perReplica;
const doc = (tag: string) => Array.from({ length: 40 }, (_, k) => `${tag} paragraph ${k} of a prompt long enough to fill blocks; `).join('');

function ok(r: AcquireResult): Extract<AcquireResult, { ok: true }> {
  if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
  return r;
}

function metrics(queries: number, engines: number, withConfig = true): string {
  const lines: string[] = [];
  for (let k = 0; k < engines; k++) {
    const l = `engine="${k}",model_name="m"`;
    lines.push(`vllm:prefix_cache_queries_total{${l}} ${queries}`, `vllm:prefix_cache_hits_total{${l}} ${Math.floor(queries / 2)}`, `vllm:kv_cache_usage_perc{${l}} 0.25`, `vllm:num_requests_waiting{${l}} 0`);
    if (withConfig) lines.push(`vllm:cache_config_info{block_size="16",${l},num_gpu_blocks="4000"} 1.0`);
  }
  return lines.join('\n') + '\n';
}

describe('data-parallel scrape vs admin changes and partial scrapes', () => {
  it('a replica removed while its scrape is in flight leaves no index slot behind', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const dpId = pool().replicas[0]!.id;
      await withOriginFetch(() => new Response(metrics(100, 2)), () => i.scrapeMetrics(pool()));
      for (let k = 0; k < 8; k++) i.release(ok(i.acquire(req({ key: 7 + k, blocks: blockHashes(doc(`r${k}`), { maxBlocks: 512 }) }))).leaseId, { status: 200 });
      // The admin removes the replica while the coordinator waits for its /metrics.
      await withOriginFetch(
        (u) => {
          if (u.hostname.startsWith(dpId)) expect(i.removeReplica('prefix', dpId).ok).toBe(true);
          return new Response(metrics(200, 2));
        },
        () => i.scrapeMetrics(pool()),
      );
      const left = Object.keys(perSlot(i)).filter((s) => s === dpId || s.startsWith(`${dpId}#`));
      expect(left).toEqual([]);
    });
  });

  it("a replica moved to another URL while its scrape is in flight does not take the old origin's engines", async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const ids = pool().replicas.map((r) => r.id);
      const dpId = ids[0]!;
      const url = pool().replicas[0]!.url;
      const only = { exclude: ids.filter((x) => x !== dpId) };
      await withOriginFetch(
        (u) => {
          // The old origin had two engines; the admin points the replica at a new one meanwhile.
          if (u.hostname.startsWith(dpId)) expect(i.upsertReplica('prefix', { id: dpId, url: url.replace('://', '://moved-'), auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
          return new Response(metrics(100, 2));
        },
        () => i.scrapeMetrics(pool()),
      );
      // Nothing is known of the new origin's engines yet: no rank (a rank it does not have is vLLM's 400).
      const a = ok(i.acquire(req({ key: 3, blocks: blockHashes(doc('moved'), { maxBlocks: 512 }), ...only })));
      expect(a.replica.dpRank).toBeUndefined();
      i.release(a.leaseId, { status: 200 });
    });
  });

  it('a scrape without vllm:cache_config_info keeps the engines and what they hold', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const ids = pool().replicas.map((r) => r.id);
      const dpId = ids[0]!;
      const only = { exclude: ids.filter((x) => x !== dpId) };
      await withOriginFetch(() => new Response(metrics(100, 2)), () => i.scrapeMetrics(pool()));
      const blocks = blockHashes(doc('kept'), { maxBlocks: 512 });
      const a = ok(i.acquire(req({ key: 11, blocks, ...only })));
      expect(a.replica.dpRank).toBeDefined();
      i.release(a.leaseId, { status: 200 });
      const slot = engineSlotId(dpId, a.replica.dpRank!);
      const held = perSlot(i)[slot]!.entries;
      expect(held).toBeGreaterThan(0);
      // Counters still rising (no restart), but this answer names no engine's cache config.
      await withOriginFetch(() => new Response(metrics(200, 2, false)), () => i.scrapeMetrics(pool()));
      expect(perSlot(i)[slot]?.entries ?? 0).toBe(held);
      const b = ok(i.acquire(req({ key: 11, blocks, ...only })));
      expect(b.replica.dpRank).toBe(a.replica.dpRank);
      i.release(b.leaseId, { status: 200 });
    });
  });
});

describe('data-parallel replica and the under-served rule', () => {
  it('requests its API cannot pin still count as routes to the replica (else it looks under-served and pulls every new pick)', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const dpId = pool().replicas[0]!.id;
      // pa1 has two engines, the others one.
      await withOriginFetch((u) => new Response(metrics(100, u.hostname.startsWith(dpId) ? 2 : 1)), () => i.scrapeMetrics(pool()));
      // Responses-style traffic (vLLM ignores the rank there): unrelated prompts, one at a time.
      const got = new Map<string, number>();
      const n = 64;
      for (let k = 0; k < n; k++) {
        const l = ok(i.acquire(req({ key: Math.imul(k + 1, 0x9e3779b1) >>> 0, blocks: blockHashes(doc(`u${k}`), { maxBlocks: 512 }), pinEngine: false })));
        expect(l.replica.dpRank).toBeUndefined();
        got.set(l.replica.id, (got.get(l.replica.id) ?? 0) + 1);
        i.release(l.leaseId, { status: 200 });
      }
      // Four replicas of equal weight: none takes more than twice its share.
      expect(got.get(dpId) ?? 0).toBeLessThanOrEqual(n / 2);
    });
  });
});

describe('engine lease counts', () => {
  it('return to zero on every way a lease ends (release, settle, expiry, a restored lease, a layout replaced meanwhile)', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const ids = pool().replicas.map((r) => r.id);
      const dpId = ids[0]!;
      const only = { exclude: ids.filter((x) => x !== dpId) };
      const engines = () => i.snapshot('prefix')!.replicas.find((r) => r.id === dpId)!.engines!.map((e) => e.inFlight);
      const total = () => engines().reduce((a, b) => a + b, 0);
      await withOriginFetch(() => new Response(metrics(100, 2)), () => i.scrapeMetrics(pool()));
      const take = (k: number) => ok(i.acquire(req({ key: 100 + k, blocks: blockHashes(doc(`l${k}`), { maxBlocks: 512 }), ...only })));
      const leases = Array.from({ length: 6 }, (_, k) => take(k));
      expect(leases.every((l) => l.replica.dpRank !== undefined)).toBe(true);
      expect(total()).toBe(6);
      i.release(leases[0]!.leaseId, { status: 200 });
      i.release(leases[0]!.leaseId, { status: 200 }); // idempotent
      i.release(leases[1]!.leaseId, { status: 502 });
      expect(total()).toBe(4);
      i.settle('prefix', { releases: [{ id: leases[2]!.leaseId, outcome: { status: 200 } }] });
      expect(total()).toBe(3);
      // Reaped at its deadline (the Worker died): counted off too.
      const state = (i as unknown as { state: PoolState }).state;
      state.leases.byId.get(leases[3]!.leaseId)!.deadline = 0;
      expireLeases(state, Date.now());
      expect(total()).toBe(2);
      // Its renewal brings it back (no engine known); its release then changes no engine count.
      const ren = { id: leases[3]!.leaseId, replica: dpId, tenant: '', deadline: Date.now() + 30_000, startedAt: Date.now(), spilled: false };
      expect(i.settle('prefix', { releases: [], renew: [ren] }).restored).toBe(1);
      expect(total()).toBe(2);
      i.release(leases[3]!.leaseId, { status: 200 });
      expect(total()).toBe(2);
      // A restart with three engines replaces the layout: the new one starts empty, the old leases end without touching it.
      await withOriginFetch(() => new Response(metrics(1, 3)), () => i.scrapeMetrics(pool()));
      expect(engines()).toEqual([0, 0, 0]);
      const fresh = take(50);
      for (const l of leases.slice(4)) i.release(l.leaseId, { status: 200 });
      expect(total()).toBe(1);
      i.release(fresh.leaseId, { status: 200 });
      expect(engines()).toEqual([0, 0, 0]);
    });
  });
});

describe('a hostile origin\'s engine layout', () => {
  it('flipping every scrape (sizes, labels, duplicates, absurd values) leaves only the current slots and never throws', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const ids = pool().replicas.map((r) => r.id);
      const dpId = ids[0]!;
      const only = { exclude: ids.filter((x) => x !== dpId) };
      const series = (labels: string[], blocks = '4000', usage = '0.25') =>
        labels.map((e) => `vllm:kv_cache_usage_perc{engine="${e}"} ${usage}\nvllm:cache_config_info{block_size="16",engine="${e}",num_gpu_blocks="${blocks}"} 1.0`).join('\n') + '\n';
      const range = (n: number, from = 0) => Array.from({ length: n }, (_, k) => String(from + k));
      const layouts = [
        series(range(2)),
        series(range(3)),
        series(range(5000)), // thousands of engines: over the pool's slot budget, one slot
        series(range(2, 7)), // a contiguous slice (hybrid balancing)
        series(['0', '0', '1']), // duplicate labels
        series(['0', '00', '1']),
        series(['a', 'b']),
        series(range(2), '999999999999999', 'NaN'),
        series(range(2), '-5', '-1'),
        series(range(3), '1', '1e308'),
        series(['999998', '999999']),
        '',
        series(range(4)),
      ];
      let k = 0;
      for (let round = 0; round < 2; round++) {
        for (const body of layouts) {
          await withOriginFetch((u) => new Response(u.hostname.startsWith(dpId) ? body : series([''])), () => i.scrapeMetrics(pool()));
          const l = ok(i.acquire(req({ key: 500 + k, blocks: blockHashes(doc(`f${k++}`), { maxBlocks: 512 }), ...only })));
          i.release(l.leaseId, { status: 200 });
          const snap = i.snapshot('prefix')!.replicas.find((r) => r.id === dpId)!;
          const current = snap.engines ? snap.engines.map((e) => engineSlotId(dpId, e.rank)) : [dpId];
          const held = Object.keys(perSlot(i)).filter((s) => s === dpId || s.startsWith(`${dpId}#`));
          for (const s of held) expect(current, `${s} after layout ${layouts.indexOf(body)}`).toContain(s);
          expect(Object.keys(perSlot(i)).length).toBeLessThanOrEqual(64);
          if (l.replica.dpRank !== undefined) expect(l.replica.dpRank).toBeLessThan(current.length);
        }
      }
    });
  });
});

describe('a health probe vs admin changes', () => {
  it("a replica moved to another URL while a failing probe of the old one is in flight is not marked down by it", async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const dpId = pool().replicas[0]!.id;
      const url = pool().replicas[0]!.url;
      const down = (h: string) => h.startsWith(dpId);
      await withOriginFetch((u) => new Response('', { status: down(u.hostname) ? 503 : 200 }), () => i.checkHealth(pool())); // fall 2: one failure so far
      await withOriginFetch(
        (u) => {
          // The operator moves the failing replica to a new origin while its next probe is out.
          if (down(u.hostname)) expect(i.upsertReplica('prefix', { id: dpId, url: url.replace('://', '://moved-'), auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
          return new Response('', { status: down(u.hostname) ? 503 : 200 });
        },
        () => i.checkHealth(pool()),
      );
      expect(i.snapshot('prefix')!.replicas.find((r) => r.id === dpId)!.healthy).toBe(true);
    });
  });
});
