// Render the coordinators' snapshots as Prometheus text exposition format 0.0.4. Pure: the
// caller gathers snapshots. Names carry units; counters end in `_total`.

import type { PoolSnapshot } from '../coordinator/types.js';
import type { PoolOpenState } from './pool-open.js';
import { TTFT_BUCKETS_S } from '../coordinator/stats.js';

type Labels = Record<string, string>;

function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

function fmtLabels(l: Labels): string {
  const parts = Object.entries(l).map(([k, v]) => `${k}="${escapeLabel(v)}"`);
  return parts.length ? `{${parts.join(',')}}` : '';
}

function fmtValue(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  return String(v);
}

/** Writes metric families in the text format (shared with observability/tenant-metrics.ts). */
export class Writer {
  private out: string[] = [];
  family(name: string, type: 'counter' | 'gauge' | 'histogram', help: string, rows: [Labels, number][]): void {
    if (rows.length === 0) return;
    this.out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const [l, v] of rows) this.out.push(`${name}${fmtLabels(l)} ${fmtValue(v)}`);
  }
  histogram(name: string, help: string, rows: { labels: Labels; counts: number[]; sum: number; count: number }[]): void {
    if (rows.length === 0) return;
    this.out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
    for (const r of rows) {
      let cum = 0;
      TTFT_BUCKETS_S.forEach((le, i) => {
        cum += r.counts[i] ?? 0;
        this.out.push(`${name}_bucket${fmtLabels({ ...r.labels, le: String(le) })} ${cum}`);
      });
      this.out.push(`${name}_bucket${fmtLabels({ ...r.labels, le: '+Inf' })} ${r.count}`);
      this.out.push(`${name}_sum${fmtLabels(r.labels)} ${fmtValue(Math.round(r.sum * 1e6) / 1e6)}`, `${name}_count${fmtLabels(r.labels)} ${r.count}`);
    }
  }
  text(): string {
    return this.out.join('\n') + '\n';
  }
}

export function renderMetrics(pools: readonly PoolSnapshot[], open: readonly PoolOpenState[] = []): string {
  const w = new Writer();
  const per = <T>(f: (p: PoolSnapshot, r: PoolSnapshot['replicas'][number]) => T | null): [Labels, T][] =>
    pools.flatMap((p) => p.replicas.flatMap((r) => {
      const v = f(p, r);
      return v === null ? [] : [[{ pool: p.pool, replica: r.id }, v] as [Labels, T]];
    }));
  const num = (f: (p: PoolSnapshot, r: PoolSnapshot['replicas'][number]) => number | null) => per(f);

  w.family('prefix_router_requests_total', 'counter', 'Finished attempts (leases released) by replica and the HTTP status the origin returned (0: no response); a retried request counts once on each replica it tried.',
    pools.flatMap((p) => p.replicas.flatMap((r) => Object.entries(r.stats.byStatus).map(([status, n]) => [{ pool: p.pool, replica: r.id, status }, n] as [Labels, number]))),
  );
  w.family('prefix_router_api_requests_total', 'counter', 'Finished attempts (leases released) by replica and API: chat, completion, embeddings, rerank, score, tokenize, detokenize, ...',
    pools.flatMap((p) => p.replicas.flatMap((r) => Object.entries(r.stats.byApi ?? {}).map(([api, n]) => [{ pool: p.pool, replica: r.id, api }, n] as [Labels, number]))),
  );
  w.family('prefix_router_in_flight_requests', 'gauge', 'Requests in flight (leases held) per replica.', num((_, r) => r.inFlight));
  w.histogram(
    'prefix_router_ttft_seconds',
    'Time to first content token measured at the router, from request arrival.',
    pools.flatMap((p) => p.replicas.map((r) => ({ labels: { pool: p.pool, replica: r.id }, ...r.stats.ttft }))),
  );
  w.family('prefix_router_prompt_tokens_total', 'counter', 'Prompt tokens reported in response usage.', num((_, r) => r.stats.promptTokens));
  w.family('prefix_router_cached_tokens_total', 'counter', 'Prompt tokens served from the prefix cache as the engine reported them (usage.prompt_tokens_details.cached_tokens, llama.cpp timings.cache_n); requests without the figure add nothing.', num((_, r) => r.stats.cachedTokens));
  w.family('prefix_router_cache_reported_prompt_tokens_total', 'counter', 'Prompt tokens of the responses whose engine reported cached tokens: the router-measured hit rate is cached_tokens_total / this.', num((_, r) => r.stats.cacheReportedPromptTokens ?? 0));
  w.family('prefix_router_requests_without_cache_report_total', 'counter', 'Responses with usage but no cached-token figure (vLLM without --enable-prompt-tokens-details, SGLang without --enable-cache-report): left out of the router-measured hit rate.', num((_, r) => r.stats.requestsWithoutCacheReport ?? 0));
  w.family('prefix_router_completion_tokens_total', 'counter', 'Completion tokens reported in response usage.', num((_, r) => r.stats.completionTokens));
  w.family('prefix_router_spills_total', 'counter', 'Keyed requests served by a replica other than the key\'s home (load bound, health, exclusion).', num((_, r) => r.stats.spills));
  w.family('prefix_router_retries_total', 'counter', 'Attempts on this replica that failed before the first byte and were retried elsewhere.', num((_, r) => r.stats.retries));
  w.family(
    'prefix_router_early_connects_total',
    'counter',
    'Requests sent to this replica ahead of the coordinator\'s pick (early connect): hit when the pick confirmed it, miss when it was cancelled.',
    pools.flatMap((p) =>
      p.replicas.flatMap((r) => [
        [{ pool: p.pool, replica: r.id, result: 'hit' }, r.stats.earlyConnectHits] as [Labels, number],
        [{ pool: p.pool, replica: r.id, result: 'miss' }, r.stats.earlyConnectMisses] as [Labels, number],
      ]),
    ),
  );
  w.family(
    'prefix_router_continuations_total',
    'counter',
    'Streams that broke after their first token, by what the router did: continued on another replica, failed (every try failed before its first token), or not_attempted_<reason> (the answer could not be continued: n_gt_1, logprobs, response_format, guided_decoding, tool_calls, reasoning, api, max_continuations, client_gone, ...).',
    pools.flatMap((p) => {
      const byOutcome = new Map<string, number>();
      for (const r of p.replicas) for (const [outcome, n] of Object.entries(r.stats.continuations ?? {})) byOutcome.set(outcome, (byOutcome.get(outcome) ?? 0) + n);
      return [...byOutcome].map(([outcome, n]) => [{ pool: p.pool, outcome }, n] as [Labels, number]);
    }),
  );
  w.family('prefix_router_continuation_reprefill_tokens_total', 'counter', 'Tokens of answers so far that continuations prefilled again on this replica after a break (counted apart from prompt tokens, not billed).', num((_, r) => r.stats.reprefillTokens ?? 0));
  w.family('prefix_router_errors_total', 'counter', 'Connection errors, timeouts and 5xx from this replica.', num((_, r) => r.stats.errors));
  w.family('prefix_router_client_aborts_total', 'counter', 'Requests the client abandoned mid-way.', num((_, r) => r.stats.clientAborts));
  w.family('prefix_router_expired_leases_total', 'counter', 'Leases freed by the coordinator at their deadline instead of by a release.',
    pools.map((p) => [{ pool: p.pool }, p.expiredLeases] as [Labels, number]),
  );
  // Data-parallel replicas pinned per engine (coordinator/dp-engines.ts): one row per engine.
  const perEngine = (f: (e: NonNullable<PoolSnapshot['replicas'][number]['engines']>[number]) => number): [Labels, number][] =>
    pools.flatMap((p) => p.replicas.flatMap((r) => (r.engines ?? []).map((e) => [{ pool: p.pool, replica: r.id, engine: e.engine }, f(e)] as [Labels, number])));
  w.family('prefix_router_engine_in_flight_requests', 'gauge', 'Leases held per data-parallel engine of a replica the router pins (X-data-parallel-rank).', perEngine((e) => e.inFlight));
  w.family('prefix_router_prefix_index_engine_entries', 'gauge', 'prefix-aware pools: router blocks the index holds for each data-parallel engine of a pinned replica.', perEngine((e) => e.indexEntries));
  const indexed = pools.filter((p) => p.prefixIndex !== null);
  w.family('prefix_router_prefix_index_entries', 'gauge', 'prefix-aware pools: (block, replica) entries in the approximate prefix index.', indexed.map((p) => [{ pool: p.pool }, p.prefixIndex!.entries] as [Labels, number]));
  w.family('prefix_router_prefix_index_bytes', 'gauge', 'prefix-aware pools: memory held by the prefix index.', indexed.map((p) => [{ pool: p.pool }, p.prefixIndex!.approxBytes] as [Labels, number]));
  w.family('prefix_router_prefix_index_evictions_total', 'counter', 'prefix-aware pools: index entries evicted by its LRU bounds.', indexed.map((p) => [{ pool: p.pool }, p.prefixIndex!.evictions] as [Labels, number]));
  const affinity = pools.filter((p) => p.responseAffinity !== undefined);
  w.family('prefix_router_response_affinity_entries', 'gauge', 'Responses API: response ids whose replica the pool remembers (all tenants).', affinity.map((p) => [{ pool: p.pool }, p.responseAffinity!.entries] as [Labels, number]));
  w.family(
    'prefix_router_response_pins_total',
    'counter',
    'Responses API: requests pinned to the replica that stored their response, by result (hit; not_found: unknown id; gone: replica removed; unavailable: replica down).',
    affinity.flatMap((p) => (['hit', 'not_found', 'gone', 'unavailable'] as const).map((result) => [{ pool: p.pool, result }, p.responseAffinity!.pins[result]] as [Labels, number])),
  );
  w.family('prefix_router_replica_up', 'gauge', '1 when the replica takes new requests (active and passive health), else 0.', num((_, r) => (r.healthy ? 1 : 0)));
  w.family('prefix_router_replica_draining', 'gauge', '1 while the replica is draining.', num((_, r) => (r.draining ? 1 : 0)));
  w.family('prefix_router_replica_weight', 'gauge', 'Configured replica weight.', num((_, r) => r.weight));
  w.family('prefix_router_vllm_prefix_cache_hit_ratio', 'gauge', 'Prefix-cache hit rate reported by the engine (vLLM, SGLang, llama.cpp) over the pool\'s window.', num((_, r) => r.vllm.hitRate));
  w.family('prefix_router_vllm_requests_waiting', 'gauge', 'Requests waiting in the engine at the last scrape (vllm:num_requests_waiting, sglang:num_queue_reqs, llamacpp:requests_deferred).', num((_, r) => r.vllm.waiting));
  w.family('prefix_router_vllm_requests_running', 'gauge', 'Requests running in the engine at the last scrape (vllm:num_requests_running, sglang:num_running_reqs, llamacpp:requests_processing).', num((_, r) => r.vllm.running));
  w.family('prefix_router_vllm_kv_cache_usage_ratio', 'gauge', 'KV-cache usage (0-1) at the last scrape (vllm:kv_cache_usage_perc, sglang:token_usage, llamacpp:kv_cache_usage_ratio).', num((_, r) => r.vllm.kvUsage));
  w.family('prefix_router_alerts_active', 'gauge', 'Active alerts: queue_imbalance per replica, hot_key per key hash.',
    pools.flatMap((p) =>
      p.alerts.map((a) => [a.kind === 'queue_imbalance' ? { pool: p.pool, alert: a.kind, replica: a.replica } : { pool: p.pool, alert: a.kind, key_kind: a.keyKind, key_hash: a.keyHash }, 1] as [Labels, number]),
    ),
  );
  // Lease protocol v2 (proxy/lease-agent.ts): billed coordinator calls, restart recovery, fail-open.
  const leased = pools.filter((p) => p.lease !== undefined);
  w.family('prefix_router_coordinator_rpcs_total', 'counter', 'Calls that reached the pool\'s coordinator, by method: each one a billed Durable Object request (counts restart with the coordinator).',
    leased.flatMap((p) => Object.entries(p.lease!.rpcs).map(([method, n]) => [{ pool: p.pool, method }, n] as [Labels, number])),
  );
  w.family('prefix_router_restored_leases_total', 'counter', 'Leases a coordinator rebuilt from Worker renewals (after a restart, or renewals that came late).', leased.map((p) => [{ pool: p.pool }, p.lease!.restoredLeases] as [Labels, number]));
  w.family('prefix_router_coordinator_fallbacks_total', 'counter', 'Requests routed open (coordinator unreachable or slower than acquireTimeoutMs): consistent hash over the last known replica set.', open.map((o) => [{ pool: o.pool }, o.fallbacks] as [Labels, number]));
  w.family('prefix_router_pool_open', 'gauge', '1 while the pool runs open: its coordinator does not answer, or requests were routed without it in the last minute.', open.map((o) => [{ pool: o.pool }, o.open ? 1 : 0] as [Labels, number]));
  w.family('prefix_router_coordinator_up', 'gauge', '1 when the pool\'s coordinator answered this scrape.', open.map((o) => [{ pool: o.pool }, o.coordinatorUp ? 1 : 0] as [Labels, number]));
  renderQueue(w, pools);
  return w.text();
}

/** Flow control (coordinator/queue.ts): the pools' queues, per band; tenants appear only in the tenant views. */
function renderQueue(w: Writer, pools: readonly PoolSnapshot[]): void {
  const queued = pools.filter((p) => p.queue !== undefined);
  const perBand = (f: (q: NonNullable<PoolSnapshot['queue']>) => Record<string, number>) => queued.flatMap((p) => Object.entries(f(p.queue!)).map(([band, n]) => [{ pool: p.pool, band }, n] as [Labels, number]));
  w.family('prefix_router_queue_depth', 'gauge', 'Requests waiting in the pool coordinator\'s queue for a slot (every replica at maxInFlightPerReplica), per priority band.', perBand((q) => q.depth));
  w.family('prefix_router_queue_admitted_total', 'counter', 'Requests admitted after waiting in the queue, per band (counts restart with the coordinator).', perBand((q) => q.admitted));
  w.family('prefix_router_queue_rejected_total', 'counter', 'Requests the queue refused, per band and reason: queue_full (the band\'s maxQueueLength, or shed for a lighter tenant), queue_timeout (maxQueueMs passed), queue_cancelled (the client went away).',
    queued.flatMap((p) => Object.entries(p.queue!.rejected).map(([k, n]) => {
      const [band, reason] = k.split('|');
      return [{ pool: p.pool, band: band ?? '', reason: reason ?? '' }, n] as [Labels, number];
    })),
  );
  w.histogram('prefix_router_queue_wait_seconds', 'Time admitted requests waited in the queue for a slot, per band.',
    queued.flatMap((p) => Object.entries(p.queue!.wait).map(([band, h]) => ({ labels: { pool: p.pool, band }, ...h }))),
  );
  // Per tenant as the tenant families are (bounded): the 20 tenants with the most waiting, per pool.
  w.family('prefix_router_queue_tenant_depth', 'gauge', 'Requests waiting in the queue per tenant (the 20 tenants with the most waiting, per pool; all bands).',
    queued.flatMap((p) => p.queue!.tenants.map((t) => [{ pool: p.pool, tenant: t.tenant }, t.queued] as [Labels, number])),
  );
  w.family('prefix_router_queue_tenant_oldest_wait_seconds', 'gauge', 'How long each of those tenants\' oldest waiting request has waited (the 20 tenants with the most waiting, per pool).',
    queued.flatMap((p) => p.queue!.tenants.map((t) => [{ pool: p.pool, tenant: t.tenant }, t.oldestWaitMs / 1000] as [Labels, number])),
  );
  w.family('prefix_router_queue_oldest_wait_seconds', 'gauge', 'How long the oldest request still waiting in the queue has waited (0: none waits).', queued.map((p) => [{ pool: p.pool }, (p.queue!.oldestWaitMs ?? 0) / 1000] as [Labels, number]));
  w.family('prefix_router_queue_reserve_held_total', 'counter', 'Requests the pool\'s shareReserve held back while only the kept slots were free (each counted once; counts restart with the coordinator). Only pools with a reserve.',
    queued.filter((p) => p.queue!.shareReserve > 0).map((p) => [{ pool: p.pool }, p.queue!.reserveHeld] as [Labels, number]),
  );
  w.family('prefix_router_queue_preempted_total', 'counter', 'Requests whose slot flow control took back before their first token for a tenant below its fair share (flowControl.preempt; their Workers aborted them at the engine and queued them again), by whether the Worker gave it back (`given`) or had already committed (`declined`; an answer still on its way counts here). Counts restart with the coordinator. Only pools with preemption on.',
    queued.filter((p) => p.queue!.preempt).flatMap((p) => [
      [{ pool: p.pool, result: 'given' }, p.queue!.preempted],
      [{ pool: p.pool, result: 'declined' }, Math.max(0, p.queue!.preemptAsked - p.queue!.preempted)],
    ] as [Labels, number][]),
  );
  w.family('prefix_router_queue_drain_per_second', 'gauge', 'Slots freed per second over the last 10 s (releases and expiries): what Retry-After is computed from.', queued.map((p) => [{ pool: p.pool }, Math.round(p.queue!.drainPerSecond * 1000) / 1000] as [Labels, number]));
}
