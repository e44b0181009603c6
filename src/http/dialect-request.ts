// A request in one of the API dialects (http/apis/<dialect>/): read and validate its body, choose
// its pools (by model, x-pool, region, a Responses pin), and per pool its tenant isolation,
// routing key and prompt blocks; then the shared request flow (request-flow.ts). Every dialect's
// POST route comes here (mountDialect). I/O: the request body; the rest through the flow.

import type { Hono } from 'hono';
import { blockHashes, hex32, NO_ROUTING_KEY, resolveRoutingKey } from '../core/index.js';
import type { PoolRuntime, RouterConfig } from '../config.js';
import type { Dialect, ValidRequest } from './apis/dialect.js';
import { parseJsonObject, readLimited } from './body.js';
import { fail, type AppContext, type AppEnv } from './context.js';
import { poolsForModel } from './models.js';
import { regionalCandidates, type RequestGeo } from './regions.js';
import { runFlow, type PoolRequest } from './request-flow.js';
import { tenantIsolation } from './tenant-isolation.js';
import { planQueue, PRIORITY_HEADER } from './flow-control.js';
import { sessionTagFor } from './cache-salt.js';
import { FIELD_VALUE, SESSION_HEADER, sessionHeaderValue } from '../proxy/upstream-request.js';
import { tenantMayUse, type Tenant } from './tenants.js';

/** What a dialect adds to the shared request (the Responses API's pin, id and background mode). */
export interface DialectPlan {
  /** The one candidate pool the request must go to (the pool of the response it follows up), if any. */
  pinnedPool(body: Record<string, unknown>, candidates: readonly PoolRuntime[]): PoolRuntime | undefined;
  /** Per pool: the dialect this request speaks there, the response it must reach and the one it records. */
  forPool(pool: PoolRuntime, body: Record<string, unknown>): { dialect: Dialect; pinResponseId?: string; recordResponseId?: string };
  /**
   * The answer comes before the generation (a background response): no early connect (a guessed
   * replica would accept and start it before the cancel for a wrong guess could reach it), and the
   * quota is settled as deferred.
   */
  background(body: Record<string, unknown>): boolean;
}

/** POST `dialect.path` to handleDialect; any other method is a 405. */
export function mountDialect(app: Hono<AppEnv>, dialect: Dialect, plan?: DialectPlan): void {
  app.post(dialect.path, (c) => handleDialect(c, dialect, plan));
  app.all(dialect.path, (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use POST`));
}

/** Read, validate, pick the pools and key, and forward one request of `dialect`'s API. */
export async function handleDialect(c: AppContext, dialect: Dialect, plan?: DialectPlan): Promise<Response> {
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
  const geo = c.req.raw.cf as RequestGeo | undefined;
  const regional = c.req.header('x-pool') === undefined ? regionalCandidates(chosen, poolsForModel(config, tenant, valid.model), geo) : [chosen];
  // A Responses follow-up goes to the pool (region) whose replica stored its previous response,
  // wherever the client is now: the id's pool tag names it.
  const pinned = plan?.pinnedPool(body, regional);
  const background = plan?.background(body) === true;

  return runFlow(c, {
    api: dialect.name,
    model: valid.model,
    startedAt,
    pools: pinned ? [pinned] : regional,
    next: 'spill',
    admit: { model: valid.model, body, dialect: dialect.errors, ...(dialect.keyless ? { promptTokens: dialect.keyless.promptTokens(body), completionTokens: 0 } : {}) },
    deferred: background,
    // Not reached: the last candidate never spills.
    none: { reason: 'no_healthy_replica', message: 'No region could take the request; retry later', retryAfterSeconds: config.retryAfterSeconds },
    prepare: (pool) => prepareDialectPool(c, dialect, body, valid, pool, plan),
  });
}

/**
 * One pool's request of `dialect`: the engine serves this API, the tenant's isolation there
 * (tenant-isolation.ts), the routing key, the prompt blocks a prefix-aware pool needs, and the
 * dialect's own plan (the Responses pin and id). A refusal is answered in the dialect's shape.
 */
async function prepareDialectPool(c: AppContext, dialect: Dialect, body: Record<string, unknown>, valid: ValidRequest, pool: PoolRuntime, plan: DialectPlan | undefined): Promise<PoolRequest | Response> {
  const config = c.get('config');
  const tenant = c.get('tenant');
  if (dialect.keyless && !pool.keylessApis.has(dialect.keyless.api)) {
    return fail(c, 'not_found', `${dialect.path} is not served for the model \`${valid.model.slice(0, 100)}\`: its pool's engine (${pool.engine}) has no ${dialect.keyless.api} API`);
  }
  const iso = await tenantIsolation(c.env, pool, tenant, body, dialect.name);
  if (!iso.ok) return fail(c, iso.reason, iso.message, { param: iso.param });
  // Flow control: the band (tenant record, x-prefix-router-priority), the cost and the tenant's weight.
  const queued = planQueue(pool, tenant, c.req.header(PRIORITY_HEADER), body, dialect.keyless ? { promptTokens: dialect.keyless.promptTokens(body), completionTokens: 0 } : undefined);
  if (!queued.ok) return fail(c, 'invalid_request', queued.message, { param: PRIORITY_HEADER });
  const rawSession = c.req.header(SESSION_HEADER);
  // Control bytes (DEL, C0 but tab) are no session id: refused here, as an origin's HTTP parser
  // would refuse them, now that the value itself never reaches an origin (it goes as its HMAC).
  if (rawSession !== undefined && !FIELD_VALUE.test(rawSession)) return fail(c, 'invalid_request', `Invalid ${SESSION_HEADER} header: control characters are not allowed`, { param: SESSION_HEADER });

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
  const planned = plan?.forPool(pool, body);
  return {
    dialect: planned?.dialect ?? dialect,
    path: dialect.keyless ? dialect.keyless.upstreamPath(pool.engine) : dialect.path,
    body,
    stream: valid.stream,
    pinResponseId: planned?.pinResponseId,
    recordResponseId: planned?.recordResponseId,
    key,
    tenant: { id: tenant.id, maxInFlight: tenant.maxInFlight, keyId: tenant.keyId, sequences: iso.sequences },
    ...(queued.queue ? { queue: queued.queue } : {}),
    cacheSalt: iso.cacheSalt,
    // The client's x-session-id reaches the origin only as this tenant's HMAC of it.
    sessionTag: await sessionTagFor(c.env, tenant.id, sessionOf(rawSession)),
    upstreamRequestId: iso.upstreamRequestId,
    blocks: usesPrefix && blocks ? blocks.subarray(0, pool.prefixMaxBlocks) : undefined,
    earlyConnect: !(plan?.background(body) === true),
    traceBlocks:
      traceBlocks > 0
        ? () => Array.from((blocks ?? blockHashes(prompt(), { maxBlocks: traceBlocks, seed: iso.blockSeed })).subarray(0, traceBlocks), hex32)
        : undefined,
  };
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

/** The session header's value as routing hashes it, or null when absent or blank. */
function sessionOf(v: string | undefined): string | null {
  if (v === undefined) return null;
  const t = sessionHeaderValue(v);
  return t === '' ? null : t;
}
