// `npm run simulate -- --trace <file> [options]`: replay a trace through each routing strategy
// against modelled vLLM replicas and compare hit rate, TTFT and throughput. I/O: reads the
// trace and profile, writes the table (stdout), progress (stderr) and the optional report.
// The model and its defaults: docs/simulator.md.

import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { parseScaleEvent, simulate, type ScaleEvent, type SimResult } from './engine.js';
import { flowTable, mergeTenants, parseTenantList, tenantTable, type FlowControlOptions } from './flow-control.js';
import { scaleTable, strategyTable, sweepTable, type SweepPoint } from './format.js';
import { DEFAULT_PROFILE, loadProfile } from './profile.js';
import { renderReport } from './report.js';
import { computeBound, computeCacheBound, defaultKeySpec, keyCoverage, loadTrace, parseKeySpec, routingKey } from './trace.js';
import { progress as progressLine } from '../scripts/lib/progress.js';

const DEFAULT_STRATEGIES = 'round-robin,least-load,hash,bounded-hash:1.25,bounded-hash:1.5,prefix-aware';

const USAGE = `usage: npm run simulate -- --trace <file> [options]
  --replicas N            replicas (default 8)
  --strategies LIST       strategy specs (default round-robin,least-load,hash,bounded-hash:1.25,
                          bounded-hash:1.5,prefix-aware); SPEC@KEY routes that row by its own key
                          source, e.g. bounded-hash:1.25@tenant
  --key SOURCE            session | tenant | prefix:<N>blocks | prefix:<N>tokens | auto | none
                          (default: session when the trace has sessions, else prefix:2blocks;
                          auto = session, else tenant, else prefix:1024tokens)
  --fallback SPEC         strategy for keyless requests (default least-load)
  --shards S              split the coordinator into S key-range shards, each placing by its
                          own in-flight view (default 1; docs/scaling.md)
  --isolates N            Worker isolates the early-connect figures spread requests over
                          (default 1; routing is not affected)
  --time-scale K          divide arrival times by K to raise the load (default 1)
  --seed S                random seed (default 1)
  --limit N               replay only the first N requests
  --profile FILE          replica model parameters (JSON; see docs/simulator.md)
  --sweep-factor LIST     bounded-hash balance factors to sweep, e.g. 1.05,1.25,1.5,2,inf
  --scale-event EV        add@600s or remove@600s (virtual time, after --time-scale)
  --scale-window T        window before/after the scale event (default 300s)
  --flow-control N        also run each strategy with the router's edge queue (issue #29): at most
                          N requests in flight per replica (maxInFlightPerReplica), the rest wait
                          at the edge in fair shares and priority bands; prints both runs side by
                          side (TTFT, edge wait p50/p99, refusals) and per-tenant shares
  --fairness UNIT         tokens (prompt + output, default) | requests: what a request costs its
                          tenant's share
  --share-reserve N       free slots kept for tenants below their fair share (the pool's
                          flowControl.shareReserve; default 0: work-conserving)
  --preempt               take a slot back before its first token from a tenant over its share
                          for one below its share (the pool's flowControl.preempt)
  --preempt-streams       and from a stream past it, paused and continued later (the pool's
                          flowControl.preemptStreams; implies --preempt)
  --weights LIST          tenant fair-share weights, e.g. acme=3,globex=1 (default 1 each)
  --bands LIST            tenant priority bands, e.g. acme=high,batch=low (bands high, normal,
                          low; default normal)
  --report FILE           write a self-contained HTML report
  --json                  print JSON instead of tables
  --no-progress           no progress bar on stderr`;

function fail(msg: string): never {
  process.stderr.write(`simulate: ${msg}\n\n${USAGE}\n`);
  process.exit(2);
}

function positive(name: string, v: string | undefined, fallback: number, integer = false): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) fail(`--${name} must be a positive ${integer ? 'integer' : 'number'}, got "${v}"`);
  return n;
}

function parseDurationMs(v: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(v.trim());
  if (!m) fail(`bad duration "${v}" (e.g. 300s)`);
  const x = Number(m[1]);
  return m[2] === 'ms' ? x : m[2] === 'm' ? x * 60_000 : x * 1000;
}

function main(): void {
  let args;
  try {
    args = parseArgs({
      options: {
        trace: { type: 'string' },
        replicas: { type: 'string' },
        strategies: { type: 'string' },
        key: { type: 'string' },
        fallback: { type: 'string' },
        shards: { type: 'string' },
        isolates: { type: 'string' },
        'time-scale': { type: 'string' },
        seed: { type: 'string' },
        limit: { type: 'string' },
        profile: { type: 'string' },
        'sweep-factor': { type: 'string' },
        'scale-event': { type: 'string' },
        'scale-window': { type: 'string' },
        report: { type: 'string' },
        'flow-control': { type: 'string' },
        'share-reserve': { type: 'string' },
        preempt: { type: 'boolean', default: false },
        'preempt-streams': { type: 'boolean', default: false },
        fairness: { type: 'string' },
        weights: { type: 'string' },
        bands: { type: 'string' },
        json: { type: 'boolean' },
        'no-progress': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }).values;
  } catch (e) {
    fail((e as Error).message);
  }
  if (args.help) {
    process.stdout.write(USAGE + '\n');
    return;
  }
  if (!args.trace) fail('--trace is required');
  const replicas = positive('replicas', args.replicas, 8, true);
  const shards = positive('shards', args.shards, 1, true);
  const isolates = positive('isolates', args.isolates, 1, true);
  const timeScale = positive('time-scale', args['time-scale'], 1);
  const seed = args.seed === undefined ? 1 : Number(args.seed);
  if (!Number.isInteger(seed)) fail(`--seed must be an integer, got "${args.seed}"`);
  const limit = positive('limit', args.limit, Infinity, true);
  const strategies = (args.strategies ?? DEFAULT_STRATEGIES).split(',').map((s) => s.trim()).filter(Boolean);
  let profile = DEFAULT_PROFILE;
  let scaleEvent: ScaleEvent | undefined;
  try {
    if (args.profile) profile = loadProfile(args.profile);
    if (args['scale-event']) scaleEvent = parseScaleEvent(args['scale-event']);
  } catch (e) {
    fail((e as Error).message);
  }
  const scaleWindowMs = args['scale-window'] ? parseDurationMs(args['scale-window']) : 300_000;
  let flowControl: FlowControlOptions | undefined;
  if (args['flow-control'] !== undefined) {
    const fairness = args.fairness ?? 'tokens';
    if (fairness !== 'tokens' && fairness !== 'requests') fail(`--fairness must be tokens or requests, got "${fairness}"`);
    try {
      flowControl = {
        maxInFlightPerReplica: positive('flow-control', args['flow-control'], 1, true),
        fairness,
        tenants: mergeTenants(args.weights ? parseTenantList(args.weights, 'weight') : {}, args.bands ? parseTenantList(args.bands, 'band') : {}),
        ...(args['share-reserve'] !== undefined ? { shareReserve: args['share-reserve'] === '0' ? 0 : positive('share-reserve', args['share-reserve'], 0, true) } : {}),
        ...(args.preempt ? { preempt: true } : {}),
        ...(args['preempt-streams'] ? { preempt: true, preemptStreams: true } : {}),
      };
    } catch (e) {
      fail((e as Error).message);
    }
  } else if (args.fairness || args.weights || args.bands || args['share-reserve'] || args.preempt || args['preempt-streams']) fail('--fairness, --weights, --bands, --share-reserve, --preempt and --preempt-streams need --flow-control N');
  const sweep = args['sweep-factor'] ? args['sweep-factor'].split(',').map((s) => s.trim()).filter(Boolean) : [];

  const wall0 = performance.now();
  const trace = loadTrace(args.trace, limit);
  if (trace.requests.length === 0) fail(`${args.trace}: no requests`);
  const keySource = args.key ?? defaultKeySpec(trace);
  let keySpec;
  try {
    keySpec = parseKeySpec(keySource);
  } catch (e) {
    fail((e as Error).message);
  }
  const keys = trace.requests.map((r) => routingKey(r, keySpec));
  const warnings: string[] = [];
  /** A key that matches no request is refused; one that matches few is reported loudly. */
  const checkKeys = (source: string, k: (number | null)[]) => {
    const c = keyCoverage(trace, source, k);
    if (c.verdict === 'refuse') fail(`${args.trace}: ${c.message}`);
    if (c.verdict === 'warn') {
      warnings.push(c.message!);
      process.stderr.write(`\n!!! simulate: ${c.message}\n\n`);
    }
  };
  checkKeys(keySource, keys);
  // Per-row key sources (`SPEC@KEY`), computed once per distinct source.
  const keysBySource = new Map<string, (number | null)[]>([[keySource, keys]]);
  const keysFor = (source: string): (number | null)[] => {
    let k = keysBySource.get(source);
    if (k === undefined) {
      let spec;
      try {
        spec = parseKeySpec(source);
      } catch (e) {
        fail((e as Error).message);
      }
      k = trace.requests.map((r) => routingKey(r, spec));
      checkKeys(source, k);
      keysBySource.set(source, k);
    }
    return k;
  };
  const bound = computeBound(trace);
  const cacheBound = Number.isFinite(profile.kvCapacityBlocks) ? computeCacheBound(trace, replicas * profile.kvCapacityBlocks) : null;

  const progress = !args['no-progress'] && !args.json ? makeProgress(strategies.length * (flowControl ? 2 : 1) + sweep.length) : null;
  const runOne = (row: string, withScale: boolean, flow?: FlowControlOptions): SimResult => {
    const at = row.indexOf('@');
    const strategy = at < 0 ? row : row.slice(0, at);
    const rowKeys = at < 0 ? keys : keysFor(row.slice(at + 1));
    try {
      const r = simulate(trace, {
        strategy,
        replicas,
        keys: rowKeys,
        timeScale,
        seed,
        profile,
        fallback: args.fallback,
        shards,
        isolates,
        scaleEvent: withScale ? scaleEvent : undefined,
        scaleWindowMs,
        flowControl: flow,
        onProgress: progress ? (d, t) => progress(flow ? `${row} + flow control` : row, d / t) : undefined,
      });
      return at < 0 ? r : { ...r, strategy: `${r.strategy}${row.slice(at)}` };
    } catch (e) {
      if (e instanceof RangeError) fail(e.message);
      throw e;
    }
  };
  const results = strategies.map((s) => runOne(s, true));
  const flowResults = flowControl ? strategies.map((s) => runOne(s, true, flowControl)) : [];
  const sweepPoints: SweepPoint[] = sweep.map((f) => ({ factor: f, result: runOne(`bounded-hash:${f}`, false) }));
  progress?.('done', 1, true);
  const wallMs = performance.now() - wall0;

  const meta = {
    trace: args.trace,
    format: trace.format,
    requests: trace.requests.length,
    skippedLines: trace.skipped,
    key: keySource,
    keyedShare: results[0]?.keyedShare ?? 0,
    keyFields: trace.keyFields,
    warnings,
    replicas,
    timeScale,
    seed,
    profile,
    wallMs,
  };
  if (args.report) {
    writeFileSync(args.report, renderReport({ meta, bound, cacheBound, results, sweep: sweepPoints }));
  }
  if (args.json) {
    const strip = (r: SimResult) => {
      const { ttftByRequest: _t, ...rest } = r;
      return rest;
    };
    process.stdout.write(JSON.stringify({ ...meta, bound, cacheBound, results: results.map(strip), ...(flowControl ? { flowControl, flowResults: flowResults.map(strip) } : {}), sweep: sweepPoints.map((p) => ({ factor: p.factor, ...strip(p.result) })) }, null, 2) + '\n');
    return;
  }
  const out: string[] = [];
  const fieldsOf = (k: 'session' | 'tenant') => Object.keys(trace.keyFields[k]).join('/');
  const keyKind = parseKeySpec(keySource).kind;
  const from = keyKind === 'session' || keyKind === 'tenant' ? (fieldsOf(keyKind) ? ` from ${fieldsOf(keyKind)}` : '') : '';
  out.push(
    `trace ${args.trace} (${trace.format}, ${trace.requests.length} requests${trace.skipped ? `, ${trace.skipped} lines skipped` : ''}), ` +
      `${replicas} replicas, key ${keySource}${from} (${(meta.keyedShare * 100).toFixed(0)}% keyed), time scale ${timeScale}, seed ${seed}${shards > 1 ? `, ${shards} coordinator shards` : ''}${isolates > 1 ? `, early connect over ${isolates} isolates` : ''}`,
    '',
    ...warnings.map((w) => `WARNING: ${w}`),
    ...(warnings.length > 0 ? [''] : []),
    strategyTable(results, bound, cacheBound),
  );
  if (flowControl) {
    out.push('', `flow control: today (every request straight to a replica, waiting in its FIFO) against the edge queue (at most ${flowControl.maxInFlightPerReplica} per replica, fairness by ${flowControl.fairness})`, '', flowTable(results.map((r, k) => ({ today: r, flow: flowResults[k]! }))));
    out.push('', `per tenant, ${results[0]!.strategy}: today / flow control`, '', tenantTable(results[0]!.flow, flowResults[0]!.flow));
  }
  if (sweepPoints.length > 0) out.push('', 'bounded-hash balance factor sweep', '', sweepTable(sweepPoints));
  const st = scaleTable(results);
  if (st) out.push('', `scale event ${args['scale-event']}`, '', st);
  out.push('', `simulated in ${(wallMs / 1000).toFixed(1)} s${args.report ? `; report: ${args.report}` : ''}`);
  process.stdout.write(out.join('\n') + '\n');
}

/** A bar redrawn on a terminal; in a log, one line per finished run (scripts/lib/progress.ts). */
function makeProgress(runs: number): (label: string, frac: number, done?: boolean) => void {
  const line = progressLine({ label: 'simulate', logEveryMs: Infinity });
  let run = 0;
  let current = '';
  let lastDraw = 0;
  return (label, frac, done = false) => {
    if (label !== current) {
      if (current !== '') line.step(`run ${run}/${runs} ${current} done`);
      current = label;
      if (label !== 'done') run++;
    }
    if (done) return line.done();
    const now = performance.now();
    if (now - lastDraw < 100 && frac < 1) return;
    lastDraw = now;
    const width = 30;
    const filled = Math.round(frac * width);
    line.update(`[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${(frac * 100).toFixed(0).padStart(3)}%  run ${run}/${runs} ${label}`);
  };
}

main();
