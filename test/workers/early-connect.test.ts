// Early connect (src/proxy/early-connect.ts) inside workerd: forward() with a scripted coordinator
// against the fake origin, which records every request it receives. The first attempt of a keyed
// request goes to the key's last replica before the acquire RPC returns; the coordinator's pick
// still decides, and a guess it does not confirm is cancelled before the client sees a byte of it.

import { env } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';
import { loadConfig, type RouterConfig } from '../../src/config';
import type { AcquireRequest, AcquireResult } from '../../src/coordinator/types';
import type { ReleaseOutcome } from '../../src/coordinator/stats';
import { LeaseMemory } from '../../src/proxy/early-connect';
import { forward, type FinishedRequest, type LeaseClient } from '../../src/proxy/forward';
import { LeaseAgent } from '../../src/proxy/lease-agent';
import { FailOpenRouter } from '../../src/proxy/lease-fallback';
import { chatDialect } from '../../src/http/apis';
import { ROUTER_CONFIG } from '../fixtures/workers/test-env';
import { chatBody, complete, originRequests, poolSnapshot, rid, until } from '../helpers/workers';

const AUTH = 'bearer:ORIGIN_KEY';
const replica = (id: string) => ({ id, url: `https://${id}.origin.test`, auth: AUTH });
const granted = (id: string): Extract<AcquireResult, { ok: true }> => ({ ok: true, leaseId: `lease-${id}-${crypto.randomUUID()}`, replica: replica(id), spilled: false, steps: 0, deadline: Date.now() + 60_000 });

/** A coordinator whose acquire first lets `beforeAnswer` look at the world, then answers `answer`. */
class ScriptedCoordinator implements LeaseClient {
  acquires: AcquireRequest[] = [];
  releases: Array<{ leaseId: string; outcome: ReleaseOutcome }> = [];
  constructor(
    public answer: () => AcquireResult | Promise<AcquireResult>,
    public beforeAnswer: () => Promise<void> = async () => {},
  ) {}
  async acquire(req: AcquireRequest): Promise<AcquireResult> {
    this.acquires.push(req);
    await this.beforeAnswer();
    return this.answer();
  }
  async release(leaseId: string, outcome: ReleaseOutcome): Promise<unknown> {
    this.releases.push({ leaseId, outcome });
    return { released: true };
  }
}

interface Run {
  requestId: string;
  finished: FinishedRequest[];
  pending: Promise<unknown>[];
}

function run(opts: { coordinator: LeaseClient; memory: LeaseMemory; keyHash: number | null; tenant?: string; maxInFlight?: number; config?: RouterConfig; pool?: string; signal?: AbortSignal }): Run & { result: ReturnType<typeof forward> } {
  const config = opts.config ?? loadConfig(env.ROUTER_CONFIG);
  const requestId = rid('early');
  const finished: FinishedRequest[] = [];
  const pending: Promise<unknown>[] = [];
  const result = forward({
    request: new Request('https://router.test/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, signal: opts.signal }),
    waitUntil: (p) => pending.push(p),
    env,
    config,
    pool: config.poolByName.get(opts.pool ?? 'chat')!,
    coordinator: opts.coordinator,
    // Each run its own isolate state: a failed acquire's breaker must not leak into the next test.
    leases: new LeaseAgent(),
    failOpenRouter: new FailOpenRouter(),
    kind: 'chat',
    dialect: chatDialect,
    path: '/v1/chat/completions',
    body: chatBody({ stream: true }),
    key: opts.keyHash === null ? { kind: 'none', hash: null } : { kind: 'header', hash: opts.keyHash },
    tenant: { id: opts.tenant ?? 'acme', maxInFlight: opts.maxInFlight },
    requestId,
    startedAt: Date.now(),
    leaseMemory: opts.memory,
    onFinish: (r) => finished.push(r),
  });
  return { requestId, finished, pending, result };
}

/** Read the response to its end and wait for the release and the trace callback. */
async function settle(r: Run & { result: ReturnType<typeof forward> }): Promise<{ status: number; replica: string | null; text: string }> {
  const res = await r.result;
  if (!res.ok) {
    await Promise.all(r.pending);
    return { status: 0, replica: null, text: res.failure.reason };
  }
  const text = await res.response.text();
  await Promise.all(r.pending);
  return { status: res.response.status, replica: res.response.headers.get('x-prefix-router-replica'), text };
}

/** Hosts that received this request id, in arrival order. */
async function hostsFor(requestId: string): Promise<string[]> {
  return (await originRequests({ rid: requestId })).map((e) => e.host);
}

/** Several round trips to the origin's control channel: time enough for a request already sent to land. */
async function roundTrips(n = 3): Promise<void> {
  for (let i = 0; i < n; i++) await originRequests({ rid: 'none' });
}

describe('early connect', () => {
  it('sends a keyed repeat to its last replica before the acquire returns, and counts a hit', async () => {
    const memory = new LeaseMemory();
    const seenAtAcquire: string[][] = [];
    let current = '';
    const coordinator = new ScriptedCoordinator(
      () => granted('ea'),
      async () => {
        await roundTrips();
        seenAtAcquire.push(await hostsFor(current));
      },
    );

    const first = run({ coordinator, memory, keyHash: 101 });
    current = first.requestId;
    const a = await settle(first);
    expect(a).toMatchObject({ status: 200, replica: 'ea' });
    expect(a.text).toContain('data: [DONE]');
    expect(seenAtAcquire[0]).toEqual([]); // nothing remembered yet: the request waited for the pick
    expect(first.finished[0]!.earlyConnect).toBeUndefined();
    expect(coordinator.releases[0]!.outcome.earlyConnect).toBeUndefined();

    const second = run({ coordinator, memory, keyHash: 101 });
    current = second.requestId;
    const b = await settle(second);
    expect(b).toMatchObject({ status: 200, replica: 'ea' });
    expect(b.text).toContain('data: [DONE]');
    expect(seenAtAcquire[1]).toEqual(['ea.origin.test']); // already at the origin while the pick was made
    expect(await hostsFor(second.requestId)).toEqual(['ea.origin.test']); // and sent once only
    expect(second.finished[0]).toMatchObject({ replica: 'ea', status: 200, earlyConnect: 'hit' });
    expect(coordinator.releases[1]!.outcome).toMatchObject({ status: 200, earlyConnect: 'hit', earlyReplica: 'ea' });
  });

  it('cancels a guess the coordinator does not confirm and serves from its pick', async () => {
    const memory = new LeaseMemory();
    // trickle-* hosts stream slowly (fixtures/fake-origin.js), so a cancelled stream is seen as aborted.
    let pick = 'trickle-eb';
    const coordinator = new ScriptedCoordinator(() => granted(pick), () => roundTrips());
    await settle(run({ coordinator, memory, keyHash: 202 }));

    pick = 'trickle-ec'; // the key moved (load bound): the guess is still trickle-eb
    const moved = run({ coordinator, memory, keyHash: 202 });
    // Cancelled, not merely dropped: nobody reads a dropped early stream, so it would stall on
    // backpressure and never be marked aborted; a cancelled one is marked before the client has
    // read a byte of the served answer (not read below until settle), however slow the machine.
    await moved.result;
    const atHeaders = await until(
      () => originRequests({ rid: moved.requestId }),
      (reqs) => reqs[0]?.aborted === true,
      { what: 'the unconfirmed early stream to trickle-eb to be marked aborted before the served answer is read' },
    );
    expect(atHeaders[0]).toMatchObject({ host: 'trickle-eb.origin.test', aborted: true });
    const r = await settle(moved);
    expect(r).toMatchObject({ status: 200, replica: 'trickle-ec' });
    expect(r.text).toContain('data: [DONE]');
    expect(r.text).not.toContain('chatcmpl-trickle-eb'); // not a byte of the cancelled answer
    expect(await hostsFor(moved.requestId)).toEqual(['trickle-eb.origin.test', 'trickle-ec.origin.test']);
    const sent = await until(
      () => originRequests({ rid: moved.requestId }),
      (reqs) => reqs[0]!.aborted === true,
    );
    expect(sent.map((e) => [e.host, e.aborted ?? false])).toEqual([
      ['trickle-eb.origin.test', true],
      ['trickle-ec.origin.test', false],
    ]);
    expect(moved.finished[0]).toMatchObject({ replica: 'trickle-ec', earlyConnect: 'miss', attempts: 1 });
    expect(coordinator.releases.at(-1)!.outcome).toMatchObject({ status: 200, earlyConnect: 'miss', earlyReplica: 'trickle-eb' });
    // The coordinator was told what had gone out early.
    expect(coordinator.acquires.at(-1)!.guess).toEqual(replica('trickle-eb'));
    // The lease went to trickle-ec, so the next request guesses it.
    const next = run({ coordinator, memory, keyHash: 202 });
    await settle(next);
    expect(await hostsFor(next.requestId)).toEqual(['trickle-ec.origin.test']);
    expect(next.finished[0]!.earlyConnect).toBe('hit');
  });

  it('after a miss on a replica the coordinator calls unusable, guesses no other key onto it', async () => {
    const memory = new LeaseMemory();
    let current = '';
    const seen: string[][] = [];
    let answer: AcquireResult = granted('eh');
    const coordinator = new ScriptedCoordinator(
      () => answer,
      async () => {
        await roundTrips();
        seen.push(await hostsFor(current));
      },
    );
    for (const key of [801, 802]) {
      const r = run({ coordinator, memory, keyHash: key });
      current = r.requestId;
      await settle(r);
    }
    // eh is drained: the coordinator leases ei and says the guess is not usable any more.
    answer = { ...granted('ei'), guessUsable: false };
    const drained = run({ coordinator, memory, keyHash: 801 });
    current = drained.requestId;
    await settle(drained);
    expect(drained.finished[0]!.earlyConnect).toBe('miss');
    // Key 802 was last leased on eh too: no guess now, it waits for the pick.
    const other = run({ coordinator, memory, keyHash: 802 });
    current = other.requestId;
    await settle(other);
    expect(seen).toEqual([[], [], ['eh.origin.test'], []]);
    expect(other.finished[0]!.earlyConnect).toBeUndefined();
  });

  it('an unreachable guessed replica the coordinator confirms is retried elsewhere like any failed attempt', async () => {
    const memory = new LeaseMemory();
    const picks = ['refuse-ej', 'ek'];
    const coordinator = new ScriptedCoordinator(() => granted(picks.shift() ?? 'ek'), () => roundTrips());
    const first = run({ coordinator, memory, keyHash: 909 });
    // The first attempt fails to connect and the retry goes to ek; the key is not remembered on refuse-ej.
    expect(await settle(first)).toMatchObject({ status: 200, replica: 'ek' });
    expect(first.finished[0]).toMatchObject({ attempts: 2, retried: true });
    // Remembered now on ek; make refuse-ej the remembered one to exercise the early failure.
    memory.remember('chat', { kind: 'header', hash: 910 }, replica('refuse-ej'), Date.now());
    picks.splice(0, picks.length, 'refuse-ej', 'ek');
    const r = run({ coordinator, memory, keyHash: 910 });
    expect(await settle(r)).toMatchObject({ status: 200, replica: 'ek' });
    expect(r.finished[0]).toMatchObject({ attempts: 2, earlyConnect: 'hit' });
    const outcomes = coordinator.releases.slice(-2).map((x) => x.outcome);
    expect(outcomes[0]).toMatchObject({ status: 0, error: 'connect', earlyConnect: 'hit', earlyReplica: 'refuse-ej' });
    expect(outcomes[1]!.earlyConnect).toBeUndefined();
  });

  it('a client gone while the acquire is in flight: the early request is aborted and the lease released', async () => {
    const memory = new LeaseMemory();
    memory.remember('chat', { kind: 'header', hash: 1001 }, replica('trickle-el'), Date.now());
    const client = new AbortController();
    const coordinator = new ScriptedCoordinator(
      () => granted('trickle-el'),
      async () => {
        await roundTrips();
        client.abort();
      },
    );
    const r = run({ coordinator, memory, keyHash: 1001, signal: client.signal });
    const res = await r.result;
    expect(res.ok).toBe(false);
    await Promise.all(r.pending);
    expect(r.finished[0]).toMatchObject({ status: 499, error: 'client_abort', earlyConnect: 'hit' });
    expect(coordinator.releases).toHaveLength(1);
    expect(coordinator.releases[0]!.outcome).toMatchObject({ error: 'client_abort', earlyConnect: 'hit' });
    const sent = await until(
      () => originRequests({ rid: r.requestId }),
      (reqs) => reqs[0]?.aborted === true,
    );
    expect(sent.map((e) => [e.host, e.aborted ?? false])).toEqual([['trickle-el.origin.test', true]]);
    expect(memory.active('chat', 'acme')).toBe(0);
  });

  it('a burst from a tenant with a cap goes out early at most cap-many at a time per isolate', async () => {
    const memory = new LeaseMemory();
    memory.remember('chat', { kind: 'header', hash: 1101 }, replica('em'), Date.now());
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    const coordinator = new ScriptedCoordinator(() => granted('em'), () => gate);
    const runs = Array.from({ length: 5 }, () => run({ coordinator, memory, keyHash: 1101, tenant: 'capped', maxInFlight: 2 }));
    expect(memory.active('chat', 'capped')).toBe(5);
    await roundTrips(4);
    const early = (await Promise.all(runs.map((x) => hostsFor(x.requestId)))).filter((h) => h.length > 0).length;
    expect(early).toBe(2);
    open();
    for (const x of runs) expect(await settle(x)).toMatchObject({ status: 200, replica: 'em' });
    expect(runs.map((x) => x.finished[0]!.earlyConnect ?? null)).toEqual(['hit', 'hit', null, null, null]);
    expect(memory.active('chat', 'capped')).toBe(0);
  });

  it('does not guess without a key, with earlyConnect off, or for a strategy that ignores keys', async () => {
    const memory = new LeaseMemory();
    let current = '';
    const seen: string[][] = [];
    const coordinator = new ScriptedCoordinator(
      () => granted('ed'),
      async () => {
        await roundTrips();
        seen.push(await hostsFor(current));
      },
    );
    for (let i = 0; i < 2; i++) {
      const r = run({ coordinator, memory, keyHash: null });
      current = r.requestId;
      await settle(r);
      expect(r.finished[0]!.earlyConnect).toBeUndefined();
    }
    const off = loadConfig({ ...ROUTER_CONFIG, earlyConnect: false });
    expect(off.earlyConnect).toBe(false);
    for (let i = 0; i < 2; i++) {
      const r = run({ coordinator, memory, keyHash: 303, config: off });
      current = r.requestId;
      await settle(r);
      expect(r.finished[0]!.earlyConnect).toBeUndefined();
      expect(await hostsFor(r.requestId)).toEqual(['ed.origin.test']);
    }
    // A pool whose strategy ignores keys (least-load) gives no reason to expect the same replica.
    for (let i = 0; i < 2; i++) {
      const r = run({ coordinator, memory, keyHash: 304, pool: 'batch' });
      current = r.requestId;
      await settle(r);
      expect(r.finished[0]!.earlyConnect).toBeUndefined();
    }
    expect(seen).toEqual([[], [], [], [], [], []]);
  });

  it('does not remember a bounded-hash spill: the key\'s next request waits for the pick', async () => {
    const memory = new LeaseMemory();
    let current = '';
    const seen: string[][] = [];
    let answer: AcquireResult = { ...granted('eg'), spilled: true };
    const coordinator = new ScriptedCoordinator(
      () => answer,
      async () => {
        await roundTrips();
        seen.push(await hostsFor(current));
      },
    );
    for (const spilled of [true, false, false]) {
      answer = { ...granted('eg'), spilled };
      const r = run({ coordinator, memory, keyHash: 707 });
      current = r.requestId;
      await settle(r);
    }
    // After the spill nothing was guessed; after the unspilled lease the third went out early.
    expect(seen).toEqual([[], [], ['eg.origin.test']]);
  });

  it('cancels the guess when the tenant is over its cap, then stops guessing for that tenant', async () => {
    const memory = new LeaseMemory();
    let answer: AcquireResult = granted('ee');
    let current = '';
    const seen: string[][] = [];
    const coordinator = new ScriptedCoordinator(
      () => answer,
      async () => {
        await roundTrips();
        seen.push(await hostsFor(current));
      },
    );
    const first = run({ coordinator, memory, keyHash: 404, tenant: 'greedy' });
    current = first.requestId;
    await settle(first);

    answer = { ok: false, reason: 'tenant_limit', retryAfterMs: 1000 };
    const refused = run({ coordinator, memory, keyHash: 404, tenant: 'greedy' });
    current = refused.requestId;
    expect(await settle(refused)).toMatchObject({ status: 0, text: 'tenant_limit' });
    expect(seen[1]).toEqual(['ee.origin.test']); // it had gone out early, and was cancelled
    expect(refused.finished[0]).toMatchObject({ status: 429, error: 'tenant_limit', earlyConnect: 'miss' });

    const again = run({ coordinator, memory, keyHash: 404, tenant: 'greedy' });
    current = again.requestId;
    await settle(again);
    expect(seen[2]).toEqual([]); // no guess while the tenant is cooling down
    expect(again.finished[0]!.earlyConnect).toBeUndefined();
  });

  it('when the acquire RPC fails, the guess is kept and served open (lease protocol v2 fail-open)', async () => {
    const memory = new LeaseMemory();
    let fail = false;
    const coordinator = new ScriptedCoordinator(() => {
      if (fail) throw new Error('Durable Object reset');
      return granted('ef');
    }, () => roundTrips());
    await settle(run({ coordinator, memory, keyHash: 505 }));
    fail = true;
    const broken = run({ coordinator, memory, keyHash: 505 });
    const res = await broken.result;
    // The guess is the key's last replica: the best an isolate without its coordinator can do.
    expect(res.ok).toBe(true);
    await settle(broken);
    expect(broken.finished[0]).toMatchObject({ status: 200, failOpen: true, replica: 'ef' });
    expect(await hostsFor(broken.requestId)).toEqual(['ef.origin.test']);
  });

  it('through the router: a session\'s repeat is an early-connect hit in the coordinator\'s stats', async () => {
    const session = `early-${crypto.randomUUID()}`;
    const ids = [rid('early-router'), rid('early-router'), rid('early-router')];
    const replicas: string[] = [];
    for (const id of ids) {
      const res = await complete(chatBody({ stream: true }), { requestId: id, headers: { 'x-session-id': session } });
      expect(res.status).toBe(200);
      await res.text();
      replicas.push(res.headers.get('x-prefix-router-replica')!);
      // A lease still held when the next request is picked would make it spill past the home
      // replica (the load bound): its release lands after the body, batched; wait for it.
      await until(() => poolSnapshot('chat'), (s) => s.leases === 0, { what: 'the request\'s lease to be released before the next one' });
    }
    expect(new Set(replicas).size).toBe(1);
    for (const id of ids) expect(await originRequests({ rid: id })).toHaveLength(1);
    // Releases land through waitUntil after the body ends, batched (releaseFlushMs): wait for the
    // two repeats' hits (other tests' requests in this pool already count in stats.requests).
    const snap = await until(
      () => poolSnapshot('chat'),
      (s) => (s.replicas.find((r) => r.id === replicas[0])?.stats.earlyConnectHits ?? 0) >= 2,
    );
    const home = snap.replicas.find((r) => r.id === replicas[0])!;
    expect(home.stats.earlyConnectHits).toBeGreaterThanOrEqual(2);
    expect(snap.replicas.reduce((n, r) => n + r.stats.earlyConnectMisses, 0)).toBe(0);
  });
});
