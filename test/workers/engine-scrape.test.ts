// The coordinator reading SGLang and llama.cpp replicas (src/engines/vllm.ts
// extractEngineSample): one scrape round per call with a stub fetch inside the object; the
// replica view (hit rate from counter deltas, waiting, running, KV usage) and the load signal
// `inflight+waiting` built on it.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import { loadConfig } from '../../src/config';
import { withOriginFetch } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
const freshStub = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`engines-${crypto.randomUUID()}`));
const pool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('queued')!;

/** SGLang: scheduler gauges with its label set, tokenizer counters (collector.py names). */
const sglang = (prompt: number, cached: number, queue: number, running: number, usage: number) =>
  [
    '# TYPE sglang:num_running_reqs gauge',
    `sglang:num_running_reqs{engine_type="unified",model_name="queued-model",pp_rank="0",tp_rank="0"} ${running}`,
    '# TYPE sglang:num_queue_reqs gauge',
    `sglang:num_queue_reqs{engine_type="unified",model_name="queued-model",pp_rank="0",tp_rank="0"} ${queue}`,
    '# TYPE sglang:token_usage gauge',
    `sglang:token_usage{engine_type="unified",model_name="queued-model",pp_rank="0",tp_rank="0"} ${usage}`,
    '# TYPE sglang:prompt_tokens_total counter',
    `sglang:prompt_tokens_total{model_name="queued-model"} ${prompt}`,
    '# TYPE sglang:cached_tokens_total counter',
    `sglang:cached_tokens_total{model_name="queued-model"} ${cached}`,
  ].join('\n') + '\n';

/** llama.cpp server: unlabelled counters and gauges (server-task.cpp to_metrics). */
const llamacpp = (processed: number, cached: number, deferred: number, processing: number) =>
  [
    '# TYPE llamacpp:prompt_tokens_total counter',
    `llamacpp:prompt_tokens_total ${processed}`,
    '# TYPE llamacpp:prompt_tokens_cached_total counter',
    `llamacpp:prompt_tokens_cached_total ${cached}`,
    '# TYPE llamacpp:requests_processing gauge',
    `llamacpp:requests_processing ${processing}`,
    '# TYPE llamacpp:requests_deferred gauge',
    `llamacpp:requests_deferred ${deferred}`,
  ].join('\n') + '\n';

const scrape = (i: PoolCoordinator, body: (host: string) => string): Promise<void> => withOriginFetch((u) => new Response(body(u.hostname)), () => i.scrapeMetrics(pool()));

describe('SGLang and llama.cpp replicas in the coordinator', () => {
  it('hit rate, waiting, running and KV usage from each engine\'s own names', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), async (i) => {
      i.snapshot('queued');
      await scrape(i, (h) => (h.startsWith('q1') ? sglang(1000, 200, 5, 7, 0.4) : llamacpp(500, 100, 2, 3)));
      await scrape(i, (h) => (h.startsWith('q1') ? sglang(3000, 1700, 6, 8, 0.5) : llamacpp(600, 400, 1, 4)));
      const view = (id: string) => i.snapshot('queued')!.replicas.find((r) => r.id === id)!.vllm;
      // SGLang: Δcached / Δprompt = 1500 / 2000; llama.cpp: Δcached / (Δprocessed + Δcached) = 300 / 400.
      expect(view('q1')).toMatchObject({ generation: 'sglang-tokens', hitRate: 0.75, waiting: 6, running: 8, kvUsage: 0.5, scrapeError: null });
      expect(view('q2')).toMatchObject({ generation: 'llamacpp-tokens', hitRate: 0.75, waiting: 1, running: 4, kvUsage: null, scrapeError: null });
    });
  });

  it('inflight+waiting counts the engine\'s own queue: a least-load pick avoids the SGLang replica with a queue', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), async (i) => {
      i.snapshot('queued');
      await scrape(i, (h) => (h.startsWith('q1') ? sglang(10, 0, 40, 16, 0.9) : llamacpp(10, 0, 0, 1)));
      // Without the queue the two tie and the pick is random: 12 in a row on q2 by chance is 1 in 4096.
      for (let n = 0; n < 12; n++) {
        const r = i.acquire({ pool: 'queued', key: null, keyKind: 'none' });
        if (!r.ok) throw new Error(r.reason);
        expect(r.replica.id).toBe('q2');
        i.release(r.leaseId, { status: 200 });
      }
    });
  });
});
