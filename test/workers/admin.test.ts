// The admin API end to end: pools and replicas (add, drain, remove, reweight) and what routing
// does with them, and tenant keys in KV (issued once, stored only as a hash, revocable).

import { env } from 'cloudflare:workers';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROUTER_CONFIG } from '../fixtures/workers/test-env';
import { admin, call, chatBody, clearKv, complete, expectError, originRequests, poolSnapshot, rid, sha256Hex, until } from '../helpers/workers';
import type { ReplicaSnapshot } from '../../src/coordinator/pool-coordinator';

/** Send `n` requests to the admin pool (round-robin) and return the replicas that served them. */
async function route(n: number, prefix: string): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    const res = await complete({ model: 'admin-model', messages: [{ role: 'user', content: `m${i}` }] }, { requestId: `${prefix}-${i}` });
    expect(res.status).toBe(200);
    await res.text();
    out.push(res.headers.get('x-prefix-router-replica')!);
  }
  return out;
}

describe('admin: pools and replicas', () => {
  it('GET /admin/pools lists every configured pool with its replica counts', async () => {
    const res = await admin('/pools');
    expect(res.status).toBe(200);
    const { pools } = await res.json<{ pools: { name: string; models: string[]; strategy: string; replicas: number; healthy: number; inFlight: number }[] }>();
    expect(pools.map((p) => p.name)).toEqual(ROUTER_CONFIG.pools.map((p) => p.name));
    const chat = pools.find((p) => p.name === 'chat')!;
    expect(chat).toMatchObject({ models: ['chat-model'], strategy: 'bounded-hash:1.25', replicas: 3, healthy: 3, inFlight: 0 });
    expect(pools.find((p) => p.name === 'empty')).toMatchObject({ replicas: 1, healthy: 1 });
  });

  it('GET /admin/pools/:pool returns the coordinator snapshot', async () => {
    const snap = await poolSnapshot('chat');
    expect(snap).toMatchObject({ pool: 'chat', strategy: 'bounded-hash:1.25', fallback: 'least-load', keys: ['header:x-session-id', 'tenant'], leases: 0, expiredLeases: 0 });
    expect(snap.replicas.map((r) => r.id)).toEqual(['a', 'b', 'c']);
    for (const r of snap.replicas) {
      expect(r).toMatchObject({ weight: 1, auth: 'bearer:ORIGIN_KEY', draining: false, healthy: true, inFlight: 0 });
      expect(JSON.stringify(r)).not.toContain('origin-secret'); // the reference, never the secret
    }
  });

  it('PUT adds a replica, PATCH drains it, DELETE removes it — and routing follows', async () => {
    const prefix = rid('adm');
    // Add m3 with weight 2: round-robin visits m1, m2, m3, m3.
    const put = await admin('/pools/admin/replicas/m3', { method: 'PUT', json: { url: 'https://m3.origin.test', weight: 2, auth: 'bearer:ORIGIN_KEY' } });
    expect(put.status).toBe(200);
    expect(await put.json<ReplicaSnapshot>()).toMatchObject({ id: 'm3', url: 'https://m3.origin.test', weight: 2, draining: false, healthy: true, inFlight: 0 });
    expect((await poolSnapshot('admin')).replicas.map((r) => r.id)).toEqual(['m1', 'm2', 'm3']);
    const served = await route(8, `${prefix}-add`);
    expect(served.filter((r) => r === 'm3')).toHaveLength(4);
    expect(served.filter((r) => r === 'm1')).toHaveLength(2);

    // Drain m1: it gets no new requests.
    const patch = await admin('/pools/admin/replicas/m1', { method: 'PATCH', json: { draining: true } });
    expect(patch.status).toBe(200);
    expect(await patch.json<ReplicaSnapshot>()).toMatchObject({ id: 'm1', draining: true });
    const m1Before = (await originRequests({ host: 'm1.origin.test' })).filter((r) => r.path === '/v1/chat/completions').length;
    const drained = await route(8, `${prefix}-drain`);
    expect(drained).not.toContain('m1');
    expect(new Set(drained)).toEqual(new Set(['m2', 'm3']));
    const m1After = (await originRequests({ host: 'm1.origin.test' })).filter((r) => r.path === '/v1/chat/completions').length;
    expect(m1After).toBe(m1Before);

    // Undrain and reweight.
    const undrain = await admin('/pools/admin/replicas/m1', { method: 'PATCH', json: { draining: false, weight: 3 } });
    expect(await undrain.json<ReplicaSnapshot>()).toMatchObject({ id: 'm1', draining: false, weight: 3 });
    expect((await route(6, `${prefix}-reweight`)).filter((r) => r === 'm1')).toHaveLength(3);

    // Remove m3 (once the last releases, batched within releaseFlushMs, have landed).
    await until(() => poolSnapshot('admin'), (s) => s.leases === 0);
    const del = await admin('/pools/admin/replicas/m3', { method: 'DELETE' });
    expect(del.status).toBe(200);
    expect(await del.json()).toEqual({ id: 'm3', inFlight: 0 });
    expect((await poolSnapshot('admin')).replicas.map((r) => r.id)).toEqual(['m1', 'm2']);
    expect(await route(6, `${prefix}-removed`)).not.toContain('m3');
    await expectError(await admin('/pools/admin/replicas/m3', { method: 'DELETE' }), 404, 'not_found');
  });

  it('PUT refuses a loopback replica: this configuration is a deployed one (no `local`), where loopback reaches nothing', async () => {
    expect((ROUTER_CONFIG as { local?: boolean }).local).toBeUndefined();
    for (const url of ['http://127.0.0.1:8000', 'http://localhost:9001', 'http://[::1]:8000', 'https://127.0.0.2']) {
      const e = await expectError(await admin('/pools/admin/replicas/lo', { method: 'PUT', json: { url, auth: 'bearer:ORIGIN_KEY' } }), 400, expect.any(String));
      expect(e.error.message, url).toMatch(/url: is a loopback address \(.+\), which only a local run can reach.*Tunnel/);
    }
    expect((await poolSnapshot('admin')).replicas.map((r) => r.id)).not.toContain('lo');
  });

  it('PUT on an existing replica replaces its settings and keeps its stats', async () => {
    const before = (await poolSnapshot('admin')).replicas.find((r) => r.id === 'm2')!;
    expect(before.stats.requests).toBeGreaterThan(0);
    const res = await admin('/pools/admin/replicas/m2', { method: 'PUT', json: { url: 'https://m2b.origin.test', weight: 4, auth: 'bearer:ORIGIN_KEY' } });
    expect(res.status).toBe(200);
    const after = (await poolSnapshot('admin')).replicas.find((r) => r.id === 'm2')!;
    expect(after).toMatchObject({ url: 'https://m2b.origin.test', weight: 4 });
    expect(after.stats.requests).toBe(before.stats.requests);
    // Weights m1 3, m2 4: one round-robin cycle of 7 serves m2 four times, at its new URL.
    const id = rid('moved');
    const served = await route(7, id);
    expect(served.filter((r) => r === 'm2')).toHaveLength(4);
    for (let i = 0; i < served.length; i++) {
      const [seen] = await originRequests({ rid: `${id}-${i}` });
      expect(seen!.host).toBe(served[i] === 'm2' ? 'm2b.origin.test' : 'm1.origin.test');
    }
  });
});

describe('admin: tenants and keys', () => {
  beforeAll(clearKv);
  afterAll(clearKv);

  const models = (key: string) => call('/v1/models', { headers: { authorization: `Bearer ${key}` } });

  it('issues a key once, stores only its hash, and revokes it', async () => {
    const put = await admin('/tenants/t1', { method: 'PUT', json: { pools: ['chat'], maxInFlight: 5 } });
    expect(put.status).toBe(200);
    expect(await put.json()).toEqual({ id: 't1', pools: ['chat'], maxInFlight: 5, allowPoolHeader: false });

    const issued = await admin('/tenants/t1/keys', { method: 'POST' });
    expect(issued.status).toBe(201);
    const { key, keyId, tenant } = await issued.json<{ key: string; keyId: string; tenant: string }>();
    expect(tenant).toBe('t1');
    expect(key).toMatch(/^pr-[A-Za-z0-9_-]{40,}$/);

    // KV holds the SHA-256 of the key, never the key itself, under any name or value.
    const hash = await sha256Hex(key);
    const { keys } = await env.TENANTS.list();
    expect(keys.map((k) => k.name)).toContain(`key:${hash}`);
    for (const k of keys) {
      expect(k.name).not.toContain(key);
      expect(await env.TENANTS.get(k.name)).not.toContain(key);
    }
    expect(await env.TENANTS.get(`key:${hash}`, 'json')).toMatchObject({ tenant: 't1', keyId });

    // The key works: its tenant sees its pools' models and can make requests.
    const ok = await models(key);
    expect(ok.status).toBe(200);
    expect((await ok.json<{ data: { id: string }[] }>()).data.map((m) => m.id)).toEqual(['chat-model']);
    const chat = await complete(chatBody(), { key });
    expect(chat.status).toBe(200);
    await chat.text();

    // A second key for the same tenant.
    const second = await (await admin('/tenants/t1/keys', { method: 'POST' })).json<{ key: string; keyId: string }>();
    expect(second.key).not.toBe(key);
    expect(second.keyId).not.toBe(keyId);

    // Revoke the first: it stops working at once in this isolate (the admin API clears the cache); the second still works.
    const del = await admin(`/tenants/t1/keys/${keyId}`, { method: 'DELETE' });
    expect(del.status).toBe(200);
    expect(await del.json()).toMatchObject({ tenant: 't1', keyId, revoked: true });
    await expectError(await models(key), 401, 'invalid_api_key');
    await expectError(await complete(chatBody(), { key }), 401, 'invalid_api_key');
    expect(await env.TENANTS.get(`key:${hash}`)).toBeNull();
    expect((await models(second.key)).status).toBe(200);
    await expectError(await admin(`/tenants/t1/keys/${keyId}`, { method: 'DELETE' }), 404, 'not_found');
  });

  it("changing a tenant's pools takes effect at once", async () => {
    await admin('/tenants/t2', { method: 'PUT', json: { pools: ['chat'] } });
    const { key } = await (await admin('/tenants/t2/keys', { method: 'POST' })).json<{ key: string }>();
    expect((await (await models(key)).json<{ data: { id: string }[] }>()).data.map((m) => m.id)).toEqual(['chat-model']);
    await admin('/tenants/t2', { method: 'PUT', json: { pools: ['private'] } });
    expect((await (await models(key)).json<{ data: { id: string }[] }>()).data.map((m) => m.id)).toEqual(['private-model']);
    await expectError(await complete(chatBody(), { key }), 404, 'model_not_found');
  });

  it("a tenant record's maxInFlight caps its concurrent requests in a pool (429 with Retry-After)", async () => {
    await admin('/tenants/t3', { method: 'PUT', json: { pools: ['chat'], maxInFlight: 1 } });
    const { key } = await (await admin('/tenants/t3/keys', { method: 'POST' })).json<{ key: string }>();
    // Hold the first stream open by not reading it: the proxy's copy loop waits on the client.
    const first = await complete(chatBody({ stream: true }), { key });
    expect(first.status).toBe(200);
    const busy = await complete(chatBody({ stream: true }), { key });
    expect(busy.headers.get('retry-after')).toBe('2');
    await expectError(busy, 429, 'tenant_limit');
    // Another tenant is not affected.
    const other = await complete(chatBody({ stream: true }));
    expect(other.status).toBe(200);
    await other.text();
    // Finish the first stream; the lease is released and the tenant may send again.
    await first.text();
    await until(
      () => poolSnapshot('chat'),
      (s) => s.leases === 0,
    );
    const again = await complete(chatBody({ stream: true }), { key });
    expect(again.status).toBe(200);
    await again.text();
  });
});
