// forward() when the pool's coordinator cannot be reached (overloaded, reset by a deploy, slow):
// the request fails open (lease protocol v2): this isolate picks by consistent hash over the last
// known replica set, serves it, counts a fallback and says so in the trace; the breaker spares
// the next requests the wait; a tenant's cap still holds per isolate; with no replica at all the
// client gets a retryable 503, not a 500.

import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import { loadConfig, parseConfig, type RouterConfig } from '../../src/config';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import { forward, type FinishedRequest, type LeaseClient } from '../../src/proxy/forward';
import { LeaseAgent } from '../../src/proxy/lease-agent';
import { FailOpenRouter } from '../../src/proxy/lease-fallback';
import { chatDialect } from '../../src/http/apis';
import { until } from '../helpers/workers';

function input(coordinator: LeaseClient, finished: FinishedRequest[], o: { agent?: LeaseAgent; open?: FailOpenRouter; config?: RouterConfig; pending?: Promise<unknown>[]; tenantMax?: number; key?: number } = {}) {
  const config = o.config ?? loadConfig(env.ROUTER_CONFIG);
  const pool = config.poolByName.get('chat')!;
  return {
    request: new Request('https://router.test/v1/chat/completions', { method: 'POST' }),
    waitUntil: (p: Promise<unknown>) => o.pending?.push(p),
    env,
    config,
    pool,
    coordinator,
    leases: o.agent ?? new LeaseAgent(),
    failOpenRouter: o.open ?? new FailOpenRouter(),
    kind: 'chat' as const,
    dialect: chatDialect,
    path: '/v1/chat/completions',
    body: { model: 'chat-model', stream: true, messages: [{ role: 'user', content: 'hi' }] },
    key: o.key === undefined ? { kind: 'none' as const, hash: null } : { kind: 'header' as const, hash: o.key },
    tenant: { id: 'acme', maxInFlight: o.tenantMax },
    requestId: `coord-fail-${crypto.randomUUID().slice(0, 8)}`,
    startedAt: Date.now(),
    onFinish: (r: FinishedRequest) => finished.push(r),
  };
}

const failing = (calls: AcquireRequest[] = []): LeaseClient => ({
  acquire: (req) => (calls.push(req), Promise.reject(new Error('Durable Object is overloaded'))),
  release: () => Promise.resolve(),
});

describe('forward: coordinator unreachable → fail-open', () => {
  it('a rejected acquire is served open from the configured replicas, counted and traced', async () => {
    const finished: FinishedRequest[] = [];
    const agent = new LeaseAgent();
    const pending: Promise<unknown>[] = [];
    const res = await forward(input(failing(), finished, { agent, pending, key: 0xabc }));
    expect(res.ok).toBe(true);
    if (!res.ok) return;
    expect(['a', 'b', 'c']).toContain(res.response.headers.get('x-prefix-router-replica'));
    await res.response.text();
    await Promise.all(pending);
    expect(finished).toHaveLength(1);
    expect(finished[0]).toMatchObject({ status: 200, failOpen: true });
    expect(agent.stats().find((s) => s.pool === 'chat')).toMatchObject({ fallbacksUnreported: 1, open: true, held: 0 });
    // A call that fails fast (an object reset under it) is sent once more before failing open.
    expect(agent.counters.rpcs.acquire).toBe(2);
  });

  it('the same key goes to the same replica open as long as it has room; the breaker skips the RPC', async () => {
    const calls: AcquireRequest[] = [];
    const agent = new LeaseAgent();
    const open = new FailOpenRouter();
    const finished: FinishedRequest[] = [];
    const pending: Promise<unknown>[] = [];
    const seen: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await forward(input(failing(calls), finished, { agent, open, pending, key: 0x5eed }));
      expect(res.ok).toBe(true);
      if (!res.ok) return;
      seen.push(res.response.headers.get('x-prefix-router-replica')!);
      await res.response.text();
    }
    await Promise.all(pending);
    expect(new Set(seen).size).toBe(1);
    // Only the first asked (twice: a fast failure is retried once); the breaker
    // (coordinatorRetryMs) routed the other two open at once.
    expect(calls).toHaveLength(2);
    expect(finished.every((f) => f.failOpen === true)).toBe(true);
  });

  it('an acquire that misses acquireTimeoutMs fails open, and the lease it took late is released at once', async () => {
    const config = parseConfig({ ...(env.ROUTER_CONFIG as object), acquireTimeoutMs: 50 });
    const released: string[] = [];
    let answer: (r: AcquireResult) => void = () => {};
    const slow: LeaseClient = {
      acquire: () => new Promise<AcquireResult>((r) => (answer = r)),
      release: async (id) => void released.push(id),
    };
    const finished: FinishedRequest[] = [];
    const pending: Promise<unknown>[] = [];
    const t0 = Date.now();
    const res = await forward(input(slow, finished, { config, pending }));
    expect(res.ok).toBe(true);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(45);
    if (res.ok) await res.response.text();
    answer({ ok: true, leaseId: 'late-lease', replica: { id: 'a', url: 'https://a.origin.test', auth: 'bearer:ORIGIN_KEY' }, spilled: false, steps: 1, deadline: Date.now() + 30_000 });
    // The late answer's release follows it asynchronously: wait for it, then for what it queued.
    await until(async () => released.slice(), (r) => r.length > 0, { what: 'the late lease to be released' });
    await Promise.all(pending);
    expect(released).toEqual(['late-lease']);
    expect(finished[0]).toMatchObject({ failOpen: true, status: 200 });
  });

  it('a tenant cap holds per isolate while open', async () => {
    const agent = new LeaseAgent();
    const open = new FailOpenRouter();
    const finished: FinishedRequest[] = [];
    const first = await forward(input(failing(), finished, { agent, open, tenantMax: 1 }));
    expect(first.ok).toBe(true);
    // The first stream is still open (body not read): the second is over the cap of 1.
    const second = await forward(input(failing(), finished, { agent, open, tenantMax: 1 }));
    expect(second.ok).toBe(false);
    if (!second.ok) expect(second.failure.reason).toBe('tenant_limit');
    if (first.ok) await first.response.text();
  });

  it('with no replica to fall back on, a retryable 503 no_healthy_replica, traced', async () => {
    const base = env.ROUTER_CONFIG as { pools: { name: string; replicas: unknown[] }[] };
    const config = parseConfig({ ...base, pools: base.pools.map((p) => (p.name === 'chat' ? { ...p, replicas: [] } : p)) });
    const finished: FinishedRequest[] = [];
    const res = await forward(input(failing(), finished, { config }));
    expect(res.ok).toBe(false);
    if (res.ok) return;
    expect(res.failure.reason).toBe('no_healthy_replica');
    expect(res.failure.retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(res.failure.message).not.toContain('overloaded');
    expect(finished).toHaveLength(1);
    expect(finished[0]).toMatchObject({ replica: null, status: 503, error: 'no_healthy_replica' });
  });
});
