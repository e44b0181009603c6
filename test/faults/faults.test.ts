// Fault suite (`npm run test:faults`): the router under Miniflare (workerd, the runtime and
// configuration path of `npm start`; test/helpers/router.ts) in front of four mock vLLM
// replicas on loopback (the mock's faithful `vllm` profile: 200 and headers before queueing and
// prefill, engine failures in-band), ~2,000 streaming requests over multi-turn sessions while: 20% of clients
// abort at random points (fetch AbortController, and raw sockets closed with FIN or RST), every
// replica answers 5% of requests with a 503, r2 is killed a third of the way in and restarted on
// the same port at two thirds, r3 stalls mid-stream for a window, r4 runs 3× slow, and two
// replicas fail after their headers and before their first token for a window each (r4 with an
// in-band error event, r1 sending nothing until firstTokenTimeoutMs): printed as `before first
// token:`, none of them client-visible; streams cut after their first token (r2 killed, r3
// stalling) are continued on another replica (issue #28), printed as `mid-stream:` with the
// continuation gap beside the pool's TTFT. Prints the
// figures (docs/benchmarks.md, "Faults") and checks: no client-visible failure the router could
// have retried away (an origin 500 is passed on, not retried), no lost request, in-flight 0 on every replica and no open mock stream after
// the run drains. FAULTS_REQUESTS sets the size (default 2,000 under `npm run test:faults`, 600
// under plain `npm test`). Then lease protocol v2 (docs/scaling.md), one printed line each:
// `rpcs per request:`, `lost releases:`, `coordinator outage:`, `coordinator restart:`, `region
// failover:`, faults injected through the test entry's hooks (test/fixtures/router-entry, not in the production bundle).
// Every step waits for the state it needs (breaker closed, leases held, restart done, trace lines
// written) by polling the router's own view with a bound (`waitFor`), and fails naming what it
// waited for: no fixed sleeps, so a slow 2-core machine is slower, not red.
// FAULTS_DEBUG=1 prints the router's own log lines (not the trace) at the end.
// I/O: loopback sockets, the workerd process Miniflare spawns.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockStats, type MockVllm, type MockVllmOptions } from '../../tools/mock-engine/index.js';
import { seededRandom } from '../../src/core/random.js';
import { startRouter, type RouterHandle } from '../helpers/router.js';
import { fetchChat, rawChat, type AbortMode, type ChatRequest, type Outcome } from '../helpers/faults-client.js';

const FULL = process.env.npm_lifecycle_event === 'test:faults';
const N = Number(process.env.FAULTS_REQUESTS ?? (FULL ? 2_000 : 600));
const CONCURRENCY = Number(process.env.FAULTS_CONCURRENCY ?? 16);
const MODEL = 'demo-model';
const POOL = 'chat';
const ADMIN_TOKEN = `faults-admin-${Math.random().toString(36).slice(2)}`;
const ORIGIN_API_KEY = `faults-origin-${Math.random().toString(36).slice(2)}`;
const TENANT_KEY = `sk-faults-${Math.random().toString(36).slice(2)}`;
// A tenant with a small requests-per-minute limit: the over-limit burst at the end (tenant quotas).
const CAPPED_KEY = `sk-faults-capped-${Math.random().toString(36).slice(2)}`;
const CAPPED_RPM = 5;
const OVER_LIMIT = Number(process.env.FAULTS_OVER_LIMIT ?? 200);
const MAX_RETRIES = 2;
const ERROR_500_RATE = 0.05;
const REQUEST_TIMEOUT_MS = 30_000;
const FIRST_TOKEN_MS = 3_000;
const SYSTEM = 'You are the fault-suite assistant. Answer briefly and never make things up. '.repeat(20);

const REGION_MODEL = 'region-model';
const MOCK_OPTS: MockVllmOptions = { apiKey: ORIGIN_API_KEY, models: [MODEL, REGION_MODEL], decodeMsPerToken: 5, maxRunning: 32 };
// Lease protocol v2, short enough that the fault run sees reaps and renewals in seconds.
const LEASE_TTL_MS = 3_000;
const RENEW_INTERVAL_MS = 1_000;
// 503s: the router retries only 502/503/504 before the first byte (a 500 is the origin's answer to
// this request, passed on); an overloaded vLLM answers 503.
const mockFaults = (i: number) => ({ error500Rate: ERROR_500_RATE, errorStatus: 503, slowFactor: i === 4 ? 3 : 1 });

let mocks: MockVllm[] = [];
const retired: MockVllm[] = [];
let router: RouterHandle | undefined;

function log(msg: string): void {
  process.stderr.write(`[faults] ${msg}\n`);
}

/** Bound on any wait for a state the next step needs (generous: a loaded 2-core machine is slow, not wrong). */
const WAIT_MS = 30_000;

/**
 * Poll `probe` until `ok` accepts its value; resolves to that value. Past `timeoutMs` it throws,
 * naming `what` it waited for and the last value (or error) seen, so a precondition that never
 * comes fails as itself rather than as a timeout of the next call.
 */
async function waitFor<T>(what: string, probe: () => Promise<T> | T, ok: (v: T) => boolean, timeoutMs = WAIT_MS, intervalMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: string = 'nothing yet';
  for (;;) {
    try {
      const v = await probe();
      if (ok(v)) return v;
      last = JSON.stringify(v)?.slice(0, 500) ?? String(v);
    } catch (e) {
      last = `error: ${(e as Error).message}`;
    }
    if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for ${what}; last seen: ${last}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

interface ReplicaSnap {
  id: string;
  healthy: boolean;
  activeUp: boolean;
  passiveDownUntil: number;
  inFlight: number;
  stats: { requests: number; retries: number; errors: number; clientAborts: number; byStatus: Record<string, number> };
}
interface PoolSnap {
  leases: number;
  expiredLeases: number;
  lease: { epoch: string; startedAt: number; lastRestoredAt: number; rpcs: Record<string, number>; fallbacks: number; restoredLeases: number; droppedReleases?: { id: string; at: number; reapedAt: number | null }[] };
  replicas: ReplicaSnap[];
}

/**
 * fetch, sent once more when the socket it reused was closed by the server under it ("other side
 * closed": an idle keep-alive connection closed by the server can race a new request on it).
 */
async function fetchOnce(url: string, init: RequestInit): Promise<Response> {
  try {
    return await fetch(url, init);
  } catch (e) {
    const code = (e as { cause?: { code?: string } }).cause?.code;
    if (code !== 'UND_ERR_SOCKET' && code !== 'ECONNRESET') throw e;
    return fetch(url, init);
  }
}

async function snapshot(pool = POOL): Promise<PoolSnap> {
  const res = await fetchOnce(`${router!.url}/admin/pools/${pool}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` }, signal: AbortSignal.timeout(15_000) });
  if (res.status !== 200) throw new Error(`admin snapshot: ${res.status}`);
  return (await res.json()) as PoolSnap;
}

type Phase = 'before' | 'kill' | 'after';
interface Done extends Outcome {
  requestId: string;
  session: string;
  abort: AbortMode;
  phase: Phase;
  startedAt: number;
}

beforeAll(async () => {
  for (let i = 1; i <= 4; i++) mocks.push(await startMockVllm({ ...MOCK_OPTS, id: `r${i}`, port: 0, seed: i, faults: mockFaults(i) }));
  const config = {
    maxRetries: MAX_RETRIES,
    // Past it a replica that sent its headers but no first token is retried elsewhere (r1's window).
    firstTokenTimeoutMs: FIRST_TOKEN_MS,
    idleTimeoutMs: 2_000,
    clientStallMs: 1_500,
    maxStreamMs: 60_000,
    traceLog: true,
    replicaHeader: true,
    leaseTtlMs: LEASE_TTL_MS,
    renewIntervalMs: RENEW_INTERVAL_MS,
    releaseFlushMs: 100,
    acquireTimeoutMs: 250,
    coordinatorRetryMs: 500,
    pools: [
      {
        name: POOL,
        models: [MODEL],
        strategy: 'bounded-hash:1.25',
        fallback: 'least-load',
        keys: ['header:x-session-id', 'tenant'],
        healthIntervalMs: 1_000,
        healthTimeoutMs: 500,
        fall: 2,
        rise: 2,
        // 5% of answers are 500s on every replica: with the defaults (3 in 10 s) a busy replica
        // would be out most of the time. 5 in 2 s still takes a dead one out within a few requests.
        maxFails: 5,
        failWindowMs: 2_000,
        failTimeoutMs: 1_000,
        scrapeIntervalMs: 5_000,
        replicas: mocks.map((m) => ({ id: m.id, url: m.url, weight: 1, auth: 'bearer:ORIGIN_API_KEY' })),
      },
      // Cross-region failover: one model in two regions (r1, r2 in weur; r3, r4 in enam).
      ...(['eu', 'us'] as const).map((name, k) => ({
        name,
        models: [REGION_MODEL],
        region: name === 'eu' ? 'weur' : 'enam',
        strategy: 'bounded-hash:1.25',
        keys: ['header:x-session-id'],
        healthIntervalMs: 1_000,
        healthTimeoutMs: 500,
        replicas: mocks.slice(2 * k, 2 * k + 2).map((m) => ({ id: m.id, url: m.url, weight: 1, auth: 'bearer:ORIGIN_API_KEY' })),
      })),
    ],
  };
  const t0 = Date.now();
  router = await startRouter({
    // The test entry: admin test-fault and test-leases, the test cf header (not in the production bundle).
    hooks: true,
    // As a string, the way a `--var` or a dashboard variable arrives (loadConfig parses either).
    config: JSON.stringify(config),
    secrets: {
      ADMIN_TOKEN,
      ORIGIN_API_KEY,
      CACHE_SALT_KEY: `faults-cache-salt-key-${Math.random().toString(36).slice(2)}-0123456789`,
    },
    tenants: [
      { key: TENANT_KEY, tenant: 'acme', keyId: 'faults-acme', pools: ['*'] },
      { key: CAPPED_KEY, tenant: 'capped', keyId: 'faults-capped', pools: ['*'], limits: { requestsPerMinute: CAPPED_RPM, tokensPerMinute: 100_000 } },
    ],
  });
  log(`router (Miniflare) up on ${router.url} in ${Date.now() - t0} ms; mocks ${mocks.map((m) => `${m.id}=${m.port}`).join(' ')}; ${N} requests, ${CONCURRENCY} concurrent sessions`);
}, 90_000);

afterAll(async () => {
  if (process.env.FAULTS_DEBUG) process.stderr.write(router?.output().split('\n').filter((l) => !l.startsWith('{"type":"request"')).slice(-150).join('\n') ?? '');
  await router?.close();
  await Promise.allSettled([...mocks, ...retired].map((m) => m.close()));
}, 30_000);

describe('faults under Miniflare', () => {
  it(`${N} streaming requests through aborts, 5% 500s, a killed replica, a stalling and a slow one`, async () => {
    const base = router!.url;
    const port = router!.port;
    const random = seededRandom(20261129); // seeded: the plan is the same on every run
    const done: Done[] = [];
    let started = 0;
    let phase: Phase = 'before';
    const marks: Record<string, number> = {};

    // ---- health poller: when r2 goes out and comes back -------------------------------------
    let polling = true;
    const r2 = { outAt: 0, activeOutAt: 0, backAt: 0 };
    const poller = (async () => {
      while (polling) {
        try {
          const s = await snapshot();
          const r = s.replicas.find((x) => x.id === 'r2')!;
          const now = Date.now();
          if (marks.kill && !r2.outAt && !r.healthy) r2.outAt = now;
          if (marks.kill && !r2.activeOutAt && !r.activeUp) r2.activeOutAt = now;
          if (marks.restart && !r2.backAt && r.healthy && r.activeUp) r2.backAt = now;
        } catch {
          /* the next poll */
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    })();

    // ---- fault schedule by requests started --------------------------------------------------
    const r2Port = mocks[1]!.port;
    const events: { at: number; run: () => Promise<void> }[] = [
      {
        at: Math.floor(N / 3),
        run: async () => {
          marks.kill = Date.now();
          phase = 'kill';
          const dead = mocks[1]!;
          retired.push(dead);
          await dead.close();
          log(`killed r2 (port ${r2Port}) at request ${started}`);
        },
      },
      {
        at: Math.floor(N * 0.4),
        run: async () => {
          marks.stallOn = Date.now();
          mocks[2]!.setFaults({ stallMidStream: 4 });
          log(`r3 stalls mid-stream from request ${started}`);
        },
      },
      {
        at: Math.floor(N * 0.5),
        run: async () => {
          marks.stallOff = Date.now();
          mocks[2]!.setFaults({ stallMidStream: null });
          log(`r3 stall off at request ${started}`);
        },
      },
      // Failures after the headers and before the first token (vLLM's order): retried elsewhere.
      {
        at: Math.floor(N * 0.15),
        run: async () => {
          marks.inBandOn = Date.now();
          mocks[3]!.setFaults({ inBandErrorAfter: 0 });
          log(`r4 fails in-band before its first token from request ${started}`);
        },
      },
      {
        at: Math.floor(N * 0.2),
        run: async () => {
          // Off only once the window did what it is for (a fast run can pass 5% of N in well under a
          // second): at least one in-band error injected (bounded; named if it never comes).
          await waitFor('r4 to inject an in-band error before a first token', () => mocks[3]!.stats().injectedInBandErrors, (n) => n > 0);
          marks.inBandOff = Date.now();
          mocks[3]!.setFaults({ inBandErrorAfter: null });
          log(`r4 in-band failures off at request ${started}`);
        },
      },
      {
        at: Math.floor((2 * N) / 3),
        run: async () => {
          mocks[1] = await startMockVllm({ ...MOCK_OPTS, id: 'r2', port: r2Port, seed: 22, faults: mockFaults(2) });
          marks.restart = Date.now();
          phase = 'after';
          log(`restarted r2 on port ${r2Port} at request ${started}`);
        },
      },
      {
        at: Math.floor(N * 0.85),
        run: async () => {
          marks.silentOn = Date.now();
          mocks[0]!.setFaults({ stallAfterTokens: 0 });
          log(`r1 sends headers and no token from request ${started}`);
        },
      },
      {
        at: Math.floor(N * 0.9),
        run: async () => {
          // Off only once the router has given up on a silent r1 stream (firstTokenTimeoutMs after its
          // headers), not after a count of requests that a fast run passes before the timeout.
          await waitFor(
            "the router to time out a first token on r1 (its before_first_token line)",
            () => /"type":"before_first_token","message":"request \S+: replica r1 answered \d+, then no first token/.test(router!.output()),
            (seen) => seen,
          );
          marks.silentOff = Date.now();
          mocks[0]!.setFaults({ stallAfterTokens: null });
          log(`r1 silence off at request ${started}`);
        },
      },
    ];
    // Fired in order of `at` (tick() looks only at the first).
    events.sort((a, b) => a.at - b.at);
    let pendingEvent: Promise<void> = Promise.resolve();
    const tick = () => {
      started++;
      while (events.length > 0 && started >= events[0]!.at) {
        const ev = events.shift()!;
        pendingEvent = pendingEvent.then(ev.run);
      }
      if (started % 200 === 0) log(`${started}/${N} started, ${done.length} done`);
    };

    // ---- sessions ------------------------------------------------------------------------------
    let sessionSeq = 0;
    const t0 = Date.now();
    const worker = async () => {
      while (started < N) {
        const session = `s${sessionSeq++}`;
        const turns = 2 + Math.floor(random() * 7);
        const messages: { role: string; content: string }[] = [{ role: 'system', content: SYSTEM }];
        for (let t = 0; t < turns && started < N; t++) {
          messages.push({ role: 'user', content: `${session} turn ${t}: ${'tell me more '.repeat(1 + Math.floor(random() * 20))}` });
          const p = random();
          const abort: AbortMode = p < 0.8 ? 'none' : p < 0.86 ? 'fetch-before-headers' : p < 0.94 ? 'fetch-mid-stream' : p < 0.97 ? 'raw-fin' : 'raw-rst';
          const abortAt = abort === 'fetch-before-headers' ? Math.floor(random() * 60) : 1 + Math.floor(random() * 10);
          const req: ChatRequest = {
            base,
            port,
            apiKey: TENANT_KEY,
            session,
            requestId: `faults-${started}-${session}-${t}`,
            messages: [...messages],
            maxTokens: 24,
            abort,
            abortAt,
            timeoutMs: REQUEST_TIMEOUT_MS,
          };
          const ph = phase;
          const at = Date.now();
          tick();
          const o = abort.startsWith('raw') ? await rawChat(req) : await fetchChat(req);
          done.push({ ...o, requestId: req.requestId, session, abort, phase: ph, startedAt: at });
          messages.push({ role: 'assistant', content: o.reply || 'ok' });
        }
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    await pendingEvent;
    const runMs = Date.now() - t0;
    log(`${done.length} requests in ${(runMs / 1000).toFixed(1)} s; draining`);

    // ---- drain: every lease released, every mock stream closed (bounded) -----------------------
    const drain0 = Date.now();
    const drained = await waitFor(
      'the drain: no lease, no in-flight request, no open mock stream',
      async () => ({ snap: await snapshot(), mockStats: mocks.map((m) => m.stats()) }),
      ({ snap: s, mockStats: ms }) => s.leases === 0 && s.replicas.every((r) => r.inFlight === 0) && ms.every((x) => x.activeStreams === 0 && x.running === 0),
    );
    const snap: PoolSnap = drained.snap;
    const mockStats: MockStats[] = drained.mockStats;
    const drainMs = Date.now() - drain0;
    // r2 comes back by its health checks (rise 2 at 1 s): on a slow machine that can be after the
    // last request; wait for it rather than miss it.
    await waitFor('r2 healthy again after its restart (the poller)', () => r2.backAt, (t) => t > 0);
    polling = false;
    await poller;
    // Every request the router answered writes one trace line as it finishes (aborted ones may
    // still be finishing in the Worker): wait for the lines of the answered ones.
    const answered = done.filter((d) => d.cls !== 'aborted').map((d) => d.requestId);
    await waitFor(
      `a trace line for each of the ${answered.length} answered requests`,
      () => {
        const ids = new Set(router!.traceLines().map((t) => String(t.requestId)));
        return answered.filter((id) => !ids.has(id));
      },
      (missing) => missing.length === 0,
    );

    // ---- figures -------------------------------------------------------------------------------
    const count = (f: (d: Done) => boolean) => done.filter(f).length;
    const sse = done.filter((d) => d.cls === 'sse_error');
    const byClass: Record<string, number> = {};
    for (const d of done) {
      const k = d.cls === 'http' ? `http ${d.status}` : d.cls === 'sse_error' ? `sse_error ${d.errorCode}` : d.cls;
      byClass[k] = (byClass[k] ?? 0) + 1;
    }
    const byPhase = (ph: Phase) => {
      const xs = done.filter((d) => d.phase === ph);
      const bad = xs.filter((d) => d.cls !== 'ok' && d.cls !== 'aborted');
      const kinds = new Map<string, number>();
      for (const d of bad) {
        const k = d.cls === 'http' ? `http ${d.status}` : d.cls === 'sse_error' ? `sse ${d.errorCode}@${d.replica}` : d.cls;
        kinds.set(k, (kinds.get(k) ?? 0) + 1);
      }
      return `${ph}: ${xs.length} requests, ${bad.length} client-visible failures (${[...kinds].map(([k, v]) => `${k} ×${v}`).join(', ') || 'none'})`;
    };
    const trace = router!.traceLines();
    const traceById = new Map(trace.map((t) => [String(t.requestId), t]));
    const retries = snap.replicas.reduce((s, r) => s + r.stats.retries, 0);
    const attemptsHist: Record<string, number> = {};
    for (const t of trace) attemptsHist[String(t.attempts)] = (attemptsHist[String(t.attempts)] ?? 0) + 1;
    const injected = [...retired, ...mocks].reduce((s, m) => s + m.stats().injectedErrors, 0);
    const figures = [
      `requests: ${done.length} (${count((d) => d.abort !== 'none')} planned aborts: ${['fetch-before-headers', 'fetch-mid-stream', 'raw-fin', 'raw-rst'].map((a) => `${a} ${count((d) => d.abort === a)}`).join(', ')}) in ${(runMs / 1000).toFixed(1)} s`,
      `outcomes: ${Object.entries(byClass).sort().map(([k, v]) => `${k} ${v}`).join(', ')}`,
      byPhase('before'),
      byPhase('kill'),
      byPhase('after'),
      `injected 500s (all mocks): ${injected}; retries (coordinator stats): ${retries}; attempts per request (trace): ${Object.entries(attemptsHist).map(([k, v]) => `${k}×${v}`).join(' ')}; expired leases: ${snap.expiredLeases}`,
      `r2 killed → marked out: ${r2.outAt ? r2.outAt - marks.kill! : 'never'} ms (active check down: ${r2.activeOutAt ? r2.activeOutAt - marks.kill! : 'never'} ms); restarted → back in: ${r2.backAt ? r2.backAt - marks.restart! : 'never'} ms`,
      `r3 stall window: ${marks.stallOff! - marks.stallOn!} ms; drain: ${drainMs} ms`,
      `in-flight after drain: ${snap.replicas.map((r) => `${r.id}=${r.inFlight}`).join(' ')}, leases ${snap.leases}; mock activeStreams: ${mockStats.map((s) => `${s.id}=${s.activeStreams}`).join(' ')}, running: ${mockStats.map((s) => `${s.id}=${s.running}`).join(' ')}`,
      `per replica (requests/retries/errors/clientAborts): ${snap.replicas.map((r) => `${r.id} ${r.stats.requests}/${r.stats.retries}/${r.stats.errors}/${r.stats.clientAborts}`).join(', ')}`,
    ];
    // Requests whose replica failed after its headers and before its first token: the router's
    // `before_first_token` log line names each (one per failed attempt), checked against the mocks.
    const beforeFirst = new Map<string, string[]>();
    for (const line of router!.output().split('\n')) {
      const m = /"type":"before_first_token","message":"request (\S+): replica (\S+) answered (\d+), then ([^";]+)/.exec(line);
      if (m) beforeFirst.set(m[1]!, [...(beforeFirst.get(m[1]!) ?? []), `${m[2]} ${m[4]}`]);
    }
    const inBandInjected = [...retired, ...mocks].reduce((s, m) => s + m.stats().injectedInBandErrors, 0);
    const firstAttempts = [...beforeFirst.values()].flat();
    const beforeFirstDone = done.filter((d) => beforeFirst.has(d.requestId));
    // A request can still run out of all its attempts on other failures (a 503 elsewhere, r2 not
    // yet back): the retry budget, the 502 the run allows below, not the commit point failing.
    // (502, or 504 when the last of them ran out of firstTokenTimeoutMs: src/proxy/first-token.ts.)
    const exhausted = (d: Done) => d.cls === 'http' && (d.status === 502 || (d.status === 504 && d.errorCode === 'upstream_timeout')) && traceById.get(d.requestId)?.attempts === MAX_RETRIES + 1;
    const beforeFirstExhausted = beforeFirstDone.filter(exhausted);
    const beforeFirstVisible = beforeFirstDone.filter((d) => d.cls !== 'ok' && d.cls !== 'aborted' && !exhausted(d));
    const kinds = new Map<string, number>();
    for (const a of firstAttempts) kinds.set(a, (kinds.get(a) ?? 0) + 1);
    figures.push(
      `before first token: ${beforeFirst.size} requests whose replica failed after its headers and before its first token, ${beforeFirstVisible.length} client-visible (${beforeFirstExhausted.length} of those requests then ran out of all ${MAX_RETRIES + 1} attempts on other failures: 502 or 504; ${firstAttempts.length} attempts: ${[...kinds].map(([k, v]) => `${k} ×${v}`).join(', ') || 'none'}; in-band errors injected by the mocks: ${inBandInjected}; ${beforeFirstDone.filter((d) => d.cls === 'aborted').length} of those requests aborted by their client later)`,
    );
    // Streams that broke after their first token (r2 killed, r3 stalling, any 503'd continuation):
    // continued on another replica (issue #28), or ended with an SSE error saying why not. The gap
    // is the client's wait across a request's breaks; the TTFT beside it, the pool's, for scale.
    const continuedLog = (router!.output().match(/"type":"continued"/g) ?? []).length;
    const cutTrace = trace.filter((t) => typeof t.continuations === 'number' || typeof t.notContinued === 'string');
    const continuedTrace = trace.filter((t) => typeof t.continuations === 'number');
    const quantile = (xs: number[], q: number) => {
      if (xs.length === 0) return 'n/a';
      const sorted = [...xs].sort((a, b) => a - b);
      return `${Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!)} ms`;
    };
    const gaps = continuedTrace.map((t) => Number(t.continuationGapMs));
    const ttfts = trace.filter((t) => t.status === 200 && typeof t.ttftMs === 'number').map((t) => t.ttftMs as number);
    const notContinued = new Map<string, number>();
    for (const t of cutTrace) if (typeof t.notContinued === 'string') notContinued.set(t.notContinued, (notContinued.get(t.notContinued) ?? 0) + 1);
    figures.push(
      `mid-stream: ${cutTrace.length} streams cut after their first token, ${continuedTrace.length} continued (${continuedLog} continuations), ${sse.length} client-visible errors (not continued: ${[...notContinued].map(([k, v]) => `${k} ×${v}`).join(', ') || 'none'}); continuation gap p50 ${quantile(gaps, 0.5)} / p99 ${quantile(gaps, 0.99)} vs pool TTFT p50 ${quantile(ttfts, 0.5)} / p99 ${quantile(ttfts, 0.99)}`,
    );
    console.info(`\n---- fault suite figures ----\n${figures.join('\n')}\n`);

    // ---- assertions ----------------------------------------------------------------------------
    expect(done.length).toBe(N);
    // Nothing hangs: every request ended within its bound.
    expect(count((d) => d.cls === 'timeout'), 'requests with no outcome within 30 s').toBe(0);
    // Every request the router answered has exactly one trace line (no lost request). Aborted ones
    // may still be finishing in the Worker; give the log a moment.
    const finished = done.filter((d) => d.cls !== 'aborted');
    const untraced = finished.filter((d) => !traceById.has(d.requestId));
    expect(untraced.map((d) => `${d.requestId} ${d.cls} ${d.status}`), 'answered requests without a trace line').toEqual([]);
    // An origin 500 is the origin's answer about that request: passed on as JSON, not retried
    // (issue #15: a retry would let one request count against every replica). About 5% of them.
    const origin500 = done.filter((d) => d.cls === 'http' && d.status === 500);
    // (A 500 may still follow a retried connection error: the dead r2 first, then a 500 elsewhere.)
    expect(origin500.length).toBeLessThanOrEqual(Math.ceil(N * ERROR_500_RATE * 2) + 5);
    // No 503 (no healthy replica), 5xx other than the exhausted-retry 502 (504 when the last
    // attempt timed out waiting for its first token) and the origin's 500s, no 4xx.
    const http = done.filter((d) => d.cls === 'http' && d.status !== 500);
    expect(http.filter((d) => d.status !== 502 && !(d.status === 504 && d.errorCode === 'upstream_timeout')).map((d) => `${d.requestId} ${d.status} ${d.errorCode} after ${traceById.get(d.requestId)?.attempts ?? '?'} attempts`)).toEqual([]);
    // A 502/504 means every attempt failed before the first token: maxRetries + 1 replicas tried
    // (the dead r2, the silent r1, then replicas whose 5xx before the first token is retried); allow 3 in all.
    for (const d of http) expect(traceById.get(d.requestId)?.attempts, `${d.requestId}: ${d.status} after fewer than ${MAX_RETRIES + 1} attempts`).toBe(MAX_RETRIES + 1);
    expect(http.length).toBeLessThanOrEqual(3);
    // Failures after the first byte are SSE error events only from a replica that died or stalled
    // mid-stream (r2 killed, r3 stalling): a cut stream is never passed off as complete. Every
    // answer here is plain text, so such a stream is continued on another replica (issue #28):
    // client-visible only when every continuation try failed too (maxContinuations, default 2:
    // a 503 or another break on each), never for a reason not to try.
    expect(continuedTrace.length, 'no stream cut mid-answer was continued').toBeGreaterThan(0);
    for (const d of sse) {
      const t = traceById.get(d.requestId);
      expect(['max_continuations', 'continuation_failed', 'no_replica'], `${d.requestId}: SSE error without trying to continue (${String(t?.notContinued)})`).toContain(t?.notContinued);
    }
    expect(sse.length, 'client-visible errors after the first token (continuation tries exhausted)').toBeLessThanOrEqual(3);
    for (const d of sse) {
      expect(['r2', 'r3'], `${d.requestId}: SSE error from ${d.replica}`).toContain(d.replica);
      // r2's were streaming when it was killed; r3's started before its stall window closed.
      if (d.replica === 'r2') expect(d.startedAt, `${d.requestId}: r2 cut after the kill`).toBeLessThanOrEqual(marks.kill!);
      if (d.replica === 'r3') expect(d.startedAt, `${d.requestId}: r3 stall outside its window`).toBeLessThan(marks.stallOff!);
    }
    expect(count((d) => d.cls === 'network'), 'streams cut without an error event').toBe(0);
    // The non-aborted requests that saw no replica die or stall under them all succeeded.
    // (before/after the kill window; r3's stalls are visible as sse_error upstream_timeout.)
    // r2 went out while dead and came back after the restart.
    expect(r2.outAt, 'r2 never marked out').toBeGreaterThan(0);
    expect(r2.backAt, 'r2 never came back').toBeGreaterThan(0);
    // Before the first token (vLLM's headers come first): every such failure was retried away.
    expect(beforeFirst.size, 'no request met a failure after the headers and before the first token').toBeGreaterThan(0);
    expect(inBandInjected, "r4's in-band window injected nothing").toBeGreaterThan(0);
    // The router read each injected error unless its client had gone first.
    const inBandSeen = firstAttempts.filter((a) => a.startsWith('r4 an error event')).length;
    expect(inBandSeen, 'in-band errors the router saw').toBeGreaterThan(0);
    expect(inBandSeen, 'in-band errors the router saw').toBeLessThanOrEqual(inBandInjected);
    expect(firstAttempts.some((a) => a.startsWith('r1 no first token')), "r1's silent window cost no attempt").toBe(true);
    expect(beforeFirstVisible.map((d) => `${d.requestId} ${d.cls} ${d.status} ${d.errorCode ?? ''}`), 'client-visible failures after a failure before the first token').toEqual([]);
    // After the drain: no lease, no in-flight, no open stream anywhere.
    expect(snap.replicas.map((r) => r.inFlight)).toEqual([0, 0, 0, 0]);
    expect(snap.leases).toBe(0);
    expect(mockStats.map((s) => s.activeStreams)).toEqual([0, 0, 0, 0]);
    expect(mockStats.map((s) => s.running)).toEqual([0, 0, 0, 0]);
  }, 600_000);
  it(`${OVER_LIMIT} requests from a tenant over its requests-per-minute limit: every one a 429 with the headers, none reaching an origin`, async () => {
    const base = router!.url;
    const send = (i: number) =>
      fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${CAPPED_KEY}`, 'content-type': 'application/json', 'x-request-id': `capped-${i}` },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: `capped ${i}` }], max_tokens: 4 }),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
    // Use up the limit (one of these may draw a mock's 500, passed on to the client: still admitted once).
    for (let i = 0; i < CAPPED_RPM; i++) {
      const res = await send(i);
      await res.text();
      expect([200, 500], `capped-${i}`).toContain(res.status);
    }
    const completions = () => [...retired, ...mocks].reduce((s, m) => s + m.stats().completionRequestsTotal, 0);
    // The admitted ones are done at every mock (no stream open) before the count is taken.
    await waitFor('every mock idle after the admitted requests', () => mocks.map((m) => m.stats()), (ss) => ss.every((x) => x.activeStreams === 0 && x.running === 0));
    const before = completions();
    const t0 = Date.now();
    const answers = await Promise.all(
      Array.from({ length: OVER_LIMIT }, async (_, i) => {
        const res = await send(CAPPED_RPM + i);
        const body = (await res.json()) as { error?: { type?: string; code?: string } };
        const h = (n: string) => res.headers.get(n);
        return { status: res.status, type: body.error?.type, code: body.error?.code, headers: [h('retry-after'), h('retry-after-ms'), h('x-ratelimit-limit-requests'), h('x-ratelimit-remaining-requests'), h('x-ratelimit-reset-requests'), h('x-ratelimit-limit-tokens'), h('x-ratelimit-remaining-tokens'), h('x-ratelimit-reset-tokens')] };
      }),
    );
    const ms = Date.now() - t0;
    const reached = completions() - before;
    const with429 = answers.filter((a) => a.status === 429 && a.type === 'requests' && a.code === 'rate_limit_exceeded');
    const withHeaders = with429.filter((a) => a.headers.every((v) => v !== null) && a.headers[3] === '0' && a.headers[2] === String(CAPPED_RPM));
    const line = `over-limit burst: ${OVER_LIMIT} requests from tenant "capped" (${CAPPED_RPM} requests/min, used up) in ${ms} ms: ${with429.length} × 429 type "requests", ${withHeaders.length} with retry-after, retry-after-ms and all six x-ratelimit-* headers; ${reached} reached an origin`;
    console.info(`\n---- tenant quota ----\n${line}\n`);
    log(line);
    expect(answers.map((a) => a.status)).toEqual(Array(OVER_LIMIT).fill(429));
    expect(withHeaders).toHaveLength(OVER_LIMIT);
    expect(reached).toBe(0);
  }, 120_000);

  // ---- lease protocol v2 (docs/scaling.md): each phase prints one line with its figure --------
  it('lease protocol v2: rpcs per request, lost releases, coordinator outage and restart, region failover', async () => {
    const base = router!.url;
    const port = router!.port;
    // Clean replicas for these phases: the injected 500s and r4's slowness belong to the run above.
    for (const m of mocks) m.setFaults({ error500Rate: 0, slowFactor: 1, stallMidStream: null });
    const lines: string[] = [];
    const say = (line: string) => {
      lines.push(line);
      log(line);
    };
    const admin = async (path: string, json?: unknown) => {
      const res = await fetchOnce(`${base}/admin${path}`, {
        method: json === undefined ? 'GET' : 'POST',
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
        body: json === undefined ? undefined : JSON.stringify(json),
        signal: AbortSignal.timeout(15_000),
      }).catch((e: Error) => {
        throw new Error(`admin ${path}${json === undefined ? '' : ` ${JSON.stringify(json)}`}: no answer (${e.message})`);
      });
      if (res.status !== 200) throw new Error(`admin ${path}: ${res.status} ${await res.text()}`);
      return res.json() as Promise<Record<string, unknown>>;
    };
    const patchReplica = async (pool: string, id: string, draining: boolean) => {
      const res = await fetchOnce(`${base}/admin/pools/${pool}/replicas/${id}`, { method: 'PATCH', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify({ draining }) });
      expect(res.status).toBe(200);
    };
    const rpcTotal = (s: PoolSnap) => ['acquire', 'settle', 'release'].reduce((n, m) => n + (s.lease.rpcs[m] ?? 0), 0);
    /** Every lease of these pools released and no request in flight (throws naming them past the bound). */
    const settled = (pools: string[]) =>
      waitFor(
        `pools ${pools.join(', ')} settled (no lease, nothing in flight)`,
        () => Promise.all(pools.map((p) => snapshot(p))),
        (snaps) => snaps.every((x) => x.leases === 0 && x.replicas.every((r) => r.inFlight === 0)),
      );
    /** Wait until the router has written a trace line for each of these requests. */
    const traced = (ids: Set<string>, what: string) =>
      waitFor(
        `trace lines of the ${ids.size} requests of ${what}`,
        () => ids.size - router!.traceLines().filter((t) => ids.has(String(t.requestId))).length,
        (missing) => missing <= 0,
      );
    const fmt = (m: Record<string, number>) => Object.entries(m).sort().map(([k, v]) => `${k}=${v}`).join(' ');
    let seq = 0;
    /** `count` clean streaming requests, `concurrency` at a time; `onStart(i)` runs as request i starts. */
    const load = async (o: { count: number; concurrency: number; model?: string; geo?: object; onStart?: (i: number) => Promise<void> | void }) => {
      const out: (Outcome & { startedAt: number; requestId: string })[] = [];
      let next = 0;
      const lane = async () => {
        while (next < o.count) {
          const i = next++;
          await o.onStart?.(i);
          const requestId = `v2-${seq++}`;
          const startedAt = Date.now();
          const r = await fetchChat({
            base,
            port,
            apiKey: TENANT_KEY,
            session: `v2s-${i % 24}`,
            requestId,
            messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: `v2 request ${i}` }],
            maxTokens: 16,
            abort: 'none',
            abortAt: 0,
            timeoutMs: REQUEST_TIMEOUT_MS,
            model: o.model,
            extraHeaders: o.geo ? { 'x-prefix-router-test-cf': JSON.stringify(o.geo) } : undefined,
          });
          out.push({ ...r, startedAt, requestId });
        }
      };
      await Promise.all(Array.from({ length: o.concurrency }, lane));
      return out;
    };
    const failures = (xs: Outcome[]) => xs.filter((x) => x.cls !== 'ok');
    /** Median router-measured TTFT (trace ttftMs) of the requests whose trace line passes `f`. */
    const medianTtft = (ids: Set<string>, f: (t: Record<string, unknown>) => boolean) => {
      const xs = router!.traceLines().filter((t) => ids.has(String(t.requestId)) && f(t) && typeof t.ttftMs === 'number').map((t) => t.ttftMs as number).sort((a, b) => a - b);
      return xs.length ? `${xs[Math.floor(xs.length / 2)]} ms` : 'n/a';
    };
    const describeFailures = (xs: Outcome[]) => failures(xs).map((x) => `${x.cls} ${x.status ?? ''} ${x.errorCode ?? ''}`.trim()).join(', ');
    await settled([POOL, 'eu', 'us']);

    // 1. rpcs per request at steady load: coordinator-side RPC entries / client requests.
    const steadyN = Math.max(200, Math.floor(N / 3));
    const before = await snapshot();
    const steady = await load({ count: steadyN, concurrency: CONCURRENCY });
    const afterSteady = (await settled([POOL]))[0]!;
    const d = (m: string) => (afterSteady.lease.rpcs[m] ?? 0) - (before.lease.rpcs[m] ?? 0);
    const rpcs = rpcTotal(afterSteady) - rpcTotal(before);
    const steadyIds = new Set(steady.map((x) => x.requestId));
    const attempts = router!.traceLines().filter((t) => steadyIds.has(String(t.requestId))).reduce((n, t) => n + Number(t.attempts ?? 1), 0);
    const perRequest = rpcs / steadyN;
    say(`rpcs per request: ${perRequest.toFixed(3)} (${rpcs} coordinator RPCs for ${steadyN} requests, ${CONCURRENCY} concurrent: acquire ${d('acquire')}, settle ${d('settle')}, release ${d('release')}; lease v1 sent acquire + release per attempt: ${((2 * attempts) / steadyN).toFixed(2)}) goal ≤ 1.2 ${perRequest <= 1.2 ? 'MET' : 'MISSED'}`);
    expect(failures(steady), describeFailures(steady)).toEqual([]);
    expect(perRequest).toBeLessThanOrEqual(1.2);

    // 2. lost releases: the coordinator drops the next D releases; the leases must be reaped within one TTL.
    const D = 20;
    await admin(`/pools/${POOL}/test-fault`, { dropReleases: D });
    const lost = await load({ count: 2 * D, concurrency: 8 });
    expect(failures(lost), describeFailures(lost)).toEqual([]);
    const dropped = await waitFor(
      `${D} dropped releases, each lease then reaped by expiry`,
      async () => (await snapshot()).lease.droppedReleases ?? [],
      (xs) => xs.length >= D && xs.every((x) => x.reapedAt !== null),
    );
    const longest = Math.max(...dropped.map((x) => (x.reapedAt ?? Infinity) - x.at));
    const afterLost = (await settled([POOL]))[0]!;
    say(`lost releases: ${dropped.length} releases dropped on purpose, ${dropped.filter((x) => x.reapedAt !== null).length} slots free again by lease expiry, the longest ${longest} ms after its lost release (TTL ${LEASE_TTL_MS} ms, renew interval ${RENEW_INTERVAL_MS} ms); in flight after: ${afterLost.replicas.reduce((n, r) => n + r.inFlight, 0)}`);
    expect(dropped).toHaveLength(D);
    expect(longest, 'a lost release held its slot longer than one TTL').toBeLessThanOrEqual(LEASE_TTL_MS + 500);
    expect(afterLost.leases).toBe(0);

    // 3. coordinator outage mid-load: every lease RPC fails for OUTAGE_MS; requests fail open.
    const OUTAGE_MS = 2_500;
    const fallbacksBefore = (await snapshot()).lease.fallbacks;
    let outageAt = 0;
    const outage = await load({
      count: 150,
      concurrency: CONCURRENCY,
      onStart: async (i) => {
        if (i === 30) {
          outageAt = Date.now();
          await admin(`/pools/${POOL}/test-fault`, { outageMs: OUTAGE_MS });
        }
      },
    });
    const outageIds = new Set(outage.map((x) => x.requestId));
    // A trace line is written as the request finishes, a little after the client saw its last byte.
    await traced(outageIds, 'the outage load');
    const open = router!.traceLines().filter((t) => outageIds.has(String(t.requestId)) && t.failOpen === true).length;
    // The isolate reports its fail-open routes once the coordinator is reachable again.
    const reported = await waitFor(
      `the coordinator to count the ${open} fail-open routes once reachable`,
      async () => (await snapshot()).lease.fallbacks - fallbacksBefore,
      (n) => n >= open,
    );
    const during = outage.filter((x) => x.startedAt >= outageAt && x.startedAt < outageAt + OUTAGE_MS).length;
    say(`coordinator outage: unreachable ${OUTAGE_MS} ms mid-load: ${outage.length} requests (${during} started during it), ${failures(outage).length} client-visible failures, ${open} routed open (trace failOpen), ${reported} fallbacks counted by the coordinator once reachable; TTFT p50 open ${medianTtft(outageIds, (t) => t.failOpen === true)} vs leased ${medianTtft(outageIds, (t) => t.failOpen !== true)}`);
    expect(failures(outage), describeFailures(outage)).toEqual([]);
    expect(open).toBeGreaterThan(0);
    expect(reported).toBe(open);
    await settled([POOL]);

    // 4. coordinator restart with streams in flight: renewals rebuild in-flight per replica.
    // First the isolate's breaker from the outage must be closed again, or these would run open
    // (unleased, so there would be nothing to rebuild).
    await waitFor(
      "the isolate's coordinator breaker closed again after the outage",
      async () => (await admin(`/pools/${POOL}/test-leases`)).agent as { open: boolean } | null,
      (agent) => agent !== null && !agent.open,
    );
    const K = 12;
    // Long enough (about 10 s of decode at 5 ms a token) to be in flight through the restart and
    // the rebuild on a slow machine; read as they arrive, so no stream stalls on its client.
    const streams = await Promise.all(
      Array.from({ length: K }, (_, i) =>
        fetchOnce(`${base}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${TENANT_KEY}`, 'content-type': 'application/json', 'x-session-id': `restart-${i}`, 'x-request-id': `v2-restart-${i}` },
          body: JSON.stringify({ model: MODEL, stream: true, max_tokens: 2_000, messages: [{ role: 'user', content: `long answer ${i}` }] }),
          signal: AbortSignal.timeout(2 * REQUEST_TIMEOUT_MS),
        }),
      ),
    );
    const reading = Promise.all(streams.map((r) => r.text()));
    let ended = 0;
    void reading.then(() => (ended = Date.now()), () => (ended = Date.now()));
    const truth: Record<string, number> = {};
    for (const r of streams) {
      const id = r.headers.get('x-prefix-router-replica') ?? '?';
      truth[id] = (truth[id] ?? 0) + 1;
    }
    // Each stream's lease is taken before its headers: the isolate holds all K, leased (not open).
    const held = await waitFor(
      `the isolate holding the leases of the ${K} streams (${fmt(truth)})`,
      async () => (await admin(`/pools/${POOL}/test-leases`)).held as Record<string, number>,
      (h) => fmt(h) === fmt(truth),
    );
    const epochBefore = (await snapshot()).lease.epoch;
    await admin(`/pools/${POOL}/test-fault`, { restart: true });
    const restartAt = Date.now();
    // The restart done (a new epoch), then renewals rebuilding in-flight per replica to the truth.
    const rebuilt = await waitFor(
      `the restarted coordinator (new epoch) to rebuild in-flight ${fmt(truth)} from renewals`,
      async () => {
        const s = await snapshot();
        return { s, seen: Object.fromEntries(s.replicas.filter((r) => r.inFlight > 0).map((r) => [r.id, r.inFlight])) };
      },
      ({ s, seen }) => s.lease.epoch !== epochBefore && fmt(seen) === fmt(truth),
      WAIT_MS,
      50,
    );
    const rebuiltMs = Date.now() - restartAt;
    // On the coordinator's own clock: from the restart to the last lease rebuilt (the poll's
    // round trips on a busy machine are not part of it).
    const coordinatorMs = rebuilt.s.lease.lastRestoredAt - rebuilt.s.lease.startedAt;
    const texts = await reading;
    const complete = texts.filter((t) => t.includes('[DONE]') && !t.includes('"error"')).length;
    say(`coordinator restart: ${K} streams in flight (${fmt(truth)}; the isolate held ${fmt(held)}), in-flight per replica equal to the true count ${coordinatorMs} ms after the restart by the coordinator's clock, seen by the test's poll after ${rebuiltMs} ms (renew interval ${RENEW_INTERVAL_MS} ms, lease TTL ${LEASE_TTL_MS} ms); ${complete}/${K} streams completed`);
    // The rebuild must be seen while the streams were still open (else it proves nothing).
    expect(ended === 0 || ended > restartAt + rebuiltMs, 'the streams ended before the rebuild was seen').toBe(true);
    // The protocol's bound, not a speed figure: a lease must be rebuilt before it would be reaped
    // (one TTL); the printed figure is about one renew interval.
    expect(coordinatorMs, 'in-flight rebuilt later than one lease TTL after the restart').toBeLessThan(LEASE_TTL_MS);
    expect(complete).toBe(K);
    await settled([POOL]);

    // 5. region failover: EU clients; eu's coordinator unreachable, then both eu replicas drained.
    const EU = { continent: 'EU', latitude: '48.86', longitude: '2.35' };
    const windows: { kind: string; from: number; to: number }[] = [];
    const R = 160;
    const region = await load({
      count: R,
      concurrency: 8,
      model: REGION_MODEL,
      geo: EU,
      onStart: async (i) => {
        if (i === Math.floor(R * 0.25)) {
          // The window: from the hook's answer (the outage is on) to 2 s after it was asked for (still on).
          const asked = Date.now();
          await admin('/pools/eu/test-fault', { outageMs: 2_000 });
          windows.push({ kind: 'coordinator unreachable', from: Date.now(), to: asked + 2_000 });
        }
        if (i === Math.floor(R * 0.6)) {
          await patchReplica('eu', 'r1', true);
          await patchReplica('eu', 'r2', true);
          windows.push({ kind: 'both replicas drained', from: Date.now(), to: Infinity });
        }
        if (i === Math.floor(R * 0.8)) {
          windows[windows.length - 1]!.to = Date.now();
          await patchReplica('eu', 'r1', false);
          await patchReplica('eu', 'r2', false);
        }
      },
    });
    const inWindow = (x: { startedAt: number }) => windows.some((w) => x.startedAt >= w.from && x.startedAt < w.to);
    const out = region.filter(inWindow);
    const early = region.slice(0, Math.floor(R * 0.2));
    const servedBy = (xs: Outcome[]) => fmt(xs.reduce<Record<string, number>>((m, x) => ((m[x.replica ?? '?'] = (m[x.replica ?? '?'] ?? 0) + 1), m), {}));
    const outIds = new Set(out.map((x) => x.requestId));
    await traced(outIds, 'the region failover window');
    const spillTraced = router!.traceLines().filter((t) => outIds.has(String(t.requestId)) && JSON.stringify(t.spilledFrom) === '["eu"]' && t.pool === 'us').length;
    say(`region failover: eu taken out (${windows.map((w) => `${w.kind} ${w.to - w.from} ms`).join(', then ')}): ${R} requests from EU, ${out.length} while it was out, served by ${servedBy(out)} (traced pool us, spilledFrom eu: ${spillTraced}); ${failures(region).length} client-visible failures (before the first byte: ${failures(region).filter((x) => x.cls === 'http' || x.cls === 'network').length}); before: ${servedBy(early)}; TTFT p50 spilled ${medianTtft(new Set(out.map((x) => x.requestId)), () => true)} vs in region ${medianTtft(new Set(early.map((x) => x.requestId)), () => true)}`);
    expect(failures(region), describeFailures(region)).toEqual([]);
    expect(out.length).toBeGreaterThan(0);
    for (const x of out) expect(['r3', 'r4'], `${x.requestId} served in eu while it was out`).toContain(x.replica);
    expect(spillTraced).toBe(out.length);
    for (const x of early) expect(['r1', 'r2']).toContain(x.replica);

    // As in the run above: 0 leaked leases after the drain, in every pool these phases used.
    const pools = [POOL, 'eu', 'us'];
    const final = await settled(pools);
    say(`v2 drain: leases ${final.map((x, i) => `${pools[i]}=${x.leases}`).join(' ')}, in flight ${final.flatMap((x) => x.replicas.map((r) => r.inFlight)).reduce((a, b) => a + b, 0)}`);
    console.info(`\n---- lease protocol v2 figures ----\n${lines.join('\n')}\n`);
    for (const x of final) {
      expect(x.leases).toBe(0);
      expect(x.replicas.every((r) => r.inFlight === 0)).toBe(true);
    }
  }, 300_000);
});
