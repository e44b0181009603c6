// The Hono app: request id, configuration, tenant auth and the routes: each API dialect's from its
// folder (apis/<dialect>/routes.ts, through dialect-request.ts and request-flow.ts), the models
// list, admin and ops. Thin handlers over pure helpers; every failure goes through errors.ts.

import { Hono } from 'hono';
import { ConfigError, loadConfig } from '../config.js';
import { errorShapeFor } from './apis/index.js';
import { anthropicRoutes } from './apis/anthropic/routes.js';
import { KEYLESS_ROOT_PATHS, keylessRoutes } from './apis/keyless/routes.js';
import { openAIChatRoutes } from './apis/openai-chat/routes.js';
import { responsesRoutes } from './apis/responses/routes.js';
import { isKeyRevokedHere, lookupTenant } from './tenants.js';
import { cacheSaltProblem } from './cache-salt.js';
import { findModel, listModels } from './models.js';
import { adminRoutes } from './admin.js';
import { withAnswerRateLimitHeaders } from './quota-admission.js';
import { opsRoutes } from './ops.js';
import { fail, type AppContext, type AppEnv } from './context.js';

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

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
    // Rate-limit headers on every answer, also those decided before admission (quota-admission.ts).
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

  // One folder per API dialect (apis/<dialect>/routes.ts), each through the same request flow.
  openAIChatRoutes(app);
  anthropicRoutes(app);
  keylessRoutes(app);
  responsesRoutes(app);

  app.route('/admin', adminRoutes());
  app.route('/', opsRoutes());

  app.notFound((c) => fail(c, 'not_found', `Unknown path ${c.req.method} ${c.req.path.slice(0, 200)}`));
  app.onError((e, c) => {
    console.error(JSON.stringify({ type: 'unhandled_error', requestId: c.get('requestId'), message: e.message }));
    return fail(c, 'internal', 'Internal error in the router');
  });
  return app;
}
