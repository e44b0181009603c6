// The rig of the stream-continuation tests (test/e2e/continuation*.test.ts, issue #28): mock vLLM
// replicas (deterministic at temperature 0, 2 ms a token) behind the router under Miniflare, a
// request's trace line by its id, and "the same request again with a fault on the replica the
// first one landed on". Only 127.0.0.1; every wait bounded.

import { expect } from 'vitest';

import type { MockFaults, MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, type RouterHandle } from './router.js';

export interface ContinuationRig {
  readonly mocks: MockVllm[];
  readonly router: RouterHandle;
  /** The trace line of the request with this x-request-id, once the router wrote it. */
  trace(requestId: string): Promise<Record<string, unknown>>;
  /**
   * The uninterrupted run (`run()`, which must not fail), then the same run with `faults` on its
   * replica (`homeOf(ref)`, the replica the first run landed on: consistent hashing sends the same
   * session there first), `clear` put back afterwards.
   */
  withFaultOnHome<S extends { error: unknown }>(run: () => Promise<S>, homeOf: (ref: S) => MockVllm | Promise<MockVllm>, faults: Partial<MockFaults>, clear: Partial<MockFaults>): Promise<{ ref: S; got: S; home: MockVllm }>;
  close(): Promise<void>;
}

/** `replicas` mocks and a router with `overrides` / `poolOverrides` over the test defaults. */
export async function startContinuationRig(replicas: number, o: { overrides: Record<string, unknown>; poolOverrides: Record<string, unknown> }): Promise<ContinuationRig> {
  const mocks = await startMocks(replicas, { decodeMsPerToken: 2 });
  const router = await startRouter({ config: routerConfig({ replicas: mocks, overrides: o.overrides, poolOverrides: o.poolOverrides }) });
  return {
    mocks,
    router,
    async trace(requestId) {
      await eventually(() => expect(router.traceLines().some((t) => t.requestId === requestId)).toBe(true), { timeoutMs: 10_000 });
      return router.traceLines().find((t) => t.requestId === requestId)!;
    },
    async withFaultOnHome(run, homeOf, faults, clear) {
      const ref = await run();
      expect(ref.error).toBeNull();
      const home = await homeOf(ref);
      home.setFaults(faults);
      try {
        return { ref, got: await run(), home };
      } finally {
        home.setFaults(clear);
      }
    },
    async close() {
      await router.close();
      await Promise.allSettled(mocks.map((m) => m.close()));
    },
  };
}
