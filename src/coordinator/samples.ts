// The dashboard's history and the pool's alerts: a sample of per-replica rates every SAMPLE_MS,
// routing keys counted for the hot-key alert, queue imbalance and hot keys evaluated. I/O: alert events logged.

import type { KeyKind } from '../core/index.js';
import type { PoolRuntime } from '../config.js';
import { createHotKeyState, evaluateHotKeys, evaluateImbalance, recordHotKey, type HotKeyAlert } from './alerts.js';
import { isHealthy, type PoolState } from './state.js';
import { histogramQuantile, type Histogram } from './stats.js';
import { SAMPLE_COUNT, type ReplicaSample } from './types.js';
import { windowHitRate } from '../engines/hit-rate.js';

/** Count one routed key (its hash, never the key) towards the hot-key alert. */
export function noteRoutingKey(s: PoolState, pool: PoolRuntime, now: number, kind: KeyKind, keyHash: string): void {
  s.board.hotKeys ??= createHotKeyState({ windowMs: pool.hotKeyWindowMs });
  recordHotKey(s.board.hotKeys, now, kind, keyHash);
}

/** One dashboard sample: per-replica rates over the interval since the previous one. */
export function takeSample(s: PoolState, now: number): void {
  const replicas: Record<string, ReplicaSample> = {};
  for (const r of s.replicas) {
    const prev = r.prevSample;
    const st = r.stats;
    // Over the requests whose engine reported cached tokens only (stats.ts reportedHitRate).
    const dPrompt = prev ? st.cacheReportedPromptTokens - prev.cacheReportedPromptTokens : 0;
    const dTtft: Histogram | null = prev
      ? { counts: st.ttft.counts.map((c, i) => c - (prev.ttft.counts[i] ?? 0)), sum: st.ttft.sum - prev.ttft.sum, count: st.ttft.count - prev.ttft.count }
      : null;
    replicas[r.id] = {
      inFlight: r.inFlight,
      waiting: r.vllm.waiting,
      requests: prev ? st.requests - prev.requests : 0,
      routerHitRate: prev && dPrompt > 0 ? (st.cachedTokens - prev.cachedTokens) / dPrompt : null,
      vllmHitRate: windowHitRate(r.hitWindow),
      ttftP50: dTtft ? histogramQuantile(dTtft, 0.5) : null,
      ttftP95: dTtft ? histogramQuantile(dTtft, 0.95) : null,
      healthy: isHealthy(r, now),
    };
    r.prevSample = { requests: st.requests, promptTokens: st.promptTokens, cachedTokens: st.cachedTokens, cacheReportedPromptTokens: st.cacheReportedPromptTokens, ttft: { counts: [...st.ttft.counts], sum: st.ttft.sum, count: st.ttft.count } };
  }
  s.board.samples.push({ at: now, replicas });
  if (s.board.samples.length > SAMPLE_COUNT) s.board.samples.splice(0, s.board.samples.length - SAMPLE_COUNT);
}

/** Queue imbalance and hot keys: raised and cleared events logged, the alerts now active kept for the snapshot. */
export function evaluateAlerts(s: PoolState, pool: PoolRuntime, now: number): void {
  const waiting: Record<string, number> = {};
  for (const r of s.replicas) if (r.vllm.waiting !== null && now - r.vllm.lastScrapeAt < 3 * pool.scrapeIntervalMs) waiting[r.id] = r.vllm.waiting;
  const imb = evaluateImbalance(s.board.imbalance, { now, waiting }, { factor: pool.imbalanceFactor, offset: pool.imbalanceOffset, holdMs: pool.imbalanceHoldMs });
  s.board.imbalance = imb.state;
  for (const e of imb.events) console.log(JSON.stringify({ type: 'alert', alert: 'queue_imbalance', event: e.type, pool: pool.name, replica: e.replica, waiting: e.waiting, threshold: e.threshold, median: e.median, reason: e.reason }));
  let hot: HotKeyAlert[] = [];
  if (s.board.hotKeys) {
    const res = evaluateHotKeys(s.board.hotKeys, now, { threshold: pool.hotKeyShare, minCount: pool.hotKeyMinCount });
    s.board.hotKeys = res.state;
    hot = res.alerts;
    for (const e of res.events) console.log(JSON.stringify({ type: 'alert', alert: 'hot_key', event: e.type, pool: pool.name, keyKind: e.keyKind, keyHash: e.keyHash, share: Math.round(e.share * 1000) / 1000 }));
  }
  s.board.alerts = [...imb.alerts, ...hot];
}
