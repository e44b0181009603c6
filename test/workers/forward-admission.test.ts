// forward() with a quota decision still under way (`admitted`, http/quota-admission.ts
// pendingDecision): awaited with the first acquire, so a refused request reaches no origin, its
// lease goes straight back, and it ends as `rate_limited`; an admitted one goes on as usual.

import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config';
import type { AcquireResult } from '../../src/coordinator/types';
import { chatDialect } from '../../src/http/apis';
import { forward, type FinishedRequest, type LeaseClient } from '../../src/proxy/forward';
import { LeaseAgent } from '../../src/proxy/lease-agent';
import { FailOpenRouter } from '../../src/proxy/lease-fallback';
import { chatBody, originRequests, rid } from '../helpers/workers';

function run(admitted: Promise<boolean>) {
  const config = loadConfig(env.ROUTER_CONFIG);
  const requestId = rid('admitted');
  const released: string[] = [];
  const finished: FinishedRequest[] = [];
  const pending: Promise<unknown>[] = [];
  let leases = 0;
  const coordinator: LeaseClient = {
    acquire: async (): Promise<AcquireResult> => ({ ok: true, leaseId: `lease-${++leases}`, replica: { id: 'a', url: 'https://a.origin.test', auth: 'bearer:ORIGIN_KEY' }, spilled: false, steps: 1, deadline: Date.now() + 30_000 }),
    release: async (id) => void released.push(id),
  };
  const result = forward({
    request: new Request('https://router.test/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': requestId } }),
    waitUntil: (p) => pending.push(p),
    env,
    config,
    pool: config.poolByName.get('chat')!,
    coordinator,
    leases: new LeaseAgent(),
    failOpenRouter: new FailOpenRouter(),
    kind: 'chat',
    dialect: chatDialect,
    path: '/v1/chat/completions',
    body: chatBody({ stream: true }),
    key: { kind: 'none', hash: null },
    tenant: { id: 'acme' },
    admitted,
    requestId,
    startedAt: Date.now(),
    onFinish: (r) => finished.push(r),
  });
  return { result, released, finished, pending, requestId };
}

describe('forward: a quota decision awaited with the first acquire', () => {
  it('refused: rate_limited, the lease given back, no origin contacted', async () => {
    let decide: (ok: boolean) => void = () => {};
    const r = run(new Promise<boolean>((resolve) => (decide = resolve)));
    // The acquire has answered; the decision has not: nothing may go out yet.
    await new Promise((res) => setTimeout(res, 20));
    decide(false);
    const res = await r.result;
    expect(res).toMatchObject({ ok: false, failure: { reason: 'rate_limited' } });
    await Promise.all(r.pending);
    expect(r.released).toEqual(['lease-1']);
    expect(r.finished).toEqual([expect.objectContaining({ replica: null, status: 429, error: 'rate_limited', attempts: 1 })]);
    expect(await originRequests({ ridPrefix: r.requestId })).toEqual([]);
  });

  it('admitted: served as usual, one lease, released once at the end', async () => {
    const r = run(Promise.resolve(true));
    const res = await r.result;
    expect(res.ok).toBe(true);
    if (res.ok) await res.response.text();
    await Promise.all(r.pending);
    expect(r.released).toEqual(['lease-1']);
    expect(r.finished).toEqual([expect.objectContaining({ replica: 'a', status: 200 })]);
    expect(await originRequests({ ridPrefix: r.requestId })).toHaveLength(1);
  });
});
