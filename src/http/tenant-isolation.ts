// What keeps one tenant's request apart from every other tenant's on the way to a shared pool,
// decided once per request after the pool is known: whether the pool can keep this API's prefix
// cache per tenant, the bounds on what it may ask the engine for, how many sequences it counts
// against the tenant's cap, the tenant's cache_salt, the namespaces of its routing keys and
// prompt blocks, and the router's own request id for the engine.
// I/O: WebCrypto (cache-salt.ts). docs/operations.md, "Tenant isolation".

import { namespaceSeed } from '../core/index.js';
import type { PoolRuntime } from '../config.js';
import { exceededBound, sequencesOf } from '../engines/request-fields.js';
import { cacheSaltFor } from './cache-salt.js';
import type { Tenant } from './tenants.js';
import type { ErrorReason } from './errors.js';

export interface Isolation {
  ok: true;
  /** Namespace of client-chosen routing keys (core/keys.ts): the tenant. */
  namespace: string;
  /** Namespace of prefix keys and prompt blocks: the tenant, or one for the pool when it shares prefixes. */
  prefixNamespace: string;
  /** Seed of the prompt-block hashes (core/blocks.ts) from prefixNamespace. */
  blockSeed: number;
  /** Sequences the request runs (n / best_of): what it counts against the tenant's cap. */
  sequences: number;
  cacheSalt: string | null;
  /** Sent upstream as x-request-id and `request_id`: never the client's (vLLM's engine id). */
  upstreamRequestId: string;
}

export type IsolationFailure = { ok: false; reason: ErrorReason; message: string; param?: string };

const seeds = new Map<string, number>();
function seedOf(ns: string): number {
  let s = seeds.get(ns);
  if (s === undefined) {
    if (seeds.size >= 10_000) seeds.clear();
    s = namespaceSeed(ns);
    seeds.set(ns, s);
  }
  return s;
}

export async function tenantIsolation(env: { CACHE_SALT_KEY?: string }, pool: PoolRuntime, tenant: Tenant, body: Record<string, unknown>, api: string): Promise<Isolation | IsolationFailure> {
  const unpartitioned = unpartitionedApiProblem(pool, api);
  if (unpartitioned !== null) return { ok: false, reason: 'pool_not_allowed', message: unpartitioned };
  const over = exceededBound(body, pool);
  if (over) return { ok: false, reason: 'invalid_request', message: over.message, param: over.param };
  const sequences = sequencesOf(body);
  const cap = tenant.maxInFlight ?? pool.maxInFlightPerTenant;
  if (cap !== undefined && sequences > cap) {
    const param = typeof body.best_of === 'number' && body.best_of === sequences ? 'best_of' : 'n';
    return { ok: false, reason: 'invalid_request', message: `Invalid '${param}': this request runs ${sequences} sequences, above this API key's concurrency limit of ${cap}.`, param };
  }
  const salt = await cacheSaltFor(env, pool, tenant.id);
  if (!salt.ok) {
    // The operator's mistake, not the client's: loud in the logs, a 500 without details to the client.
    console.error(JSON.stringify({ type: 'config_error', message: salt.message }));
    return { ok: false, reason: 'misconfigured', message: 'The router is misconfigured; the operator has been told in the logs' };
  }
  const prefixNamespace = pool.cacheSalt === 'shared' ? `shared\u0000${pool.name}` : `tenant\u0000${tenant.id}`;
  return { ok: true, namespace: tenant.id, prefixNamespace, blockSeed: seedOf(prefixNamespace), sequences, cacheSalt: salt.salt, upstreamRequestId: crypto.randomUUID() };
}

/**
 * Why this pool may not serve `api` to a tenant whose prefix cache it partitions, or null: vLLM's
 * Messages endpoint drops `cache_salt` (entrypoints/anthropic: its request model has no such field
 * and the chat request it builds carries none), so the partition would not hold there. A pool
 * opts in with `messagesSharedCache`. count_tokens computes no KV and stays open.
 */
export function unpartitionedApiProblem(pool: Pick<PoolRuntime, 'cacheSalt' | 'engine' | 'messagesSharedCache'>, api: string): string | null {
  if (api !== 'messages' || pool.cacheSalt !== 'tenant' || pool.engine !== 'vllm' || pool.messagesSharedCache) return null;
  return "This model's pool does not serve the Messages API: its engine cannot keep tenants' prefix caches apart on /v1/messages (it ignores cache_salt there). Use /v1/chat/completions, or ask the operator to set messagesSharedCache on the pool.";
}
