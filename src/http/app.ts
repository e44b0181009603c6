// The Hono app: request id, tenant auth, body validation, pool and routing key, then the proxy.
// Thin handlers over pure helpers; every failure goes through errors.ts.

import { Hono } from 'hono';
import { blockHashes, hex32, NO_ROUTING_KEY, resolveRoutingKey } from '../core/index.js';
import { ConfigError, loadConfig, type PoolRuntime, type RouterConfig } from '../config.js';
import { forward, type FinishedRequest } from '../proxy/forward.js';
import { regionalCandidates, testGeoHeader, type RequestGeo } from './regions.js';
import { LeaseMemory } from '../proxy/early-connect.js';
import { formatTraceLine } from '../observability/trace-log.js';
import { parseJsonObject, readLimited } from './body.js';
import type { ErrorReason } from './errors.js';
import { DIALECTS, errorShapeFor, newResponseId, poolTag, poolTagOf, RESPONSE_ID_PARAM, responsesDialect, storedResponseDialect, type Dialect } from './apis/index.js';
import { KEYLESS_DIALECTS } from './apis/keyless/index.js';
import { isKeyRevokedHere, lookupTenant, noteKeyRevoked, tenantMayUse, type Tenant } from './tenants.js';
import { tenantIsolation } from './tenant-isolation.js';
import { cacheSaltProblem } from './cache-salt.js';
import { findModel, listModels, poolsForModel } from './models.js';
import { adminRoutes } from './admin.js';
import { testHookRoutes } from './test-hooks.js';
import { admitRequest, withAnswerRateLimitHeaders } from './quota-admission.js';
import { opsRoutes } from './ops.js';
import { fail, leaseClientFor, type AppContext, type AppEnv } from './context.js';

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** Keyless API paths outside /v1 (vLLM's /tokenize, /detokenize, /rerank, /v2/rerank): authenticated too. */
const KEYLESS_ROOT_PATHS = KEYLESS_DIALECTS.map((d) => d.path).filter((p) => !p.startsWith('/v1/'));

/** This isolate's recent leases by routing key, for early connect (proxy/early-connect.ts). */
const leaseMemory = new LeaseMemory();

export function createApp(): Hono<AppEnv> {
  const app = new Hono<AppEnv>();

  app.use('*', async (c, next) => {
    const incoming = c.req.header('x-request-id');
    c.set('requestId', incoming && REQUEST_ID.test(incoming) ? incoming : crypto.randomUUID());
    c.set('errorShape', errorShapeFor(c.req.path));
    try {
      c.set('config', loadConfig(c.env.ROUTER_CONFIG));
    } catch (e) {
      // Operator error, not client input: say so without echoing configuration values.
      console.error(JSON.stringify({ type: 'config_error', message: e instanceof ConfigError ? e.message : 'unreadable configuration' }));
      if (c.req.path === '/healthz') return c.json({ status: 'misconfigured' }, 500);
      return fail(c, 'misconfigured', 'The router is misconfigured; the operator has been told in the logs');
    }
    // The runtime takes up to ~128 KiB of headers; nothing the router serves needs that much, and
    // forwarded headers (x-session-id) would otherwise carry it to the origin.
    let headerBytes = 0;
    c.req.raw.headers.forEach((value, name) => (headerBytes += name.length + value.length + 4));
    const maxHeaderBytes = c.get('config').maxHeaderBytes;
    if (headerBytes > maxHeaderBytes) return fail(c, 'headers_too_large', `Request headers exceed the limit of ${maxHeaderBytes} bytes`);
    await next();
  });

  app.get('/healthz', (c) => {
    // A deployment that cannot salt its tenants' caches is not healthy: say so where probes look.
    const saltProblem = cacheSaltProblem(c.env, c.get('config').pools);
    if (saltProblem) console.error(JSON.stringify({ type: 'config_error', message: saltProblem }));
    return saltProblem ? c.json({ status: 'misconfigured' }, 500) : c.json({ status: 'ok' });
  });

  // Tenant auth on every API path: /v1/*, and the keyless APIs vLLM serves outside /v1.
  const authenticate = async (c: AppContext, next: () => Promise<void>) => {
    // A tenant key comes as "Authorization: Bearer <key>" (OpenAI SDKs), and on the Anthropic
    // paths also as "x-api-key: <key>" (Anthropic's SDKs, Claude Code); Authorization wins when
    // both are sent. Elsewhere x-api-key is no credential (and is never forwarded).
    const anthropic = c.get('errorShape') === 'anthropic';
    const authz = c.req.header('authorization');
    const apiKey = anthropic ? c.req.header('x-api-key') : undefined;
    if (authz === undefined && apiKey === undefined) {
      return fail(c, 'missing_api_key', anthropic ? 'You didn\'t provide an API key. Send it as "x-api-key: <key>" or "Authorization: Bearer <key>".' : 'You didn\'t provide an API key. Send it as "Authorization: Bearer <key>".');
    }
    const key = authz !== undefined ? /^Bearer ([\x21-\x7e]{1,512})$/.exec(authz)?.[1] : /^[\x21-\x7e]{1,512}$/.exec(apiKey!)?.[0];
    if (key === undefined) return fail(c, 'invalid_api_key', authz !== undefined ? 'Malformed Authorization header; expected "Bearer <key>".' : 'Malformed x-api-key header.');
    const tenant = await lookupTenant(c.env, key, c.get('config').tenantCacheMs);
    if (!tenant || isKeyRevokedHere(tenant)) return fail(c, 'invalid_api_key', 'Incorrect API key provided.');
    c.set('tenant', tenant);
    await next();
    // Rate-limit headers on every answer, also those decided before admission (http/quota-admission.ts).
    if (tenant.limits) c.res = await withAnswerRateLimitHeaders({ env: c.env, tenant }, c.res, c.get('errorShape') === 'anthropic' ? 'anthropic' : 'openai');
  };
  app.use('/v1/*', authenticate);
  for (const path of KEYLESS_ROOT_PATHS) app.use(path, authenticate);

  app.get('/v1/models', (c) => c.json({ object: 'list', data: listModels(c.get('config'), c.get('tenant')) }));
  app.get('/v1/models/:id{.+}', (c) => {
    const id = c.req.param('id');
    const model = findModel(c.get('config'), c.get('tenant'), id);
    // The same answer for a model that does not exist and one only other tenants' pools serve.
    return model ? c.json(model) : fail(c, 'model_not_found', `The model \`${id.slice(0, 100)}\` does not exist or you do not have access to it`, { param: 'model' });
  });
  app.all('/v1/models', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use GET`));
  app.all('/v1/models/:id{.+}', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use GET`));

  for (const dialect of DIALECTS) {
    app.post(dialect.path, (c) => handleDialect(c, dialect));
    app.all(dialect.path, (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use POST`));
  }
  app.post('/v1/responses', (c) => handleDialect(c, responsesDialect, responsesPlan));
  app.all('/v1/responses', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use POST`));
  app.get('/v1/responses/:id', (c) => handleResponseById(c, 'GET', ''));
  app.delete('/v1/responses/:id', (c) => handleResponseById(c, 'DELETE', ''));
  app.all('/v1/responses/:id', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use GET or DELETE`));
  app.post('/v1/responses/:id/cancel', (c) => handleResponseById(c, 'POST', '/cancel'));
  app.all('/v1/responses/:id/cancel', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use POST`));

  app.route('/admin', adminRoutes());
  app.route('/admin', testHookRoutes());
  app.route('/', opsRoutes());

  app.notFound((c) => fail(c, 'not_found', `Unknown path ${c.req.method} ${c.req.path.slice(0, 200)}`));
  app.onError((e, c) => {
    console.error(JSON.stringify({ type: 'unhandled_error', requestId: c.get('requestId'), message: e.message }));
    return fail(c, 'internal', 'Internal error in the router');
  });
  return app;
}

/** What a dialect's handler adds once the pool is known (the Responses API's pin and id). */
interface RequestPlan {
  dialect: Dialect;
  pinResponseId?: string;
  recordResponseId?: string;
}

/**
 * Responses API: a follow-up is pinned to the replica that stored `previous_response_id`; a new
 * response gets its id from the router (pool-tagged), recorded with the pick when it is stored.
 */
function responsesPlan(pool: PoolRuntime, body: Record<string, unknown>): RequestPlan {
  const id = newResponseId(pool.name);
  const prev = typeof body.previous_response_id === 'string' ? body.previous_response_id : undefined;
  return { dialect: responsesDialect.forRequest(id), pinResponseId: prev, recordResponseId: body.store === false ? undefined : id };
}

/** Read, validate, pick the pool and key, and forward one request of `dialect`'s API. */
export async function handleDialect(c: AppContext, dialect: Dialect, plan?: (pool: PoolRuntime, body: Record<string, unknown>) => RequestPlan): Promise<Response> {
  const startedAt = Date.now();
  const config = c.get('config');
  const tenant = c.get('tenant');
  const ct = c.req.header('content-type') ?? '';
  if (!/^application\/json\s*(;|$)/i.test(ct)) return fail(c, 'unsupported_media_type', 'Content-Type must be application/json');
  const raw = await readLimited(c.req.raw, config.maxBodyBytes, config.bodyTimeoutMs);
  if (!raw.ok) return fail(c, raw.reason, raw.message);
  const parsed = parseJsonObject(raw.bytes);
  if (!parsed.ok) return fail(c, parsed.reason, parsed.message);
  const body = parsed.value;
  const valid = dialect.validate(body);
  if (!valid.ok) return fail(c, valid.reason, valid.message, { param: valid.param });

  const chosen = selectPool(c, config, tenant, valid.model);
  if (chosen instanceof Response) return chosen;
  // Cross-region failover (regions.ts): the nearest region's pool first, the next on a spill.
  const geo = config.testHooks ? (testGeoHeader(c.req.header('x-prefix-router-test-cf')) ?? (c.req.raw.cf as RequestGeo | undefined)) : (c.req.raw.cf as RequestGeo | undefined);
  const regional = c.req.header('x-pool') === undefined ? regionalCandidates(chosen, poolsForModel(config, tenant, valid.model), geo) : [chosen];
  // A Responses follow-up goes to the pool (region) whose replica stored its previous response,
  // wherever the client is now: the id's pool tag names it.
  const pinTag = plan && typeof body.previous_response_id === 'string' ? poolTagOf(body.previous_response_id) : null;
  const pinned = pinTag === null ? undefined : regional.find((p) => poolTag(p.name) === pinTag);
  const candidates = pinned ? [pinned] : regional;
  let quota: Awaited<ReturnType<typeof admitRequest>> | undefined;
  /** Regional pools this request spilled past, nearest first (trace line). */
  const spilledFrom: string[] = [];
  for (let ci = 0; ci < candidates.length; ci++) {
    const pool = candidates[ci]!;
    if (dialect.keyless && !pool.keylessApis.has(dialect.keyless.api)) {
      return fail(c, 'not_found', `${dialect.path} is not served for the model \`${valid.model.slice(0, 100)}\`: its pool's engine (${pool.engine}) has no ${dialect.keyless.api} API`);
    }
    const iso = await tenantIsolation(c.env, pool, tenant, body, dialect.name);
    if (!iso.ok) return fail(c, iso.reason, iso.message, { param: iso.param });

    // A dialect's own session identity (Claude Code's header, metadata.user_id) stands in for the
    // pool's first header source when the client did not send that header.
    const sessionHeader = pool.keySources.find((s) => s.kind === 'header')?.name;
    const header = (n: string): string | undefined => {
      const v = c.req.header(n);
      if (v !== undefined || n !== sessionHeader || !dialect.sessionId) return v;
      return dialect.sessionId({ headers: c.req.raw.headers, body });
    };
    let promptText: string | undefined;
    const prompt = (): string => (promptText ??= dialect.promptText(body));
    // Keyless APIs have no prefix to keep: no key, so the pool's fallback (least-load) picks.
    const key = dialect.keyless ? NO_ROUTING_KEY : resolveRoutingKey(pool.keySources, { header, tenant: tenant.id, body, prompt, namespace: iso.namespace, prefixNamespace: iso.prefixNamespace });
    // Block hashes before the pick only when a prefix-aware pool needs them (hashed once, also for
    // the trace log). Hashes for the trace log alone wait until the request is finished: same CPU,
    // but off the path to the first token.
    const usesPrefix = pool.strategyImpl.usesPrefix === true && !dialect.keyless;
    const traceBlocks = config.traceLog && !dialect.keyless ? config.traceBlocks : 0;
    const blockCount = usesPrefix ? Math.max(pool.prefixMaxBlocks, traceBlocks) : 0;
    const blocks = blockCount > 0 ? blockHashes(prompt(), { maxBlocks: blockCount, seed: iso.blockSeed }) : null;
    const requestId = c.get('requestId');
    const planned = plan?.(pool, body);
    // Requests- and tokens-per-minute limits (http/quota-admission.ts): before anything reaches a replica.
    const q = (quota ??= await admitRequest(c, { model: valid.model, body, dialect: dialect.errors, ...(dialect.keyless ? { promptTokens: dialect.keyless.promptTokens(body), completionTokens: 0 } : {}) }));
    if (q.refused) {
      if (config.traceLog) {
        console.log(formatTraceLine({ at: startedAt, requestId, api: dialect.name, pool: pool.name, tenant: tenant.id, model: valid.model, keyKind: key.kind, keyHash: key.hash === null ? null : hex32(key.hash), replica: null, status: 429, error: 'rate_limited', ttftMs: null, durationMs: Date.now() - startedAt, promptTokens: null, cachedTokens: null, completionTokens: null, retried: false, spilled: false, attempts: 0 }));
      }
      return q.refused;
    }
    const result = await forward({
      request: c.req.raw,
      waitUntil: (p) => c.executionCtx.waitUntil(p),
      env: c.env,
      config,
      pool,
      coordinator: q.leaseClient(leaseClientFor(c.env, pool.name)),
      canSpill: ci < candidates.length - 1,
      kind: dialect.name,
      dialect: planned?.dialect ?? dialect,
      path: dialect.keyless ? dialect.keyless.upstreamPath(pool.engine) : dialect.path,
      body,
      stream: valid.stream,
      pinResponseId: planned?.pinResponseId,
      recordResponseId: planned?.recordResponseId,
      key,
      tenant: { id: tenant.id, maxInFlight: tenant.maxInFlight, keyId: tenant.keyId, sequences: iso.sequences },
      cacheSalt: iso.cacheSalt,
      upstreamRequestId: iso.upstreamRequestId,
      blocks: usesPrefix && blocks ? blocks.subarray(0, pool.prefixMaxBlocks) : undefined,
      requestId,
      startedAt,
      // No early connect for a background response: a guessed replica would accept and start it
      // before the cancel for a wrong guess could reach it.
      leaseMemory: q.earlyConnect && !(plan && body.background === true) ? leaseMemory : undefined,
      onFinish: (r: FinishedRequest) => {
        q.settle(r, { deferred: plan !== undefined && body.background === true });
        if (!config.traceLog) return;
        const hashes = traceBlocks > 0 ? (blocks ?? blockHashes(prompt(), { maxBlocks: traceBlocks, seed: iso.blockSeed })) : null;
        const traced = hashes ? Array.from(hashes.subarray(0, traceBlocks), hex32) : undefined;
        console.log(formatTraceLine({ at: startedAt, requestId, api: dialect.name, pool: pool.name, tenant: tenant.id, model: valid.model, keyKind: key.kind, keyHash: key.hash === null ? null : hex32(key.hash), ...r, upstreamRequestId: iso.upstreamRequestId, ...(spilledFrom.length > 0 ? { spilledFrom } : {}), blocks: traced }));
      },
    });
    if (result.ok) return q.withHeaders(result.response);
    if (result.spill) {
      spilledFrom.push(pool.name);
      continue;
    }
    const refused = q.refusedAfterForward();
    if (refused) return refused;
    const f = result.failure;
    if (f.reason === 'key_revoked') {
      noteKeyRevoked(tenant);
      return fail(c, 'invalid_api_key', f.message);
    }
    const reason: ErrorReason = f.reason === 'client_closed' ? 'upstream_unavailable' : f.reason;
    return q.withHeaders(fail(c, reason, f.message, { retryAfterSeconds: f.retryAfterSeconds }));
  }
  // Not reached: the last candidate never spills.
  return fail(c, 'no_healthy_replica', 'No region could take the request; retry later', { retryAfterSeconds: config.retryAfterSeconds });
}

/**
 * GET /v1/responses/{id} (retrieve; `?stream=true` replays a background response's events),
 * POST /v1/responses/{id}/cancel and DELETE /v1/responses/{id}: pinned to the replica that
 * stored the id for this tenant, in the pool its tag names (or, for an untagged id another engine
 * made, the first of the tenant's pools that knows it). Never another replica.
 */
async function handleResponseById(c: AppContext, method: 'GET' | 'POST' | 'DELETE', suffix: '' | '/cancel'): Promise<Response> {
  const startedAt = Date.now();
  const config = c.get('config');
  const tenant = c.get('tenant');
  const id = c.req.param('id') ?? '';
  if (!RESPONSE_ID_PARAM.test(id)) return fail(c, 'invalid_request', 'Invalid response id', { param: 'response_id' });
  const query = new URLSearchParams();
  if (method === 'GET') {
    const stream = c.req.query('stream');
    if (stream !== undefined && stream !== 'true' && stream !== 'false') return fail(c, 'invalid_request', "Invalid value for 'stream': expected true or false", { param: 'stream' });
    const after = c.req.query('starting_after');
    if (after !== undefined && !/^\d{1,9}$/.test(after)) return fail(c, 'invalid_request', "Invalid value for 'starting_after': expected a sequence number", { param: 'starting_after' });
    if (stream !== undefined) query.set('stream', stream);
    if (after !== undefined) query.set('starting_after', after);
    for (const inc of c.req.queries('include') ?? c.req.queries('include[]') ?? []) if (/^[a-z0-9_.]{1,64}$/.test(inc)) query.append('include', inc);
  }
  const stream = method === 'GET' && query.get('stream') === 'true';

  const requested = c.req.header('x-pool');
  let pools: PoolRuntime[];
  if (requested !== undefined) {
    if (!tenant.allowPoolHeader) return fail(c, 'pool_not_allowed', 'This API key may not choose a pool with x-pool', { param: 'x-pool' });
    const p = config.poolByName.get(requested);
    if (!p || !tenantMayUse(tenant, p.name)) return fail(c, 'pool_not_found', 'Unknown pool in x-pool', { param: 'x-pool' });
    pools = [p];
  } else {
    const allowed = config.pools.filter((p) => tenantMayUse(tenant, p.name));
    const tag = poolTagOf(id);
    const tagged = tag === null ? undefined : allowed.find((p) => poolTag(p.name) === tag);
    pools = tagged ? [tagged] : allowed;
  }
  const path = `/v1/responses/${id}${suffix}${query.size > 0 ? `?${query}` : ''}`;
  const requestId = c.get('requestId');
  // A retrieve, poll or cancel names no model and spends no tokens: it counts against the tenant's
  // requests per minute only (a tight polling loop is still a load on the engine).
  const q = await admitRequest(c, { model: '', body: {}, dialect: 'openai', promptTokens: 0, completionTokens: 0 });
  if (q.refused) return q.refused;
  let failure: { reason: ErrorReason; message: string; retryAfterSeconds?: number } = { reason: 'response_not_found', message: `Response with id '${id}' not found.` };
  for (const pool of pools) {
    const result = await forward({
      request: c.req.raw,
      waitUntil: (p) => c.executionCtx.waitUntil(p),
      env: c.env,
      config,
      pool,
      coordinator: q.leaseClient(leaseClientFor(c.env, pool.name)),
      kind: 'responses',
      dialect: storedResponseDialect,
      path,
      method,
      body: null,
      stream,
      pinResponseId: id,
      key: { kind: 'none', hash: null },
      tenant: { id: tenant.id, maxInFlight: tenant.maxInFlight, keyId: tenant.keyId },
      requestId,
      startedAt,
      onFinish: (r: FinishedRequest) => {
        if (r.error !== 'response_not_found') q.settle(r);
        if (config.traceLog && r.error !== 'response_not_found') console.log(formatTraceLine({ at: startedAt, requestId, api: 'responses', pool: pool.name, tenant: tenant.id, keyKind: 'none', keyHash: null, ...r }));
      },
    });
    if (result.ok) return q.withHeaders(result.response);
    const f = result.failure;
    if (f.reason === 'key_revoked') noteKeyRevoked(tenant);
    failure = { reason: f.reason === 'client_closed' ? 'upstream_unavailable' : f.reason === 'key_revoked' ? 'invalid_api_key' : f.reason, message: f.message, retryAfterSeconds: f.retryAfterSeconds };
    // Only "this pool does not know the id" moves on to the tenant's next pool.
    if (f.reason !== 'response_not_found') break;
  }
  const refused = q.refusedAfterForward();
  if (refused) return refused;
  return q.withHeaders(fail(c, failure.reason, failure.message, { retryAfterSeconds: failure.retryAfterSeconds }));
}

/** Pool by model; a tenant allowed to may choose among its pools with `x-pool`. */
function selectPool(c: AppContext, config: RouterConfig, tenant: Tenant, model: string): PoolRuntime | Response {
  const requested = c.req.header('x-pool');
  let pool: PoolRuntime | undefined;
  if (requested !== undefined) {
    if (!tenant.allowPoolHeader) return fail(c, 'pool_not_allowed', 'This API key may not choose a pool with x-pool', { param: 'x-pool' });
    pool = config.poolByName.get(requested);
    if (!pool) return fail(c, 'pool_not_found', 'Unknown pool in x-pool', { param: 'x-pool' });
    if (!pool.models.includes(model)) {
      return fail(c, 'model_not_found', `The model \`${model.slice(0, 100)}\` is not served by pool "${pool.name}"`, { param: 'model' });
    }
  } else {
    // The first pool serving the model that this tenant may use (the order GET /v1/models shows).
    pool = poolsForModel(config, tenant, model)[0] ?? config.poolByModel.get(model) ?? (config.defaultPool ? config.poolByName.get(config.defaultPool) : undefined);
    if (!pool) return fail(c, 'model_not_found', `The model \`${model.slice(0, 100)}\` does not exist`, { param: 'model' });
  }
  if (!tenantMayUse(tenant, pool.name)) {
    // Same answer as an unknown model when the tenant picked by model: do not reveal other tenants' pools.
    return requested !== undefined
      ? fail(c, 'pool_not_allowed', 'This API key may not use that pool', { param: 'x-pool' })
      : fail(c, 'model_not_found', `The model \`${model.slice(0, 100)}\` does not exist`, { param: 'model' });
  }
  return pool;
}
