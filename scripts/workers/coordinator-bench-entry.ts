// Worker entry for `npm run bench:coordinator` (bundled by test/helpers/router.ts, never deployed;
// type-checked with the Workers types, as src/ is):
// the real PoolCoordinator plus a Durable Object whose one method does nothing, so a run can set
// the coordinator's acquire + release against the bare cost of a Durable Object RPC in the same
// runtime. GET /?mode=…&n=… makes n sequential calls (an in-object mode: one RPC in which the
// object makes n pairs itself) and answers how many succeeded; `&base=1` sends them to
// BASELINE_COORDINATOR instead (another commit's PoolCoordinator, bound only in the script's
// before/after mode, which builds an entry exporting it next to this one's). I/O: RPCs.

import { DurableObject } from 'cloudflare:workers';
import { PoolCoordinatorImpl } from '../../src/coordinator/pool-coordinator.js';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types.js';
import type { ReleaseOutcome } from '../../src/coordinator/stats.js';

/** Mirrors BenchMode in scripts/bench-coordinator.ts (a Node script cannot import this module's types). */
type BenchMode = 'noop' | 'pair' | 'pair-held' | 'prefix-pair' | 'wide-pair' | 'loop' | 'wide-loop';

/** Per mode: the pool, the leases held during the run, prompt blocks, and whether the object loops itself. */
const SPEC: Record<Exclude<BenchMode, 'noop'>, { pool: string; held: number; prefix: boolean; inObject: boolean }> = {
  pair: { pool: 'chat', held: 0, prefix: false, inObject: false },
  'pair-held': { pool: 'chat', held: 64, prefix: false, inObject: false },
  'prefix-pair': { pool: 'prefix', held: 0, prefix: true, inObject: false },
  'wide-pair': { pool: 'wide', held: 128, prefix: false, inObject: false },
  loop: { pool: 'chat', held: 0, prefix: false, inObject: true },
  'wide-loop': { pool: 'wide', held: 128, prefix: false, inObject: true },
};

/** What both ends of a pair need: the real object (in-object) or its stub (RPC). */
interface Leases {
  acquire(req: AcquireRequest): AcquireResult | Promise<AcquireResult>;
  release(leaseId: string, outcome: ReleaseOutcome): unknown;
}

const OUTCOME: ReleaseOutcome = { status: 200, ttftMs: 12, durationMs: 900, promptTokens: 2048, cachedTokens: 1536, completionTokens: 128 };

/** Golden-ratio spread of session numbers over 32 bits (the router hashes real keys). */
const keyOf = (i: number) => Math.imul(i % 256, 0x9e3779b1) >>> 0;

/** 32 chained block hashes per session: a prompt of about 2,000 tokens, shared by 8 sessions' turns. */
function blocksOf(i: number): Uint32Array {
  const b = new Uint32Array(32);
  let h = (i % 8) + 1;
  for (let j = 0; j < b.length; j++) b[j] = h = Math.imul(h ^ (j + 1), 0x85ebca6b) >>> 0;
  return b;
}

const requestOf = (mode: Exclude<BenchMode, 'noop'>, i: number): AcquireRequest => ({ pool: SPEC[mode].pool, key: keyOf(i), keyKind: 'header', exclude: [], tenant: 'acme', ...(SPEC[mode].prefix ? { blocks: blocksOf(i) } : {}) });

/** n pairs with the mode's leases held meanwhile; the count that succeeded. Awaits only what is a promise. */
async function runPairs(c: Leases, mode: Exclude<BenchMode, 'noop'>, n: number): Promise<{ ok: number; held: number }> {
  const holding: string[] = [];
  for (let i = 0; i < SPEC[mode].held; i++) {
    const a = await c.acquire(requestOf(mode, 100_000 + i));
    if (a.ok) holding.push(a.leaseId);
  }
  let ok = 0;
  for (let i = 0; i < n; i++) {
    const a = await c.acquire(requestOf(mode, i));
    if (!a.ok) continue;
    await c.release(a.leaseId, OUTCOME);
    ok++;
  }
  for (const id of holding) await c.release(id, { status: 200 });
  return { ok, held: holding.length };
}

/** The same inside the object, with no await between calls (what the pair costs the object itself). */
export function loopInObject(c: { acquire(req: AcquireRequest): AcquireResult; release(leaseId: string, outcome: ReleaseOutcome): unknown }, mode: string, n: number): { ok: number; held: number } {
  const m = mode as Exclude<BenchMode, 'noop'>;
  if (!(m in SPEC) || !SPEC[m].inObject) throw new Error(`not an in-object mode: ${mode}`);
  const holding: string[] = [];
  for (let i = 0; i < SPEC[m].held; i++) {
    const a = c.acquire(requestOf(m, 100_000 + i));
    if (a.ok) holding.push(a.leaseId);
  }
  let ok = 0;
  for (let i = 0; i < n; i++) {
    const a = c.acquire(requestOf(m, i));
    if (!a.ok) continue;
    c.release(a.leaseId, OUTCOME);
    ok++;
  }
  for (const id of holding) c.release(id, { status: 200 });
  return { ok, held: holding.length };
}

export class PoolCoordinator extends PoolCoordinatorImpl {
  benchLoop(mode: string, n: number): { ok: number; held: number } {
    return loopInObject(this, mode, n);
  }
}

/** The baseline: an RPC with acquire's argument and a result of acquire's shape, and no work. */
export class NoopObject extends DurableObject {
  ping(req: AcquireRequest): { ok: true; leaseId: string; replica: { id: string; url: string; auth: string }; spilled: boolean; steps: number; deadline: number } {
    return { ok: true, leaseId: 'noop', replica: { id: req.pool, url: 'http://127.0.0.1:1', auth: 'bearer:X' }, spilled: false, steps: 0, deadline: 0 };
  }
}

type BenchEnv = Env & { NOOP: DurableObjectNamespace<NoopObject>; BASELINE_COORDINATOR?: DurableObjectNamespace<PoolCoordinator> };

export default {
  async fetch(request: Request, env: BenchEnv): Promise<Response> {
    const url = new URL(request.url);
    const mode = url.searchParams.get('mode') as BenchMode;
    const n = Math.min(2_000_000, Number(url.searchParams.get('n') ?? 1000));
    if (mode === 'noop') {
      const stub = env.NOOP.get(env.NOOP.idFromName('noop'));
      let ok = 0;
      for (let i = 0; i < n; i++) if ((await stub.ping(requestOf('pair', i))).ok) ok++;
      return Response.json({ ok });
    }
    if (!(mode in SPEC)) return Response.json({ error: `unknown mode ${mode}` }, { status: 400 });
    const ns = url.searchParams.get('base') === '1' ? env.BASELINE_COORDINATOR : (env.POOL_COORDINATOR as unknown as DurableObjectNamespace<PoolCoordinator>);
    if (ns === undefined) return Response.json({ error: 'no BASELINE_COORDINATOR bound (before/after mode only)' }, { status: 400 });
    const stub = ns.get(ns.idFromName(SPEC[mode].pool));
    if (SPEC[mode].inObject) return Response.json(await stub.benchLoop(mode, n));
    return Response.json(await runPairs(stub as unknown as Leases, mode, n));
  },
};
