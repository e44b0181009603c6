// The model list a tenant sees (GET /v1/models, /v1/models/{id}) and the pool a model routes to
// for that tenant. Pure over the parsed config and the tenant record: no I/O.
//
// One entry per model id, however many pools serve it (clients and UIs key on `id`); the pools
// this tenant may use for it ride in the `prefix_router` extension field, the first being the one
// a request without `x-pool` goes to. Pools the tenant may not use are never named, and a model
// only they serve does not exist for this tenant.

import type { PoolRuntime, RouterConfig } from '../config.js';
import { tenantMayUse } from './tenants.js';
import type { TenantRecord } from './tenants.js';

export interface ModelEntry {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
  /** Extension: the pools serving this model that this tenant may use, in routing order. */
  prefix_router: { pools: string[] };
}

/** The pools that serve `model` and that `tenant` may use, in configuration order. */
export function poolsForModel(config: RouterConfig, tenant: TenantRecord, model: string): PoolRuntime[] {
  return config.pools.filter((p) => p.models.includes(model) && tenantMayUse(tenant, p.name));
}

/** Every model the tenant may use, once each, in the order the pools first list them. */
export function listModels(config: RouterConfig, tenant: TenantRecord): ModelEntry[] {
  const byId = new Map<string, ModelEntry>();
  for (const p of config.pools) {
    if (!tenantMayUse(tenant, p.name)) continue;
    for (const id of p.models) {
      const e = byId.get(id);
      if (e) e.prefix_router.pools.push(p.name);
      else byId.set(id, entry(id, p.name));
    }
  }
  return [...byId.values()];
}

/** One model for the tenant, or null when it does not exist for them (unknown, or only in pools they may not use). */
export function findModel(config: RouterConfig, tenant: TenantRecord, id: string): ModelEntry | null {
  const pools = poolsForModel(config, tenant, id);
  if (pools.length === 0) return null;
  const e = entry(id, pools[0]!.name);
  e.prefix_router.pools = pools.map((p) => p.name);
  return e;
}

function entry(id: string, pool: string): ModelEntry {
  return { id, object: 'model', created: 0, owned_by: 'prefix-router', prefix_router: { pools: [pool] } };
}
