// The Responses API's by-id routes in workerd: a retrieve, poll or cancel counts against the
// tenant's requests per minute (no tokens) with OpenAI's 429 and x-ratelimit-* headers, and an id
// the tenant never made is a 404 that reaches no origin.

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { TenantMeter } from '../../src/index';
import type { TenantLimits } from '../../src/quota/limits';
import { admin, call } from '../helpers/workers';

type Meter = DurableObjectStub<TenantMeter>;
const meter = (tenant: string): Meter => env.TENANT_METER.get(env.TENANT_METER.idFromName(tenant)) as unknown as Meter;

async function tenantWith(limits: TenantLimits): Promise<{ id: string; key: string }> {
  const id = `resp-${crypto.randomUUID().slice(0, 8)}`;
  expect((await admin(`/tenants/${id}`, { method: 'PUT', json: { pools: ['chat'], limits } })).status).toBe(200);
  const issued = await admin(`/tenants/${id}/keys`, { method: 'POST' });
  expect(issued.status).toBe(201);
  return { id, key: (await issued.json<{ key: string }>()).key };
}

describe('GET /v1/responses/{id} and its cancel under a requests-per-minute limit', () => {
  it('count as requests: the limit admits two, the third is a 429 in OpenAI shape', async () => {
    const t = await tenantWith({ requestsPerMinute: 2, tokensPerMinute: 1_000_000 });
    await runInDurableObject<TenantMeter, void>(meter(t.id), (m) => void (m.now = () => 1_000_000_000));
    const id = `resp_${'7'.repeat(32)}`;
    const auth = { authorization: `Bearer ${t.key}` };
    const first = await call(`/v1/responses/${id}`, { headers: auth });
    expect(first.status).toBe(404);
    expect(await first.json()).toMatchObject({ error: { code: 'response_not_found', type: 'invalid_request_error' } });
    expect(first.headers.get('x-ratelimit-remaining-requests')).toBe('1');
    expect((await call(`/v1/responses/${id}/cancel`, { method: 'POST', headers: auth })).status).toBe(404);
    const third = await call(`/v1/responses/${id}`, { headers: auth });
    expect(third.status).toBe(429);
    expect(await third.json()).toMatchObject({ error: { type: 'requests' } });
    expect(third.headers.get('retry-after')).not.toBeNull();
  });
});
