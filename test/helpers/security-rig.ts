// Helpers for the abuse suite (test/e2e/security): raw HTTP/1.1 over node:net (so a test can send
// what fetch refuses to: CR/LF in values, un-normalised paths, stalled bodies, huge headers), a
// small response parser, a rig of the router under Miniflare with mock replicas, and the leak
// scanner. Only 127.0.0.1; every socket has a deadline.

import { connect } from 'node:net';

import { expect } from 'vitest';

import type { MockVllm, MockVllmOptions } from '../../tools/mock-engine/index.js';
import { routerConfig, startMocks, startRouter, TEST_ADMIN_TOKEN, TEST_ORIGIN_API_KEY, TEST_TENANTS, type RouterHandle, type TestTenant } from './router.js';

// ---- raw HTTP ------------------------------------------------------------------------------------

export interface RawResponse {
  /** 0 when the server closed (or the deadline passed) without a parsable status line. */
  status: number;
  headers: Record<string, string>;
  body: string;
  /** Everything received, latin1. */
  raw: string;
  /** Milliseconds from the first byte written to the status line (or to the end, without one). */
  elapsedMs: number;
  /** The server closed the connection (rather than our deadline ending the wait). */
  closedByServer: boolean;
}

export interface RawRequest {
  method?: string;
  /** Request target, sent exactly as given (no normalisation, no escaping). */
  path?: string;
  /** Sent in this order, exactly as given (a value may hold CR, LF or NUL). */
  headers?: [string, string][];
  body?: string | Uint8Array;
  /** Add Content-Length for `body` (default true unless a content-length/transfer-encoding header is given). */
  contentLength?: boolean;
  /** Send these bytes as the whole request instead (headers and body ignored). */
  raw?: string | Uint8Array;
  /** More writes after the first, each after a delay; the socket then stays open (no half-close). */
  trickle?: { delayMs: number; data: string | Uint8Array }[];
  /** Give up after this long (default 5 s). */
  timeoutMs?: number;
}

const toBuf = (d: string | Uint8Array) => (typeof d === 'string' ? Buffer.from(d, 'latin1') : Buffer.from(d));

/** Serialise a request: Host and Connection: close first, then the given headers, then the body. */
export function serialise(port: number, r: RawRequest): Buffer {
  if (r.raw !== undefined) return toBuf(r.raw);
  const headers: [string, string][] = [['Host', `127.0.0.1:${port}`], ['Connection', 'close'], ...(r.headers ?? [])];
  const body = r.body === undefined ? undefined : toBuf(r.body);
  const framed = headers.some(([n]) => /^(content-length|transfer-encoding)$/i.test(n));
  if (body !== undefined && (r.contentLength ?? !framed)) headers.push(['Content-Length', String(body.byteLength)]);
  const head = `${r.method ?? 'POST'} ${r.path ?? '/v1/chat/completions'} HTTP/1.1\r\n` + headers.map(([n, v]) => `${n}: ${v}\r\n`).join('') + '\r\n';
  return body === undefined ? Buffer.from(head, 'latin1') : Buffer.concat([Buffer.from(head, 'latin1'), body]);
}

/** Send one request on a fresh loopback socket and read until the server closes or the deadline. */
export function rawHttp(port: number, r: RawRequest): Promise<RawResponse> {
  const timeoutMs = r.timeoutMs ?? 15_000;
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    const chunks: Buffer[] = [];
    const timers: NodeJS.Timeout[] = [];
    let started = 0;
    let statusAt = 0;
    let done = false;
    const finish = (closedByServer: boolean) => {
      if (done) return;
      done = true;
      for (const t of timers) clearTimeout(t);
      socket.destroy();
      const raw = Buffer.concat(chunks).toString('latin1');
      resolve({ ...parseResponse(raw), raw, elapsedMs: (statusAt || Date.now()) - started, closedByServer });
    };
    timers.push(setTimeout(() => finish(false), timeoutMs));
    socket.on('error', () => finish(true));
    socket.on('close', () => finish(true));
    socket.on('data', (b: Buffer) => {
      chunks.push(b);
      if (!statusAt && Buffer.concat(chunks).includes('\r\n')) statusAt = Date.now();
      // A complete response ends the wait even when the server keeps the connection open.
      if (isComplete(Buffer.concat(chunks).toString('latin1'))) finish(false);
    });
    socket.on('connect', () => {
      started = Date.now();
      socket.write(serialise(port, r));
      let at = 0;
      for (const t of r.trickle ?? []) {
        at += t.delayMs;
        timers.push(setTimeout(() => !done && socket.write(toBuf(t.data)), at));
      }
    });
  });
}

function splitHead(raw: string): { head: string; rest: string } | null {
  const i = raw.indexOf('\r\n\r\n');
  return i < 0 ? null : { head: raw.slice(0, i), rest: raw.slice(i + 4) };
}

function headerMap(head: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of head.split('\r\n').slice(1)) {
    const c = line.indexOf(':');
    if (c <= 0) continue;
    const name = line.slice(0, c).trim().toLowerCase();
    const value = line.slice(c + 1).trim();
    out[name] = name in out ? `${out[name]}, ${value}` : value;
  }
  return out;
}

function dechunk(s: string): { body: string; complete: boolean } {
  let body = '';
  let i = 0;
  for (;;) {
    const eol = s.indexOf('\r\n', i);
    if (eol < 0) return { body, complete: false };
    const size = parseInt(s.slice(i, eol).split(';')[0]!, 16);
    if (Number.isNaN(size)) return { body, complete: false };
    if (size === 0) return { body, complete: true };
    if (s.length < eol + 2 + size) return { body: body + s.slice(eol + 2), complete: false };
    body += s.slice(eol + 2, eol + 2 + size);
    i = eol + 2 + size + 2;
  }
}

function isComplete(raw: string): boolean {
  const p = splitHead(raw);
  if (!p) return false;
  const h = headerMap(p.head);
  if (/chunked/i.test(h['transfer-encoding'] ?? '')) return dechunk(p.rest).complete;
  if (h['content-length'] !== undefined) return Buffer.byteLength(p.rest, 'latin1') >= Number(h['content-length']);
  return /^HTTP\/1\.1 (1\d\d|204|304)/.test(p.head);
}

export function parseResponse(raw: string): { status: number; headers: Record<string, string>; body: string } {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(raw);
  if (!m) return { status: 0, headers: {}, body: '' };
  const p = splitHead(raw);
  if (!p) return { status: Number(m[1]), headers: {}, body: '' };
  const headers = headerMap(p.head);
  let body = /chunked/i.test(headers['transfer-encoding'] ?? '') ? dechunk(p.rest).body : p.rest;
  body = Buffer.from(body, 'latin1').toString('utf8');
  return { status: Number(m[1]), headers, body };
}

// ---- the rig -------------------------------------------------------------------------------------

export const MODEL = 'demo-model';
export const POOL = 'chat';
export const OTHER_POOL = 'batch';
export const OTHER_MODEL = 'batch-model';

export interface Rig {
  router: RouterHandle;
  mocks: MockVllm[];
  port: number;
  tenants: readonly TestTenant[];
  keyOf(tenant: string): string;
  /** Completion requests the mocks received, all together. */
  completions(): number;
  /** `id=url` of every replica of every pool, sorted: to prove an admin call changed nothing. */
  replicaSet(): Promise<string[]>;
  poolSnapshot(pool?: string): Promise<PoolSnap>;
  /** Every response this rig's helpers saw, for the leak scan. */
  seen: { where: string; text: string }[];
  /** rawHttp that records the response for the leak scan. */
  send(r: RawRequest, where?: string): Promise<RawResponse>;
  /** fetch on the router that records the response (body read as text). */
  fetchText(path: string, init?: RequestInit, where?: string): Promise<{ status: number; headers: Headers; text: string }>;
  close(): Promise<void>;
}

export interface PoolSnap {
  leases: number;
  replicas: { id: string; url: string; auth: string; healthy: boolean; inFlight: number; lastCheckError?: string | null }[];
}

export interface RigOptions {
  mocks?: number;
  mockOptions?: MockVllmOptions;
  tenants?: readonly TestTenant[];
  secrets?: Record<string, string>;
  overrides?: Record<string, unknown>;
  poolOverrides?: Record<string, unknown>;
  /** Replicas of the main pool beyond the mocks. */
  extraReplicas?: { id: string; url: string; auth: string }[];
  /** Pools besides `chat` and `batch`, as given. */
  extraPools?: Record<string, unknown>[];
  echoLogs?: boolean;
}

export async function startRig(o: RigOptions = {}): Promise<Rig> {
  const mocks = await startMocks(o.mocks ?? 3, o.mockOptions ?? { decodeMsPerToken: 2, maxRunning: 64 });
  const base = routerConfig({
    replicas: mocks,
    overrides: o.overrides,
    poolOverrides: o.poolOverrides,
    extraPools: [{ name: OTHER_POOL, models: [OTHER_MODEL], strategy: 'least-load', keys: ['none'], replicas: [{ id: 'b1', url: mocks[0]!.url, auth: 'bearer:ORIGIN_API_KEY' }] }, ...(o.extraPools ?? [])],
  }) as { pools: { replicas: unknown[] }[] };
  base.pools[0]!.replicas.push(...(o.extraReplicas ?? []).map((r) => ({ ...r, weight: 1 })));
  let router: RouterHandle;
  try {
    router = await startRouter({ config: base as never, tenants: o.tenants, secrets: o.secrets, echoLogs: o.echoLogs });
  } catch (e) {
    await Promise.allSettled(mocks.map((m) => m.close()));
    throw e;
  }
  const tenants = o.tenants ?? TEST_TENANTS;
  const seen: { where: string; text: string }[] = [];
  const record = (where: string, status: number, headers: Iterable<[string, string]>, body: string) => {
    seen.push({ where, text: `${status}\n${[...headers].map(([k, v]) => `${k}: ${v}`).join('\n')}\n\n${body}` });
  };
  const poolSnapshot = async (pool = POOL): Promise<PoolSnap> => {
    const res = await router.adminFetch(`/admin/pools/${pool}`);
    const text = await res.text();
    record(`GET /admin/pools/${pool}`, res.status, res.headers, text);
    expect(res.status).toBe(200);
    return JSON.parse(text) as PoolSnap;
  };
  const rig: Rig = {
    router,
    mocks,
    port: router.port,
    tenants,
    keyOf(tenant) {
      const t = tenants.find((x) => x.tenant === tenant);
      if (!t) throw new Error(`no test tenant ${tenant}`);
      return t.key;
    },
    // Requests that reached an engine: completions and the keyless APIs.
    completions: () => mocks.reduce((s, m) => s + m.stats().completionRequestsTotal + m.stats().keylessRequestsTotal, 0),
    async replicaSet() {
      const out: string[] = [];
      for (const p of [POOL, OTHER_POOL]) for (const r of (await poolSnapshot(p)).replicas) out.push(`${p}/${r.id}=${r.url}`);
      return out.sort();
    },
    poolSnapshot,
    seen,
    async send(r, where) {
      const res = await rawHttp(router.port, r);
      seen.push({ where: where ?? `${r.method ?? 'POST'} ${r.path ?? ''}`, text: res.raw });
      return res;
    },
    async fetchText(path, init, where) {
      const res = await fetch(router.url + path, { ...init, signal: init?.signal ?? AbortSignal.timeout(20_000) });
      const text = await res.text();
      record(where ?? path, res.status, res.headers, text);
      return { status: res.status, headers: res.headers, text };
    },
    async close() {
      await router.close();
      await Promise.allSettled(mocks.map((m) => m.close()));
    },
  };
  return rig;
}

/** Wait until every replica of the pool reports healthy (the first health round runs on first use). */
export async function waitHealthy(rig: Rig, ids?: string[], timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const snap = await rig.poolSnapshot();
    if (snap.replicas.filter((r) => !ids || ids.includes(r.id)).every((r) => r.healthy)) return;
    if (Date.now() > deadline) throw new Error(`replicas not healthy: ${JSON.stringify(snap.replicas.map((r) => [r.id, r.healthy]))}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The trace line of one request, waiting for it (the Worker writes it when the request is finished). */
export async function traceLineOf(rig: Rig, requestId: string, timeoutMs = 15_000): Promise<Record<string, unknown>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const t = rig.router.traceLines().find((l) => l.requestId === requestId);
    if (t) return t;
    if (Date.now() > deadline) throw new Error(`no trace line for ${requestId}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/**
 * The positive sync point a scan of the logs needs (it is a negative check: "no line holds X"):
 * no lease held in `pools` (a request writes its trace line as it finishes, before its release is
 * sent), then a sentinel request's own trace line, which follows every earlier line on the pipe.
 */
export async function logsSettled(rig: Rig, pools: string[] = [POOL, OTHER_POOL], timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const held = await Promise.all(pools.map(async (p) => [p, (await rig.poolSnapshot(p)).leases] as const));
    if (held.every(([, n]) => n === 0)) break;
    if (Date.now() > deadline) throw new Error(`leases still held before the log scan: ${JSON.stringify(held)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const sentinel = await rig.fetchText('/v1/chat/completions', {
    method: 'POST',
    headers: { authorization: `Bearer ${rig.tenants[0]!.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: 'log sentinel' }] }),
  }, 'log sentinel');
  expect(sentinel.status).toBe(200);
  await traceLineOf(rig, sentinel.headers.get('x-request-id')!, timeoutMs);
}

// ---- leaks ---------------------------------------------------------------------------------------

/** Every secret of the rig: origin keys, tenant keys, the admin token, plus any extra secret values. */
export function secretValues(rig: Rig, extra: string[] = []): string[] {
  const s = [TEST_ORIGIN_API_KEY, TEST_ADMIN_TOKEN, rig.router.secrets.ADMIN_TOKEN!, rig.router.secrets.ORIGIN_API_KEY!, ...rig.tenants.map((t) => t.key), ...extra];
  return [...new Set(s.filter((x) => typeof x === 'string' && x.length >= 8))];
}

/** Where any secret shows up in the recorded responses or the worker's log lines. */
export function findLeaks(rig: Rig, secrets: string[]): string[] {
  const out: string[] = [];
  const check = (where: string, text: string) => {
    for (const s of secrets) {
      if (text.includes(s)) out.push(`${where}: contains secret ${s.slice(0, 10)}…`);
      // Also the JSON-escaped form (a value with quotes or control characters).
      const escaped = JSON.stringify(s).slice(1, -1);
      if (escaped !== s && text.includes(escaped)) out.push(`${where}: contains escaped secret ${s.slice(0, 10)}…`);
    }
  };
  for (const r of rig.seen) check(`response to ${r.where}`, r.text);
  rig.router.logs.forEach((l, i) => check(`log line ${i} (${l.slice(0, 60)})`, l));
  return out;
}
