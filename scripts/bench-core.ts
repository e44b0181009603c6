// Routing-core micro-benchmark: picks per second and ns per pick for 8, 64 and 256 replicas,
// against the `hashring` npm package (ketama, md5) and against the routing core of a baseline
// git ref (default: main before #17), both measured in the same run on the same keys.
// I/O: console only (table on stdout, progress on stderr); `git archive` of the baseline's
// src/core into a temporary directory. Run: npm run bench:core [-- --json] [-- --baseline REF]
//
// Method: one fixed set of 100k session-id strings (32 hex chars, seeded); every timed batch
// walks a contiguous slice of them. Our per-pick time includes hashString(sessionId), as the
// router does, so it compares like for like with hashring.get(sessionId), which hashes too.
// Each case is warmed up, then timed in several batches; the MEDIAN batch is reported, both as
// wall-clock and as process CPU time (user + system): on a shared 2-core machine other work
// steals the CPU mid-batch, which inflates wall-clock but not CPU time. The load average at
// the start and end is printed so a reader can tell a quiet run from a busy one.

import { execSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import * as current from '../src/core/index.js';
import { blockHashes, buildRing, createStrategy, hashString, matchPrefix as ourMatchPrefix, PrefixIndex, PrefixMatchScratch, RunningTotals, seededRandom, type PickContext, type ReplicaView, type Ring, type Strategy } from '../src/core/index.js';

type Core = typeof current;

// hashring 3.2.0 is CommonJS without type declarations: describe the part we use.
interface HashRingInstance {
  get(key: string): string | undefined;
}
type HashRingCtor = new (servers: string[] | Record<string, number>, algorithm?: string, options?: Record<string, unknown>) => HashRingInstance;
const HashRing = createRequire(import.meta.url)('hashring') as HashRingCtor;

const JSON_OUT = process.argv.includes('--json');
const argAt = process.argv.indexOf('--baseline');
/** main before #17's core changes (the faster core is judged against it). */
const DEFAULT_BASELINE = 'e39b5ad';
const BASELINE_REF = argAt >= 0 ? process.argv[argAt + 1]! : DEFAULT_BASELINE;

/** The baseline's src/core, from `git archive`, imported as its own module graph (own scratch buffers). */
async function loadBaseline(ref: string): Promise<{ core: Core; commit: string } | { error: string }> {
  if (!/^[\w./~^-]+$/.test(ref)) return { error: `baseline ref "${ref}" has unexpected characters` };
  const dir = mkdtempSync(join(os.tmpdir(), 'bench-core-baseline-'));
  try {
    const commit = execSync(`git rev-parse --short ${ref}`, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    execSync(`git archive ${commit} src/core | tar -x -C ${JSON.stringify(dir)}`, { stdio: ['ignore', 'ignore', 'pipe'] });
    const core = (await import(pathToFileURL(join(dir, 'src/core/index.ts')).href)) as Core;
    process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
    return { core, commit };
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    return { error: `baseline ${ref} unavailable (${(e as Error).message.split('\n')[0]})` };
  }
}
const baseline = await loadBaseline(BASELINE_REF);
const SIZES = [8, 64, 256];
const KEY_COUNT = 100_000;
const BATCH = 20_000; // picks per timed batch
const WARMUP_BATCHES = 4;
const TIMED_BATCHES = 11;
const BUDGET_MS = 90_000; // stop timing more batches past this (3 per case at least), so the run stays near 2 minutes

const rnd = seededRandom(0x5eed);
const hex = (n: number) => Array.from({ length: n }, () => Math.floor(rnd() * 16).toString(16)).join('');
const SESSION_IDS = Array.from({ length: KEY_COUNT }, () => hex(32));

/**
 * A realistic load mix: in-flight uniform 0..8, one replica in 16 (at least one) pinned at its
 * bounded-hash cap so picks that land there must walk on, and one replica unhealthy.
 */
function loadState(n: number, ring: Ring): ReplicaView[] {
  const r = seededRandom(n);
  const replicas: ReplicaView[] = ring.ids.map((id) => ({ id, weight: 1, inFlight: Math.floor(r() * 9), healthy: true, draining: false }));
  replicas[n - 1] = { ...replicas[n - 1]!, healthy: false };
  // Slots at this load (HAProxy: ceil((U + 1) × 1.25) spread evenly, weights all 1).
  const capped = Math.max(1, Math.floor(n / 16));
  for (let k = 0; k < capped; k++) {
    const i = Math.floor(r() * (n - 1));
    const used = replicas.reduce((s, x) => s + x.inFlight, 0);
    const total = Math.ceil(((used + 1) * 125) / 100);
    const W = n - 1;
    const slots = Math.max(1, Math.floor(((i + 1) * total) / W) - Math.floor((i * total) / W));
    replicas[i] = { ...replicas[i]!, inFlight: slots + 1 }; // above its slots even after the sum grows
  }
  return replicas;
}

interface Case {
  name: string;
  /** Run `count` picks starting at key offset `from`; returns a checksum so nothing is optimised away. */
  run(from: number, count: number): number;
}

/**
 * `totals`: the pick gets Σ in-flight and the usable weight sums the caller keeps (RunningTotals,
 * as the simulator does); without it, it walks every replica (the baseline always does).
 */
function pickCase(name: string, core: Core, strategy: Strategy, ring: Ring, replicas: readonly ReplicaView[], keyed: boolean, withTotals = false): Case {
  const random = core.seededRandom(7);
  const totals = withTotals ? new RunningTotals().refresh(replicas, 1) : undefined;
  if (totals) for (const r of replicas) totals.add(r.inFlight);
  const hash = core.hashString;
  return {
    name,
    run(from, count) {
      let sink = 0;
      for (let j = 0; j < count; j++) {
        const id = SESSION_IDS[(from + j) % KEY_COUNT]!;
        const ctx: PickContext = { ring, replicas, key: keyed ? hash(id) : null, random, totals };
        const p = strategy.pick(ctx);
        sink += p.ok ? p.index : -1;
      }
      return sink;
    },
  };
}

const ourCase = (name: string, strategy: Strategy, ring: Ring, replicas: readonly ReplicaView[], keyed: boolean, withTotals = false) => pickCase(name, current, strategy, ring, replicas, keyed, withTotals);

function hashringCase(name: string, ring: HashRingInstance): Case {
  return {
    name,
    run(from, count) {
      let sink = 0;
      for (let j = 0; j < count; j++) sink += ring.get(SESSION_IDS[(from + j) % KEY_COUNT]!)!.length;
      return sink;
    },
  };
}

interface Result {
  replicas: number;
  case: string;
  /** Median wall-clock ns per pick over the timed batches. */
  nsPerPick: number;
  picksPerSec: number;
  /** Median process CPU ns per pick over the same batches. */
  cpuNsPerPick: number;
  batches: number;
  minNs: number;
  maxNs: number;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

const started = Date.now();
let globalSink = 0;
let offset = 0;

/** A full collection before each case when the run has `--expose-gc` (npm run bench:core), so no case pays for another's garbage. */
const collect = (globalThis as { gc?: () => void }).gc ?? (() => {});

function measure(c: Case, n: number, batch = BATCH): Result {
  collect();
  for (let b = 0; b < WARMUP_BATCHES; b++) {
    globalSink += c.run(offset, batch);
    offset = (offset + batch) % KEY_COUNT;
  }
  const wall: number[] = [];
  const cpu: number[] = [];
  for (let b = 0; b < TIMED_BATCHES && (b < 3 || Date.now() - started < BUDGET_MS); b++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    globalSink += c.run(offset, batch);
    const t1 = process.hrtime.bigint();
    const dc = process.cpuUsage(c0);
    offset = (offset + batch) % KEY_COUNT;
    wall.push(Number(t1 - t0) / batch);
    cpu.push(((dc.user + dc.system) * 1000) / batch);
  }
  const m = median(wall);
  const r: Result = { replicas: n, case: c.name, nsPerPick: m, picksPerSec: 1e9 / m, cpuNsPerPick: median(cpu), batches: wall.length, minNs: Math.min(...wall), maxNs: Math.max(...wall) };
  process.stderr.write(`  ${String(n).padStart(3)} replicas  ${c.name.padEnd(34)} ${m.toFixed(0).padStart(6)} ns/pick wall, ${r.cpuNsPerPick.toFixed(0).padStart(6)} ns CPU\n`);
  return r;
}

process.stderr.write(`bench-core: ${SIZES.join('/')} replicas, ${KEY_COUNT} session ids, ${TIMED_BATCHES} batches of ${BATCH} picks (median), warm-up ${WARMUP_BATCHES}\n`);

const loadBefore = os.loadavg()[0]!;
const results: Result[] = [];
const CASES = {
  bounded: 'bounded-hash:1.25 (mixed load), caller-kept totals',
  boundedWalk: 'bounded-hash:1.25 (mixed load), walking the replicas',
  boundedBase: 'baseline bounded-hash:1.25 (mixed load)',
  hash: 'hash (mixed load)',
  least: 'least-load (no key)',
  hashring: 'hashring.get (npm, md5 ketama)',
  newPrompt: 'prefix-aware acquire, new 512-block prompt (index full)',
  newPromptBase: 'baseline prefix-aware acquire, new 512-block prompt',
  warm: 'prefix-aware acquire, warm 512-block prompt',
  warmBase: 'baseline prefix-aware acquire, warm 512-block prompt',
  blockHash: 'blockHashes (128 KB prompt, per prompt)',
} as const;
const base = 'core' in baseline ? baseline : null;
process.stderr.write(base ? `baseline: src/core at ${base.commit} (${BASELINE_REF})\n` : `${(baseline as { error: string }).error}: baseline rows skipped\n`);

for (const n of SIZES) {
  const ids = Array.from({ length: n }, (_, i) => `replica-${i}`);
  const ring = buildRing(ids.map((id) => ({ id, weight: 1 })));
  const replicas = loadState(n, ring);
  // Same membership as ours; its default of 40 vnodes × 4 points = 160 points per server
  // matches our 160 points per weight. Its 5000-entry LRU cache is left on (the default), but
  // 100k distinct keys walked in order never hit it, so this is the plain lookup path.
  const hr = new HashRing(ids);
  results.push(measure(ourCase(CASES.bounded, createStrategy('bounded-hash:1.25'), ring, replicas, true, true), n));
  results.push(measure(ourCase(CASES.boundedWalk, createStrategy('bounded-hash:1.25'), ring, replicas, true), n));
  if (base) {
    const bring = base.core.buildRing(ids.map((id) => ({ id, weight: 1 })));
    results.push(measure(pickCase(CASES.boundedBase, base.core, base.core.createStrategy('bounded-hash:1.25'), bring as unknown as Ring, replicas, true), n));
  }
  results.push(measure(ourCase(CASES.hash, createStrategy('hash'), ring, replicas, true), n));
  results.push(measure(ourCase(CASES.least, createStrategy('least-load'), ring, replicas, false), n));
  results.push(measure(hashringCase(CASES.hashring, hr), n));
}

// Prefix-aware acquires at 64 replicas, as the coordinator makes them: matchAll (+ staleAll, recent
// routes and the key's home where the ref has them), the strategy's pick, recordRoute (with the
// key), with hashString(sessionId) for the ring key.
//   new prompt: the index is filled to its capacity first (every replica at its 8,192 router
//     blocks, prompts recorded round-robin), then every acquire brings a 512-block prompt nobody
//     has sent (its 8 leading blocks shared by all): the walk stops after the shared blocks, and
//     recordRoute inserts (and evicts) the rest;
//   warm: 600 sessions' 512-block prompts recorded on replicas round-robin; an acquire is a
//     session's next turn (its first 504 blocks plus 8 new ones), so the walk follows a
//     ~500-block match on one replica, which the pick follows.
// Load: in-flight uniform 0..3 (inside prefix-aware's no-starvation window, so a warm turn is
// followed), one replica unhealthy.
function prefixLoadState(n: number, ring: Ring): ReplicaView[] {
  const r = seededRandom(n + 1);
  const replicas: ReplicaView[] = ring.ids.map((id) => ({ id, weight: 1, inFlight: Math.floor(r() * 4), healthy: true, draining: false }));
  replicas[n - 1] = { ...replicas[n - 1]!, healthy: false };
  return replicas;
}
interface Acquirer {
  acquire(key: number, blocks: Uint32Array): number;
  /** Record a route directly (filling the index before timing), with the session's key when it has one. */
  record(replica: string, blocks: Uint32Array, key?: number): void;
}
function acquirer(core: Core, ring: Ring, replicas: readonly ReplicaView[]): Acquirer {
  const strategy = core.createStrategy('prefix-aware:1.25');
  const index = new core.PrefixIndex();
  const random = core.seededRandom(11);
  const matched = new Int32Array(ring.size);
  const stale = new Uint8Array(ring.size);
  const hasStale = typeof (index as { staleAll?: unknown }).staleAll === 'function';
  // The coordinator's own path where the ref has it (matchAll + staleAll + recent routes).
  const matchPrefix = (core as { matchPrefix?: typeof ourMatchPrefix }).matchPrefix;
  const scratch = new PrefixMatchScratch();
  const totals = new RunningTotals().refresh(replicas, 1);
  for (const r of replicas) totals.add(r.inFlight);
  // The coordinator also remembers the key's replica (a ref whose index takes no key ignores it).
  const keyed = index as unknown as { recordRoute(replica: string, blocks: Uint32Array, key?: number): void };
  return {
    acquire(key, blocks) {
      let prefixMatch;
      if (matchPrefix !== undefined) prefixMatch = matchPrefix(index as unknown as PrefixIndex, ring.ids, blocks, scratch, key);
      else {
        index.matchAll(ring.ids, blocks, matched);
        prefixMatch = hasStale ? { blocks: blocks.length, matched, stale: index.staleAll(ring.ids, stale) } : { blocks: blocks.length, matched };
      }
      const p = strategy.pick({ ring, replicas, key, random, prefixMatch, totals });
      if (!p.ok) throw new Error('prefix-aware pick failed');
      keyed.recordRoute(ring.ids[p.index]!, blocks, key);
      return p.index;
    },
    record(replica, blocks, key) {
      keyed.recordRoute(replica, blocks, key);
    },
  };
}
{
  const n = 64;
  const members = Array.from({ length: n }, (_, i) => ({ id: `replica-${i}`, weight: 1 }));
  const ring = buildRing(members);
  const replicas = prefixLoadState(n, ring);
  const impls: [string, string, string, Core][] = [[CASES.newPrompt, CASES.warm, 'ours', current]];
  if (base) impls.push([CASES.newPromptBase, CASES.warmBase, 'baseline', base.core]);
  const random = seededRandom(11);
  const r32 = () => (random() * 2 ** 32) >>> 0;
  const shared = Array.from({ length: 8 }, (_, i) => 0x5a5a0000 + i);
  const freshPrompt = () => Uint32Array.from({ length: 512 }, (_, i) => (i < 8 ? shared[i]! : r32()));
  // The same prompts for both implementations: fill, then timed.
  const FILL = Math.ceil((n * 8192) / (512 - 8)) + 2 * n;
  const fill = Array.from({ length: FILL }, freshPrompt);
  const timedNew = Array.from({ length: 4000 }, freshPrompt);
  const SESSIONS = 600;
  const firstTurns = Array.from({ length: SESSIONS }, freshPrompt);
  const nextTurns = firstTurns.map((p) => {
    const next = p.slice();
    for (let i = 504; i < 512; i++) next[i] = r32();
    return next;
  });
  for (const [newName, warmName, label, core] of impls) {
    const coreRing = core.buildRing(members) as unknown as Ring;
    process.stderr.write(`  filling the ${label} index (${FILL} prompts of 512 blocks)\n`);
    const full = acquirer(core, coreRing, replicas);
    for (let k = 0; k < FILL; k++) full.record(members[k % (n - 1)]!.id, fill[k]!);
    let at = 0;
    results.push(
      measure(
        {
          name: newName,
          run(from, count) {
            let sink = 0;
            for (let j = 0; j < count; j++) sink += full.acquire(hashString(SESSION_IDS[(from + j) % KEY_COUNT]!), timedNew[at++ % timedNew.length]!);
            return sink;
          },
        },
        n,
        200,
      ),
    );
    const warm = acquirer(core, coreRing, replicas);
    for (let s = 0; s < SESSIONS; s++) warm.record(members[s % (n - 1)]!.id, firstTurns[s]!, hashString(SESSION_IDS[s]!));
    results.push(
      measure(
        {
          name: warmName,
          run(from, count) {
            let sink = 0;
            for (let j = 0; j < count; j++) {
              const s = (from + j) % SESSIONS;
              sink += warm.acquire(hashString(SESSION_IDS[s]!), nextTurns[s]!);
            }
            return sink;
          },
        },
        n,
        2_000,
      ),
    );
  }
  // 128 KiB of JSON-ish text: the canonical prompt of a long agent conversation.
  const prompt = Array.from({ length: 2048 }, (_, i) => `{"role":"user","content":"turn ${i} ${(i * 2654435761) >>> 0}"}`).join('').slice(0, 128 * 1024);
  const blockHash: Case = {
    name: CASES.blockHash,
    run(_from, count) {
      let sink = 0;
      for (let j = 0; j < count; j++) sink += blockHashes(prompt)[511]! & 1;
      return sink;
    },
  };
  results.push(measure(blockHash, n, 500));
}

const elapsedS = (Date.now() - started) / 1000;
const find = (replicas: number, name: string) => results.find((r) => r.replicas === replicas && r.case === name);
const ratios = SIZES.map((n) => {
  const ours = find(n, CASES.bounded)!;
  const theirs = find(n, CASES.hashring)!;
  return { replicas: n, hashringNsOverBoundedNs: theirs.nsPerPick / ours.nsPerPick, cpuRatio: theirs.cpuNsPerPick / ours.cpuNsPerPick };
});
const loadAfter = os.loadavg()[0]!;
// Goals (#17), judged on CPU time (the wall clock also counts other engineers' work on this
// machine), each printed with the baseline measured in this run.
const at64 = find(64, CASES.bounded)!;
const base64 = find(64, CASES.boundedBase);
const newP = find(64, CASES.newPrompt)!;
const newBase = find(64, CASES.newPromptBase);
const warm = find(64, CASES.warm)!;
const warmBase = find(64, CASES.warmBase);
const goals = [
  { goal: 'bounded-hash pick at 64 replicas ≤ 0.5 µs', met: at64.cpuNsPerPick <= 500, ours: at64.cpuNsPerPick, baseline: base64?.cpuNsPerPick ?? null },
  { goal: 'prefix-aware acquire, new 512-block prompt, 64 replicas ≤ 25 µs', met: newP.cpuNsPerPick <= 25_000, ours: newP.cpuNsPerPick, baseline: newBase?.cpuNsPerPick ?? null },
  { goal: 'prefix-aware acquire, warm 512-block prompt, 64 replicas: no slower than the baseline', met: warmBase !== undefined && warm.cpuNsPerPick <= warmBase.cpuNsPerPick, ours: warm.cpuNsPerPick, baseline: warmBase?.cpuNsPerPick ?? null },
];
const machine = { nproc: os.availableParallelism?.() ?? os.cpus().length, cpu: os.cpus()[0]?.model ?? 'unknown', node: process.version, platform: `${process.platform}-${process.arch}` };
const fmtNs = (ns: number) => (ns >= 10_000 ? `${(ns / 1000).toFixed(1)} µs` : ns >= 1000 ? `${(ns / 1000).toFixed(2)} µs` : `${ns.toFixed(0)} ns`);

if (JSON_OUT) {
  process.stdout.write(
    JSON.stringify(
      {
        benchmark: 'bench-core',
        date: new Date().toISOString(),
        machine,
        loadAverage1m: { before: loadBefore, after: loadAfter },
        baseline: base ? { ref: BASELINE_REF, commit: base.commit } : { ref: BASELINE_REF, error: (baseline as { error: string }).error },
        method: { keys: KEY_COUNT, batch: BATCH, warmupBatches: WARMUP_BATCHES, timedBatches: TIMED_BATCHES, statistic: 'median ns per pick over timed batches (goals on CPU time)', ourPickIncludesHashString: true },
        results,
        ratios,
        goals,
        elapsedSeconds: elapsedS,
        sink: globalSink,
      },
      null,
      2,
    ) + '\n',
  );
} else {
  const lines: string[] = [];
  lines.push(`Routing core pick cost (median of up to ${TIMED_BATCHES} batches, after ${WARMUP_BATCHES} warm-up batches)`);
  lines.push(`${machine.nproc} cores (${machine.cpu}), Node ${machine.node}, ${machine.platform}; 1-min load average ${loadBefore.toFixed(1)} before, ${loadAfter.toFixed(1)} after`);
  lines.push(base ? `Baseline: src/core at ${base.commit} (${BASELINE_REF}), measured in this run.` : `No baseline: ${(baseline as { error: string }).error}.`);
  lines.push('Our picks include hashString(sessionId) (MurmurHash3 of the UTF-8 id), as the router does; hashring.get(sessionId) hashes too (md5).');
  lines.push('Load: in-flight uniform 0..8 per replica, 1 in 16 replicas above its bounded-hash cap, 1 replica unhealthy (prefix-aware acquires: 0..3, 1 unhealthy).');
  lines.push('Prefix-aware acquire = matchPrefix (matchAll, staleAll with recent routes, the session key\'s home where the ref has them) + pick + recordRoute (with the key) at 64 replicas; "index full": every replica at its 8,192-block capacity first. A full GC before each case (--expose-gc).');
  lines.push('');
  lines.push('| replicas | case | ns/op wall (median) | ops/s wall | ns/op CPU (median) | wall min–max ns |');
  lines.push('|---:|---|---:|---:|---:|---:|');
  for (const r of results) {
    lines.push(`| ${r.replicas} | ${r.case} | ${r.nsPerPick.toFixed(0)} | ${(r.picksPerSec / 1e6).toFixed(3)} M | ${r.cpuNsPerPick.toFixed(0)} | ${r.minNs.toFixed(0)}–${r.maxNs.toFixed(0)} |`);
  }
  lines.push('');
  for (const r of ratios) lines.push(`${String(r.replicas).padStart(3)} replicas: hashring.get / bounded-hash pick = ${r.hashringNsOverBoundedNs.toFixed(2)}× wall, ${r.cpuRatio.toFixed(2)}× CPU`);
  lines.push('');
  lines.push('Goals (CPU time; the baseline from the same run in brackets, with ours ÷ baseline):');
  for (const g of goals) {
    const vs = g.baseline !== null ? ` [baseline ${fmtNs(g.baseline)}, ${(g.ours / g.baseline).toFixed(3)}×]` : ' [no baseline]';
    lines.push(`  ${g.met ? 'MET   ' : 'MISSED'} ${g.goal}: ${fmtNs(g.ours)}${vs}`);
  }
  lines.push(`(run took ${elapsedS.toFixed(1)} s; checksum ${globalSink})`);
  process.stdout.write(lines.join('\n') + '\n');
}
