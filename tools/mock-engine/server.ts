// The mock vLLM replica: a node:http server on 127.0.0.1 with vLLM's OpenAI endpoints, /health,
// /metrics and the mock's /_mock/* control endpoints, over a simulated engine (prefix cache,
// prefill and decode delays, a bounded set of running sequences with a FIFO waiting queue).
//
// The engine is a timing model, not a GPU model: each sequence sleeps for its own prefill and
// per-token decode delays; they do not slow each other down beyond the `maxRunning` slots.

import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';

import { seededRandom } from '../../src/core/random.js';
import { FINISH_REASONS, newCounters, observeTtft, renderMetrics, type FinishReason } from './metrics.js';
import { openAIFormat, type Counts, type Finish, type WireFormat } from './wire-format.js';
import { ResponsesApi } from './responses-api.js';
import { MessagesApi } from './anthropic-api.js';
import {
  modelList,
  parseCompletionRequest,
  type Kind,
  type ParsedRequest,
  type ResponseIds,
  type WireError,
} from './openai-format.js';
import { answerKeyless, keylessApiFor } from './keyless.js';
import { chainBlockHashes, PrefixCache, saltParent } from './prefix-cache.js';
import { balanceEngine, parseRankHeader, rankOutOfRange, STATS_INTERVAL_MS } from './data-parallel.js';
import { BLOCK_TOKENS, countTokens, fullBlocks, outputStart, outputToken } from './prompt.js';
import { ENGINE_ERROR, errorJson, inBandError, resolveProfile, SSE_KEEP_ALIVE_COMMENT, unauthorizedJson, type EngineFamily, type ProfileBehaviour } from './profiles.js';
import {
  DEFAULT_FAULTS,
  type MetricsFlavor,
  type MockFaults,
  type MockStats,
  type MockVllm,
  type MockVllmOptions,
  type ReceivedRequest,
} from './types.js';

const HOST = '127.0.0.1';
/** Request bodies above this are refused; vLLM has no such limit, but a mock should not eat RAM. */
const MAX_BODY_BYTES = 64 * 1024 * 1024;

interface ResolvedOptions {
  id: string;
  port: number;
  models: string[];
  apiKey: string | undefined;
  cacheBlocks: number;
  prefillTokensPerSec: number;
  decodeMsPerToken: number;
  maxRunning: number;
  maxModelLen: number;
  seed: number;
  metricsFlavor: MetricsFlavor;
  dataParallelSize: number;
  behaviour: ProfileBehaviour;
  /** vLLM's --sse-keep-alive-interval, ms; null: off (vLLM's default). */
  sseKeepAliveMs: number | null;
}

function positive(name: string, v: number): number {
  if (!Number.isFinite(v) || v <= 0) throw new Error(`mock-vllm: ${name} must be a positive number, got ${v}`);
  return v;
}

function resolveOptions(o: MockVllmOptions): ResolvedOptions {
  const models = o.models === undefined ? ['demo-model'] : Array.isArray(o.models) ? o.models : [o.models];
  if (models.length === 0 || models.some((m) => !m)) throw new Error('mock-vllm: models must be non-empty names');
  const behaviour = resolveProfile(o.profile, { headersFirst: o.headersFirst, responsesStore: o.responsesStore, metricsFlavor: o.metricsFlavor });
  const flavor = behaviour.metricsFlavor;
  if (!['current', 'v1-blocks', 'v0', 'sglang', 'llamacpp'].includes(flavor)) throw new Error(`mock-vllm: unknown metricsFlavor ${flavor}`);
  return {
    id: o.id ?? 'mock',
    port: o.port ?? 0,
    models,
    apiKey: o.apiKey || undefined,
    cacheBlocks: Math.floor(positive('cacheBlocks', o.cacheBlocks ?? 2048)),
    prefillTokensPerSec: positive('prefillTokensPerSec', o.prefillTokensPerSec ?? 50_000),
    decodeMsPerToken: o.decodeMsPerToken ?? 2,
    maxRunning: Math.floor(positive('maxRunning', o.maxRunning ?? 8)),
    maxModelLen: Math.floor(positive('maxModelLen', o.maxModelLen ?? 32_768)),
    seed: o.seed ?? 0,
    metricsFlavor: flavor,
    dataParallelSize: dataParallelSize(o.dataParallelSize),
    behaviour,
    sseKeepAliveMs: sseKeepAlive(o.sseKeepAliveMs, behaviour),
  };
}

function sseKeepAlive(ms: number | undefined, b: ProfileBehaviour): number | null {
  if (ms === undefined || ms === 0) return null;
  if (!b.sseKeepAlive) throw new Error(`mock-vllm: sseKeepAliveMs models vLLM's --sse-keep-alive-interval; profile ${b.profile} has no such flag`);
  return positive('sseKeepAliveMs', ms);
}

function dataParallelSize(n: number | undefined): number {
  if (n === undefined) return 1;
  if (!Number.isInteger(n) || n < 1 || n > 64) throw new Error(`mock-vllm: dataParallelSize must be an integer 1..64, got ${n}`);
  return n;
}

/** Validate and merge fault flags; throws with the bad field named. */
export function mergeFaults(base: MockFaults, partial: Partial<MockFaults>): MockFaults {
  const next = { ...base };
  for (const [k, v] of Object.entries(partial)) {
    switch (k) {
      case 'failHealth':
      case 'stallBeforeForever':
      case 'dropConnection':
        if (typeof v !== 'boolean') throw new Error(`fault ${k} must be a boolean`);
        next[k] = v;
        break;
      case 'error500Rate':
        if (typeof v !== 'number' || !(v >= 0 && v <= 1)) throw new Error('fault error500Rate must be in 0..1');
        next.error500Rate = v;
        break;
      case 'errorStatus':
        if (typeof v !== 'number' || !Number.isInteger(v) || v < 500 || v > 599) throw new Error('fault errorStatus must be a 5xx status');
        next.errorStatus = v;
        break;
      case 'stallBeforeMs':
        if (typeof v !== 'number' || !(v >= 0)) throw new Error('fault stallBeforeMs must be >= 0');
        next.stallBeforeMs = v;
        break;
      case 'slowFactor':
        if (typeof v !== 'number' || !(v >= 0)) throw new Error('fault slowFactor must be >= 0');
        next.slowFactor = v;
        break;
      case 'stallMidStream':
      case 'inBandErrorAfter':
      case 'dropAfterTokens':
      case 'stallAfterTokens':
        if (v !== null && (typeof v !== 'number' || !Number.isInteger(v) || v < 0)) {
          throw new Error(`fault ${k} must be null or an integer >= 0`);
        }
        next[k] = v as number | null;
        break;
      default:
        throw new Error(`unknown fault ${k}`);
    }
  }
  return next;
}

/** Sleep unless aborted first; resolves false when aborted. */
async function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return false;
  if (ms <= 0) return true;
  try {
    await delay(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) {
        reject(new Error('body too large'));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function parseMaybeJson(raw: string): unknown {
  if (raw === '') return null;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

/** One sequence in the engine: what it holds in the cache and how many tokens it occupies. */
interface Sequence {
  held: string[];
  tokens: number;
}

/**
 * Slots for running sequences with a FIFO waiting queue, as vLLM's V1 scheduler with
 * `--max-num-seqs` and its default `--scheduling-policy fcfs`: Scheduler.schedule() admits from
 * `self.waiting` only while `len(self.running) < self.max_num_running_reqs` (= max_num_seqs), and
 * FCFSRequestQueue pops the oldest first (vllm-project/vllm vllm/v1/core/sched/scheduler.py,
 * vllm/v1/core/sched/request_queue.py). `waiting` is `len(self.waiting)`, which make_stats() reports
 * as SchedulerStats.num_waiting_reqs and vllm/v1/metrics/loggers.py exports as
 * `vllm:num_requests_waiting` (running: `vllm:num_requests_running`). A request aborted while it
 * waits leaves the queue (Scheduler.finish_requests removes it from `waiting`).
 */
class Slots {
  running = 0;
  /** Most sequences waiting at once since the last reset (how deep the engine's own FIFO got). */
  peakWaiting = 0;
  private readonly queue: Array<() => void> = [];

  constructor(private readonly max: number) {}

  get waiting(): number {
    return this.queue.length;
  }

  /** Resolves true once a slot is taken, false if `signal` aborts while waiting. */
  acquire(signal: AbortSignal): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    if (this.running < this.max && this.queue.length === 0) {
      this.running++;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const grant = (): void => {
        signal.removeEventListener('abort', onAbort);
        this.running++;
        resolve(true);
      };
      const onAbort = (): void => {
        const i = this.queue.indexOf(grant);
        if (i >= 0) this.queue.splice(i, 1);
        resolve(false);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.queue.push(grant);
      if (this.queue.length > this.peakWaiting) this.peakWaiting = this.queue.length;
    });
  }

  release(): void {
    this.running--;
    const next = this.queue.shift();
    if (next) next();
  }
}

/**
 * One engine core: its own prefix cache, scheduler slots and running sequences (a vLLM server
 * with --data-parallel-size N has N of them behind one API server), and its prefix counters.
 */
class EngineCore {
  readonly cache: PrefixCache;
  readonly slots: Slots;
  readonly sequences = new Set<Sequence>();
  prefix = { queriesTokens: 0, hitsTokens: 0, queriesBlocks: 0, hitsBlocks: 0 };
  requests = 0;
  /** The balancer's view: counts as last published, plus its own picks since. */
  published = { waiting: 0, running: 0 };

  constructor(readonly cacheBlocks: number, maxRunning: number) {
    this.cache = new PrefixCache(cacheBlocks);
    this.slots = new Slots(maxRunning);
  }

  reset(): void {
    this.cache.clear();
    this.slots.peakWaiting = this.slots.waiting;
    this.prefix = { queriesTokens: 0, hitsTokens: 0, queriesBlocks: 0, hitsBlocks: 0 };
    this.requests = 0;
  }

  /** KV usage as vLLM reports it: blocks in use by running sequences over capacity (cached-but-free blocks count as free). */
  kvUsage(): number {
    let privateBlocks = 0;
    for (const s of this.sequences) privateBlocks += Math.max(0, Math.ceil(s.tokens / BLOCK_TOKENS) - s.held.length);
    return Math.min(1, (this.cache.heldBlocks + privateBlocks) / this.cacheBlocks);
  }
}

class MockReplica {
  readonly opts: ResolvedOptions;
  faults: MockFaults;
  /** Engine cores in rank order (one unless dataParallelSize > 1). */
  readonly engines: EngineCore[];
  /** When the balancer's counts were last refreshed (every STATS_INTERVAL_MS, as vLLM's DP coordinator publishes). */
  private publishedAt = -Infinity;
  /** Seeded, so `error500Rate` replays identically for a given seed. */
  private rng: () => number;
  private readonly shutdown = new AbortController();
  private readonly startedAt = Math.floor(Date.now() / 1000);
  port = 0;

  // Counters (cleared by reset).
  private counters = newCounters(Date.now());
  private requestsTotal = 0;
  private completionRequestsTotal = 0;
  private keylessRequestsTotal = 0;
  private byStatus: Record<string, number> = {};
  private activeStreams = 0;
  private abortedByClient = 0;
  private droppedConnections = 0;
  private injectedErrors = 0;
  private injectedInBandErrors = 0;
  private keepAlivesSent = 0;
  private lastRequest: ReceivedRequest | null = null;
  private lastCompletionRequest: ReceivedRequest | null = null;
  private lastPostByPath = new Map<string, ReceivedRequest>();

  /** The Responses API and its per-instance store (responses-api.ts); the Messages API (anthropic-api.ts). */
  readonly responsesApi: ResponsesApi;
  readonly messagesApi: MessagesApi;

  constructor(options: MockVllmOptions) {
    this.opts = resolveOptions(options);
    const host = {
      models: this.opts.models,
      maxModelLen: this.opts.maxModelLen,
      behaviour: this.opts.behaviour,
      generate: this.generate.bind(this),
      rankProblem: (h: string | string[] | undefined) => {
        const e = this.engineFor(h);
        return e instanceof EngineCore ? null : e.message;
      },
      openStream: (res: ServerResponse) => new SseWriter(res, () => null, new AbortController().signal, this, this.opts.behaviour).openNow(),
    };
    this.responsesApi = new ResponsesApi(host);
    this.messagesApi = new MessagesApi(host);
    this.faults = mergeFaults({ ...DEFAULT_FAULTS }, options.faults ?? {});
    this.engines = Array.from({ length: this.opts.dataParallelSize }, () => new EngineCore(this.opts.cacheBlocks, this.opts.maxRunning));
    this.rng = seededRandom(this.opts.seed);
  }

  abortAll(): void {
    this.shutdown.abort();
  }

  reset(): void {
    for (const e of this.engines) e.reset();
    this.responsesApi.clear();
    this.counters = newCounters(Date.now());
    this.requestsTotal = 0;
    this.completionRequestsTotal = 0;
    this.keylessRequestsTotal = 0;
    this.byStatus = {};
    this.abortedByClient = 0;
    this.droppedConnections = 0;
    this.injectedErrors = 0;
    this.injectedInBandErrors = 0;
    this.keepAlivesSent = 0;
    this.lastRequest = null;
    this.lastCompletionRequest = null;
    this.lastPostByPath.clear();
    this.rng = seededRandom(this.opts.seed);
  }

  stats(): MockStats {
    const finishedByReason: Record<string, number> = {};
    for (const r of FINISH_REASONS) finishedByReason[r] = this.counters.finished[r];
    const sum = (f: (e: EngineCore) => number) => this.engines.reduce((a, e) => a + f(e), 0);
    return {
      id: this.opts.id,
      port: this.port,
      models: [...this.opts.models],
      requestsTotal: this.requestsTotal,
      completionRequestsTotal: this.completionRequestsTotal,
      keylessRequestsTotal: this.keylessRequestsTotal,
      byStatus: { ...this.byStatus },
      activeStreams: this.activeStreams,
      running: sum((e) => e.slots.running),
      waiting: sum((e) => e.slots.waiting),
      peakWaiting: sum((e) => e.slots.peakWaiting),
      abortedByClient: this.abortedByClient,
      droppedConnections: this.droppedConnections,
      injectedErrors: this.injectedErrors,
      injectedInBandErrors: this.injectedInBandErrors,
      keepAlivesSent: this.keepAlivesSent,
      profile: this.opts.behaviour.profile,
      prefixCache: {
        queriesTokens: this.counters.prefixQueriesTokens,
        hitsTokens: this.counters.prefixHitsTokens,
        blocks: sum((e) => e.cache.size),
        capacityBlocks: sum((e) => e.cache.capacity),
        heldBlocks: sum((e) => e.cache.heldBlocks),
        evictions: sum((e) => e.cache.evictions),
      },
      ...(this.engines.length > 1
        ? {
            engines: this.engines.map((e, rank) => ({
              rank,
              requests: e.requests,
              running: e.slots.running,
              waiting: e.slots.waiting,
              prefixCache: { queriesTokens: e.prefix.queriesTokens, hitsTokens: e.prefix.hitsTokens, blocks: e.cache.size, capacityBlocks: e.cache.capacity },
            })),
          }
        : {}),
      promptTokensTotal: this.counters.promptTokens,
      generationTokensTotal: this.counters.generationTokens,
      finishedByReason,
      faults: { ...this.faults },
      lastRequest: this.lastRequest,
      lastCompletionRequest: this.lastCompletionRequest,
      lastPostByPath: Object.fromEntries(this.lastPostByPath),
    };
  }

  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? '/', 'http://mock').pathname;
    const method = req.method ?? 'GET';
    let raw: string;
    try {
      raw = await readBody(req);
    } catch (err) {
      // Either the body was too large or the client went away mid-body; only the first gets an answer.
      if ((err as Error).message === 'body too large' && !res.headersSent) sendJson(res, 413, { error: 'body too large' });
      return;
    }

    if (path.startsWith('/_mock/')) return this.handleControl(method, path, raw, res);

    this.requestsTotal++;
    const received: ReceivedRequest = { method, path, headers: { ...req.headers }, body: parseMaybeJson(raw) };
    this.lastRequest = received;
    if (method === 'POST') {
      // Bounded: a client cycling through made-up paths keeps at most 64 of them.
      if (this.lastPostByPath.size >= 64 && !this.lastPostByPath.has(path)) this.lastPostByPath.clear();
      this.lastPostByPath.set(path, received);
    }
    res.on('close', () => {
      if (res.headersSent) this.byStatus[res.statusCode] = (this.byStatus[res.statusCode] ?? 0) + 1;
    });

    if (this.faults.dropConnection) {
      this.droppedConnections++;
      req.socket.destroy();
      return;
    }

    // vLLM's --api-key middleware guards /v1 only; /health and /metrics stay open.
    if (this.opts.apiKey !== undefined && path.startsWith('/v1') && method !== 'OPTIONS') {
      if (req.headers.authorization !== `Bearer ${this.opts.apiKey}`) return sendJson(res, 401, unauthorizedJson(this.opts.behaviour.family));
    }

    const route = `${method} ${path}`;
    const byId = /^\/v1\/responses\/([^/]+)(\/cancel)?$/.exec(path);
    if (byId) {
      const id = decodeURIComponent(byId[1]!);
      if (byId[2] && method === 'POST') return this.responsesApi.cancel(id, res);
      if (!byId[2] && method === 'GET') return this.responsesApi.retrieve(id, new URL(req.url ?? '/', 'http://mock').searchParams, res);
      return sendJson(res, 405, { detail: 'Method Not Allowed' });
    }
    switch (route) {
      case 'POST /v1/responses':
        this.completionRequestsTotal++;
        return this.responsesApi.create(req, raw, res);
      case 'POST /v1/messages':
        this.completionRequestsTotal++;
        return this.messagesApi.create(req, raw, res);
      case 'POST /v1/messages/count_tokens':
        return this.messagesApi.countTokens(raw, res);
      case 'GET /health':
        res.writeHead(this.faults.failHealth ? 503 : 200, { 'content-length': '0' }).end();
        return;
      case 'GET /metrics':
        return this.sendMetrics(res);
      case 'GET /v1/models':
        return sendJson(res, 200, modelList(this.opts.models, this.startedAt, this.opts.maxModelLen));
      case 'POST /v1/chat/completions':
      case 'POST /v1/completions':
        this.lastCompletionRequest = received;
        this.completionRequestsTotal++;
        return this.complete(path === '/v1/completions' ? 'completion' : 'chat', req, raw, res);
    }
    const keyless = keylessApiFor(path);
    if (keyless && method === 'POST') {
      this.keylessRequestsTotal++;
      const r = answerKeyless(keyless, raw, { models: this.opts.models, maxModelLen: this.opts.maxModelLen, now: Math.floor(Date.now() / 1000) });
      if (!r.ok) return sendError(res, r.error, this.opts.behaviour.family);
      this.counters.promptTokens += r.promptTokens;
      return sendJson(res, 200, r.body);
    }
    const known = ['/health', '/metrics', '/v1/models', '/v1/chat/completions', '/v1/completions', '/v1/responses', '/v1/messages', '/v1/messages/count_tokens'];
    if (known.includes(path) || keyless) return sendJson(res, 405, { detail: 'Method Not Allowed' });
    return sendJson(res, 404, { detail: 'Not Found' });
  }

  private handleControl(method: string, path: string, raw: string, res: ServerResponse): void {
    const route = `${method} ${path}`;
    if (route === 'GET /_mock/stats') return sendJson(res, 200, this.stats());
    if (route === 'POST /_mock/reset') {
      this.reset();
      return sendJson(res, 200, { ok: true });
    }
    if (route === 'POST /_mock/faults') {
      try {
        const partial = raw === '' ? {} : (JSON.parse(raw) as Partial<MockFaults>);
        if (!partial || typeof partial !== 'object' || Array.isArray(partial)) throw new Error('body must be an object');
        this.faults = mergeFaults(this.faults, partial);
      } catch (err) {
        return sendJson(res, 400, { error: (err as Error).message });
      }
      return sendJson(res, 200, this.faults);
    }
    return sendJson(res, 404, { error: `unknown control endpoint ${route}` });
  }

  private sendMetrics(res: ServerResponse): void {
    const e0 = this.engines[0]!;
    const body = renderMetrics({
      counters: this.counters,
      modelName: this.opts.models[0]!,
      running: e0.slots.running,
      waiting: e0.slots.waiting,
      kvUsage: e0.kvUsage(),
      numGpuBlocks: this.opts.cacheBlocks,
      flavor: this.opts.metricsFlavor,
      ...(this.engines.length > 1
        ? { engines: this.engines.map((e) => ({ running: e.slots.running, waiting: e.slots.waiting, kvUsage: e.kvUsage(), numGpuBlocks: this.configBlocks(e), ...e.prefix })) }
        : {}),
    });
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' }).end(body);
  }

  /**
   * The num_gpu_blocks an engine's cache_config_info label says: vLLM's is the server's total over
   * its data-parallel engines on every label (profiles.ts dpTotalBlocksLabel, legacy's too since
   * the router reads it so); without that flag, the engine's own.
   */
  private configBlocks(e: EngineCore): number {
    return this.opts.behaviour.dpTotalBlocksLabel ? this.engines.reduce((a, x) => a + x.cacheBlocks, 0) : e.cacheBlocks;
  }

  /** The engine core a request runs on: its valid `X-data-parallel-rank`, else the balancer's pick; an error for a rank out of range. */
  private engineFor(header: string | string[] | undefined): EngineCore | WireError {
    const rank = parseRankHeader(header);
    if (rank === null) {
      const now = performance.now();
      if (now - this.publishedAt >= STATS_INTERVAL_MS) {
        this.publishedAt = now;
        for (const e of this.engines) e.published = { waiting: e.slots.waiting, running: e.slots.running };
      }
      const e = this.engines[balanceEngine(this.engines.map((x) => x.published))]!;
      e.published = { ...e.published, waiting: e.published.waiting + 1 };
      return e;
    }
    if (rank < 0 || rank >= this.engines.length) return { status: 400, type: 'BadRequestError', message: rankOutOfRange(rank, this.engines.length, this.opts.behaviour.family) };
    return this.engines[rank]!;
  }

  private async complete(kind: Kind, req: IncomingMessage, raw: string, res: ServerResponse): Promise<void> {
    const arrival = performance.now();
    const b = this.opts.behaviour;
    const parsed = parseCompletionRequest(kind, raw, this.opts.models, this.opts.maxModelLen, countTokens, b);
    if ('status' in parsed) return sendError(res, parsed, b.family);
    const engine = this.engineFor(req.headers['x-data-parallel-rank']);
    if (!(engine instanceof EngineCore)) {
      // vLLM checks the rank inside AsyncLLM.generate, after a stream's headers went out.
      if (parsed.stream && b.rankErrorInBand) {
        const stream = new SseWriter(res, () => null, new AbortController().signal, this, b);
        stream.openNow();
        res.end(inBandError(b.family, engine));
        return;
      }
      return sendError(res, engine, b.family);
    }

    // The client going away (before or during the answer) aborts the sequence; so does close().
    const clientGone = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) clientGone.abort();
    });
    const signal = AbortSignal.any([clientGone.signal, this.shutdown.signal]);

    if (this.faults.error500Rate > 0 && this.rng() < this.faults.error500Rate) {
      this.injectedErrors++;
      return sendError(res, { status: this.faults.errorStatus, type: this.faults.errorStatus === 503 ? 'ServiceUnavailableError' : 'InternalServerError', message: 'mock-vllm: injected error (error500Rate)' }, b.family);
    }
    // Headers-first engines answer a stream's 200 now; queueing, prefill and the stall faults follow.
    const stream = parsed.stream ? new SseWriter(res, () => this.faults.stallMidStream, signal, this, b, this.opts.sseKeepAliveMs) : null;
    if (stream && b.headersFirst) stream.openNow();
    if (this.faults.stallBeforeForever) {
      await untilAborted(signal);
      return this.countClientAbort();
    }
    if (this.faults.stallBeforeMs > 0 && !(await sleep(this.faults.stallBeforeMs, signal))) {
      return this.countClientAbort();
    }

    if (!(await engine.slots.acquire(signal))) {
      // Aborted while waiting: vLLM finishes it with reason "abort".
      this.counters.finished.abort++;
      return this.countClientAbort();
    }
    try {
      const requestId = typeof req.headers['x-request-id'] === 'string' ? req.headers['x-request-id'] : randomUUID().replace(/-/g, '');
      const ids: ResponseIds = {
        id: `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`,
        created: Math.floor(Date.now() / 1000),
        model: parsed.model,
      };
      await this.run(engine, parsed, ids, arrival, signal, res, undefined, stream, true);
    } finally {
      engine.slots.release();
    }
  }

  /** Prefill, decode and answer one admitted sequence. */
  private async run(
    engine: EngineCore,
    p: ParsedRequest,
    ids: ResponseIds,
    arrival: number,
    signal: AbortSignal,
    res: ServerResponse | null,
    format: WireFormat = openAIFormat(p.kind, ids, p.includeUsage, this.opts.behaviour),
    writer: SseWriter | null = null,
    tokenFaults = false,
  ): Promise<void> {
    const c = this.counters;
    const promptTokens = countTokens(p.prompt);
    const hashes = chainBlockHashes(fullBlocks(p.prompt), saltParent(p.cacheSalt));
    // vLLM recomputes the last prompt token to get logits, so a fully cached prompt hits at most
    // up to prompt_len - 1 tokens (KVCacheManager.get_computed_blocks).
    const maxHitBlocks = Math.min(hashes.length, Math.floor((promptTokens - 1) / BLOCK_TOKENS));
    const cache = engine.cache;
    const hitBlocks = cache.matchPrefix(hashes, maxHitBlocks);
    const cachedTokens = hitBlocks * BLOCK_TOKENS;
    const queriedBlocks = Math.ceil(promptTokens / BLOCK_TOKENS);
    c.prefixQueriesTokens += promptTokens;
    c.prefixHitsTokens += cachedTokens;
    c.prefixQueriesBlocks += queriedBlocks;
    c.prefixHitsBlocks += hitBlocks;
    // The engine's own counters too (per-engine series of a data-parallel server).
    const ep = engine.prefix;
    ep.queriesTokens += promptTokens;
    ep.hitsTokens += cachedTokens;
    ep.queriesBlocks += queriedBlocks;
    ep.hitsBlocks += hitBlocks;
    engine.requests++;

    const seq: Sequence = { held: [], tokens: promptTokens };
    engine.sequences.add(seq);
    seq.held = hashes.slice(0, cache.acquire(hashes.slice(0, hitBlocks), 0));

    let generated = 0;
    let rawText = '';
    let outcome: FinishReason = 'abort';
    // The engine failed on purpose (a token fault): not the client's abort.
    let faulted = false;
    let onFinish = (): void => format.finished?.('', null, { promptTokens, completionTokens: 0, cachedTokens });
    try {
      const slow = this.faults.slowFactor;
      const prefillMs = ((promptTokens - cachedTokens) / this.opts.prefillTokensPerSec) * 1000 * slow;
      const prefillStart = performance.now();
      if (!(await sleep(prefillMs, signal))) return;
      const decodeStart = performance.now();
      const promptMs = decodeStart - prefillStart;
      seq.held = hashes.slice(0, cache.acquire(hashes, seq.held.length));
      c.promptTokens += promptTokens;
      observeTtft(c, (performance.now() - arrival) / 1000);

      // A prompt ending in the start of its own greedy answer goes on from there (prompt.ts outputStart).
      const { seed, index: start } = outputStart(p.prompt);
      const counts = (): Counts => ({ promptTokens, completionTokens: generated, cachedTokens, promptMs, predictedMs: performance.now() - decodeStart });
      let visible = '';
      let finish: Finish | null = null;
      // A background response (Responses API) has no client connection: it runs to its end or its cancel.
      const stream = p.stream && res ? (writer ?? new SseWriter(res, () => this.faults.stallMidStream, signal, this, this.opts.behaviour)) : null;
      // With no connection (background) the events are still made: the format may keep them.
      const sendAll = async (chunks: string[]): Promise<boolean> => {
        if (stream) for (const ch of chunks) if (!(await stream.send(ch))) return false;
        return !signal.aborted;
      };
      onFinish = () => format.finished?.(visible, outcome === 'abort' ? null : (finish ?? { reason: 'length', stopReason: null }), counts());

      // An engine failure before the first token comes before vLLM's first chunk (the role chunk
      // goes out with the first output).
      if (tokenFaults && res) {
        const hit = await this.tokenFault(0, p.stream ? stream : null, res, signal, format);
        if (hit !== null) {
          faulted = hit === 'faulted';
          return;
        }
      }
      if (p.stream && !(await sendAll(format.open(counts())))) return;
      for (let i = 0; i < p.maxTokens && !finish; i++) {
        // The first token comes out of prefill; every further one costs a decode step.
        if (i > 0 && !(await sleep(this.opts.decodeMsPerToken * this.faults.slowFactor, signal))) return;
        if (tokenFaults && res && i > 0) {
          const hit = await this.tokenFault(i, p.stream ? stream : null, res, signal, format);
          if (hit !== null) {
            faulted = hit === 'faulted';
            return;
          }
        }
        const tok = outputToken(seed, start + i);
        generated++;
        seq.tokens++;
        rawText += tok;
        let next = visible + tok;
        for (const s of p.stop) {
          const at = next.indexOf(s);
          if (at >= 0) {
            next = next.slice(0, at);
            finish = { reason: 'stop', stopReason: s };
            break;
          }
        }
        if (!finish && i === p.maxTokens - 1) finish = { reason: 'length', stopReason: null };
        const delta = next.slice(visible.length);
        visible = next;
        if (p.stream && !(await sendAll(format.delta(delta, finish)))) return;
      }
      const done = finish ?? { reason: 'length' as const, stopReason: null };

      outcome = done.reason;
      if (p.stream) {
        if (!(await sendAll(format.close(visible, done, counts())))) {
          outcome = 'abort';
          return;
        }
        res?.end();
      } else if (res) {
        sendJson(res, 200, format.full(visible, done, counts()));
      }
    } finally {
      onFinish();
      c.generationTokens += generated;
      c.finished[outcome]++;
      if (outcome === 'abort' && !faulted) this.countClientAbort();
      // Blocks filled during decode are cached too, so the next turn of a conversation hits them.
      const all = generated > 0 ? chainBlockHashes(fullBlocks(p.prompt + rawText), saltParent(p.cacheSalt)) : hashes;
      const heldAll = cache.acquire(all, seq.held.length);
      cache.release(all.slice(0, heldAll));
      engine.sequences.delete(seq);
      if (outcome === 'abort' && !faulted && res && !res.writableEnded) res.destroy();
    }
  }

  /**
   * The token faults before token `i` (i tokens sent): null when none applies, else how the
   * request ended ('faulted': the mock ended it; 'aborted': the client went away while stalled).
   */
  private async tokenFault(i: number, stream: SseWriter | null, res: ServerResponse, signal: AbortSignal, format?: WireFormat): Promise<'faulted' | 'aborted' | null> {
    const f = this.faults;
    const b = this.opts.behaviour;
    if (f.inBandErrorAfter === i) {
      this.injectedInBandErrors++;
      // llama.cpp answers a failed first result as a plain HTTP error; so does any non-streamed request.
      if (!stream || (!stream.opened && !b.headersFirst && b.family === 'llama.cpp')) {
        sendError(res, ENGINE_ERROR, b.family);
        return 'faulted';
      }
      stream.openNow();
      res.end(format?.inBandError?.(ENGINE_ERROR.message) ?? inBandError(b.family, ENGINE_ERROR));
      return 'faulted';
    }
    if (f.dropAfterTokens === i) {
      this.droppedConnections++;
      if (stream) {
        stream.openNow();
        // Let the headers (and any chunk) reach the socket before it is destroyed.
        await new Promise((r) => setImmediate(r));
      }
      res.socket?.destroy();
      res.destroy();
      return 'faulted';
    }
    if (f.stallAfterTokens === i) {
      stream?.openNow();
      await untilAborted(signal);
      return 'aborted';
    }
    return null;
  }

  /**
   * Admit and run one generation written in `format` (the Responses and Messages endpoints);
   * `res` null runs it in the background (a Responses `background: true` request).
   */
  async generate(p: ParsedRequest, format: WireFormat, signal: AbortSignal, res: ServerResponse | null, rankHeader?: string | string[], tokenFaults = false): Promise<void> {
    const arrival = performance.now();
    const all = AbortSignal.any([signal, this.shutdown.signal]);
    // Messages passes its rank header (checked by the caller, rankProblem); Responses none, as vLLM.
    const picked = this.engineFor(rankHeader);
    const engine = picked instanceof EngineCore ? picked : this.engineFor(undefined) as EngineCore;
    const b = this.opts.behaviour;
    const stream = p.stream && res ? new SseWriter(res, () => this.faults.stallMidStream, all, this, b) : null;
    if (stream && b.headersFirst) stream.openNow();
    if (!(await engine.slots.acquire(all))) {
      this.counters.finished.abort++;
      return this.countClientAbort();
    }
    try {
      await this.run(engine, p, { id: '', created: Math.floor(Date.now() / 1000), model: p.model }, arrival, all, res, format, stream, tokenFaults);
    } finally {
      engine.slots.release();
    }
  }

  /** An abort caused by close() is not the client's doing. */
  private countClientAbort(): void {
    if (!this.shutdown.signal.aborted) this.abortedByClient++;
  }

  onKeepAlive(): void {
    this.keepAlivesSent++;
  }

  onStreamOpen(): void {
    this.activeStreams++;
  }

  onStreamClose(): void {
    this.activeStreams--;
  }
}

/**
 * Writes SSE chunks, sending the headers with the first one (or at once, `openNow`, for
 * headers-first engines), and applies the stall-mid-stream fault.
 */
class SseWriter {
  private sent = 0;
  opened = false;

  constructor(
    private readonly res: ServerResponse,
    private readonly stallAfter: () => number | null,
    private readonly signal: AbortSignal,
    private readonly owner: MockReplica,
    private readonly behaviour: ProfileBehaviour,
    /** vLLM's --sse-keep-alive-interval (ms), or null. */
    private readonly keepAliveMs: number | null = null,
  ) {}

  private lastWriteAt = 0;

  private open(): void {
    if (this.opened) return;
    this.opened = true;
    this.res.writeHead(200, streamHeaders(this.behaviour));
    this.owner.onStreamOpen();
    this.res.on('close', () => this.owner.onStreamClose());
    this.lastWriteAt = performance.now();
    if (this.keepAliveMs !== null) this.startKeepAlive(this.keepAliveMs);
  }

  /**
   * vLLM's with_sse_keep_alive wraps the stream's generator and yields a comment whenever no chunk
   * came for the interval: while queued, in prefill, stalled, between tokens
   * (vllm/entrypoints/serve/utils/sse_keep_alive.py). Checked at a tenth of the interval.
   */
  private startKeepAlive(ms: number): void {
    const timer = setInterval(() => {
      if (this.res.writableEnded || this.res.destroyed) return clearInterval(timer);
      if (performance.now() - this.lastWriteAt < ms) return;
      this.lastWriteAt = performance.now();
      this.owner.onKeepAlive();
      this.res.write(SSE_KEEP_ALIVE_COMMENT);
    }, Math.max(1, Math.floor(ms / 10)));
    timer.unref();
    this.res.once('close', () => clearInterval(timer));
  }

  /** Send the 200 and the headers now, before any chunk. */
  openNow(): void {
    if (this.opened || this.res.headersSent) return;
    this.open();
    this.res.flushHeaders();
  }

  /** Resolves false when the sequence was aborted (client gone or shutdown). */
  async send(chunk: string): Promise<boolean> {
    if (this.signal.aborted) return false;
    const stall = this.stallAfter();
    if (stall !== null && this.sent >= stall) {
      this.open();
      this.res.flushHeaders();
      await untilAborted(this.signal);
      return false;
    }
    this.open();
    this.sent++;
    this.lastWriteAt = performance.now();
    if (!this.res.write(chunk)) {
      // Respect backpressure so a slow reader slows generation instead of growing a buffer.
      let onDrain = (): void => {};
      await Promise.race([new Promise<void>((r) => this.res.once('drain', (onDrain = r))), untilAborted(this.signal)]);
      this.res.off('drain', onDrain);
    }
    return !this.signal.aborted;
  }
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
}

/**
 * A stream's headers: Starlette's StreamingResponse(media_type="text/event-stream") adds the
 * charset for a text/* type and nothing else (vLLM, SGLang); llama.cpp's httplib chunked provider
 * sends the bare type; the legacy mock sent a charset and `cache-control: no-cache`.
 */
function streamHeaders(b: ProfileBehaviour): Record<string, string> {
  if (b.profile === 'legacy') return { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' };
  if (b.family === 'llama.cpp') return { 'content-type': 'text/event-stream' };
  return { 'content-type': 'text/event-stream; charset=utf-8' };
}

function sendError(res: ServerResponse, e: WireError, family: EngineFamily = 'vllm'): void {
  const text = JSON.stringify(errorJson(family, e));
  res.writeHead(e.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
}

/** Start a mock replica on 127.0.0.1 and resolve once it listens. */
export async function startMockVllm(options: MockVllmOptions = {}): Promise<MockVllm> {
  const replica = new MockReplica(options);
  const sockets = new Set<Socket>();
  const keepAlive = options.keepAlive ?? true;
  const server: Server = createServer((req, res) => {
    // Without keep-alive every answer says `Connection: close`: no client pools a socket to it.
    if (!keepAlive) res.shouldKeepAlive = false;
    replica.handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) sendError(res, { status: 500, type: 'InternalServerError', message: String(err) });
      else res.destroy();
    });
  });
  // Streams may last long; node's default request timeouts would cut stalled test streams.
  server.requestTimeout = 0;
  server.headersTimeout = 0;
  server.keepAliveTimeout = 5_000;
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(replica.opts.port, HOST, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  replica.port = port;

  let closing: Promise<void> | null = null;
  return {
    id: replica.opts.id,
    port,
    url: `http://${HOST}:${port}`,
    close() {
      closing ??= new Promise<void>((resolve) => {
        replica.abortAll();
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      });
      return closing;
    },
    setFaults(partial) {
      replica.faults = mergeFaults(replica.faults, partial);
    },
    stats: () => replica.stats(),
    reset: () => replica.reset(),
  };
}
