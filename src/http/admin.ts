// Admin API behind ADMIN_TOKEN: pools and replicas (through each pool's coordinator) and
// tenant keys (in the TENANTS KV namespace; only key hashes are stored).
// I/O: coordinator RPCs, KV reads and writes.

import { Hono, type MiddlewareHandler } from 'hono';
import { z } from 'zod';
import type { AdminResult } from '../coordinator/types.js';
import { authSecretName } from '../origin/origin-auth.js';
import { authRefSchema } from '../config.js';
import { coordinatorFor, fail, type AppContext, type AppEnv } from './context.js';
import { checkAdmin, tokenInQuery } from './admin-auth.js';
import { parseJsonObject, readLimited } from './body.js';
import { registerUsageRoutes } from './usage-admin.js';
import { clearTenantCache, kvKeyName, kvTenantName, noteKeyRevoked, revocationId, secretKeyExists, sha256Hex, tenantRecordSchema } from './tenants.js';

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const ADMIN_BODY_LIMIT = 64 * 1024;

export function adminRoutes(): Hono<AppEnv> {
  const admin = new Hono<AppEnv>();

  admin.use('*', async (c, next) => {
    if (tokenInQuery(c)) return fail(c, 'token_in_query', 'Credentials are not accepted in the query string; use the Authorization header');
    const admin = await checkAdmin(c);
    if (typeof admin === 'number') return fail(c, 'auth_rate_limited', 'Too many failed admin credentials from this client; retry later', { retryAfterSeconds: admin });
    if (admin !== 'ok') return fail(c, 'admin_unauthorized', 'Admin token required');
    await next();
  });

  // Path ids are checked by middleware registered on the routes' own patterns: a `*` middleware
  // sees no route params, so the check there never ran (a 600-character tenant id reached KV,
  // whose 512-byte key limit turned it into a 500).
  const checkIds: MiddlewareHandler<AppEnv> = async (c, next) => {
    for (const [name, value] of Object.entries(c.req.param() as Record<string, string>)) {
      if (!ID.test(value)) return fail(c, 'invalid_request', `Invalid ${name}: use 1-64 letters, digits, "_", "." or "-"`, { param: name });
    }
    await next();
  };
  for (const pattern of ['/pools/:pool', '/pools/:pool/replicas/:id', '/tenants/:id', '/tenants/:id/keys', '/tenants/:id/keys/:keyId', '/tenants/:id/usage', '/tenants/:id/limits']) admin.use(pattern, checkIds);
  registerUsageRoutes(admin);

  admin.get('/pools', async (c) => {
    const config = c.get('config');
    const pools = await Promise.all(
      config.pools.map(async (p) => {
        const snap = await coordinatorFor(c.env, p.name).snapshot(p.name);
        return {
          name: p.name,
          models: p.models,
          strategy: p.strategy,
          fallback: p.fallback,
          keys: p.keys,
          replicas: snap?.replicas.length ?? 0,
          healthy: snap?.replicas.filter((r) => r.healthy).length ?? 0,
          inFlight: snap?.replicas.reduce((s, r) => s + r.inFlight, 0) ?? 0,
        };
      }),
    );
    return c.json({ pools });
  });

  admin.get('/pools/:pool', async (c) => {
    const name = c.req.param('pool');
    if (!c.get('config').poolByName.has(name)) return fail(c, 'pool_not_found', `No pool named "${name}"`);
    const snap = await coordinatorFor(c.env, name).snapshot(name);
    return c.json(snap);
  });

  admin.put('/pools/:pool/replicas/:id', async (c) => {
    const { pool, id } = c.req.param();
    const body = await readAdminBody(c);
    if (body instanceof Response) return body;
    const authProblem = checkAuthRef(c, pool, body.auth);
    if (authProblem) return authProblem;
    const urlProblem = checkReplicaHost(c, body.url);
    if (urlProblem) return urlProblem;
    const res = await coordinatorFor(c.env, pool).upsertReplica(pool, { ...body, id });
    return adminResult(c, res);
  });

  admin.patch('/pools/:pool/replicas/:id', async (c) => {
    const { pool, id } = c.req.param();
    const body = await readAdminBody(c);
    if (body instanceof Response) return body;
    const patch = z.object({ weight: z.number().int().min(1).max(256).optional(), draining: z.boolean().optional() }).strict().safeParse(body);
    if (!patch.success) return fail(c, 'invalid_request', patch.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`).join('; '));
    const res = await coordinatorFor(c.env, pool).patchReplica(pool, id, patch.data);
    return adminResult(c, res);
  });

  admin.delete('/pools/:pool/replicas/:id', async (c) => {
    const { pool, id } = c.req.param();
    const res = await coordinatorFor(c.env, pool).removeReplica(pool, id);
    return adminResult(c, res);
  });

  admin.put('/tenants/:id', async (c) => {
    const kv = c.env.TENANTS;
    if (!kv) return fail(c, 'conflict', 'Tenant management needs the TENANTS KV namespace');
    const body = await readAdminBody(c);
    if (body instanceof Response) return body;
    const rec = tenantRecordSchema.safeParse({ ...body, id: c.req.param('id') });
    if (!rec.success) return fail(c, 'invalid_request', rec.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`).join('; '));
    const unknown = rec.data.pools.filter((p) => p !== '*' && !c.get('config').poolByName.has(p));
    if (unknown.length > 0) return fail(c, 'invalid_request', `Unknown pools: ${unknown.join(', ')}`, { param: 'pools' });
    await kv.put(kvTenantName(rec.data.id), JSON.stringify(rec.data));
    clearTenantCache();
    return c.json(rec.data);
  });

  admin.post('/tenants/:id/keys', async (c) => {
    const kv = c.env.TENANTS;
    if (!kv) return fail(c, 'conflict', 'Tenant management needs the TENANTS KV namespace');
    const tenant = c.req.param('id');
    if (!(await kv.get(kvTenantName(tenant)))) return fail(c, 'not_found', `No tenant "${tenant}"; create it with PUT /admin/tenants/${tenant}`);
    const bytes = crypto.getRandomValues(new Uint8Array(32));
    const key = 'pr-' + btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
    const keyId = 'k' + [...crypto.getRandomValues(new Uint8Array(6))].map((b) => b.toString(16).padStart(2, '0')).join('');
    const hash = await sha256Hex(key);
    const createdAt = Date.now();
    await kv.put(kvKeyName(hash), JSON.stringify({ tenant, keyId, createdAt }));
    await kv.put(`tenantkey:${tenant}:${keyId}`, hash);
    // The key is returned once and never stored; only its SHA-256 is.
    return c.json({ tenant, keyId, key, createdAt }, 201);
  });

  admin.delete('/tenants/:id/keys/:keyId', async (c) => {
    const kv = c.env.TENANTS;
    if (!kv) return fail(c, 'conflict', 'Tenant management needs the TENANTS KV namespace');
    const { id, keyId } = c.req.param();
    const hash = await kv.get(`tenantkey:${id}:${keyId}`);
    const inSecret = secretKeyExists(c.env, id, keyId);
    if (!hash && !inSecret) return fail(c, 'not_found', `No key "${keyId}" for tenant "${id}"`);
    // First this isolate, which refuses the key from now on before anything is sent (a key held in
    // TENANT_KEYS would otherwise be looked up again from the secret, and early connect would send
    // its next request to an origin before the coordinator refused it); then every pool's
    // coordinator, which refuses it in acquire (persisted); then KV, whose deletion alone takes up
    // to a minute to reach every location plus each isolate's lookup cache (tenantCacheMs).
    noteKeyRevoked({ id, keyId });
    const pools = c.get('config').pools;
    const pushed = await Promise.allSettled(pools.map((p) => coordinatorFor(c.env, p.name).revokeKeys([revocationId(id, keyId)])));
    const failed = pools.filter((_, i) => pushed[i]!.status === 'rejected').map((p) => p.name);
    if (hash) {
      await kv.delete(kvKeyName(hash));
      await kv.delete(`tenantkey:${id}:${keyId}`);
    }
    clearTenantCache();
    if (failed.length > 0) {
      console.error(JSON.stringify({ type: 'revocation_incomplete', tenant: id, keyId, pools: failed }));
      return fail(c, 'no_healthy_replica', `Revocation reached every pool but ${failed.join(', ')}; call again`, { retryAfterSeconds: 1 });
    }
    return c.json({ tenant: id, keyId, revoked: true, pools: pools.map((p) => p.name), ...(inSecret ? { note: 'The key is in TENANT_KEYS: remove it there too; until then the coordinators refuse it.' } : {}) });
  });

  return admin;
}

async function readAdminBody(c: AppContext): Promise<Record<string, unknown> | Response> {
  if (!/^application\/json\s*(;|$)/i.test(c.req.header('content-type') ?? '')) return fail(c, 'unsupported_media_type', 'Content-Type must be application/json');
  const raw = await readLimited(c.req.raw, ADMIN_BODY_LIMIT, c.get('config').bodyTimeoutMs);
  if (!raw.ok) return fail(c, raw.reason, raw.message);
  const parsed = parseJsonObject(raw.bytes);
  if (!parsed.ok) return fail(c, parsed.reason, parsed.message);
  return parsed.value;
}

/**
 * Only auth references declared for the pool (`authRefs`, or those its configured replicas use)
 * whose secret exists in this deployment are accepted: one PUT must not point an origin
 * credential at another host. The same secret under another kind is refused too.
 */
function checkAuthRef(c: AppContext, poolName: string, ref: unknown): Response | null {
  if (ref === undefined) return null;
  const parsed = authRefSchema.safeParse(ref);
  if (!parsed.success) return fail(c, 'invalid_request', `auth: ${parsed.error.issues[0]!.message}`, { param: 'auth' });
  const pool = c.get('config').poolByName.get(poolName);
  if (pool && !pool.allowedAuthRefs.has(parsed.data)) {
    const name = authSecretName(parsed.data);
    const other = name ? [...pool.allowedAuthRefs].find((r) => authSecretName(r) === name) : undefined;
    const why = other ? `the pool declares ${name} as "${other}", not "${parsed.data}"` : `"${parsed.data}" is not declared for pool "${pool.name}" (authRefs)`;
    return fail(c, 'invalid_request', `auth: ${why}`, { param: 'auth' });
  }
  const name = authSecretName(parsed.data);
  if (name && typeof (c.env as unknown as Record<string, unknown>)[name] !== 'string') return fail(c, 'invalid_request', `auth: unknown auth reference (no secret named ${name})`, { param: 'auth' });
  return null;
}

/** A replica may not be the router itself (a request loop, and the router's own credentials on the way). */
function checkReplicaHost(c: AppContext, url: unknown): Response | null {
  if (typeof url !== 'string') return null;
  let host: string;
  try {
    host = new URL(url).host.toLowerCase().replace(/\.(?=:|$)/, '');
  } catch {
    return null; // the schema names the problem
  }
  const own = new URL(c.req.url).host.toLowerCase();
  if (host === own) return fail(c, 'invalid_request', 'url: points at the router itself', { param: 'url' });
  return null;
}

function adminResult<T>(c: AppContext, res: AdminResult<T>): Response {
  if (res.ok) return c.json(res.value as object);
  const reason = res.reason === 'unknown_pool' ? 'pool_not_found' : res.reason === 'not_found' ? 'not_found' : 'invalid_request';
  return fail(c, reason, res.message);
}

