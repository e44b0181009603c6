// Router configuration: parsed and validated once per isolate from the `ROUTER_CONFIG` var
// (a JSON string or a wrangler.toml table) or, when that var is absent, from `router.config.json`
// bundled with the Worker. A bad field fails with a message naming it.
// No I/O beyond reading the value handed in (the JSON module is part of the bundle).

import { z } from 'zod';
// A variable holds at most 5 KB (developers.cloudflare.com/workers/platform/limits/#environment-variables),
// a few dozen replicas; a module of the bundle is bounded only by the Worker's size (10 MB on the
// Paid plan, same page, "Worker size"). `null` in the file: no bundled configuration (docs/deploy.md).
import bundledRouterConfig from '../router.config.json';
import { replicaUrlProblem, replicaUrlSchema, type OriginTarget } from './origin/replica-url.js';
import { createStrategy, DEFAULT_QUEUE_BANDS, MAX_INDEX_ENTRIES, parseKeySource, type KeySource, type Strategy } from './core/index.js';
import { engineApis, engineProfile, ENGINES, KEYLESS_APIS, type KeylessApi } from './engines/index.js';
import { engineFieldProblem } from './engines/request-fields.js';
import { forwardHeaderProblem } from './origin/forward-headers.js';

export const DEFAULTS = {
  // prefix-aware became the default on the simulator's evidence (docs/benchmarks.md, "Prefix-aware
  // routing (simulator)"): better p95 TTFT than bounded-hash:1.25 on every workload class replayed.
  strategy: 'prefix-aware',
  fallback: 'least-load',
  keys: ['header:x-session-id', 'body:prompt_cache_key', 'tenant', 'prefix:4096'],
  pointsPerWeight: 160,
  /** Longest stream allowed: cut with a final SSE error event (its lease is renewed until then). */
  maxStreamMs: 600_000,
  /**
   * Streaming: from sending an attempt to its first content event (headers included); past it the
   * attempt is abandoned and retried on another replica. vLLM sends its headers before queueing
   * and prefill, so the time to headers alone says nothing (docs/operations.md). Its old name,
   * `firstByteTimeoutMs`, is still read when this one is not set.
   */
  firstTokenTimeoutMs: 60_000,
  /** Time between two upstream chunks once streaming. */
  idleTimeoutMs: 60_000,
  /** A write to the client that does not complete in this window means nobody is reading. */
  clientStallMs: 10_000,
  maxBodyBytes: 2 * 1024 * 1024,
  /** Request header names and values together (Cloudflare's edge allows 128 KB; vLLM's server far less). */
  maxHeaderBytes: 32 * 1024,
  /** Time to receive the whole request body. */
  bodyTimeoutMs: 30_000,
  maxRetries: 2,
  /**
   * A streamed plain-text answer that breaks after its first token is continued on another replica
   * at most this many times per request (proxy/continuation.ts, docs/operations.md); 0: never.
   */
  maxContinuations: 2,
  retryAfterSeconds: 1,
  healthIntervalMs: 5_000,
  healthTimeoutMs: 2_000,
  fall: 2,
  rise: 2,
  maxFails: 3,
  failWindowMs: 10_000,
  failTimeoutMs: 10_000,
  scrapeIntervalMs: 5_000,
  tenantCacheMs: 30_000,
  /**
   * Whole-request limit of a non-streaming request (its headers come only when generation ends).
   * Under the 120 s after which Cloudflare's proxy in front of an origin (Tunnel, Access) answers
   * 524 without response headers (support/troubleshooting/http-status-codes/cloudflare-5xx-errors/error-524/):
   * the router answers its own 504 first, which names the setting. Raise it only for origins not
   * proxied by Cloudflare or with a raised Proxy Read Timeout (Enterprise, up to 6,000 s; docs/deploy.md).
   */
  nonStreamTimeoutMs: 100_000,
  /** Per-pool bounds on what one request may ask an engine for (docs/operations.md, "Tenant isolation"). */
  maxN: 8,
  maxBestOf: 8,
  maxOutputTokens: 32_768,
  /** Lease protocol v2 (proxy/lease-agent.ts): a lease not renewed within this is reaped. */
  leaseTtlMs: 30_000,
  /** Each isolate renews all its live leases of a pool in one call this often (≤ TTL / 2). */
  renewIntervalMs: 10_000,
  /** A release not piggybacked on an acquire within this is sent in one batched call. */
  releaseFlushMs: 100,
  /** An acquire with no answer by then fails open (consistent hash over the last known replicas). */
  acquireTimeoutMs: 250,
  /** After a failed coordinator call, this isolate routes open without asking for this long. */
  coordinatorRetryMs: 2_000,
  /** How long the router remembers which replica stored a Responses API response (24 h). */
  responseAffinityTtlMs: 24 * 3600_000,
  /** Response ids remembered per pool; the oldest are forgotten first beyond this. */
  responseAffinityMaxEntries: 100_000,
} as const;

/**
 * Largest `maxBodyBytes` accepted. A Workers isolate has 128 MB for every request it serves at once
 * (developers.cloudflare.com/workers/platform/limits/#memory: past it the runtime may cancel requests),
 * and a request body is held several times over on its way through: the chunks read and their
 * concatenation (http/body.ts), the decoded string, the parsed JSON (objects cost several times the
 * text), the rewritten body serialised again (proxy/upstream-request.ts) and its bytes for the
 * upstream fetch. Measured (test/e2e/body-memory.test.ts, docs/deploy.md): at least 3-4 copies live
 * in the heap at once (a lower bound: a copy made and dropped inside one task is not sampled); two
 * requests at the cap peaked at 55-64 MB, four at 104-113 MB. So two at once still leave room for the
 * Worker, its caches and the streams it serves; four do not.
 */
export const MAX_BODY_BYTES_CAP = 8 * 1024 * 1024;

/** Simultaneous outgoing connections of one invocation (developers.cloudflare.com/workers/platform/limits/#simultaneous-open-connections). */
export const MAX_SIMULTANEOUS_CONNECTIONS = 6;

/** Durable Object location hints; a pool's `region` is one of them (docs/scaling.md). */
export const REGIONS = ['wnam', 'enam', 'sam', 'weur', 'eeur', 'apac', 'oc', 'afr', 'me'] as const;

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const SECRET_NAME = /^[A-Z][A-Z0-9_]{0,63}$/;

/** `bearer:SECRET_NAME` (vLLM --api-key), `headers:SECRET_NAME` (JSON of fixed headers), or `none`. */
export const authRefSchema = z
  .string()
  .regex(/^(none|bearer:[A-Z][A-Z0-9_]{0,63}|headers:[A-Z][A-Z0-9_]{0,63})$/, 'must be "none", "bearer:SECRET_NAME" or "headers:SECRET_NAME"')
  .refine((s) => !ROUTER_SECRETS.has(s.slice(s.indexOf(':') + 1)), 'must not name one of the router\'s own secrets');

/** The router's own secrets and settings: an origin auth reference naming one would send it to a replica. */
const ROUTER_SECRETS = new Set(['ADMIN_TOKEN', 'METRICS_TOKEN', 'TENANT_KEYS', 'ROUTER_CONFIG', 'CACHE_SALT_KEY']);

// Replica URLs (what the edge can reach) are checked in origin/replica-url.ts; its names are re-exported here for the config's users.
export { CLOUDFLARE_HTTPS_PORTS, normalizeReplicaUrl, replicaEndpoint, replicaUrlProblem, replicaUrlSchema, type OriginTarget } from './origin/replica-url.js';

export const replicaSchema = z.object({
  id: z.string().regex(ID, 'must be 1-64 characters of letters, digits, "_", "." or "-"'),
  url: replicaUrlSchema,
  weight: z.number().int().min(1).max(256).default(1),
  auth: authRefSchema.default('none'),
  draining: z.boolean().default(false),
});
export type ReplicaConfig = z.infer<typeof replicaSchema>;

const strategySpec = z.string().superRefine((s, ctx) => {
  try {
    createStrategy(s);
  } catch (e) {
    ctx.addIssue({ code: 'custom', message: (e as Error).message });
  }
});

const keySpec = z.string().superRefine((s, ctx) => {
  try {
    parseKeySource(s);
  } catch (e) {
    ctx.addIssue({ code: 'custom', message: (e as Error).message });
  }
});

/**
 * Flow control (issue #29, core/fair-queue.ts, docs/operations.md "Flow control"): when every
 * replica is at its bound (`maxInFlightPerReplica`), a request waits in the coordinator's queue
 * instead of being refused or spilled. `enabled: false`, or no bound: today's behaviour.
 */
const queueBandSchema = z
  .object({
    name: z.string().regex(/^[a-z0-9][a-z0-9_-]{0,31}$/, 'must be 1-32 characters of lowercase letters, digits, "_" or "-"'),
    /** Longest a request of this band waits for a slot; then 503 (or 429 over its share). Under the lease TTL's order of a stream, at most 10 minutes. */
    maxQueueMs: z.number().int().min(1).max(600_000),
    maxQueueLength: z.number().int().min(1).max(100_000),
    /** Slots of the pool kept free for the bands above this one (default 0); non-decreasing down the bands. */
    headroom: z.number().int().min(0).max(1_000_000).optional(),
  })
  .strict();
export const flowControlSchema = z
  .object({
    enabled: z.boolean().default(true),
    /** What a request costs its tenant's share: estimated prompt tokens + max output tokens, or one per request. */
    fairness: z.enum(['tokens', 'requests']).default('tokens'),
    /** Highest priority first; the last is shed first. */
    bands: z
      .array(queueBandSchema)
      .min(1)
      .max(8)
      .default(DEFAULT_QUEUE_BANDS.map((b) => ({ ...b })))
      .superRefine((bands, ctx) => {
        const seen = new Set<string>();
        bands.forEach((b, i) => {
          if (seen.has(b.name)) ctx.addIssue({ code: 'custom', path: [i, 'name'], message: `duplicate band "${b.name}"` });
          seen.add(b.name);
          const above = i > 0 ? (bands[i - 1]!.headroom ?? 0) : 0;
          if ((b.headroom ?? 0) < above) ctx.addIssue({ code: 'custom', path: [i, 'headroom'], message: `must be at least the band above's (${above}): a lower band keeps at least as many slots free as a higher one` });
        });
      }),
    /** The band of a request whose tenant record names none. */
    defaultBand: z.string().default('normal'),
    /**
     * Slots kept free for tenants below their fair share (default 0: work-conserving): a tenant
     * holding its share of the slots and of the recent admissions takes a slot only while more than
     * this many are free. A light tenant's
     * request then starts at once instead of at the next slot a burst frees, at the price of up to
     * this many slots idle while another tenant is active (core heldBackByReserve).
     */
    shareReserve: z.number().int().min(0).max(1_000_000).default(0),
    /**
     * Preemption before the first token (default off): when a request of a tenant below its fair
     * share waits because every slot is taken, the coordinator asks the Worker of the youngest
     * request of a tenant over its share (of the slots and of the recent admissions, in the same
     * band or a lower one) to give its slot back while that request has sent nothing to its
     * client: the Worker aborts it at the engine (vLLM frees the sequence on disconnect) and
     * queues it again, and the freed slot goes to the queue's next request. What vLLM's own
     * scheduler does not do at its `max_num_seqs` bound (vllm/v1/core/sched/scheduler.py: the
     * waiting loop stops at `max_num_running_reqs`; priority preemption happens only when KV
     * blocks run out), done by the router, recompute-style: the preempted request's prefill so far
     * is lost, its client sees only a later first token (core preemptionVictim).
     */
    preempt: z.boolean().default(false),
    /**
     * Preemption of streams past their first token too (default off; needs `preempt`): a stream
     * of a tenant over its share may be paused for a waiting request of a tenant below its share.
     * The Worker aborts it at the engine, gives the slot back, and continues the answer once its
     * tenant's turn comes again, as it continues a stream whose replica broke (maxContinuations,
     * proxy/continue-step.ts): the continuation prefills the prompt and the answer so far (on the
     * replica that holds its prefix, when that one is the pick), its client sees a pause in the
     * stream and then the rest of the answer. Only answers that can be continued (the dialect's
     * refusal() is null: no tool call, no reasoning, n = 1…) are paused, each at most once; a
     * paused stream waits ahead of its tenant's other requests, for its band's maxQueueMs at most
     * (past it, the stream ends with an error event saying why). vLLM does the same inside one
     * engine when KV blocks run out (recompute preemption, vllm/v1/core/sched/scheduler.py
     * `_preempt_request`, which puts the request back at the front of its waiting queue with
     * `prepend_request`); the router does it across the pool, for fairness between tenants.
     */
    preemptStreams: z.boolean().default(false),
  })
  .strict()
  .superRefine((f, ctx) => {
    if (f.preemptStreams && !f.preempt) ctx.addIssue({ code: 'custom', path: ['preemptStreams'], message: 'preemptStreams pauses streams for flow control\'s preemption: set preempt: true as well' });
    if (!f.bands.some((b) => b.name === f.defaultBand)) ctx.addIssue({ code: 'custom', path: ['defaultBand'], message: `"${f.defaultBand}" is not one of the bands (${f.bands.map((b) => b.name).join(', ')})` });
  });
export type FlowControlConfig = z.infer<typeof flowControlSchema>;

/** Flow control applies to a pool: on in its configuration, and a per-replica bound to keep (coordinator/queue.ts). */
export function flowControlActive(pool: { flowControl: FlowControlConfig; maxInFlightPerReplica?: number }): boolean {
  return pool.flowControl.enabled && pool.maxInFlightPerReplica !== undefined;
}

const poolSchema = z
  .object({
    name: z.string().regex(ID, 'must be 1-64 characters of letters, digits, "_", "." or "-"'),
    models: z.array(z.string().min(1).max(256)).min(1),
    strategy: strategySpec.default(DEFAULTS.strategy),
    fallback: strategySpec.default(DEFAULTS.fallback),
    keys: z.array(keySpec).min(1).default([...DEFAULTS.keys]),
    loadSignal: z.enum(['inflight', 'inflight+waiting']).default('inflight'),
    /** The engine behind the replicas (src/engines/): which keyless APIs the pool serves. */
    engine: z.enum(ENGINES).default('vllm'),
    /** Keyless APIs the pool serves, instead of its engine's list (e.g. [] for a chat-only pool). */
    endpoints: z.array(z.enum(KEYLESS_APIS)).max(KEYLESS_APIS.length).optional(),
    pointsPerWeight: z.number().int().min(1).max(1000).default(DEFAULTS.pointsPerWeight),
    /**
     * Where the pool's coordinator should live (Durable Object location hint: wnam, enam, sam, weur,
     * eeur, apac, oc, afr, me); put it near the replicas (docs/scaling.md). Applies when it is first created.
     */
    locationHint: z.enum(REGIONS).optional(),
    /**
     * The region this pool serves from (cross-region failover): a model served by pools in several
     * regions goes to the nearest one with capacity (http/regions.ts). Also the coordinator's
     * location hint unless `locationHint` says otherwise.
     */
    region: z.enum(REGIONS).optional(),
    /**
     * A replica with this many requests in flight takes no more: when all are there the pool is
     * saturated, and a regional model spills to the next region (unset: only the load bound).
     */
    maxInFlightPerReplica: z.number().int().min(1).optional(),
    /** Queue at the edge when every replica is at maxInFlightPerReplica (docs/operations.md, "Flow control"). */
    flowControl: flowControlSchema.prefault({}),
    /** Per-tenant cap on requests in flight in this pool (a tenant record's own limit wins). */
    maxInFlightPerTenant: z.number().int().min(1).optional(),
    healthIntervalMs: z.number().int().min(100).default(DEFAULTS.healthIntervalMs),
    healthTimeoutMs: z.number().int().min(50).default(DEFAULTS.healthTimeoutMs),
    /**
     * Health checks and scrapes in progress at once from the coordinator (a round is spread over
     * ticks). At most 6: an invocation has six simultaneous outgoing connections and queues the rest
     * while their timeouts already run, which reads as false failures
     * (developers.cloudflare.com/workers/platform/limits/#simultaneous-open-connections).
     */
    healthConcurrency: z.number().int().min(1).max(MAX_SIMULTANEOUS_CONNECTIONS, `at most ${MAX_SIMULTANEOUS_CONNECTIONS}: a Workers invocation opens six connections at once and queues the rest while their timeouts run (developers.cloudflare.com/workers/platform/limits/#simultaneous-open-connections)`).default(4),
    fall: z.number().int().min(1).default(DEFAULTS.fall),
    rise: z.number().int().min(1).default(DEFAULTS.rise),
    maxFails: z.number().int().min(1).default(DEFAULTS.maxFails),
    failWindowMs: z.number().int().min(100).default(DEFAULTS.failWindowMs),
    failTimeoutMs: z.number().int().min(100).default(DEFAULTS.failTimeoutMs),
    scrapeIntervalMs: z.number().int().min(100).default(DEFAULTS.scrapeIntervalMs),
    /** Window of the vLLM-reported prefix-cache hit rate (from counter deltas). */
    hitRateWindowMs: z.number().int().min(1000).default(300_000),
    /** Queue imbalance alert: waiting > max(factor × median, median + offset) for holdMs. */
    imbalanceFactor: z.number().min(1).default(2),
    imbalanceOffset: z.number().min(0).default(4),
    imbalanceHoldMs: z.number().int().min(0).default(600_000),
    /** Hot key alert: one key above this share of the pool's requests over the window. */
    hotKeyShare: z.number().gt(0).max(1).default(0.2),
    hotKeyMinCount: z.number().int().min(0).default(50),
    hotKeyWindowMs: z.number().int().min(1000).default(300_000),
    /** prefix-aware: most prompt blocks (256 bytes ≈ 64 tokens each) hashed and indexed per request. */
    prefixMaxBlocks: z.number().int().min(1).max(4096).default(512),
    /** prefix-aware: a replica's KV capacity in router blocks until vllm:cache_config_info is scraped. */
    prefixCapacityBlocks: z.number().int().min(1).default(8192),
    /** prefix-aware: global cap on (block, replica) index entries (≤ 52 bytes each), at most what fits in an isolate (MAX_INDEX_ENTRIES). */
    prefixIndexMaxEntries: z
      .number()
      .int()
      .min(1024)
      .max(MAX_INDEX_ENTRIES, `at most ${MAX_INDEX_ENTRIES} (≈ 27 MB: a Workers isolate's 128 MB also holds the Worker and other pools' indexes)`)
      .default(MAX_INDEX_ENTRIES),
    replicas: z.array(replicaSchema).default([]),
    /**
     * prefix-aware, vLLM: pin each request to one data-parallel engine of a replica whose scrape
     * reports several (`engine` label), with vLLM's `X-data-parallel-rank` header, and keep one
     * index slot per engine. Unset: on. false: vLLM's own balancer picks the engine and the
     * replica's engines are one cache to the index. docs/operations.md, "Data-parallel engines".
     */
    dataParallelPinning: z.boolean().optional(),
    /**
     * Origin auth references replicas of this pool may use (also through the admin API); unset:
     * those the configured replicas use, plus "none". An admin-added replica naming another is a 400.
     */
    authRefs: z.array(authRefSchema).optional(),
    /**
     * The engine's prefix cache partition: `tenant` sets `cache_salt` to a keyed hash of the tenant
     * (CACHE_SALT_KEY), `shared` lets tenants share cached prefixes (timing side channel,
     * CVE-2025-46570: only for tenants that may see each other's prompts), `off` for engines without
     * cache_salt (llama.cpp, vLLM V0): the field is not sent. vLLM and SGLang both honour it, so the
     * default stays `tenant` for every engine: SGLang folds it into the radix tree's namespace
     * (python/sglang/srt/entrypoints/openai/serving_base.py `_compute_extra_key` → `RadixKey.extra_key`;
     * mem_cache/radix_cache.py `match_prefix`: different extra_keys "never share prefix nodes";
     * sgl-project/sglang#10317, effective since #23300). docs/operations.md, "Tenant isolation".
     */
    cacheSalt: z.enum(['tenant', 'shared', 'off']).default('tenant'),
    /**
     * vLLM's Messages endpoint (/v1/messages) drops `cache_salt` (its request model has no such
     * field), so on a `cacheSalt: "tenant"` pool tenants' Messages requests would share the prefix
     * cache. Refused (403) unless this is true: the operator accepts cross-tenant prefix sharing on
     * that path (CVE-2025-46570's timing side channel). docs/operations.md, "Tenant isolation".
     */
    messagesSharedCache: z.boolean().default(false),
    /**
     * Responses API streams broken after their first token are continued on another replica
     * (issue #28) through vLLM's partial-message continuation (an assistant input item with
     * `status: in_progress`; vllm-project/vllm#32100, responses/utils.py
     * should_continue_final_message). Off by default: an older vLLM starts a new message instead.
     * docs/operations.md, "Continuing a broken stream".
     */
    continueResponses: z.boolean().default(false),
    /** Engine control fields (src/engines/request-fields.ts) clients of this pool may set; all are removed otherwise. */
    allowEngineFields: z.array(z.string()).default([]).superRefine((names, ctx) => {
      for (const n of names) {
        const problem = engineFieldProblem(n);
        if (problem) ctx.addIssue({ code: 'custom', message: problem });
      }
    }),
    /** Most choices (`n`) and `best_of` one request may ask for, and its output tokens. */
    maxN: z.number().int().min(1).max(128).default(DEFAULTS.maxN),
    maxBestOf: z.number().int().min(1).max(128).default(DEFAULTS.maxBestOf),
    maxOutputTokens: z.number().int().min(1).max(10_000_000).default(DEFAULTS.maxOutputTokens),
    /** Client headers forwarded to this pool's origins beyond the fixed list (names, case-insensitive). */
    forwardHeaders: z.array(z.string()).default([]).superRefine((names, ctx) => {
      for (const n of names) {
        const problem = forwardHeaderProblem(n);
        if (problem) ctx.addIssue({ code: 'custom', message: problem });
      }
    }).transform((names) => names.map((n) => n.toLowerCase())),
  })
  .superRefine((p, ctx) => {
    if (p.authRefs) {
      p.replicas.forEach((r, i) => {
        if (r.auth !== 'none' && !p.authRefs!.includes(r.auth)) ctx.addIssue({ code: 'custom', path: ['replicas', i, 'auth'], message: `"${r.auth}" is not in the pool's authRefs` });
      });
    }
    const seen = new Set<string>();
    p.replicas.forEach((r, i) => {
      if (seen.has(r.id)) ctx.addIssue({ code: 'custom', path: ['replicas', i, 'id'], message: `duplicate replica id "${r.id}"` });
      seen.add(r.id);
    });
    if (p.dataParallelPinning === true && engineProfile(p.engine).dataParallelRanks === undefined) ctx.addIssue({ code: 'custom', path: ['dataParallelPinning'], message: `pins vLLM's data-parallel engines only (X-data-parallel-rank); a "${p.engine}" pool is never pinned` });
    if (p.dataParallelPinning === true && !strategyUsesPrefix(p.strategy)) ctx.addIssue({ code: 'custom', path: ['dataParallelPinning'], message: `only a prefix-aware pool pins engines (the prefix index says which holds a prompt); strategy "${p.strategy}" never does` });
    const fb = createStrategy(p.fallback);
    if (fb.keyed) ctx.addIssue({ code: 'custom', path: ['fallback'], message: 'the fallback must not need a key (least-load or round-robin)' });
  });
export type PoolConfig = z.infer<typeof poolSchema>;

function strategyUsesPrefix(spec: string): boolean {
  try {
    return createStrategy(spec).usesPrefix === true;
  } catch {
    return true; // an invalid strategy has its own error
  }
}

const configSchema = z
  .object({
    pools: z.array(poolSchema).min(1),
    /** Pool for requests whose model no pool lists; unset means such requests get 404. */
    defaultPool: z.string().optional(),
    maxBodyBytes: z.number().int().min(1024).max(MAX_BODY_BYTES_CAP, `at most ${MAX_BODY_BYTES_CAP} (8 MiB): a body is held several times over while it is parsed and rewritten (3-4 copies measured), and an isolate has 128 MB for all its requests (docs/deploy.md, "What each limit means for your fleet")`).default(DEFAULTS.maxBodyBytes),
    maxHeaderBytes: z.number().int().min(1024).max(1024 * 1024).default(DEFAULTS.maxHeaderBytes),
    /**
     * UsageRegistry shards (quota/registry-shards.ts): a tenant's usage reports go to shard
     * hash(tenant) % usageShards, readers fan out and merge. One Durable Object serves about 1,000
     * requests/s (developers.cloudflare.com/durable-objects/reference/faq/#how-much-work-can-a-single-durable-object-do)
     * and a meter reports at most once per 2 s: ~2,000 active tenants per shard. Raise it, never lower it
     * (the shards past the new count are no longer read).
     */
    usageShards: z.number().int().min(1).max(64).default(1),
    /** Days of hourly usage rows the registry keeps for the billing export (an alarm deletes older ones). */
    usageRetentionDays: z.number().int().min(1).max(400).default(400),
    bodyTimeoutMs: z.number().int().min(100).default(DEFAULTS.bodyTimeoutMs),
    maxRetries: z.number().int().min(0).max(5).default(DEFAULTS.maxRetries),
    maxContinuations: z.number().int().min(0).max(5).default(DEFAULTS.maxContinuations),
    retryAfterSeconds: z.number().int().min(1).max(3600).default(DEFAULTS.retryAfterSeconds),
    firstTokenTimeoutMs: z.number().int().min(100).optional(),
    /** The old name of firstTokenTimeoutMs (when it bounded the time to headers): read when that one is not set. */
    firstByteTimeoutMs: z.number().int().min(100).optional(),
    idleTimeoutMs: z.number().int().min(100).default(DEFAULTS.idleTimeoutMs),
    clientStallMs: z.number().int().min(100).default(DEFAULTS.clientStallMs),
    maxStreamMs: z.number().int().min(1000).default(DEFAULTS.maxStreamMs),
    tenantCacheMs: z.number().int().min(0).max(300_000).default(DEFAULTS.tenantCacheMs),
    /** Failed operator credentials (admin bearer, dashboard login) per client and window before 429. */
    authFailureLimit: z.number().int().min(1).max(10_000).default(20),
    authFailureWindowMs: z.number().int().min(1000).max(86_400_000).default(300_000),
    /** Whole-request limit of a non-streaming request; its timeout is not held against the replica. */
    nonStreamTimeoutMs: z.number().int().min(1000).default(DEFAULTS.nonStreamTimeoutMs),
    responseAffinityTtlMs: z.number().int().min(60_000).max(30 * 24 * 3600_000).default(DEFAULTS.responseAffinityTtlMs),
    responseAffinityMaxEntries: z.number().int().min(100).max(10_000_000).default(DEFAULTS.responseAffinityMaxEntries),
    replicaHeader: z.boolean().default(true),
    /**
     * Send a keyed request's first attempt to the replica this isolate last leased the key on while
     * the acquire RPC is in flight; cancelled if the coordinator picks otherwise (proxy/early-connect.ts).
     */
    earlyConnect: z.boolean().default(true),
    /** Emit one JSON trace line per finished request (docs/observability.md). */
    traceLog: z.boolean().default(true),
    /** Chained prompt-block hashes kept in each trace line, for replay in the simulator (0: none). */
    traceBlocks: z.number().int().min(0).max(4096).default(128),
    leaseTtlMs: z.number().int().min(1_000).max(600_000).default(DEFAULTS.leaseTtlMs),
    renewIntervalMs: z.number().int().min(100).default(DEFAULTS.renewIntervalMs),
    releaseFlushMs: z.number().int().min(0).max(5_000).default(DEFAULTS.releaseFlushMs),
    acquireTimeoutMs: z.number().int().min(10).max(60_000).default(DEFAULTS.acquireTimeoutMs),
    coordinatorRetryMs: z.number().int().min(0).max(60_000).default(DEFAULTS.coordinatorRetryMs),
    /**
     * This configuration runs on one machine (`npm start`, tests): its replicas are loopback mocks.
     * No effect on the Worker; `npm run deploy:check` validates such a configuration for a local
     * run only, says it is not deployable, and `--strict` refuses it (docs/deploy.md).
     */
    local: z.boolean().default(false),
  })
  .superRefine((c, ctx) => {
    const names = new Set<string>();
    c.pools.forEach((p, i) => {
      if (names.has(p.name)) ctx.addIssue({ code: 'custom', path: ['pools', i, 'name'], message: `duplicate pool "${p.name}"` });
      names.add(p.name);
    });
    if (c.defaultPool !== undefined && !names.has(c.defaultPool)) ctx.addIssue({ code: 'custom', path: ['defaultPool'], message: `no pool named "${c.defaultPool}"` });
    // Two renewals fit in one TTL, so one lost renewal never reaps a live lease.
    if (c.renewIntervalMs * 2 > c.leaseTtlMs) ctx.addIssue({ code: 'custom', path: ['renewIntervalMs'], message: `must be at most half of leaseTtlMs (${c.leaseTtlMs})` });
  });

export type RouterConfigInput = z.input<typeof configSchema>;

export interface PoolRuntime extends PoolConfig {
  /** Auth references replicas of this pool may use (`authRefs`, or the configured replicas' plus "none"). */
  readonly allowedAuthRefs: ReadonlySet<string>;
  readonly strategyImpl: Strategy;
  readonly fallbackImpl: Strategy;
  readonly keySources: readonly KeySource[];
  /** Keyless APIs this pool serves: `endpoints`, or its engine's list. */
  readonly keylessApis: ReadonlySet<KeylessApi>;
}

export interface RouterConfig extends Omit<z.infer<typeof configSchema>, 'pools' | 'firstTokenTimeoutMs' | 'firstByteTimeoutMs'> {
  /** `firstTokenTimeoutMs`, else the old `firstByteTimeoutMs`, else the default. */
  readonly firstTokenTimeoutMs: number;
  readonly pools: readonly PoolRuntime[];
  readonly poolByName: ReadonlyMap<string, PoolRuntime>;
  readonly poolByModel: ReadonlyMap<string, PoolRuntime>;
  /** Every pool serving a model, in configuration order (several: one per region). */
  readonly poolsByModel: ReadonlyMap<string, readonly PoolRuntime[]>;
}

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

export interface ParseOptions {
  /** `edge` refuses loopback origins too (`npm run deploy:check`); `local` (default) accepts them. See OriginTarget. */
  target?: OriginTarget;
  /** Where the value came from, for messages: `ROUTER_CONFIG` (default) or `router.config.json`. */
  source?: ConfigSource;
}

/** The two places a configuration comes from: the var, or the JSON module bundled with the Worker. */
export type ConfigSource = 'ROUTER_CONFIG' | 'router.config.json';

/** Parse and validate; throws ConfigError whose message names every bad field. */
export function parseConfig(raw: unknown, opts: ParseOptions = {}): RouterConfig {
  const src = opts.source ?? 'ROUTER_CONFIG';
  let value = raw;
  if (typeof raw === 'string') {
    try {
      value = JSON.parse(raw);
    } catch (e) {
      throw new ConfigError(`${src} is not valid JSON: ${(e as Error).message}`);
    }
  }
  if (value === undefined || value === null) throw new ConfigError(src === 'ROUTER_CONFIG' ? 'ROUTER_CONFIG is not set' : `${src} holds no configuration`);
  const res = configSchema.safeParse(value);
  if (!res.success) {
    const lines = res.error.issues.map((i) => `${src}.${i.path.join('.')}: ${i.message}`);
    throw new ConfigError(`invalid configuration:\n  ${lines.join('\n  ')}`);
  }
  if (opts.target === 'edge') {
    // The schema accepts loopback (the Worker cannot tell Miniflare from the edge); a deploy does not.
    const lines: string[] = [];
    res.data.pools.forEach((p, i) =>
      p.replicas.forEach((r, j) => {
        const problem = replicaUrlProblem(r.url, 'edge');
        if (problem) lines.push(`${src}.pools.${i}.replicas.${j}.url: ${problem}`);
      }),
    );
    if (lines.length > 0) throw new ConfigError(`invalid configuration for the edge:\n  ${lines.join('\n  ')}`);
  }
  const pools = res.data.pools.map(
    (p): PoolRuntime => ({
      ...p,
      allowedAuthRefs: new Set(['none', ...(p.authRefs ?? p.replicas.map((r) => r.auth))]),
      strategyImpl: createStrategy(p.strategy),
      fallbackImpl: createStrategy(p.fallback),
      keySources: p.keys.map(parseKeySource),
      keylessApis: new Set(p.endpoints ?? engineApis(p.engine)),
    }),
  );
  const poolByName = new Map(pools.map((p) => [p.name, p]));
  const poolByModel = new Map<string, PoolRuntime>();
  // A model listed by several pools routes to the first; tenants allowed to may pick another with x-pool.
  for (const p of pools) for (const m of p.models) if (!poolByModel.has(m)) poolByModel.set(m, p);
  const poolsByModel = new Map<string, PoolRuntime[]>();
  for (const p of pools) for (const m of p.models) poolsByModel.set(m, [...(poolsByModel.get(m) ?? []), p]);
  const { firstTokenTimeoutMs, firstByteTimeoutMs, ...rest } = res.data;
  return { ...rest, firstTokenTimeoutMs: firstTokenTimeoutMs ?? firstByteTimeoutMs ?? DEFAULTS.firstTokenTimeoutMs, pools, poolByName, poolByModel, poolsByModel };
}

const cache = new WeakMap<object, RouterConfig>();
let lastString: { raw: string; config: RouterConfig } | undefined;

/**
 * Parse once per isolate: the same env value returns the same parsed config. Without the
 * `ROUTER_CONFIG` var, the bundled `router.config.json` (`bundled`, for tests) is the configuration.
 */
export function loadConfig(raw: unknown, bundled: unknown = bundledRouterConfig): RouterConfig {
  if (raw === undefined || raw === null) {
    if (bundled === undefined || bundled === null) throw new ConfigError('no configuration: set the ROUTER_CONFIG var or put it in router.config.json next to wrangler.toml (docs/deploy.md)');
    if (typeof bundled !== 'object') return parseConfig(bundled, { source: 'router.config.json' });
    const hit = cache.get(bundled);
    if (hit) return hit;
    const config = parseConfig(bundled, { source: 'router.config.json' });
    cache.set(bundled, config);
    return config;
  }
  if (typeof raw === 'string') {
    if (lastString?.raw === raw) return lastString.config;
    const config = parseConfig(raw);
    lastString = { raw, config };
    return config;
  }
  if (raw !== null && typeof raw === 'object') {
    const hit = cache.get(raw);
    if (hit) return hit;
    const config = parseConfig(raw);
    cache.set(raw, config);
    return config;
  }
  return parseConfig(raw);
}
