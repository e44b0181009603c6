// Review of #17's data-parallel scrape (src/coordinator/pool-coordinator.ts scrapeOne,
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

type Stub = DurableObjectStub<PoolCoordinator>;
const freshStub = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`dp-race-${crypto.randomUUID()}`));
const inDO = <R>(stub: Stub, fn: (i: PoolCoordinator) => R | Promise<R>) => runInDurableObject<PoolCoordinator, R>(stub, fn);
const req = (over: Partial<AcquireRequest>): AcquireRequest => ({ pool: 'prefix', key: 1, keyKind: 'header', ...over });
const pool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('prefix')!;
const perSlot = (i: PoolCoordinator) => (i as unknown as { prefixIndex: PrefixIndex }).prefixIndex.stats().perReplica;
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

async function withFetch(answer: (url: URL) => Response, run: () => Promise<void>): Promise<void> {
  await new Promise((r) => setTimeout(r, 5)); // workerd's clock moves across I/O only
  const real = globalThis.fetch;
  globalThis.fetch = (async (input: RequestInfo | URL) => answer(new URL(input instanceof Request ? input.url : String(input)))) as typeof fetch;
  try {
    await run();
  } finally {
    globalThis.fetch = real;
  }
}

describe('data-parallel scrape vs admin changes and partial scrapes', () => {
  it('a replica removed while its scrape is in flight leaves no index slot behind', async () => {
    await inDO(freshStub(), async (i) => {
      i.snapshot('prefix');
      const dpId = pool().replicas[0]!.id;
      await withFetch(() => new Response(metrics(100, 2)), () => i.scrapeMetrics(pool()));
      for (let k = 0; k < 8; k++) i.release(ok(i.acquire(req({ key: 7 + k, blocks: blockHashes(doc(`r${k}`), { maxBlocks: 512 }) }))).leaseId, { status: 200 });
      // The admin removes the replica while the coordinator waits for its /metrics.
      await withFetch(
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
      await withFetch(
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
      await withFetch(() => new Response(metrics(100, 2)), () => i.scrapeMetrics(pool()));
      const blocks = blockHashes(doc('kept'), { maxBlocks: 512 });
      const a = ok(i.acquire(req({ key: 11, blocks, ...only })));
      expect(a.replica.dpRank).toBeDefined();
      i.release(a.leaseId, { status: 200 });
      const slot = engineSlotId(dpId, a.replica.dpRank!);
      const held = perSlot(i)[slot]!.entries;
      expect(held).toBeGreaterThan(0);
      // Counters still rising (no restart), but this answer names no engine's cache config.
      await withFetch(() => new Response(metrics(200, 2, false)), () => i.scrapeMetrics(pool()));
      expect(perSlot(i)[slot]?.entries ?? 0).toBe(held);
      const b = ok(i.acquire(req({ key: 11, blocks, ...only })));
      expect(b.replica.dpRank).toBe(a.replica.dpRank);
      i.release(b.leaseId, { status: 200 });
    });
  });
});
