// The one request flow of every API route, after the route has read its request and chosen its
// pools: per pool, prepare (the route's own: isolation, routing key, pins) → admit (the tenant's
// quota, once: quota-admission.ts) → forward (proxy/forward.ts, with the same lease client for
// every route) → the answer, or the failure in the route's error shape. The dialect routes
// (dialect-request.ts) and the Responses by-id routes (apis/responses/routes.ts) differ only in
// what they hand in. I/O: through forward() and the admission; one trace line per finished request.

import { hex32 } from '../core/index.js';
import type { PoolRuntime } from '../config.js';
import { formatTraceLine } from '../observability/trace-log.js';
import { LeaseMemory } from '../proxy/early-connect.js';
import { forward, type FinishedRequest, type ForwardFailure, type ForwardInput } from '../proxy/forward.js';
import { fail, leaseClientFor, type AppContext } from './context.js';
import type { ErrorReason } from './errors.js';
import { admitRequest, type Admission, type AdmitInput } from './quota-admission.js';
import { noteKeyRevoked } from './tenants.js';

/** This isolate's recent leases by routing key, for early connect (proxy/early-connect.ts). */
const leaseMemory = new LeaseMemory();

/** What a route sends to one pool: forward()'s particulars. */
export type PoolRequest = Pick<ForwardInput, 'path' | 'method' | 'body' | 'stream' | 'dialect' | 'key' | 'pinResponseId' | 'recordResponseId' | 'tenant' | 'cacheSalt' | 'sessionTag' | 'upstreamRequestId' | 'blocks' | 'queue'> & {
  /** Early connect may be used (when the admission is decided, too). */
  earlyConnect: boolean;
  /** The prompt-block hashes for the trace line, computed when the request is finished. */
  traceBlocks?: () => string[] | undefined;
};

export interface Flow {
  /** The API's name in the trace log and the lease outcomes. */
  api: string;
  /** The model asked for (the trace line); none for a by-id request. */
  model?: string;
  startedAt: number;
  /** The pools to try, in order. */
  pools: readonly PoolRuntime[];
  /**
   * When the next pool is tried: `spill`, when a pool could not take the request before anything
   * went out (regional failover, regions.ts); `response_not_found`, when a pool does not know the
   * response id (by-id routes: the tenant's next pool may).
   */
  next: 'spill' | 'response_not_found';
  /** The tenant's quota admission of this request (asked once, before the first forward). */
  admit: AdmitInput;
  /** A 2xx that comes before the generation (a background response): settled as deferred. */
  deferred?: boolean;
  /** The answer when no pool was tried (none left to try). */
  none: ForwardFailure;
  /** The route's request to `pool`, or the answer that ends the flow (a refusal in its shape). */
  prepare(pool: PoolRuntime): Promise<PoolRequest | Response>;
}

export async function runFlow(c: AppContext, flow: Flow): Promise<Response> {
  const config = c.get('config');
  const tenant = c.get('tenant');
  const requestId = c.get('requestId');
  const { startedAt } = flow;
  let admission: Admission | undefined;
  let failure: ForwardFailure | null = null;
  /** Regional pools this request spilled past, nearest first (trace line). */
  const spilledFrom: string[] = [];
  for (let i = 0; i < flow.pools.length; i++) {
    const pool = flow.pools[i]!;
    const req = await flow.prepare(pool);
    if (req instanceof Response) return req;
    const { earlyConnect, traceBlocks, ...particulars } = req;
    const keyHash = req.key.hash === null ? null : hex32(req.key.hash);
    const traced = { at: startedAt, requestId, api: flow.api, pool: pool.name, tenant: tenant.id, model: flow.model, keyKind: req.key.kind, keyHash };

    // Admit: requests- and tokens-per-minute limits, before anything reaches a replica.
    const q = (admission ??= await admitRequest(c, flow.admit));
    if (q.refused) {
      if (config.traceLog) {
        console.log(formatTraceLine({ ...traced, replica: null, status: 429, error: 'rate_limited', ttftMs: null, durationMs: Date.now() - startedAt, promptTokens: null, cachedTokens: null, completionTokens: null, retried: false, spilled: false, attempts: 0 }));
      }
      return q.refused;
    }

    const result = await forward({
      ...particulars,
      request: c.req.raw,
      waitUntil: (p) => c.executionCtx.waitUntil(p),
      env: c.env,
      config,
      pool,
      coordinator: leaseClientFor(c.env, pool.name),
      kind: flow.api,
      canSpill: flow.next === 'spill' && i < flow.pools.length - 1,
      admitted: q.pendingDecision(),
      requestId,
      startedAt,
      leaseMemory: earlyConnect && q.earlyConnect ? leaseMemory : undefined,
      onFinish: (r: FinishedRequest) => {
        // This pool did not know the id: the next one is asked, and that one's end is the request's.
        if (flow.next === 'response_not_found' && r.error === 'response_not_found') return;
        q.settle(r, { deferred: flow.deferred === true });
        if (!config.traceLog) return;
        console.log(formatTraceLine({ ...traced, ...r, upstreamRequestId: req.upstreamRequestId, ...(spilledFrom.length > 0 ? { spilledFrom } : {}), blocks: traceBlocks?.() }));
      },
    });
    if (result.ok) return q.withHeaders(result.response);
    if (result.spill) {
      spilledFrom.push(pool.name);
      continue;
    }
    failure = result.failure;
    if (flow.next === 'response_not_found' && failure.reason === 'response_not_found') continue;
    break;
  }
  return answerFailure(c, admission, failure ?? flow.none);
}

/** The request's failure in the route's error shape (errors.ts), with its rate-limit headers. */
function answerFailure(c: AppContext, q: Admission | undefined, f: ForwardFailure): Response {
  // The quota decision forward() waited for refused the request: the admission's 429.
  if (f.reason === 'rate_limited') return q?.refused ?? fail(c, 'tenant_limit', f.message, { retryAfterSeconds: c.get('config').retryAfterSeconds });
  if (f.reason === 'key_revoked') {
    noteKeyRevoked(c.get('tenant'));
    return fail(c, 'invalid_api_key', f.message);
  }
  const reason: ErrorReason = f.reason === 'client_closed' ? 'upstream_unavailable' : f.reason;
  const res = fail(c, reason, f.message, { retryAfterSeconds: f.retryAfterSeconds });
  return q ? q.withHeaders(res) : res;
}
