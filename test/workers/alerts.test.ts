// Alerts wired into the coordinator: a routing key carrying most of a pool's requests raises a
// hot_key alert naming its kind and hash (never the raw key) on the alarm's evaluation, visible in
// the snapshot and in /metrics; it is logged as one JSON line.

import { env } from 'cloudflare:workers';
import { runDurableObjectAlarm, runInDurableObject } from 'cloudflare:test';
import { describe, expect, it } from 'vitest';
import type { PoolCoordinator } from '../../src/index';
import { hashString, hex32 } from '../../src/core/hash';
import { until } from '../helpers/workers';

type Stub = DurableObjectStub<PoolCoordinator>;
interface Internals {
  state: { alarm: { nextSampleAt: number; nextHealthAt: number; nextScrapeAt: number } };
}

describe('hot-key alert in the coordinator', () => {
  it('one session id on 80% of requests raises hot_key with its hash, not the key', async () => {
    const stub: Stub = env.POOL_COORDINATOR.get(env.POOL_COORDINATOR.idFromName(`alerts-${crypto.randomUUID()}`));
    const hot = 'the-same-session-id-for-every-user';
    const logs: string[] = [];
    // Captured from the start: the alarm also fires by itself (first use schedules one at once),
    // and on a loaded machine that run may be the one that evaluates the alert.
    const original = console.log;
    console.log = (...args: unknown[]) => {
      logs.push(args.map(String).join(' '));
      original(...args);
    };
    try {
      await runInDurableObject<PoolCoordinator, void>(stub, (i) => {
        for (let n = 0; n < 100; n++) {
          const key = n % 5 === 0 ? hashString(`other-${n}`) : hashString(hot);
          const r = i.acquire({ pool: 'chat', key, keyKind: 'header' });
          if (!r.ok) throw new Error(r.reason);
          i.release(r.leaseId, { status: 200 });
        }
        // Only the sample/alert step is due; health and scrape stay quiet.
        const internals = (i as unknown as Internals).state.alarm;
        internals.nextSampleAt = 0;
        internals.nextHealthAt = Date.now() + 3_600_000;
        internals.nextScrapeAt = Date.now() + 3_600_000;
      });
      // Run the alarm (unless a run of its own is under way: then wait for that one's evaluation).
      await runDurableObjectAlarm(stub);
      await until(
        () => runInDurableObject<PoolCoordinator, boolean>(stub, (i) => i.snapshot('chat')!.alerts.some((a) => a.kind === 'hot_key')),
        (raised) => raised,
        { what: 'the alarm to raise hot_key' },
      );
    } finally {
      console.log = original;
    }
    const snap = await runInDurableObject<PoolCoordinator, ReturnType<PoolCoordinator['snapshot']>>(stub, (i) => i.snapshot('chat'));
    const alert = snap!.alerts.find((a) => a.kind === 'hot_key');
    expect(alert).toMatchObject({ kind: 'hot_key', keyKind: 'header', keyHash: hex32(hashString(hot)) });
    expect(JSON.stringify(snap)).not.toContain(hot);
    const line = logs.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.type === 'alert' && l.alert === 'hot_key');
    expect(line).toMatchObject({ event: 'raised', pool: 'chat', keyKind: 'header', keyHash: hex32(hashString(hot)) });
    expect(logs.join('\n')).not.toContain(hot);
  });
});
