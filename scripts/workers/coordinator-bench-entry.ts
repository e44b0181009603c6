// Worker entry for `npm run bench:coordinator` (bundled by test/helpers/router.ts, never deployed;
// type-checked with the Workers types, as src/ is):
// the real PoolCoordinator plus a Durable Object whose one method does nothing, so a run can set
// the coordinator's acquire + release against the bare cost of a Durable Object RPC in the same
// runtime. GET /?mode=…&n=… makes n sequential calls and answers how many succeeded. I/O: RPCs.

import { DurableObject } from 'cloudflare:workers';
import { PoolCoordinatorImpl } from '../../src/coordinator/pool-coordinator.js';
import type { AcquireRequest } from '../../src/coordinator/types.js';
import { coordinatorFor } from '../../src/http/context.js';

export class PoolCoordinator extends PoolCoordinatorImpl {}

/** The baseline: an RPC with acquire's argument and a result of acquire's shape, and no work. */
export class NoopObject extends DurableObject {
  ping(req: AcquireRequest): { ok: true; leaseId: string; replica: { id: string; url: string; auth: string }; spilled: boolean; steps: number; deadline: number } {
    return { ok: true, leaseId: 'noop', replica: { id: req.pool, url: 'http://127.0.0.1:1', auth: 'bearer:X' }, spilled: false, steps: 0, deadline: 0 };
  }
}

/** Mirrors BenchMode in scripts/bench-coordinator.ts (a Node script cannot import this module's types). */
type BenchMode = 'noop' | 'pair' | 'pair-held' | 'prefix-pair';

/** Golden-ratio spread of session numbers over 32 bits (the router hashes real keys). */
const keyOf = (i: number) => Math.imul(i % 256, 0x9e3779b1) >>> 0;

/** 32 chained block hashes per session: a prompt of about 2,000 tokens, shared by 8 sessions' turns. */
function blocksOf(i: number): Uint32Array {
  const b = new Uint32Array(32);
  let h = (i % 8) + 1;
  for (let j = 0; j < b.length; j++) b[j] = h = Math.imul(h ^ (j + 1), 0x85ebca6b) >>> 0;
  return b;
}

export default {
  async fetch(request: Request, env: Env & { NOOP: DurableObjectNamespace<NoopObject> }): Promise<Response> {
    const url = new URL(request.url);
    const mode = url.searchParams.get('mode') as BenchMode;
    const n = Math.min(100_000, Number(url.searchParams.get('n') ?? 1000));
    const held = mode === 'pair-held' ? 64 : 0;
    const pool = mode === 'prefix-pair' ? 'prefix' : 'chat';
    const request0 = (i: number): AcquireRequest => ({ pool, key: keyOf(i), keyKind: 'header', exclude: [], tenant: 'acme', ...(mode === 'prefix-pair' ? { blocks: blocksOf(i) } : {}) });
    if (mode === 'noop') {
      const stub = env.NOOP.get(env.NOOP.idFromName('noop'));
      let ok = 0;
      for (let i = 0; i < n; i++) if ((await stub.ping(request0(i))).ok) ok++;
      return Response.json({ ok });
    }
    const coordinator = coordinatorFor(env, pool);
    const holding: string[] = [];
    for (let i = 0; i < held; i++) {
      const a = await coordinator.acquire(request0(100_000 + i));
      if (a.ok) holding.push(a.leaseId);
    }
    let ok = 0;
    for (let i = 0; i < n; i++) {
      const a = await coordinator.acquire(request0(i));
      if (!a.ok) continue;
      await coordinator.release(a.leaseId, { status: 200, ttftMs: 12, durationMs: 900, promptTokens: 2048, cachedTokens: 1536, completionTokens: 128 });
      ok++;
    }
    for (const id of holding) await coordinator.release(id, { status: 200 });
    return Response.json({ ok, held: holding.length });
  },
};
