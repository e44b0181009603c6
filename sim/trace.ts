// Trace loading for the simulator: parses the three input formats into one request list whose
// prompts are sequences of 16-token KV-block ids, and derives routing keys and the reuse bound.
// I/O: only `loadTrace` reads a file; everything else is pure.
//
// Block identity follows vLLM's automatic prefix caching: a block is identified by its own
// tokens plus everything before it (docs.vllm.ai/en/latest/design/prefix_caching). Trace block
// ids are re-chained here (id of block j = intern(id of block j-1, trace id j)), so equal ids
// always mean equal prefixes whatever the source promised, and interned to dense integers so
// the caches can index them cheaply. A trace block of B tokens becomes B/16 consecutive ids.

import { readFileSync } from 'node:fs';
import { fmix32, hashString, murmur3Round } from '../src/core/index.js';
import { PrefixCache } from './prefix-cache.js';

/** vLLM's default KV block size in tokens; only full blocks are cached and reused. */
export const KV_BLOCK_TOKENS = 16;

export type TraceFormat = 'mooncake' | 'generated' | 'router-log';

export interface SimRequest {
  /** Position in the trace after sorting by arrival (ties keep file order). */
  readonly index: number;
  /** Arrival in ms from the first request, before any time compression. */
  readonly arrivalMs: number;
  readonly promptTokens: number;
  /** At least 1: the first token comes out of the prefill step. */
  readonly outputTokens: number;
  /** Dense ids of the prompt's full 16-token blocks, in order (length floor(promptTokens / 16)). */
  readonly blocks: Int32Array;
  /** 16-token blocks per native trace block (32 for Mooncake's 512-token blocks). */
  readonly nativeBlockWidth: number;
  readonly session: string | null;
  /** Session key hash given by the trace itself (the router log's keyHash), if any. */
  readonly sessionHash: number | null;
  readonly tenant: string | null;
  /**
   * The request's priority band, when the trace says (the router log's `band`, issue #29; a
   * generated line's `band` or `priority`): flow control in the simulator queues it there.
   */
  readonly band?: string | null;
}

/**
 * Field names a trace line may carry its session and tenant under, first present wins: ours
 * (gen-trace), then the common ones of request logs and public traces. `user` is OpenAI's
 * end-user id, which for routing plays a tenant's part (one key per end user).
 */
export const SESSION_FIELDS = ['session', 'session_id', 'sessionId', 'conversation_id', 'conversationId'] as const;
export const TENANT_FIELDS = ['tenant', 'tenant_id', 'tenantId', 'user', 'user_id'] as const;

export interface Trace {
  readonly source: string;
  readonly format: TraceFormat;
  readonly requests: readonly SimRequest[];
  /** Lines that were not request records (other log lines, blank lines, bad JSON). */
  readonly skipped: number;
  /** Number of dense block ids allocated (ids are in [0, idCount)). */
  readonly idCount: number;
  readonly header: Readonly<Record<string, unknown>> | null;
  /** Which field names supplied sessions and tenants, with how many requests each. */
  readonly keyFields: { readonly session: Readonly<Record<string, number>>; readonly tenant: Readonly<Record<string, number>> };
  /** The field names of the first request line (for messages about a key that matches nothing). */
  readonly firstFields: readonly string[];
}

/**
 * Blocks a request may take from the cache: vLLM always recomputes at least the last prompt
 * token (it needs its logits), so a fully cached prompt still prefills its last block.
 */
export function lookupLimit(promptTokens: number, blockCount: number): number {
  return Math.min(blockCount, Math.floor((promptTokens - 1) / KV_BLOCK_TOKENS));
}

// ---------------------------------------------------------------------------------------------
// Interning chained block ids

/** Maps (parent id, trace block id) to a dense base id; 53-bit keys make collisions negligible. */
export class BlockInterner {
  private readonly map = new Map<number, number>();
  private next = 0;

  get count(): number {
    return this.next;
  }

  /** Base id of the trace block `x` after `parent` (-1 at the start); reserves `width` ids. */
  chain(parent: number, x: number, width: number): number {
    const p = parent | 0;
    const lo = x >>> 0;
    const hi = Math.floor(x / 4294967296) >>> 0;
    // Two MurmurHash3 lanes over the words (parent, lo, hi), 12 bytes.
    const a = fmix32(murmur3Round(murmur3Round(murmur3Round(0x9747b28c, p), lo), hi) ^ 12);
    const b = fmix32(murmur3Round(murmur3Round(murmur3Round(0x5bd1e995, p), lo), hi) ^ 12);
    const key = (a & 0x1fffff) * 4294967296 + b;
    let id = this.map.get(key);
    if (id === undefined) {
      id = this.next;
      this.next += width;
      this.map.set(key, id);
    }
    return id;
  }

  /** An id no other block shares (prompt tokens a truncated trace does not describe). */
  fresh(): number {
    return this.next++;
  }
}

/** Expand native trace block ids to dense 16-token ids for a prompt of `promptTokens`. */
export function expandBlocks(interner: BlockInterner, ids: ArrayLike<number>, width: number, promptTokens: number): Int32Array {
  const full = Math.floor(promptTokens / KV_BLOCK_TOKENS);
  const out = new Int32Array(full);
  let parent = -1;
  let n = 0;
  for (let j = 0; j < ids.length && n < full; j++) {
    const base = interner.chain(parent, ids[j]!, width);
    parent = base;
    for (let k = 0; k < width && n < full; k++) out[n++] = base + k;
  }
  while (n < full) out[n++] = interner.fresh();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parsing

interface RawRequest {
  arrivalMs: number;
  promptTokens: number;
  outputTokens: number;
  blocks: Int32Array;
  width: number;
  session: string | null;
  sessionHash: number | null;
  tenant: string | null;
  band: string | null;
  order: number;
}

/** A line's priority band (`band`, or `priority` when it is a name): 1-64 characters, else none. */
function bandOf(obj: Record<string, unknown>): string | null {
  const v = typeof obj.band === 'string' ? obj.band : typeof obj.priority === 'string' ? obj.priority : null;
  return v !== null && v.length > 0 && v.length <= 64 ? v : null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** The first of `fields` that `obj` has as a non-empty string or a finite number, and its name. */
function firstField(obj: Record<string, unknown>, fields: readonly string[]): { name: string; value: string } | null {
  for (const name of fields) {
    const v = obj[name];
    if (typeof v === 'string' && v !== '') return { name, value: v };
    if (typeof v === 'number' && Number.isFinite(v)) return { name, value: String(v) };
  }
  return null;
}

/** Parse trace text (any of the three formats, detected per line). */
export function parseTrace(text: string, source = '<memory>', limit = Infinity): Trace {
  const interner = new BlockInterner();
  const raw: RawRequest[] = [];
  let skipped = 0;
  let header: Record<string, unknown> | null = null;
  let headerBlockTokens: number | null = null;
  const formats = new Set<TraceFormat>();
  const keyFields = { session: {} as Record<string, number>, tenant: {} as Record<string, number> };
  let firstFields: string[] | null = null;
  const field = (obj: Record<string, unknown>, kind: 'session' | 'tenant'): string | null => {
    const f = firstField(obj, kind === 'session' ? SESSION_FIELDS : TENANT_FIELDS);
    if (f === null) return null;
    keyFields[kind][f.name] = (keyFields[kind][f.name] ?? 0) + 1;
    return f.value;
  };
  /** A request line of either format: whole token counts, at least one output token, chained block ids. */
  const add = (r: { arrivalMs: number; prompt: number; output: number | null; ids: ArrayLike<number>; width: number; session: string | null; sessionHash: number | null; tenant: string | null; band?: string | null }) => {
    const promptTokens = Math.round(r.prompt);
    raw.push({
      arrivalMs: r.arrivalMs,
      promptTokens,
      outputTokens: Math.max(1, Math.round(r.output ?? 1)),
      blocks: expandBlocks(interner, r.ids, r.width, promptTokens),
      width: r.width,
      session: r.session,
      sessionHash: r.sessionHash,
      tenant: r.tenant,
      band: r.band ?? null,
      order: raw.length,
    });
  };
  let start = 0;
  while (start < text.length && raw.length < limit) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    const line = text.slice(start, end).trim();
    start = end + 1;
    if (line === '' || line[0] !== '{') {
      if (line !== '') skipped++;
      continue;
    }
    let obj: Record<string, unknown>;
    try {
      const v: unknown = JSON.parse(line);
      if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error('not an object');
      obj = v as Record<string, unknown>;
    } catch {
      skipped++;
      continue;
    }
    if (obj.type === 'header') {
      header = obj;
      headerBlockTokens = num(obj.block_tokens);
      continue;
    }
    if (obj.type === 'request') {
      // The router's own per-request log line: 64-token chained block hashes in hex.
      const ts = num(obj.ts);
      const prompt = num(obj.promptTokens);
      if (ts === null || prompt === null || prompt < 1) {
        skipped++;
        continue;
      }
      const hex = Array.isArray(obj.blocks) ? obj.blocks.filter((b): b is string => typeof b === 'string') : [];
      const ids = hex.map((h) => parseInt(h, 16) >>> 0);
      const width = 64 / KV_BLOCK_TOKENS;
      const keyHash = typeof obj.keyHash === 'string' && obj.keyKind !== 'none' && /^[0-9a-f]{1,8}$/i.test(obj.keyHash) ? parseInt(obj.keyHash, 16) >>> 0 : null;
      if (keyHash !== null) keyFields.session.keyHash = (keyFields.session.keyHash ?? 0) + 1;
      firstFields ??= Object.keys(obj);
      add({ arrivalMs: ts, prompt, output: num(obj.completionTokens), ids, width, session: null, sessionHash: keyHash, tenant: field(obj, 'tenant'), band: bandOf(obj) });
      formats.add('router-log');
      continue;
    }
    if (obj.type !== undefined || !Array.isArray(obj.hash_ids)) {
      skipped++;
      continue;
    }
    // Mooncake (512-token blocks) or our generated superset (block_tokens on the line or header).
    const ts = num(obj.timestamp);
    const prompt = num(obj.input_length);
    if (ts === null || prompt === null || prompt < 1) {
      skipped++;
      continue;
    }
    const blockTokens = num(obj.block_tokens) ?? headerBlockTokens ?? 512;
    if (blockTokens < KV_BLOCK_TOKENS || blockTokens % KV_BLOCK_TOKENS !== 0) throw new RangeError(`${source}: block_tokens ${blockTokens} is not a multiple of ${KV_BLOCK_TOKENS}`);
    const width = blockTokens / KV_BLOCK_TOKENS;
    const ids = (obj.hash_ids as unknown[]).map((x) => (typeof x === 'number' ? x : typeof x === 'string' ? hashString(x) : 0));
    firstFields ??= Object.keys(obj);
    const session = field(obj, 'session');
    add({ arrivalMs: ts, prompt, output: num(obj.output_length), ids, width, session, sessionHash: null, tenant: field(obj, 'tenant'), band: bandOf(obj) });
    formats.add(header !== null || session !== null || obj.block_tokens !== undefined ? 'generated' : 'mooncake');
  }
  raw.sort((a, b) => a.arrivalMs - b.arrivalMs || a.order - b.order);
  const t0 = raw.length > 0 ? raw[0]!.arrivalMs : 0;
  const requests: SimRequest[] = raw.map((r, index) => ({
    index,
    arrivalMs: r.arrivalMs - t0,
    promptTokens: r.promptTokens,
    outputTokens: r.outputTokens,
    blocks: r.blocks,
    nativeBlockWidth: r.width,
    session: r.session,
    sessionHash: r.sessionHash,
    tenant: r.tenant,
    ...(r.band !== null ? { band: r.band } : {}),
  }));
  const format: TraceFormat = formats.has('router-log') ? 'router-log' : formats.has('generated') ? 'generated' : 'mooncake';
  return { source, format, requests, skipped, idCount: interner.count, header, keyFields, firstFields: firstFields ?? [] };
}

export function loadTrace(path: string, limit = Infinity): Trace {
  return parseTrace(readFileSync(path, 'utf8'), path, limit);
}

// ---------------------------------------------------------------------------------------------
// Routing keys

export type KeySpec =
  | { readonly kind: 'session' }
  | { readonly kind: 'tenant' }
  | { readonly kind: 'prefix'; readonly count: number; readonly unit: 'blocks' | 'tokens' }
  | { readonly kind: 'auto' }
  | { readonly kind: 'none' };

/**
 * Tokens of the `prefix` key that `auto` falls back to: the router's default `prefix:4096`
 * (bytes, src/core/keys.ts) at ~4 bytes a token; for Mooncake it is `prefix:2blocks`.
 */
export const AUTO_PREFIX_TOKENS = 1024;

/**
 * `session`, `tenant`, `prefix:<N>blocks` (native trace blocks), `prefix:<N>tokens`, `auto`
 * (session, else tenant, else `prefix:1024tokens`: the key list `header:x-session-id,tenant,prefix`), `none`.
 */
export function parseKeySpec(spec: string): KeySpec {
  const s = spec.trim();
  if (s === 'session' || s === 'tenant' || s === 'none' || s === 'auto') return { kind: s };
  const m = /^prefix:(\d+)(blocks?|tokens?)$/.exec(s);
  if (m) {
    const count = Number(m[1]);
    if (count < 1) throw new RangeError(`--key ${spec}: the prefix length must be ≥ 1`);
    return { kind: 'prefix', count, unit: m[2]!.startsWith('block') ? 'blocks' : 'tokens' };
  }
  throw new RangeError(`unknown --key "${spec}" (known: session, tenant, prefix:<N>blocks, prefix:<N>tokens, auto, none)`);
}

/**
 * The routing key hash of a request, or null (keyless: the fallback picks). A prefix key is
 * the chained id of the last 16-token block inside the first N blocks/tokens, which
 * identifies that whole prefix; prompts shorter than N use what they have.
 */
export function routingKey(req: SimRequest, spec: KeySpec): number | null {
  switch (spec.kind) {
    case 'session':
      if (req.sessionHash !== null) return req.sessionHash;
      return req.session !== null ? hashString(req.session) : null;
    case 'tenant':
      return req.tenant !== null ? hashString(`tenant\u0000${req.tenant}`) : null;
    case 'prefix': {
      const n = spec.unit === 'blocks' ? spec.count * req.nativeBlockWidth : Math.floor(spec.count / KV_BLOCK_TOKENS);
      const k = Math.min(n, req.blocks.length);
      return k === 0 ? null : hashString(`prefix\u0000${req.blocks[k - 1]!}`);
    }
    case 'auto':
      return routingKey(req, { kind: 'session' }) ?? routingKey(req, { kind: 'tenant' }) ?? routingKey(req, { kind: 'prefix', count: AUTO_PREFIX_TOKENS, unit: 'tokens' });
    case 'none':
      return null;
  }
}

/** The key a trace supports best when the user gives none: sessions if it has them, else 2 native blocks. */
export function defaultKeySpec(trace: Trace): string {
  return trace.requests.some((r) => r.session !== null || r.sessionHash !== null) ? 'session' : 'prefix:2blocks';
}

/** What a chosen key covers: `refuse` when it matches no request, `warn` when under half. */
export interface KeyCoverage {
  readonly keyed: number;
  readonly total: number;
  readonly verdict: 'ok' | 'warn' | 'refuse';
  /** For warn and refuse: what matched, what the trace has, what to do instead. */
  readonly message: string | null;
}

/** Under this share of keyed requests a key source is reported as mostly missing. */
export const KEY_WARN_SHARE = 0.5;

/**
 * Whether `keys` (routingKey of each request under `source`) gives the strategies anything to
 * route by. A key that matches nothing would make every keyed strategy silently the fallback, so
 * the caller refuses; `none` is a choice, not a miss.
 */
export function keyCoverage(trace: Trace, source: string, keys: readonly (number | null)[]): KeyCoverage {
  const spec = parseKeySpec(source);
  const total = keys.length;
  const keyed = keys.reduce<number>((n, k) => n + (k === null ? 0 : 1), 0);
  if (spec.kind === 'none' || total === 0) return { keyed, total, verdict: 'ok', message: null };
  const share = keyed / total;
  if (share >= KEY_WARN_SHARE) return { keyed, total, verdict: 'ok', message: null };
  const seen = trace.firstFields.length > 0 ? `its first request has ${trace.firstFields.join(', ')}` : 'it has no request fields';
  const names = spec.kind === 'session' ? `${SESSION_FIELDS.join(', ')} (or the router log's keyHash)` : spec.kind === 'tenant' ? TENANT_FIELDS.join(', ') : null;
  const found = (k: 'session' | 'tenant') => Object.entries(trace.keyFields[k]).map(([f, n]) => `${f} on ${n}`).join(', ');
  const what =
    names !== null
      ? `--key ${source} reads ${names}; ${keyed === 0 ? `no request has one (${seen})` : `only ${keyed} of ${total} requests have one (${found(spec.kind as 'session' | 'tenant')})`}`
      : `--key ${source} gives a key to ${keyed} of ${total} requests (prompts shorter than one full block have none)`;
  const has = (k: 'session' | 'tenant') => Object.keys(trace.keyFields[k]).length > 0;
  const better = (['session', 'tenant'] as const).filter((k) => k !== spec.kind && has(k));
  const instead = `every keyed strategy would route ${keyed === 0 ? 'every request' : 'the rest'} by the fallback${keyed === 0 ? ' and report it under its own name' : ''}. Use --key ${[...better, 'prefix:2blocks', 'auto'].join(', --key ')}, or --key none to mean it`;
  return { keyed, total, verdict: keyed === 0 ? 'refuse' : 'warn', message: `${what}: ${instead}.` };
}

// ---------------------------------------------------------------------------------------------
// The reuse bound

export interface ReuseBound {
  readonly promptTokens: number;
  readonly cachedTokens: number;
  /** Token hit rate of one replica with an infinite cache; no routing can beat it. */
  readonly tokenHitRate: number;
}

/**
 * The finite-cache bound: the trace replayed in arrival order against one LRU prefix cache with
 * the whole pool's KV (`capacityBlocks` = replicas × one replica's), each request admitted and
 * released at once. Where cache size, not routing, limits reuse, this is the most a pool of
 * that much KV can hit (one replica holding all eight caches); not a strict bound (overlapping
 * requests pin blocks in the replica model, and a clever split could beat LRU), but the yardstick
 * for "as good as one big cache". Infinite capacity gives `computeBound`.
 */
export function computeCacheBound(trace: Trace, capacityBlocks: number): ReuseBound {
  if (!Number.isFinite(capacityBlocks)) return computeBound(trace);
  const cache = new PrefixCache(capacityBlocks);
  let prompt = 0;
  let cached = 0;
  for (const r of trace.requests) {
    const total = Math.max(r.blocks.length, Math.ceil((r.promptTokens + r.outputTokens) / KV_BLOCK_TOKENS));
    const adm = cache.admit(r.blocks, lookupLimit(r.promptTokens, r.blocks.length), total, true)!;
    cache.release(r.blocks, adm.pinned, total);
    prompt += r.promptTokens;
    cached += adm.hits * KV_BLOCK_TOKENS;
  }
  return { promptTokens: prompt, cachedTokens: cached, tokenHitRate: prompt > 0 ? cached / prompt : 0 };
}

/** Replay the trace in arrival order against one infinite cache (same rules as the replica model). */
export function computeBound(trace: Trace): ReuseBound {
  const seen = new Uint8Array(trace.idCount);
  let prompt = 0;
  let cached = 0;
  for (const r of trace.requests) {
    const limit = lookupLimit(r.promptTokens, r.blocks.length);
    let h = 0;
    while (h < limit && seen[r.blocks[h]!] === 1) h++;
    for (let i = 0; i < r.blocks.length; i++) seen[r.blocks[i]!] = 1;
    prompt += r.promptTokens;
    cached += h * KV_BLOCK_TOKENS;
  }
  return { promptTokens: prompt, cachedTokens: cached, tokenHitRate: prompt > 0 ? cached / prompt : 0 };
}
