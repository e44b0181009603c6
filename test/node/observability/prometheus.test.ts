// Golden file for the Prometheus text the router serves on /metrics: a fixed two-pool snapshot
// rendered byte for byte against test/fixtures/metrics/golden.prom, then linted with
// `promtool check metrics` (Debian's `prometheus` package). Set UPDATE_GOLDEN=1 to rewrite the
// golden file, and review the diff by eye before committing it.

import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import type { PoolSnapshot, ReplicaSnapshot, VllmView } from '../../../src/coordinator/types.js';
import { emptyStats, TTFT_BUCKETS_S, type ReplicaStats } from '../../../src/coordinator/stats.js';
import { renderMetrics } from '../../../src/observability/prometheus.js';
import { promtool, promtoolMissing } from '../../helpers/promtool.js';

const GOLDEN = join(import.meta.dirname, '../../fixtures/metrics/golden.prom');
const AT = 1_767_225_600_000; // 2026-01-01T00:00:00Z

function vllm(v: Partial<VllmView>): VllmView {
  return { generation: 'v1-tokens', hitRate: null, waiting: null, running: null, kvUsage: null, blockSize: 16, numGpuBlocks: 27034, lastScrapeAt: AT - 2_000, scrapeError: null, ...v };
}

function stats(s: Partial<Omit<ReplicaStats, 'ttft'>>, ttftCounts?: number[], ttftSum = 0): ReplicaStats {
  const base = emptyStats();
  const counts = ttftCounts ?? base.ttft.counts;
  expect(counts).toHaveLength(TTFT_BUCKETS_S.length + 1);
  return { ...base, ...s, ttft: { counts, sum: ttftSum, count: counts.reduce((a, b) => a + b, 0) } };
}

function replica(id: string, r: Partial<ReplicaSnapshot>): ReplicaSnapshot {
  return {
    id,
    url: `https://${id}.vllm.example.com`,
    weight: 1,
    auth: 'bearer:ORIGIN_API_KEY',
    draining: false,
    healthy: true,
    activeUp: true,
    passiveDownUntil: 0,
    inFlight: 0,
    lastCheckAt: AT - 1_000,
    lastCheckError: null,
    stats: emptyStats(),
    vllm: vllm({}),
    ...r,
  };
}

export const FIXTURE: PoolSnapshot[] = [
  {
    pool: 'chat',
    strategy: 'bounded-hash:1.25',
    fallback: 'least-load',
    keys: ['header:x-session-id', 'tenant'],
    loadSignal: 'inflight',
    at: AT,
    leases: 3,
    expiredLeases: 2,
    prefixIndex: { entries: 12345, blocks: 4000, approxBytes: 567890, maxEntries: 1048576, evictions: 17 },
    responseAffinity: { entries: 321, pins: { hit: 40, not_found: 3, gone: 1, unavailable: 2 } },
    replicas: [
      replica('r1', {
        weight: 2,
        inFlight: 3,
        //                    ≤10ms 25ms 50ms 100ms 250ms 500ms 1s 2.5s 5s 10s 30s 60s +Inf
        stats: stats(
          { requests: 42, byStatus: { '200': 40, '502': 1, '0': 1 }, errors: 2, retries: 1, spills: 5, clientAborts: 1, earlyConnectHits: 30, earlyConnectMisses: 2, promptTokens: 120_000, cachedTokens: 96_000, cacheReportedPromptTokens: 114_000, completionTokens: 8_400, usageReports: 40, requestsWithoutCacheReport: 2, continuations: { continued: 3, failed: 1, not_attempted_response_format: 1 }, reprefillTokens: 420 },
          [0, 2, 5, 10, 12, 6, 3, 1, 0, 0, 0, 0, 1],
          75.123456789,
        ),
        vllm: vllm({ hitRate: 0.8125, waiting: 14, running: 32, kvUsage: 0.9375 }),
      }),
      replica('r2', {
        stats: stats({ requests: 7, byStatus: { '200': 7 }, promptTokens: 7_000, cachedTokens: 0, cacheReportedPromptTokens: 0, completionTokens: 700, usageReports: 7, requestsWithoutCacheReport: 7, continuations: { continued: 2 } }, [0, 0, 0, 0, 1, 4, 2, 0, 0, 0, 0, 0, 0], 3.5),
        // A replica whose scrape found no vLLM signals (not a vLLM, or metrics disabled).
        vllm: vllm({ generation: 'none', hitRate: null, waiting: null, running: null, kvUsage: null, scrapeError: 'status 404' }),
      }),
      replica('r3', {
        draining: true,
        healthy: false,
        activeUp: false,
        lastCheckError: 'connection failed',
        // Never served a request: no requests_total rows, an all-zero histogram.
        vllm: vllm({ hitRate: 0, waiting: 0, running: 0, kvUsage: 0 }),
      }),
    ],
    alerts: [
      { kind: 'queue_imbalance', replica: 'r1', raisedAt: AT - 60_000, aboveSince: AT - 660_000, waiting: 14, threshold: 4, median: 0 },
      { kind: 'hot_key', keyKind: 'session', keyHash: '9e3779b9', raisedAt: AT - 30_000, share: 0.35, guaranteed: 70, count: 72, total: 200 },
    ],
    // Flow control (#29): the queue per band.
    queue: {
      depth: { high: 0, normal: 5, low: 2 },
      admitted: { high: 3, normal: 40 },
      rejected: { 'normal|queue_timeout': 4, 'low|queue_full': 1, 'normal|queue_cancelled': 2 },
      wait: { normal: { counts: [10, 5, 5, 5, 5, 4, 3, 2, 1, 0, 0, 0, 0], sum: 12.5, count: 40 } },
      drainPerSecond: 6.3,
      tenants: [{ tenant: 'noisy', queued: 6, oldestWaitMs: 2_500 }, { tenant: 'quiet', queued: 1, oldestWaitMs: 120 }],
      boundPerReplica: 64,
      oldestWaitMs: 2_500,
      shareReserve: 1,
      reserveHeld: 7,
      preempt: true,
      preemptAsked: 5,
      preempted: 4,
    },
    samples: [],
  },
  {
    // Config restricts ids to [A-Za-z0-9_.-]; the renderer must still escape what it is given.
    pool: 'batch',
    strategy: 'least-load',
    fallback: 'least-load',
    keys: ['none'],
    loadSignal: 'inflight+waiting',
    at: AT,
    leases: 0,
    expiredLeases: 0,
    prefixIndex: null,
    replicas: [
      replica('gpu "a"\\1\nx', {
        stats: stats({ requests: 3, byStatus: { '200': 2, '503': 1 }, errors: 1, promptTokens: 300, cachedTokens: 48, cacheReportedPromptTokens: 300, completionTokens: 30, usageReports: 2, requestsWithoutCacheReport: 0 }, [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.07),
        vllm: vllm({ generation: 'v0-gauge', hitRate: 0.5, waiting: 2, running: 1, kvUsage: null }),
      }),
    ],
    alerts: [],
    samples: [],
  },
];

/** `promtool check metrics` reads the exposition on stdin; lint problems go to stdout/stderr. */
const checkMetrics = (text: string) => promtool(['check', 'metrics'], text);

describe('renderMetrics', () => {
  const text = renderMetrics(FIXTURE);

  it('matches the golden file byte for byte', () => {
    if (process.env.UPDATE_GOLDEN === '1' || !existsSync(GOLDEN)) {
      if (process.env.CI) throw new Error(`golden file ${GOLDEN} missing in CI`);
      writeFileSync(GOLDEN, text);
    }
    expect(text).toBe(readFileSync(GOLDEN, 'utf8'));
  });

  it('declares HELP and TYPE once per family, before its samples', () => {
    const lines = text.split('\n');
    expect(lines.at(-1)).toBe(''); // ends with a newline
    const seen = new Map<string, string>();
    let current = '';
    for (const line of lines.slice(0, -1)) {
      const m = /^# (HELP|TYPE) (\S+) (.+)$/.exec(line);
      if (m) {
        const key = `${m[1]} ${m[2]}`;
        expect(seen.has(key), `duplicate ${key}`).toBe(false);
        seen.set(key, m[3]!);
        current = m[2]!;
        continue;
      }
      const name = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line)![1]!;
      const type = seen.get(`TYPE ${current}`);
      expect(type, line).toBeDefined();
      if (type === 'histogram') expect(name, line).toMatch(new RegExp(`^${current}_(bucket|sum|count)$`));
      else expect(name, line).toBe(current);
      if (type === 'counter') expect(name).toMatch(/_total$/);
    }
  });

  it('renders cumulative buckets with +Inf equal to the count', () => {
    const series = new Map<string, { le: string; v: number }[]>();
    const counts = new Map<string, number>();
    for (const line of text.split('\n')) {
      const b = /^prefix_router_ttft_seconds_bucket\{(.*),le="([^"]+)"\} (\S+)$/.exec(line);
      if (b) series.set(b[1]!, [...(series.get(b[1]!) ?? []), { le: b[2]!, v: Number(b[3]) }]);
      const c = /^prefix_router_ttft_seconds_count\{(.*)\} (\S+)$/.exec(line);
      if (c) counts.set(c[1]!, Number(c[2]));
    }
    expect(series.size).toBe(4);
    for (const [labels, rows] of series) {
      expect(rows.map((r) => r.le)).toEqual([...TTFT_BUCKETS_S.map(String), '+Inf']);
      for (let i = 1; i < rows.length; i++) expect(rows[i]!.v).toBeGreaterThanOrEqual(rows[i - 1]!.v);
      expect(rows.at(-1)!.v).toBe(counts.get(labels));
    }
  });

  it('escapes label values', () => {
    expect(text).toContain('replica="gpu \\"a\\"\\\\1\\nx"');
    expect(text).not.toMatch(/\r/);
  });

  it('never exposes replica URLs or auth references', () => {
    expect(text).not.toContain('vllm.example.com');
    expect(text).not.toContain('ORIGIN_API_KEY');
  });

  it('passes promtool check metrics with no lint problems', (ctx) => {
    const r = checkMetrics(text);
    if (!r) {
      promtoolMissing('the /metrics lint check');
      ctx.skip();
      return;
    }
    expect(r.output, 'promtool lint output').toBe('');
    expect(r.status).toBe(0);
    // The check is not vacuous: the same promtool flags a counter without `_total`.
    const bad = checkMetrics('# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests 1\n')!;
    expect(bad.status).not.toBe(0);
    expect(bad.output).toContain('_total');
  });

  it('an empty exposition (no pools) is still valid', () => {
    const r = checkMetrics(renderMetrics([]));
    if (!r) return promtoolMissing('the empty /metrics lint check');
    expect(r.status).toBe(0);
  });
});

describe('data-parallel engines on /metrics', () => {
  it('one row per engine of a pinned replica; none for single-engine replicas', () => {
    const pinned: PoolSnapshot = {
      ...FIXTURE[0]!,
      replicas: [
        replica('dp1', {
          inFlight: 3,
          engines: [
            { rank: 0, engine: '0', inFlight: 1, indexEntries: 40, indexCapacity: 750 },
            { rank: 1, engine: '1', inFlight: 2, indexEntries: 96, indexCapacity: 1500 },
          ],
        }),
        replica('one', {}),
      ],
    };
    const text = renderMetrics([pinned]);
    expect(text).toContain('prefix_router_engine_in_flight_requests{pool="chat",replica="dp1",engine="0"} 1\n');
    expect(text).toContain('prefix_router_engine_in_flight_requests{pool="chat",replica="dp1",engine="1"} 2\n');
    expect(text).toContain('prefix_router_prefix_index_engine_entries{pool="chat",replica="dp1",engine="1"} 96\n');
    expect(text).not.toMatch(/engine_[a-z_]+\{[^}]*replica="one"/);
    // Without a pinned replica the families are absent (the golden file above has none).
    expect(renderMetrics(FIXTURE)).not.toContain('prefix_router_engine_in_flight_requests');
  });
});
