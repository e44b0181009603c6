// The Responses API's routes: POST /v1/responses through the shared dialect request with the
// Responses plan (a follow-up pinned to the replica that stored `previous_response_id`, a new
// response named by the router and recorded with the pick), and the by-id routes (retrieve,
// cancel) through the same request flow, pinned to the replica that stored the id; DELETE is
// answered by the router (vLLM has none).
// I/O: through the request flow (http/request-flow.ts).

import type { Hono } from 'hono';
import type { PoolRuntime } from '../../../config.js';
import { fail, type AppContext, type AppEnv } from '../../context.js';
import { mountDialect, type DialectPlan } from '../../dialect-request.js';
import { runFlow } from '../../request-flow.js';
import { tenantMayUse } from '../../tenants.js';
import { newResponseId, poolTag, poolTagOf, RESPONSE_ID_PARAM, responsesDialect, storedResponseDialect } from './index.js';
import { storeErrorShape } from './store.js';

/**
 * A follow-up is pinned to the pool whose replica stored `previous_response_id` (its pool tag),
 * then to that replica; a new response gets its id from the router (pool-tagged), recorded with
 * the pick when it is stored.
 */
const responsesPlan: DialectPlan = {
  pinnedPool(body, candidates) {
    const tag = typeof body.previous_response_id === 'string' ? poolTagOf(body.previous_response_id) : null;
    return tag === null ? undefined : candidates.find((p) => poolTag(p.name) === tag);
  },
  forPool(pool, body) {
    const id = newResponseId(pool.name);
    const prev = typeof body.previous_response_id === 'string' ? body.previous_response_id : undefined;
    // A follow-up's 404 from its replica is explained (store.ts): the router knew the id.
    const dialect = responsesDialect.forRequest(id);
    return { dialect: prev === undefined ? dialect : { ...dialect, originError: storeErrorShape(prev, 'previous_response_id') }, pinResponseId: prev, recordResponseId: body.store === false ? undefined : id };
  },
  background: (body) => body.background === true,
};

export function responsesRoutes(app: Hono<AppEnv>): void {
  mountDialect(app, responsesDialect, responsesPlan);
  app.get('/v1/responses/:id', (c) => handleResponseById(c, 'GET', ''));
  // vLLM has no DELETE for responses (its router defines none: FastAPI answers 405) and its store
  // has no delete: a stored response stays in the replica's memory until it restarts. The router
  // says so itself instead of forwarding a request no engine it fronts can serve.
  app.delete('/v1/responses/:id', (c) =>
    fail(
      c,
      'method_not_allowed',
      'DELETE /v1/responses/{id} is not supported: vLLM cannot delete a stored response (it stays in the memory of the replica that made it until that replica restarts). ' +
        'Use POST /v1/responses/{id}/cancel to stop a background response, and store: false for responses that should not be kept.',
      { param: 'response_id' },
    ),
  );
  app.all('/v1/responses/:id', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use GET`));
  app.post('/v1/responses/:id/cancel', (c) => handleResponseById(c, 'POST', '/cancel'));
  app.all('/v1/responses/:id/cancel', (c) => fail(c, 'method_not_allowed', `Method ${c.req.method} is not allowed; use POST`));
}

/**
 * GET /v1/responses/{id} (retrieve; `?stream=true` replays a background response's events) and
 * POST /v1/responses/{id}/cancel: pinned to the replica that
 * stored the id for this tenant, in the pool its tag names (or, for an untagged id another engine
 * made, each of the tenant's pools in turn until one knows it). Never another replica.
 */
async function handleResponseById(c: AppContext, method: 'GET' | 'POST', suffix: '' | '/cancel'): Promise<Response> {
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
  return runFlow(c, {
    api: 'responses',
    startedAt,
    pools,
    next: 'response_not_found',
    // A retrieve, poll or cancel names no model and spends no tokens: it counts against the tenant's
    // requests per minute only (a tight polling loop is still a load on the engine).
    admit: { model: '', body: {}, dialect: 'openai', promptTokens: 0, completionTokens: 0 },
    none: { reason: 'response_not_found', message: `Response with id '${id}' not found.` },
    prepare: async () => ({
      // The replica's 404 for an id the router knows: explained (store.ts).
      dialect: { ...storedResponseDialect, originError: storeErrorShape(id, 'response_id') },
      path,
      method,
      body: null,
      stream,
      pinResponseId: id,
      key: { kind: 'none', hash: null },
      tenant: { id: tenant.id, maxInFlight: tenant.maxInFlight, keyId: tenant.keyId },
      earlyConnect: false,
    }),
  });
}
