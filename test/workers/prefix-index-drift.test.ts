// The coordinator's prefix index follows the engine (#17): a route recorded at pick time is taken
// back when its request fails; a detected vLLM restart (counter reset in /metrics) clears that
// replica's entries; the capacity is the free KV (num_gpu_blocks × (1 − kv_cache_usage_perc)).
// /metrics is answered by a stub fetch inside the object.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import { loadConfig } from '../../src/config';
import { blockHashes } from '../../src/core/blocks';
import { anchorLength, type PrefixIndex } from '../../src/core/prefix-index';
import { withOriginFetch } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
const freshStub = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`drift-${crypto.randomUUID()}`));
const inDO = <R>(stub: Stub, fn: (i: PoolCoordinator) => R | Promise<R>) => runInDurableObject<PoolCoordinator, R>(stub, fn);
const req = (over: Partial<AcquireRequest>): AcquireRequest => ({ pool: 'prefix', key: 1, keyKind: 'header', ...over });
const pool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('prefix')!;
const indexOf = (i: PoolCoordinator) => (i as unknown as { state: { prefixIndex: PrefixIndex | null } }).state.prefixIndex;

function ok(r: AcquireResult): Extract<AcquireResult, { ok: true }> {
  if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
  return r;
}

const doc = (tag: string) => Array.from({ length: 40 }, (_, k) => `${tag} paragraph ${k} of a prompt long enough to fill blocks; `).join('');

/** A vLLM V1 /metrics body: one label set per engine. */
function metrics(queries: number, hits: number, engines: { blocks: number; usage: number }[]): string {
  const lines: string[] = [];
  engines.forEach((e, k) => {
    const l = `engine="${k}",model_name="m"`;
    lines.push(`vllm:prefix_cache_queries_total{${l}} ${queries}`, `vllm:prefix_cache_hits_total{${l}} ${hits}`);
    lines.push(`vllm:kv_cache_usage_perc{${l}} ${e.usage}`);
    lines.push(`vllm:cache_config_info{block_size="16",${l},num_gpu_blocks="${e.blocks}"} 1.0`);
    lines.push(`vllm:num_requests_running{${l}} 0`, `vllm:num_requests_waiting{${l}} 0`);
  });
  return lines.join('\n') + '\n';
}

/** Run one scrape round with every replica answering `body(host)`. */
const scrape = (i: PoolCoordinator, body: (host: string) => string): Promise<void> =>
  withOriginFetch((u) => new Response(body(u.hostname), { headers: { 'content-type': 'text/plain; version=0.0.4' } }), () => i.scrapeMetrics(pool()));

describe('prefix index drift', () => {
  it('records a route at pick time and takes it back when its request fails (no 2xx)', async () => {
    await inDO(freshStub(), (i) => {
      const blocks = blockHashes(doc('a'), { maxBlocks: 512 });
      const entries = () => i.snapshot('prefix')!.prefixIndex!.entries;
      for (const outcome of [{ status: 503 }, { status: 400 }, { status: 0, error: 'connect' as const }]) {
        const l = ok(i.acquire(req({ key: 12, blocks })));
        // vLLM caches the prompt once its prefill is done: the index knows it while the stream runs.
        expect(entries()).toBe(anchorLength(blocks.length));
        i.release(l.leaseId, outcome);
        expect(entries(), `after ${outcome.status}`).toBe(0);
      }
      const a = ok(i.acquire(req({ key: 11, blocks })));
      i.release(a.leaseId, { status: 200 });
      expect(entries()).toBe(anchorLength(blocks.length));
      // A continuation that fails takes back only the blocks it added, not the prefix it found.
      const longer = blockHashes(doc('a') + doc('more'), { maxBlocks: 512 });
      const b = ok(i.acquire(req({ key: 11, blocks: longer })));
      expect(b.replica.id).toBe(a.replica.id);
      expect(b.matchedBlocks).toBe(anchorLength(blocks.length));
      expect(entries()).toBe(anchorLength(longer.length));
      i.release(b.leaseId, { status: 502 });
      expect(indexOf(i)!.stats().perReplica[a.replica.id]!.entries).toBe(anchorLength(blocks.length));
      // A second release of the same lease changes nothing.
      i.release(b.leaseId, { status: 502 });
      expect(entries()).toBe(anchorLength(blocks.length));
    });
  });

  it('clears a replica on a detected vLLM restart (its counters went down), keeps the others', async () => {
    await inDO(freshStub(), async (i) => {
      const held = new Map<string, number>();
      for (let k = 0; k < 12; k++) {
        const blocks = blockHashes(doc(`s${k}`), { maxBlocks: 512 });
        const a = ok(i.acquire(req({ key: 1000 + k * 7919, blocks })));
        i.release(a.leaseId, { status: 200 });
        held.set(a.replica.id, (held.get(a.replica.id) ?? 0) + anchorLength(blocks.length));
      }
      const victim = [...held.keys()][0]!;
      const healthy = [{ blocks: 100_000, usage: 0 }];
      await scrape(i, () => metrics(50_000, 20_000, healthy));
      await scrape(i, () => metrics(60_000, 25_000, healthy));
      const before = indexOf(i)!.stats().perReplica;
      expect(before[victim]!.entries).toBe(held.get(victim));
      // The victim restarted: its counters start again from a small value. Health never saw it down.
      await scrape(i, (host) => (host.startsWith(victim) ? metrics(300, 100, healthy) : metrics(70_000, 30_000, healthy)));
      const after = indexOf(i)!.stats().perReplica;
      expect(after[victim]?.entries ?? 0).toBe(0);
      for (const [id, n] of held) if (id !== victim) expect(after[id]!.entries).toBe(n);
      expect(i.snapshot('prefix')!.replicas.find((r) => r.id === victim)!.healthy).toBe(true);
    });
  });

  it('sizes the index by the free KV plus its own prompts in flight, and trims when running requests pin more', async () => {
    await inDO(freshStub(), async (i) => {
      const blocks = blockHashes(doc('cap'), { maxBlocks: 512 });
      const a = ok(i.acquire(req({ key: 5, blocks })));
      i.release(a.leaseId, { status: 200 });
      // 16,000 blocks at 62.5% used: 6,000 free vLLM blocks × 16 tokens / 64 per router block = 1,500.
      // (Data-parallel engines get one slot each: dp-engines.test.ts.)
      await scrape(i, () => metrics(10, 5, [{ blocks: 16_000, usage: 0.625 }]));
      expect(indexOf(i)!.stats().perReplica[a.replica.id]!.capacity).toBe(1_500);
      // Running requests pin almost everything: 1% free of 16,000 = 160 blocks = 40 router blocks.
      await scrape(i, () => metrics(20, 10, [{ blocks: 16_000, usage: 0.99 }]));
      const s = indexOf(i)!.stats().perReplica[a.replica.id]!;
      expect(s.capacity).toBe(40);
      expect(s.entries).toBeLessThanOrEqual(40);
      // Its own requests in flight there pin their prompts too, and the index holds them: they count.
      const held = ok(i.acquire(req({ key: 5, blocks })));
      expect(held.replica.id).toBe(a.replica.id);
      await scrape(i, () => metrics(30, 15, [{ blocks: 16_000, usage: 0.99 }]));
      expect(indexOf(i)!.stats().perReplica[a.replica.id]!.capacity).toBe(40 + anchorLength(blocks.length));
      i.release(held.leaseId, { status: 200 });
      await scrape(i, () => metrics(40, 20, [{ blocks: 16_000, usage: 0.99 }]));
      expect(indexOf(i)!.stats().perReplica[a.replica.id]!.capacity).toBe(40);
    });
  });
});
