// Review of #17's kept pick state (src/coordinator/pick-state.ts) against a hostile origin: an
// `inflight+waiting` pool reads each replica's queue from its /metrics. A negative queue must not
// make that replica look emptier than idle (it would take every request), and a huge one must
// not break the running Σ in-flight the pick keeps (1e20 + 5 − 1e20 is 0 in floating point: the
// load bound would drift until the next rebuild).

import { env } from 'cloudflare:workers';
import { runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import type { AcquireResult } from '../../src/coordinator/types';
import type { ReplicaView } from '../../src/core/index';
import type { RunningTotals } from '../../src/core/strategies/load-bound';
import { loadConfig } from '../../src/config';
import { withOriginFetch } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
const freshStub = (): Stub => env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`waiting-${crypto.randomUUID()}`));
const pool = () => loadConfig(env.ROUTER_CONFIG).poolByName.get('queued')!;
const vllm = (waiting: string) => `vllm:num_requests_waiting{model_name="queued-model"} ${waiting}\nvllm:num_requests_running{model_name="queued-model"} 0\n`;

const scrape = (i: PoolCoordinator, body: (host: string) => string): Promise<void> => withOriginFetch((u) => new Response(body(u.hostname)), () => i.scrapeMetrics(pool()));

function ok(r: AcquireResult): Extract<AcquireResult, { ok: true }> {
  if (!r.ok) throw new Error(`acquire failed: ${r.reason}`);
  return r;
}

const take = (i: PoolCoordinator) => ok(i.acquire({ pool: 'queued', key: null, keyKind: 'none' }));
const kept = (i: PoolCoordinator) => {
  const s = (i as unknown as { state: { pickState: { totals: RunningTotals; views: ReplicaView[] } } }).state.pickState;
  return { used: s.totals.used, sum: s.views.reduce((n, v) => n + v.inFlight, 0), views: s.views };
};

describe('a hostile origin\'s queue length in an inflight+waiting pool', () => {
  it('a negative queue counts as none: that replica does not take every request', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), async (i) => {
      i.snapshot('queued');
      await scrape(i, (h) => vllm(h.startsWith('q1') ? '-1000000' : '0'));
      const got = new Map<string, number>();
      for (let k = 0; k < 20; k++) {
        const l = take(i);
        got.set(l.replica.id, (got.get(l.replica.id) ?? 0) + 1);
      }
      expect(got.get('q1')).toBe(10);
      expect(got.get('q2')).toBe(10);
    });
  });

  it('a huge or fractional queue keeps the running Σ in-flight exact', async () => {
    await runInDurableObject<PoolCoordinator, void>(freshStub(), async (i) => {
      i.snapshot('queued');
      const leases = Array.from({ length: 5 }, () => take(i));
      for (const w of ['1e20', '0.1', '1.7e308', '3.5', '0']) {
        await scrape(i, (h) => vllm(h.startsWith('q1') ? w : '2'));
        take(i); // the pick reads the kept views
        const k = kept(i);
        expect(k.used, `after waiting ${w}`).toBe(k.sum);
        expect(k.views.every((v) => Number.isSafeInteger(v.inFlight) && v.inFlight >= 0), `after waiting ${w}`).toBe(true);
      }
      for (const l of leases) i.release(l.leaseId, { status: 200 });
    });
  });
});
