// Wiring only: the Worker's default export and the PoolCoordinator Durable Object class.
import { createApp } from './http/app.js';
import { PoolCoordinatorImpl } from './coordinator/pool-coordinator.js';
import { RouterGuardImpl } from './coordinator/router-guard.js';

export class PoolCoordinator extends PoolCoordinatorImpl {}
export class RouterGuard extends RouterGuardImpl {}

const app = createApp();

export default {
  fetch: (request, env, ctx) => app.fetch(request, env, ctx),
} satisfies ExportedHandler<Env>;
