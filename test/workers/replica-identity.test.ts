// A replica removed and added again under the same id is a new replica: streams still running on
// the old one release into nothing, never into the new one's in-flight count or stats.
import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';

describe('replica identity across remove and re-add', () => {
  it('old leases do not touch the re-added replica', async () => {
    const stub = env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`identity-${crypto.randomUUID()}`));
    await runInDurableObject<PoolCoordinator, void>(stub, (i) => {
      const leases: string[] = [];
      for (let k = 0; k < 5; k++) {
        const r = i.acquire({ pool: 'chat', key: k, keyKind: 'header', exclude: ['a', 'c'] });
        if (!r.ok) throw new Error(r.reason);
        expect(r.replica.id).toBe('b');
        leases.push(r.leaseId);
      }
      expect(i.removeReplica('chat', 'b')).toMatchObject({ ok: true, value: { id: 'b', inFlight: 5 } });
      expect(i.upsertReplica('chat', { id: 'b', url: 'https://b2.origin.test', auth: 'bearer:ORIGIN_KEY' }).ok).toBe(true);
      const fresh = i.acquire({ pool: 'chat', key: 99, keyKind: 'header', exclude: ['a', 'c'] });
      if (!fresh.ok) throw new Error(fresh.reason);
      const b = () => i.snapshot('chat')!.replicas.find((r) => r.id === 'b')!;
      expect(b().inFlight).toBe(1);
      for (const l of leases) expect(i.release(l, { status: 200, promptTokens: 100, cachedTokens: 50 })).toEqual({ released: true });
      expect(b().inFlight).toBe(1);
      expect(b().stats.requests).toBe(0);
      expect(i.snapshot('chat')!.leases).toBe(1);
      i.release(fresh.leaseId, { status: 200 });
      expect(b().inFlight).toBe(0);
      expect(b().stats.requests).toBe(1);
    });
  });
});
