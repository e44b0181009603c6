// RouterGuard across hibernation (#27 item 5): on the edge an idle Durable Object is hibernated
// after 10 s and its memory discarded (cloudflare-docs durable-objects/concepts/durable-object-lifecycle.mdx);
// Miniflare keeps it alive. Here the object is thrown out between guesses (ctx.abort() inside the
// object, then a fresh stub: the runtime builds a new instance on the same storage), which is what
// a guess spaced more than 10 s after the last one meets in production. The count must survive.

import { abortAllDurableObjects, listDurableObjectIds, runInDurableObject } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import type { RouterGuardImpl } from '../../src/coordinator/router-guard';
import { call } from '../helpers/workers';
import { ADMIN_TOKEN } from '../fixtures/workers/test-env';

type Guard = DurableObjectStub<RouterGuardImpl>;
const guardNamed = (name: string) => env.ROUTER_GUARD.get(env.ROUTER_GUARD.idFromName(name)) as unknown as Guard;

/**
 * Evict every object, as hibernation drops an idle one: the next call constructs it again on the
 * same storage. (`ctx.abort()` from inside works too but logs an uncaught broken-output-gate error
 * per call.) Safe here because no other object lives in this file: an aborted PoolCoordinator
 * alarm once hung the next file (coordinator.test.ts), so the last test checks none was created.
 */
async function evict(): Promise<void> {
  await abortAllDurableObjects();
}

/** An instance marker: undefined on a freshly constructed object. */
const markerOf = (name: string) => runInDurableObject(guardNamed(name), (i: RouterGuardImpl) => (i as unknown as { marker?: number }).marker);
const mark = (name: string, v: number) => runInDurableObject(guardNamed(name), (i: RouterGuardImpl) => void ((i as unknown as { marker?: number }).marker = v));

describe('RouterGuard keeps failed-credential counts in storage', () => {
  it('a client throttled after maxFailures guesses although the object is rebuilt between every guess', async () => {
    const name = 'evict-between-guesses';
    const verdicts: boolean[] = [];
    for (let i = 0; i < 5; i++) {
      await mark(name, i + 1);
      expect(await markerOf(name)).toBe(i + 1);
      const v = await guardNamed(name).admit('admin:198.51.100.7', true, 3, 300_000);
      verdicts.push(v.ok);
      await evict();
      // The eviction took: a new instance (no marker) on the same storage.
      expect(await markerOf(name)).toBeUndefined();
    }
    // Three failures are allowed; the fourth and fifth checks are over the budget.
    expect(verdicts).toEqual([true, true, true, false, false]);
    const right = await guardNamed(name).admit('admin:198.51.100.7', false, 3, 300_000);
    expect(right.ok).toBe(false);
    expect(right.retryAfterMs).toBeGreaterThan(290_000);
    // Another client is not affected.
    expect((await guardNamed(name).admit('admin:198.51.100.8', false, 3, 300_000)).ok).toBe(true);
  });

  it('a window that has passed forgives the client, after an eviction too', async () => {
    const name = 'evict-window';
    for (let i = 0; i < 3; i++) await guardNamed(name).admit('login:203.0.113.1', true, 2, 1_000);
    await evict();
    expect((await guardNamed(name).admit('login:203.0.113.1', false, 2, 1_000)).ok).toBe(false);
    await new Promise((r) => setTimeout(r, 1_100));
    await evict();
    expect((await guardNamed(name).admit('login:203.0.113.1', false, 2, 1_000)).ok).toBe(true);
  });

  it('through the Worker: wrong admin tokens from one address get 429 once over the budget, the global guard evicted after each', async () => {
    const headers = (token: string) => ({ authorization: `Bearer ${token}`, 'cf-connecting-ip': '192.0.2.55' });
    const statuses: number[] = [];
    // authFailureLimit defaults to 20 failures per 300 s window (src/config.ts).
    for (let i = 0; i < 21; i++) {
      const res = await call('/admin/pools/chat', { headers: headers(`wrong-token-${i}-0123456789`) });
      statuses.push(res.status);
      await res.body?.cancel();
      await evict();
    }
    expect(statuses.slice(0, 20).every((s) => s === 401)).toBe(true);
    expect(statuses[20]).toBe(429);
    // Over the budget the right token is refused too, so a slow guesser learns nothing.
    const right = await call('/admin/pools/chat', { headers: headers(ADMIN_TOKEN) });
    expect(right.status).toBe(429);
    expect(Number(right.headers.get('retry-after'))).toBeGreaterThan(0);
    await right.body?.cancel();
    // Refused at the credential check: no pool coordinator (and no alarm of one) was ever started.
    expect(await listDurableObjectIds(env.POOL_COORDINATOR)).toEqual([]);
  });
});
