// Shared helpers for the Workers-pool tests: calls into the router's default export, the fake
// origin's control channel (test/fixtures/workers/fake-origin.js), the tenant-key KV, and
// error-shape assertions.

import { env, exports } from 'cloudflare:workers';
import { expect } from 'vitest';
import type { PoolSnapshot } from '../../src/coordinator/pool-coordinator';
import { ADMIN_TOKEN, TENANTS } from '../fixtures/workers/test-env';

export const ROUTER = 'https://router.test';
export const KEYS = {
  acme: TENANTS.acme.key,
  basic: TENANTS.basic.key,
  picky: TENANTS.picky.key,
  root: TENANTS.root.key,
} as const;

let n = 0;
/** A request id unique to this test run (the router forwards it; the fake origin logs it). */
export function rid(prefix = 'req'): string {
  n++;
  return `${prefix}-${n}-${crypto.randomUUID().slice(0, 8)}`;
}

export function call(path: string, init?: RequestInit): Promise<Response> {
  return exports.default.fetch(new Request(ROUTER + path, init));
}

export interface CompletionOptions {
  key?: string | null;
  headers?: Record<string, string>;
  requestId?: string;
  path?: '/v1/chat/completions' | '/v1/completions';
}

/** POST a completion request as a tenant (acme by default). */
export function complete(body: unknown, opts: CompletionOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...opts.headers };
  const key = opts.key === undefined ? KEYS.acme : opts.key;
  if (key !== null) headers.authorization = `Bearer ${key}`;
  if (opts.requestId) headers['x-request-id'] = opts.requestId;
  return call(opts.path ?? '/v1/chat/completions', { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
}

export function chatBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: 'chat-model', messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello.' }], ...extra };
}

export function admin(path: string, init: RequestInit & { json?: unknown } = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (!headers.has('authorization')) headers.set('authorization', `Bearer ${ADMIN_TOKEN}`);
  let body = init.body;
  if (init.json !== undefined) {
    headers.set('content-type', 'application/json');
    body = JSON.stringify(init.json);
  }
  return call('/admin' + path, { ...init, headers, body });
}

/** The pool's coordinator snapshot through GET /admin/pools/:pool (asserts 200). */
export async function poolSnapshot(pool: string): Promise<PoolSnapshot> {
  const res = await admin(`/pools/${pool}`);
  expect(res.status).toBe(200);
  return res.json<PoolSnapshot>();
}

/** Delete every tenant key from the TENANTS KV namespace (all list pages). */
export async function clearKv(): Promise<void> {
  for (;;) {
    const page = await env.TENANTS.list();
    await Promise.all(page.keys.map((k) => env.TENANTS.delete(k.name)));
    if (page.list_complete) break;
  }
}

export interface OriginRequest {
  seq: number;
  host: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  body: string;
  sent?: string;
  status?: number;
  /** A streamed response whose reader went away before its end. */
  aborted?: boolean;
}

/** Requests the fake origin saw, filtered by exact request id, request-id prefix or host. */
export async function originRequests(filter: { rid?: string; ridPrefix?: string; host?: string }): Promise<OriginRequest[]> {
  const q = new URLSearchParams();
  if (filter.rid !== undefined) q.set('rid', filter.rid);
  if (filter.ridPrefix !== undefined) q.set('ridPrefix', filter.ridPrefix);
  if (filter.host !== undefined) q.set('host', filter.host);
  const res = await fetch(`https://control.origin.test/requests?${q}`);
  expect(res.status).toBe(200);
  return ((await res.json()) as { requests: OriginRequest[] }).requests;
}

/** Make the fake origin answer /health on `host` with `status`. */
export async function setOriginHealth(host: string, status: number): Promise<void> {
  const res = await fetch(`https://control.origin.test/health?host=${encodeURIComponent(host)}&status=${status}`, { method: 'POST' });
  expect(res.status).toBe(200);
}

export interface WireError {
  error: { message: string; type: string; param: string | null; code: string };
}

/** Assert an OpenAI-shaped error with this status and code; returns the body. */
export async function expectError(res: Response, status: number, code: unknown): Promise<WireError> {
  const text = await res.text();
  expect({ status: res.status, text }).toMatchObject({ status });
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  const body = JSON.parse(text) as WireError;
  expect(Object.keys(body)).toEqual(['error']);
  expect(body.error).toMatchObject({ message: expect.any(String), type: expect.any(String), code });
  expect(body.error.param === null || typeof body.error.param === 'string').toBe(true);
  expect(body.error.message.length).toBeGreaterThan(0);
  return body;
}

export async function sha256Hex(s: string): Promise<string> {
  const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(s));
  return [...new Uint8Array(d)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** Split an SSE body into its events (each with its trailing blank line). */
export function sseEvents(text: string): string[] {
  return text.split(/(?<=\n\n)/).filter((e) => e.length > 0);
}

export function isUsageOnlyEvent(event: string): boolean {
  if (!event.startsWith('data: {')) return false;
  const data = JSON.parse(event.slice(6)) as { choices?: unknown[]; usage?: unknown };
  return Array.isArray(data.choices) && data.choices.length === 0 && typeof data.usage === 'object' && data.usage !== null;
}

/**
 * Poll `read` until `done` holds and return that value. The bound is generous (a loaded 2-core
 * machine can take seconds to settle a release); when it runs out the test fails naming the
 * condition waited for and the last value read, instead of asserting on a state not reached yet.
 */
export async function until<T>(read: () => Promise<T>, done: (v: T) => boolean, opts: { timeoutMs?: number; what?: string } = {}): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 15_000;
  const deadline = Date.now() + timeoutMs;
  let v = await read();
  // Bounded twice: by time, and by count in case a clock that moves only across I/O stalls.
  for (let i = 0; i < 10_000 && !done(v); i++) {
    if (Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 10));
    v = await read();
  }
  if (!done(v)) {
    const last = JSON.stringify(v) ?? String(v);
    throw new Error(`until: waited ${timeoutMs} ms for ${opts.what ?? String(done)}; last value: ${last.length > 600 ? `${last.slice(0, 600)}…` : last}`);
  }
  return v;
}

/**
 * Run `run` with the isolate's `fetch` answered by `answer` (what a coordinator's scrape or health
 * probe reaches), then restore it. Waits `settleMs` first: workerd's clock moves only across I/O,
 * so each call's timestamps are newer than the last one's.
 */
export async function withOriginFetch<T>(answer: (url: URL) => Response | Promise<Response>, run: () => Promise<T>, settleMs = 5): Promise<T> {
  await new Promise((r) => setTimeout(r, settleMs));
  const real = globalThis.fetch;
  globalThis.fetch = (async (input: RequestInfo | URL) => answer(new URL(input instanceof Request ? input.url : String(input)))) as typeof fetch;
  try {
    return await run();
  } finally {
    globalThis.fetch = real;
  }
}
