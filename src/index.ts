// Wiring only: the Worker's default export and the Durable Object classes (PoolCoordinator per
// pool, TenantMeter per tenant, the one UsageRegistry).
import { createApp } from './http/app.js';
import { PoolCoordinatorImpl } from './coordinator/pool-coordinator.js';
import { TenantMeterImpl } from './quota/tenant-meter.js';
import { UsageRegistryImpl } from './quota/usage-registry.js';
import { RouterGuardImpl } from './coordinator/router-guard.js';

export class PoolCoordinator extends PoolCoordinatorImpl {}
export class TenantMeter extends TenantMeterImpl {}
export class UsageRegistry extends UsageRegistryImpl {}
export class RouterGuard extends RouterGuardImpl {}

const app = createApp();

export default {
  fetch: (request, env, ctx) => app.fetch(request, env, ctx),
} satisfies ExportedHandler<Env>;
