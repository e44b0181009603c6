// The data-parallel restart rig of the stale-rank tests (test/e2e/data-parallel*.test.ts): a router
// in front of a mock vLLM with two data-parallel engines, a session the router pinned to engine 1,
// then the server back on the same port with one engine before the router's next scrape. Only
// 127.0.0.1; every wait bounded.

import { expect } from 'vitest';

import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startRouter, TEST_ORIGIN_API_KEY, type RouterHandle } from './router.js';

export interface ShrinkRig {
  /** The mock: two engines until `shrink()`, one after. */
  mock: MockVllm;
  readonly router: RouterHandle;
  /** The pool's one replica as the admin API shows it. */
  replica(): Promise<PoolSnapshot['replicas'][number]>;
  /**
   * The first session `send(session, k)` (k = 0, 1, … up to 40) puts on engine 1, as `rankOf()`
   * reads the rank header the mock last received; fails when none of 40 lands there.
   */
  sessionOnEngine1(send: (session: string, k: number) => Promise<void>, rankOf: () => unknown): Promise<{ session: string; k: number }>;
  /** The server restarts on the same port with one engine; the router still believes in two. */
  shrink(): Promise<void>;
  close(): Promise<void>;
}

/**
 * Starts the rig (`tag` names the mock and the sessions). keepAlive false: the server restarts on
 * the same port, and a socket the router pooled to the old process would fail the first attempt
 * as a connection error with no other replica to retry on (seen in CI), which is not what these
 * tests are about. One scrape and health round when the coordinator starts, then none for a
 * minute: the restart goes unseen.
 */
export async function startShrinkRig(tag: string, o: { overrides?: Record<string, unknown>; poolOverrides?: Record<string, unknown> } = {}): Promise<ShrinkRig> {
  let mock = await startMockVllm({ id: tag, keepAlive: false, port: 0, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], dataParallelSize: 2 });
  const router = await startRouter({
    config: routerConfig({
      replicas: [mock],
      strategy: 'prefix-aware',
      keys: ['header:x-session-id', 'prefix:4096'],
      ...(o.overrides ? { overrides: o.overrides } : {}),
      poolOverrides: { scrapeIntervalMs: 60_000, healthIntervalMs: 60_000, ...o.poolOverrides },
    }),
  });
  const replica = async () => ((await (await router.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot).replicas[0]!;
  await eventually(async () => expect((await replica()).engines).toHaveLength(2), { timeoutMs: 15_000, intervalMs: 100 });
  const rig: ShrinkRig = {
    get mock() {
      return mock;
    },
    router,
    replica,
    async sessionOnEngine1(send, rankOf) {
      for (let k = 0; k < 40; k++) {
        const session = `${tag}-${k}`;
        await send(session, k);
        if (rankOf() === '1') return { session, k };
      }
      throw new Error(`none of 40 sessions of ${tag} was pinned to engine 1`);
    },
    async shrink() {
      const port = mock.port;
      await mock.close();
      mock = await startMockVllm({ id: tag, keepAlive: false, port, apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'] });
      expect(mock.stats().profile).toBe('vllm');
    },
    async close() {
      await router.close();
      await mock.close();
    },
  };
  return rig;
}
