// What every HTTP module shares, below all of them: the Hono env and context types, the pool's
// coordinator stub and lease client, and `fail` (an error in the caller's API shape). app.ts,
// admin.ts, ops.ts and the route modules import it; it imports none of them. I/O: none (stubs only).

import type { Context } from 'hono';
import { loadConfig, type RouterConfig } from '../config.js';
import type { PoolCoordinatorImpl } from '../coordinator/pool-coordinator.js';
import type { AcquireResult, SettleResult } from '../coordinator/types.js';
import type { LeaseClient } from '../proxy/forward.js';
import { errorResponse, type ErrorReason, type ErrorShape } from './errors.js';
import type { Tenant } from './tenants.js';

export type AppEnv = { Bindings: Env; Variables: { requestId: string; config: RouterConfig; tenant: Tenant; errorShape: ErrorShape } };
export type AppContext = Context<AppEnv>;

/**
 * Lease RPCs of one request: a fresh stub per call, since a stub stays broken once its object was
 * reset (a deploy, an eviction under error, a restart), and the renewals that rebuild a restarted
 * coordinator go out through requests that began before it.
 */
export function leaseClientFor(env: Env, pool: string): LeaseClient {
  return {
    // A request with a queue ticket may wait for a slot (flow control): the coordinator's acquireQueued, still its one acquire call.
    acquire: (req) => (req.queue ? coordinatorFor(env, pool).acquireQueued(req) : coordinatorFor(env, pool).acquire(req)) as Promise<AcquireResult>,
    cancelQueued: (name, ticket) => coordinatorFor(env, pool).cancelQueued(name, ticket) as Promise<unknown>,
    release: (id, outcome) => coordinatorFor(env, pool).release(id, outcome) as Promise<unknown>,
    settle: (name, batch) => coordinatorFor(env, pool).settle(name, batch) as Promise<SettleResult>,
  };
}

/** The pool's coordinator: one Durable Object per pool name, placed by the pool's location hint. */
export function coordinatorFor(env: Env, pool: string): DurableObjectStub<PoolCoordinatorImpl> {
  const p = loadConfig(env.ROUTER_CONFIG).poolByName.get(pool);
  // A regional pool's coordinator lives in its region unless a location hint says otherwise.
  const locationHint = p?.locationHint ?? p?.region;
  const id = env.POOL_COORDINATOR.idFromName(pool);
  return (locationHint ? env.POOL_COORDINATOR.get(id, { locationHint }) : env.POOL_COORDINATOR.get(id)) as unknown as DurableObjectStub<PoolCoordinatorImpl>;
}

export function fail(c: AppContext, reason: ErrorReason, message: string, opts: { param?: string; retryAfterSeconds?: number } = {}): Response {
  return errorResponse(reason, message, { ...opts, shape: c.get('errorShape'), headers: { 'x-request-id': c.get('requestId') ?? '' } });
}
