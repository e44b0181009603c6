// forward() when the pool's coordinator RPC itself fails (overloaded, reset by a deploy): the
// client gets a retryable 503 failure value, not an exception that becomes a 500.

import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config';
import { forward, type FinishedRequest, type LeaseClient } from '../../src/proxy/forward';

function input(coordinator: LeaseClient, finished: FinishedRequest[]) {
  const config = loadConfig(env.ROUTER_CONFIG);
  const pool = config.poolByName.get('chat')!;
  return {
    request: new Request('https://router.test/v1/chat/completions', { method: 'POST' }),
    waitUntil: () => {},
    env,
    config,
    pool,
    coordinator,
    kind: 'chat' as const,
    path: '/v1/chat/completions',
    body: { model: 'chat-model', messages: [{ role: 'user', content: 'hi' }] },
    key: { kind: 'none' as const, hash: null },
    tenant: { id: 'acme' },
    requestId: 'coord-fail-1',
    startedAt: Date.now(),
    onFinish: (r: FinishedRequest) => finished.push(r),
  };
}

describe('forward: coordinator RPC failure', () => {
  it('a rejected acquire is a 503 no_healthy_replica failure with Retry-After, and is traced', async () => {
    const finished: FinishedRequest[] = [];
    const coordinator: LeaseClient = {
      acquire: () => Promise.reject(new Error('Durable Object is overloaded')),
      release: () => Promise.resolve(),
    };
    const res = await forward(input(coordinator, finished));
    expect(res.ok).toBe(false);
    if (res.ok) return;
    expect(res.failure.reason).toBe('no_healthy_replica');
    expect(res.failure.retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(res.failure.message).not.toContain('overloaded');
    expect(finished).toHaveLength(1);
    expect(finished[0]).toMatchObject({ replica: null, status: 503, error: 'no_healthy_replica' });
  });
});
