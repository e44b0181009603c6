// Per-replica counters the coordinator keeps from lease outcomes: requests by status, errors,
// retries, spills, tokens, a TTFT histogram. Plain serialisable data; no I/O.

/** TTFT histogram upper bounds in seconds (Prometheus-style, cumulative when rendered). */
export const TTFT_BUCKETS_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60] as const;

export interface Histogram {
  /** counts[i] = observations ≤ TTFT_BUCKETS_S[i] and > the previous bound; the last slot is +Inf. */
  counts: number[];
  sum: number;
  count: number;
}

export interface ReplicaStats {
  requests: number;
  /** Finished requests by HTTP status the client saw from this replica ("0" = no response). */
  byStatus: Record<string, number>;
  /** Finished requests by API (chat, completion, embeddings, ...): at most MAX_APIS names. */
  byApi: Record<string, number>;
  /** Connection errors, timeouts and 5xx from this replica. */
  errors: number;
  /** Attempts on this replica that failed before the first byte and were retried elsewhere. */
  retries: number;
  /** Keyed picks that landed here although the key's home replica was another. */
  spills: number;
  clientAborts: number;
  /** Early connects to this replica the coordinator's pick confirmed. */
  earlyConnectHits: number;
  /** Early connects to this replica cancelled because the coordinator leased another (counted at that lease's release). */
  earlyConnectMisses: number;
  /** Prompt tokens of every usage report, whether or not the engine said how many were cached. */
  promptTokens: number;
  /** Cached prompt tokens the engine reported (requests without a report add nothing: unknown, not 0). */
  cachedTokens: number;
  /**
   * Prompt tokens of the requests whose engine reported its cached tokens: the router-measured hit
   * rate is cachedTokens / cacheReportedPromptTokens, never over requests whose figure is unknown.
   */
  cacheReportedPromptTokens: number;
  completionTokens: number;
  /** Requests whose usage reported prompt tokens. */
  usageReports: number;
  /**
   * Usage reports without a cached-token figure (vLLM without --enable-prompt-tokens-details,
   * SGLang without --enable-cache-report, or with those flags a count of 0, which both leave out).
   */
  requestsWithoutCacheReport: number;
  ttft: Histogram;
  /**
   * Streams that broke on this replica after their first token, by outcome (proxy/continue-step.ts):
   * `continued`, `failed`, `not_attempted_<reason>`; at most MAX_CONTINUATION_OUTCOMES names.
   * Optional: stats persisted before it existed have none.
   */
  continuations?: Record<string, number>;
  /** Tokens of answers so far that continuations prefilled again on this replica (not billed). Optional as above. */
  reprefillTokens?: number;
  /**
   * Responses this replica was asked to store and answered `store: false` (its Responses store is
   * off: vLLM without VLLM_ENABLE_RESPONSES_API_STORE). Optional as above.
   */
  responsesNotStored?: number;
}

/** The router-measured prefix-cache hit rate of `s`: over the requests whose engine reported it; null when none did. */
export function reportedHitRate(s: Pick<ReplicaStats, 'cachedTokens' | 'cacheReportedPromptTokens'>): number | null {
  return s.cacheReportedPromptTokens > 0 ? s.cachedTokens / s.cacheReportedPromptTokens : null;
}

export function emptyHistogram(): Histogram {
  return { counts: new Array(TTFT_BUCKETS_S.length + 1).fill(0), sum: 0, count: 0 };
}

export function emptyStats(): ReplicaStats {
  return {
    requests: 0,
    byStatus: {},
    byApi: {},
    errors: 0,
    retries: 0,
    spills: 0,
    clientAborts: 0,
    earlyConnectHits: 0,
    earlyConnectMisses: 0,
    promptTokens: 0,
    cachedTokens: 0,
    cacheReportedPromptTokens: 0,
    completionTokens: 0,
    usageReports: 0,
    requestsWithoutCacheReport: 0,
    ttft: emptyHistogram(),
  };
}

export function observe(h: Histogram, seconds: number): void {
  let i = 0;
  while (i < TTFT_BUCKETS_S.length && seconds > TTFT_BUCKETS_S[i]!) i++;
  h.counts[i] = (h.counts[i] ?? 0) + 1;
  h.sum += seconds;
  h.count++;
}

/** Quantile estimate from a histogram by linear interpolation inside the bucket (as PromQL's histogram_quantile). */
export function histogramQuantile(h: Histogram, q: number): number | null {
  if (h.count === 0) return null;
  const rank = q * h.count;
  let seen = 0;
  for (let i = 0; i < h.counts.length; i++) {
    const c = h.counts[i]!;
    if (seen + c >= rank && c > 0) {
      const lo = i === 0 ? 0 : TTFT_BUCKETS_S[i - 1]!;
      const hi = i < TTFT_BUCKETS_S.length ? TTFT_BUCKETS_S[i]! : TTFT_BUCKETS_S[TTFT_BUCKETS_S.length - 1]!;
      return lo + (hi - lo) * ((rank - seen) / c);
    }
    seen += c;
  }
  return TTFT_BUCKETS_S[TTFT_BUCKETS_S.length - 1]!;
}

/** Cloudflare's "a timeout occurred" (error 524): the proxy in front of the origin waited 120 s for headers. */
export const PROXY_READ_TIMEOUT_STATUS = 524;

/** How an attempt ended badly; `max_duration` is the router's own cut at maxStreamMs, not the replica's fault. */
export type ReleaseError = 'connect' | 'timeout' | 'upstream_5xx' | 'idle_timeout' | 'stream_error' | 'client_abort' | 'max_duration';

export interface ReleaseOutcome {
  /** HTTP status from the origin; 0 when there was no response (connection error, timeout). */
  status: number;
  error?: ReleaseError;
  /** The attempt failed before the first byte and the request went on to another replica. */
  retried?: boolean;
  ttftMs?: number | null;
  durationMs?: number;
  promptTokens?: number | null;
  cachedTokens?: number | null;
  completionTokens?: number | null;
  /** The request went out early (proxy/early-connect.ts) to `earlyReplica`: confirmed or cancelled. */
  earlyConnect?: 'hit' | 'miss';
  earlyReplica?: string;
  /** The API the request used (the dialect's name), for the per-API request counter. */
  api?: string;
  /** Responses API: the id the engine gave its response, when it is not the one the router asked for. */
  responseId?: string;
  /** The engine refused the router's X-data-parallel-rank (its engines changed): unpin the replica until its next scrape. */
  rankRefused?: boolean;
  /**
   * Responses API: the id of a response the router asked the replica to store and whose answer
   * said `store: false` (vLLM without VLLM_ENABLE_RESPONSES_API_STORE): marked not stored.
   */
  notStored?: string;
  /**
   * The stream broke on this replica after its first token: `continued` on another replica,
   * `failed` (every try failed), or `not_attempted_<reason>` (proxy/continue-step.ts).
   */
  continuation?: string;
  /** This request's continuations prefilled the answer so far again: tokens, counted apart from promptTokens. */
  reprefillTokens?: number;
  /**
   * Flow control preempted the attempt before its first token (its slot went to a tenant below its
   * fair share; coordinator/queue.ts): not a served request, not the replica's failure. With a
   * `continuation` outcome: a stream paused past its first token (flowControl.preemptStreams), its
   * segment served here, not a failure either.
   */
  preempted?: boolean;
}

/** Distinct API names counted per replica; names come from the Worker's dialects, never a client. */
export const MAX_APIS = 16;
export const MAX_CONTINUATION_OUTCOMES = 32;
const CONTINUATION_OUTCOME = /^[a-z][a-z0-9_]{0,63}$/;
const API_NAME = /^[a-z][a-z0-9_]{0,31}$/;

export function recordOutcome(s: ReplicaStats, o: ReleaseOutcome, spilled: boolean): void {
  // A preempted attempt gave its slot back before its first token and went on elsewhere: counted by
  // the queue, not here. A stream paused past its first token (flowControl.preemptStreams, its
  // `continuation` outcome `paused`) served a segment of its answer here: recorded as one, never
  // as an error (isReplicaFailure).
  if (o.preempted === true && o.continuation === undefined) return;
  s.requests++;
  const st = String(o.status);
  s.byStatus[st] = (s.byStatus[st] ?? 0) + 1;
  if (o.api !== undefined && API_NAME.test(o.api)) {
    s.byApi ??= {};
    if (o.api in s.byApi || Object.keys(s.byApi).length < MAX_APIS) s.byApi[o.api] = (s.byApi[o.api] ?? 0) + 1;
  }
  if (o.continuation !== undefined && CONTINUATION_OUTCOME.test(o.continuation)) {
    const c = (s.continuations ??= {});
    if (o.continuation in c || Object.keys(c).length < MAX_CONTINUATION_OUTCOMES) c[o.continuation] = (c[o.continuation] ?? 0) + 1;
  }
  if (typeof o.reprefillTokens === 'number' && Number.isFinite(o.reprefillTokens) && o.reprefillTokens > 0) s.reprefillTokens = (s.reprefillTokens ?? 0) + o.reprefillTokens;
  if (typeof o.notStored === 'string') s.responsesNotStored = (s.responsesNotStored ?? 0) + 1;
  if (spilled) s.spills++;
  if (o.retried) s.retries++;
  if (o.error === 'client_abort') s.clientAborts++;
  // A refused data-parallel rank is the router's stale pin, whatever the status (vLLM's Messages route answers it 500).
  else if (!o.rankRefused && ((o.error && o.error !== 'max_duration') || o.status >= 500)) s.errors++;
  if (typeof o.promptTokens === 'number' && o.promptTokens >= 0) {
    s.promptTokens += o.promptTokens;
    s.usageReports++;
    if (typeof o.cachedTokens === 'number' && o.cachedTokens >= 0) {
      s.cachedTokens += Math.min(o.cachedTokens, o.promptTokens);
      s.cacheReportedPromptTokens += o.promptTokens;
    } else {
      s.requestsWithoutCacheReport++;
    }
  }
  if (typeof o.completionTokens === 'number' && o.completionTokens >= 0) s.completionTokens += o.completionTokens;
  if (typeof o.ttftMs === 'number' && o.ttftMs >= 0) observe(s.ttft, o.ttftMs / 1000);
}

/**
 * True when the outcome counts against the replica's passive health (NGINX max_fails): no
 * connection, no answer in time, a 5xx, or a stream that broke or went silent mid-way (a replica
 * stalling mid-stream keeps accepting connections, so active checks alone would not take it out).
 *
 * A 524 is not: Cloudflare's proxy in front of the origin (a Tunnel or Access hostname) answers it
 * when the origin sent no response headers within the Proxy Read Timeout, 120 s by default
 * (developers.cloudflare.com/support/troubleshooting/http-status-codes/cloudflare-5xx-errors/error-524/):
 * a non-streaming generation still running, which vLLM answers only when it ends. The replica is
 * busy, not broken, like the router's own `nonStreamTimeoutMs` cut (`max_duration`).
 */
export function isReplicaFailure(o: ReleaseOutcome): boolean {
  if (o.preempted === true) return false;
  if (o.error === 'client_abort' || o.error === 'max_duration' || o.rankRefused) return false;
  if (o.status === PROXY_READ_TIMEOUT_STATUS) return false;
  return o.error === 'connect' || o.error === 'timeout' || o.error === 'upstream_5xx' || o.error === 'idle_timeout' || o.error === 'stream_error' || o.status >= 500;
}
