// Wiring only: the Worker's default export and the PoolCoordinator Durable Object class.
import { DurableObject } from 'cloudflare:workers';

export class PoolCoordinator extends DurableObject<Env> {}

export default {
  async fetch(request: Request): Promise<Response> {
    const url = new URL(request.url);
    if (url.pathname === '/healthz') return Response.json({ status: 'ok' });
    return Response.json({ error: { message: 'Not found', type: 'invalid_request_error', code: 'not_found' } }, { status: 404 });
  },
} satisfies ExportedHandler<Env>;
