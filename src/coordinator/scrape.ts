// vLLM /metrics scraping: one replica's engine sample (prefix-cache hit rate window, queue,
// KV capacity and data-parallel engines, dp-engines.ts) taken into its state. I/O: metrics fetches to the replicas.

import { replicaEndpoint, type PoolRuntime } from '../config.js';
import { resolveOriginAuth } from '../origin/origin-auth.js';
import { applyEngineScrape, dropEngines, pushCapacities, slotBudget } from './dp-engines.js';
import { extractEngineSample, kvCapacity, kvCapacityFromTotals } from '../engines/index.js';
import { readCapped, runLimited } from './origin-fetch.js';
import { parsePromText } from '../engines/prom-text.js';
import type { PoolState, ReplicaLive } from './state.js';
import { pushSample, windowHitRate } from '../engines/hit-rate.js';

const SCRAPE_TIMEOUT_MS = 2_000;
const MAX_SCRAPE_BYTES = 4 * 1024 * 1024;

/** Scrape every replica's /metrics once, at most healthConcurrency at once. */
export async function scrapeMetrics(s: PoolState, pool: PoolRuntime): Promise<void> {
  await runLimited(s.replicas.map((r) => () => scrapeOne(s, r, pool)), pool.healthConcurrency);
}

/** Scrape one replica: its vLLM view, hit-rate window and engines; an answer about an origin it no longer is, is dropped. */
export async function scrapeOne(s: PoolState, r: ReplicaLive, pool: PoolRuntime): Promise<void> {
  const at = Date.now();
  const url = r.url;
  const auth = resolveOriginAuth(s.env, r.auth);
  if (!auth.ok) {
    r.vllm = { ...r.vllm, lastScrapeAt: at, scrapeError: auth.problem };
    return;
  }
  try {
    // Never follow an origin's redirect (it could point anywhere, with our credentials).
    const res = await fetch(replicaEndpoint(r.url, '/metrics'), { headers: auth.headers, redirect: 'manual', signal: AbortSignal.timeout(Math.min(SCRAPE_TIMEOUT_MS, pool.scrapeIntervalMs)) });
    if (!res.ok) {
      await res.body?.cancel();
      r.vllm = { ...r.vllm, lastScrapeAt: at, scrapeError: res.status >= 300 && res.status < 400 ? `redirect (status ${res.status}) not followed` : `status ${res.status}` };
      return;
    }
    // Read at most MAX_SCRAPE_BYTES; the rest is cancelled, never buffered.
    const parsed = parsePromText(await readCapped(res, MAX_SCRAPE_BYTES));
    // Removed or moved to another origin meanwhile: this answer is not about it any more (its
    // engines and capacities would re-create dropped index slots or pin the new origin to ranks it may not have).
    if (!s.replicas.includes(r) || r.url !== url) return;
    const sample = extractEngineSample(parsed, at);
    const resetsBefore = r.hitWindow.resets;
    r.hitWindow = pushSample(r.hitWindow, sample, pool.hitRateWindowMs);
    // A counter reset is a vLLM restart: every engine's prefix cache is empty, whatever health
    // saw (vLLM's counters live in the API server process: they reset together, dp-engines.ts).
    if (r.hitWindow.resets > resetsBefore) dropEngines(s.prefixIndex, r.dp.slots, r.id);
    const kv = kvCapacity(parsed) ?? kvCapacityFromTotals(sample.numGpuBlocks, sample.blockSize, sample.kvUsage);
    const engines = applyEngineScrape(r.dp, r.id, kv, pool.engine === 'vllm' && pool.dataParallelPinning !== false && pool.strategyImpl.usesPrefix === true, r.leaseBlocks, slotBudget(s.replicas, r));
    dropEngines(s.prefixIndex, engines.dropped);
    if (engines.dp !== r.dp) s.engineMatcher.invalidate();
    r.dp = engines.dp;
    if (s.prefixIndex) pushCapacities(s.prefixIndex, r.dp);
    r.vllm = {
      generation: sample.generation,
      hitRate: windowHitRate(r.hitWindow),
      waiting: sample.waiting ?? null,
      running: sample.running ?? null,
      kvUsage: sample.kvUsage ?? null,
      blockSize: sample.blockSize ?? null,
      numGpuBlocks: sample.numGpuBlocks ?? null,
      lastScrapeAt: at,
      scrapeError: null,
    };
    s.pickState.moved(r); // its engine queue (inflight+waiting)
  } catch (e) {
    r.vllm = { ...r.vllm, lastScrapeAt: at, scrapeError: (e as Error).name === 'TimeoutError' ? 'timeout' : 'connection failed' };
  }
}
