// A by-id Responses request (GET /v1/responses/{id}) takes its lease through the same lease client
// as every dialect (http/context.ts leaseClientFor: a fresh coordinator stub per call), not a bare
// stub held for the whole request. A stub stays broken once its object was reset (a deploy, an
// eviction, a restart), so a by-id request whose coordinator restarted after its acquire could not
// deliver its release, renewals or fallback report through a held stub: the release retried the
// broken stub until the lease's TTL, and while its flush loop ran no other request of the isolate
// started one for that pool. Here every stub made before the "reset" (right after the acquire)
// fails, as a reset one does; stubs made after it work.

import { env } from 'cloudflare:workers';
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinatorImpl } from '../../src/coordinator/pool-coordinator';
import type { AcquireRequest } from '../../src/coordinator/types';
import { newResponseId } from '../../src/http/apis';
import { createApp } from '../../src/http/app';
import { KEYS, ROUTER } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinatorImpl>;
const real = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName('chat')) as unknown as Stub;

/** POOL_COORDINATOR whose stubs break when `reset()` is called, like stubs of a reset object. */
function resettableNamespace() {
  let generation = 0;
  let acquires = 0;
  const ns = env.POOL_COORDINATOR;
  const wrapped = {
    idFromName: (name: string) => ns.idFromName(name),
    get(id: DurableObjectId, opts?: DurableObjectNamespaceGetDurableObjectOptions) {
      const stub = ns.get(id, opts) as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>;
      const born = generation;
      return new Proxy(stub, {
        get(target, prop) {
          if (typeof prop !== 'string' || prop === 'then') return undefined;
          return async (...args: unknown[]) => {
            if (born < generation) throw new Error('Durable Object reset: this stub is broken; create a new one');
            const out = await target[prop]!(...args);
            // The object is reset just after it answered the by-id request's acquire.
            if (prop === 'acquire' && (args[0] as AcquireRequest).pin) {
              acquires++;
              generation++;
            }
            return out;
          };
        },
      });
    },
  };
  return { ns: wrapped as unknown as DurableObjectNamespace, acquires: () => acquires };
}

describe('GET /v1/responses/{id}: the lease is released through a fresh stub after a coordinator reset', () => {
  it('the release reaches the coordinator within the flush interval, not after the lease TTL', async () => {
    const id = newResponseId('chat');
    // The coordinator knows the id: stored on a replica of pool "chat" by an earlier request.
    const stored = await real().acquire({ pool: 'chat', key: null, keyKind: 'none', tenant: 'acme', viewVersion: '', record: { responseId: id } });
    expect(stored.ok).toBe(true);
    if (!stored.ok) return;
    await real().release(stored.leaseId, { status: 200 });
    const before = (await real().snapshot('chat'))!.leases;

    const rs = resettableNamespace();
    const ctx = createExecutionContext();
    const res = await createApp().fetch(new Request(`${ROUTER}/v1/responses/${id}`, { headers: { authorization: `Bearer ${KEYS.acme}` } }), { ...env, POOL_COORDINATOR: rs.ns }, ctx);
    await res.text();
    // Pinned to the replica that stored it (the fake origin has no Responses API: its 404 is passed on).
    expect(res.headers.get('x-prefix-router-replica')).toBe(stored.replica.id);
    expect(rs.acquires()).toBe(1);

    // The lease must be gone from the coordinator well before its TTL (30 s).
    let leases = -1;
    for (let i = 0; i < 40; i++) {
      leases = (await real().snapshot('chat'))!.leases;
      if (leases === before) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(leases).toBe(before);
    await waitOnExecutionContext(ctx);
  });
});
