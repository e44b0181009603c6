// Flow control (issue #29) inside workerd: the priority header's 400 in both error shapes; an
// acquire that finds every replica at maxInFlightPerReplica waits in the coordinator's queue and is
// admitted when a lease is released; a wait past the band's maxQueueMs is a 503 (pool saturated) or
// a 429 (the tenant over its fair share) with Retry-After; a client that goes away leaves the queue.
// Pool `flow` (test-env.ts): two replicas of one slot each, bands high/normal (20 s) and low (300 ms).

import { env } from 'cloudflare:workers';
import { afterEach, describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import { call, expectError, KEYS, poolSnapshot, until } from '../helpers/workers';
import { ADMIN_TOKEN } from '../fixtures/workers/test-env';
import { loadConfig } from '../../src/config';

const POOL = 'flow';
const stub = () => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(POOL)) as unknown as DurableObjectStub<PoolCoordinator>;

function send(opts: { priority?: string; signal?: AbortSignal; content?: string } = {}): Promise<Response> {
  const headers: Record<string, string> = { authorization: `Bearer ${KEYS.root}`, 'content-type': 'application/json' };
  if (opts.priority !== undefined) headers['x-prefix-router-priority'] = opts.priority;
  return call('/v1/chat/completions', { method: 'POST', headers, body: JSON.stringify({ model: 'flow-model', max_tokens: 8, messages: [{ role: 'user', content: opts.content ?? 'hi' }] }), signal: opts.signal });
}

/** Fill both replicas with leases held for `tenant` (the test's stand-in for streams in flight). */
/** Replica of each lease `fill` took. */
const replicaOf = new Map<string, string>();

async function fill(tenant: string): Promise<string[]> {
  await until(() => poolSnapshot(POOL), (s) => s.leases === 0, { what: 'pool flow idle before filling it' });
  const held: string[] = [];
  for (let i = 0; i < 2; i++) {
    const r = await stub().acquire({ pool: POOL, key: null, keyKind: 'none', tenant });
    expect(r.ok, 'a free slot').toBe(true);
    if (r.ok) {
      held.push(r.leaseId);
      replicaOf.set(r.leaseId, r.replica.id);
    }
  }
  // At the bound: a plain acquire (no ticket) is refused as before flow control.
  expect((await stub().acquire({ pool: POOL, key: null, keyKind: 'none', tenant })).ok).toBe(false);
  return held;
}

let holding: string[] = [];
afterEach(async () => {
  for (const id of holding) await stub().release(id, { status: 200, durationMs: 1 });
  holding = [];
  await until(() => poolSnapshot(POOL), (s) => s.leases === 0 && Object.values(s.queue?.depth ?? {}).every((n) => n === 0), { what: 'pool flow idle and its queue empty after the test' });
});

describe('flow control: x-prefix-router-priority', () => {
  it('an unknown band is a 400 naming the header and the band (OpenAI shape)', async () => {
    const body = await expectError(await send({ priority: 'gold' }), 400, 'invalid_request');
    expect(body.error.param).toBe('x-prefix-router-priority');
    expect(body.error.message).toContain('x-prefix-router-priority');
    expect(body.error.message).toContain('"gold"');
  });

  it('a band above the tenant\'s own is a 400 naming it', async () => {
    const body = await expectError(await send({ priority: 'high' }), 400, 'invalid_request');
    expect(body.error.message).toMatch(/may not use priority band "high"/);
  });

  it('/v1/messages answers the same 400 in Anthropic\'s shape', async () => {
    const res = await call('/v1/messages', {
      method: 'POST',
      headers: { 'x-api-key': KEYS.root, 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-prefix-router-priority': 'urgent!' },
      body: JSON.stringify({ model: 'flow-model', max_tokens: 8, messages: [{ role: 'user', content: 'Hi' }] }),
    });
    expect(res.status).toBe(400);
    const body = await res.json<{ type: string; error: { type: string; message: string } }>();
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('invalid_request_error');
    expect(body.error.message).toContain('x-prefix-router-priority');
    expect(body.error.message).toContain('"urgent!"');
  });

  it('an allowed band (its own, or one below) is served', async () => {
    expect((await send({ priority: 'low' })).status).toBe(200);
    expect((await send({ priority: 'normal' })).status).toBe(200);
  });
});

describe('flow control: the coordinator queue', () => {
  it('an acquire at the bound waits, and is admitted to the replica a release frees', async () => {
    holding = await fill('other');
    const pending = send({ content: 'queued' });
    const snap = await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 1, { what: 'the request waiting in the normal band' });
    expect(snap.queue!.tenants).toEqual([{ tenant: 'root', queued: 1, oldestWaitMs: expect.any(Number) }]);
    // Nothing reached an engine meanwhile: both replicas still hold one lease each.
    expect(snap.replicas.map((r) => r.inFlight)).toEqual([1, 1]);
    const freed = holding.shift()!;
    const before = await poolSnapshot(POOL);
    await stub().release(freed, { status: 200, durationMs: 1 });
    const res = await pending;
    expect(res.status).toBe(200);
    // The replica the strategy picked when the slot freed: the one freed (the other is still full).
    expect(res.headers.get('x-prefix-router-replica')).toBe(replicaOf.get(freed));
    await res.text();
    const after = await until(() => poolSnapshot(POOL), (s) => (s.queue?.admitted.normal ?? 0) > (before.queue?.admitted.normal ?? 0), { what: 'the queued request counted as admitted' });
    expect(after.queue!.wait.normal!.count).toBeGreaterThan(0);
    // The freed slot was taken, not one beyond the bound.
    expect(after.replicas.every((r) => r.inFlight <= 1)).toBe(true);
  });

  it('a wait past maxQueueMs is a 503 queue_timeout with Retry-After when the pool is saturated by others', async () => {
    holding = await fill('other');
    const res = await send({ priority: 'low' });
    const body = await expectError(res, 503, 'queue_timeout');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(body.error.message).toMatch(/saturated/);
    const snap = await poolSnapshot(POOL);
    expect(snap.queue!.rejected['low|queue_timeout']).toBeGreaterThanOrEqual(1);
  });

  it('a 429 queue_timeout_over_share when the tenant itself holds more than its fair share', async () => {
    holding = await fill('root');
    const res = await send({ priority: 'low' });
    await expectError(res, 429, 'queue_timeout_over_share');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
  });

  it('a client that goes away leaves the queue at once', async () => {
    holding = await fill('other');
    const abort = new AbortController();
    const pending = send({ signal: abort.signal, content: 'leaving' }).then(
      (r) => r.status,
      () => 'aborted',
    );
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 1, { what: 'the request waiting in the normal band' });
    abort.abort();
    const snap = await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 0, { what: 'the cancelled request out of the queue' });
    expect(snap.queue!.rejected['normal|queue_cancelled']).toBeGreaterThanOrEqual(1);
    expect(await pending).not.toBe(200);
    // Nobody took a slot for it: a release now leaves the pool one lease lighter.
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    await until(() => poolSnapshot(POOL), (s) => s.leases === 1, { what: 'one lease left after the release' });
  });

  it('coordinator RPCs: acquireQueued waits for a release; cancelQueued answers the waiting call', async () => {
    holding = await fill('other');
    const req = (ticket: string): AcquireRequest => ({ pool: POOL, key: null, keyKind: 'none', tenant: 't', queue: { ticket, band: 'normal', cost: 10, weight: 1 } });
    const waiting = stub().acquireQueued(req('tk-1')) as Promise<AcquireResult>;
    const cancelled = stub().acquireQueued(req('tk-2')) as Promise<AcquireResult>;
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 2, { what: 'two tickets waiting' });
    expect(await stub().cancelQueued(POOL, 'tk-2')).toEqual({ cancelled: true });
    expect(await cancelled).toMatchObject({ ok: false, reason: 'queue_cancelled' });
    expect(await stub().cancelQueued(POOL, 'tk-2')).toEqual({ cancelled: false });
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    const got = await waiting;
    expect(got).toMatchObject({ ok: true, band: 'normal' });
    expect(got.queuedMs).toBeGreaterThanOrEqual(0);
    if (got.ok) holding.push(got.leaseId);
  });

  it('the `queued` callback comes once, when an acquire starts waiting; a resuming request waits ahead of its tenant\'s others', async () => {
    let queuedCalls = 0;
    const onQueued = () => void queuedCalls++;
    const req = (ticket: string, resume = false): AcquireRequest => ({ pool: POOL, key: null, keyKind: 'none', tenant: 'a', queue: { ticket, band: 'normal', cost: 10, weight: 1, ...(resume ? { resume: true as const } : {}) } });
    // A free slot: leased at once, no callback.
    await until(() => poolSnapshot(POOL), (s) => s.leases === 0, { what: 'pool flow idle' });
    const free = (await stub().acquireQueued({ ...req('free'), queued: onQueued })) as AcquireResult;
    expect(free.ok).toBe(true);
    if (free.ok) await stub().release(free.leaseId, { status: 200, durationMs: 1 });
    expect(queuedCalls).toBe(0);
    holding = await fill('other');
    const order: string[] = [];
    const wait = (r: AcquireRequest) =>
      (stub().acquireQueued(r) as Promise<AcquireResult>).then((x) => {
        order.push(r.queue!.ticket);
        if (x.ok) holding.push(x.leaseId);
        return x;
      });
    const a1 = wait({ ...req('a-1'), queued: onQueued });
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 1, { what: 'a-1 waiting' });
    await until(async () => queuedCalls, (n) => n === 1, { what: 'the queued callback' });
    // Given its slot back to preemption before: it goes ahead of a-1 (vLLM's prepend_request).
    const back = wait(req('a-back', true));
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 2, { what: 'a-back waiting' });
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    expect(await back).toMatchObject({ ok: true });
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    expect(await a1).toMatchObject({ ok: true });
    expect(order).toEqual(['a-back', 'a-1']);
    expect(queuedCalls).toBe(1);
  });

  it('a coordinator restart while waiting: a retriable 503 queue_lost, not fail-open', async () => {
    holding = await fill('other');
    const pending = send({ content: 'restart' });
    // Waiting longer than an acquire takes (acquireTimeoutMs): the Worker knows it was queued, not unreachable.
    const snap = await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 1 && s.queue.oldestWaitMs > 2 * loadConfig(env.ROUTER_CONFIG).acquireTimeoutMs, { what: 'the request waiting past acquireTimeoutMs' });
    // Who waits and for how long, per tenant (prefix_router_queue_tenant_oldest_wait_seconds): the one waiter is its tenant's oldest.
    expect(snap.queue!.tenants).toHaveLength(1);
    expect(snap.queue!.tenants[0]!.queued).toBe(1);
    expect(snap.queue!.tenants[0]!.oldestWaitMs).toBeGreaterThan(2 * loadConfig(env.ROUTER_CONFIG).acquireTimeoutMs);
    expect(snap.queue!.tenants[0]!.oldestWaitMs).toBeLessThanOrEqual(snap.queue!.oldestWaitMs);
    const fault = await call(`/admin/pools/${POOL}/test-fault`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify({ restart: true }) });
    expect(fault.status).toBe(200);
    const res = await pending;
    await expectError(res, 503, 'queue_lost');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    // The isolate did not take the coordinator for gone: the next request is served through it.
    holding = [];
    const next = await send({ content: 'after restart' });
    expect(next.status).toBe(200);
    await next.text();
  });

  it('a higher band is admitted first; within a band, FIFO per tenant', async () => {
    holding = await fill('other');
    const req = (ticket: string, band: string, tenant: string): AcquireRequest => ({ pool: POOL, key: null, keyKind: 'none', tenant, queue: { ticket, band, cost: 10, weight: 1 } });
    const order: string[] = [];
    const wait = (ticket: string, band: string, tenant: string) =>
      (stub().acquireQueued(req(ticket, band, tenant)) as Promise<AcquireResult>).then((r) => {
        order.push(ticket);
        if (r.ok) holding.push(r.leaseId);
        return r;
      });
    const n1 = wait('n-1', 'normal', 'a');
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 1, { what: 'n-1 waiting' });
    const n2 = wait('n-2', 'normal', 'a');
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 2, { what: 'n-2 waiting' });
    const h1 = wait('h-1', 'high', 'b');
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.high === 1, { what: 'h-1 waiting' });
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    expect(await h1).toMatchObject({ ok: true, band: 'high' });
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    expect(await n1).toMatchObject({ ok: true, band: 'normal' });
    expect(order).toEqual(['h-1', 'n-1']);
    await stub().release(holding.shift()!, { status: 200, durationMs: 1 });
    expect(await n2).toMatchObject({ ok: true });
    expect(order).toEqual(['h-1', 'n-1', 'n-2']);
  });

  it('a full band refuses (queue_full, over share) and sheds a burst\'s newest for a tenant with less waiting', async () => {
    holding = await fill('other');
    const req = (ticket: string, tenant: string): AcquireRequest => ({ pool: POOL, key: null, keyKind: 'none', tenant, queue: { ticket, band: 'normal', cost: 10, weight: 1 } });
    const calls = new Map<string, Promise<AcquireResult>>();
    const answered = new Map<string, AcquireResult>();
    const track = (t: string, p: Promise<AcquireResult>) => calls.set(t, p.then((r) => (answered.set(t, r), r)));
    for (let i = 0; i < 10; i++) track(`noisy-${i}`, stub().acquireQueued(req(`noisy-${i}`, 'noisy')) as Promise<AcquireResult>);
    await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 10, { what: 'the normal band full (10)' });
    // The burst's own next request finds the band full: refused at once, the tenant over its share.
    const refused = await (stub().acquireQueued(req('noisy-10', 'noisy')) as Promise<AcquireResult>);
    expect(refused).toMatchObject({ ok: false, reason: 'queue_full', overShare: true, band: 'normal' });
    expect(refused.ok === false && refused.retryAfterMs).toBeGreaterThanOrEqual(1000);
    // Another tenant gets in: the burst's newest is pushed out.
    track('quiet-0', stub().acquireQueued(req('quiet-0', 'quiet')) as Promise<AcquireResult>);
    const snap = await until(() => poolSnapshot(POOL), (s) => s.queue?.depth.normal === 10 && s.queue.tenants.some((t) => t.tenant === 'quiet'), { what: 'quiet waiting in the full band' });
    expect(snap.queue!.tenants).toEqual([{ tenant: 'noisy', queued: 9, oldestWaitMs: expect.any(Number) }, { tenant: 'quiet', queued: 1, oldestWaitMs: expect.any(Number) }]);
    // The burst's newest (whichever of its calls reached the object last) was answered queue_full.
    await until(async () => answered.size, (n) => n === 1, { what: 'one noisy call answered' });
    const [shed, shedResult] = [...answered][0]!;
    expect(shed).toMatch(/^noisy-/);
    expect(shedResult).toMatchObject({ ok: false, reason: 'queue_full' });
    for (const t of [...calls.keys()].filter((k) => k !== shed)) await stub().cancelQueued(POOL, t);
    for (const [t, p] of calls) if (t !== shed) expect(await p).toMatchObject({ ok: false, reason: 'queue_cancelled' });
  });

  it('headroom: a low request waits while only the slot kept for the bands above is free; a normal one takes it', async () => {
    await until(() => poolSnapshot(POOL), (s) => s.leases === 0, { what: 'pool flow idle' });
    const r = await stub().acquire({ pool: POOL, key: null, keyKind: 'none', tenant: 'other' });
    expect(r.ok).toBe(true);
    if (r.ok) holding.push(r.leaseId);
    await expectError(await send({ priority: 'low' }), 503, 'queue_timeout');
    const normal = await send({ content: 'takes the kept slot' });
    expect(normal.status).toBe(200);
    await normal.text();
  });

  it('/metrics shows the queue per pool and band', async () => {
    const res = await call('/metrics', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text).toMatch(/^prefix_router_queue_depth\{pool="flow",band="normal"\} 0$/m);
    expect(text).toMatch(/^prefix_router_queue_rejected_total\{pool="flow",band="low",reason="queue_timeout"\} \d+$/m);
    expect(text).toMatch(/^prefix_router_queue_wait_seconds_count\{pool="flow",band="normal"\} \d+$/m);
  });
});
