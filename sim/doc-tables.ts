// Renders `npm run simulate -- --json` outputs as the tables of docs/benchmarks.md ("Prefix-aware
// routing (simulator)"): hit rate and its share of the best a pool of this much KV can do, TTFT,
// p95 against least-load's, per-replica request spread with the fewest requests any replica got
// as a share of the mean, spill, and the prefix index's predicted hit rate against the replica
// model's. I/O: reads the JSON files named on the command line, writes Markdown to stdout.
//
//   npx tsx sim/doc-tables.ts "multi-turn, --time-scale 16=/tmp/simout/multi-turn.json" …

import { readFileSync } from 'node:fs';
import { markdownTable } from './format.js';

interface Row {
  strategy: string;
  tokenHitRate: number;
  ttftMs: { p50: number; p95: number; p99: number };
  inFlight: { peak: number };
  requestsPerReplica: { max: number; mean: number };
  minRequestShare: number;
  spillRate: number;
  perReplica: { requests: number }[];
  indexTracking: { predictedHitRate: number; visibleHitRate: number; modelHitRate: number } | null;
}
interface Out {
  bound: { tokenHitRate: number };
  cacheBound: { tokenHitRate: number } | null;
  replicas: number;
  results: Row[];
}

const pct = (x: number) => (Number.isFinite(x) ? (x * 100).toFixed(1) : '-');
const secs = (ms: number) => (Number.isFinite(ms) ? (ms / 1000).toFixed(ms < 10_000 ? 2 : 1) : '-');

export function docTable(out: Out): string {
  const best = Math.min(out.bound.tokenHitRate, out.cacheBound?.tokenHitRate ?? Infinity);
  const ll = out.results.find((r) => r.strategy === 'least-load');
  const head = ['strategy', 'hit %', 'of best %', 'TTFT p50 s', 'p95 s', 'p99 s', 'p95 ÷ least-load', 'in-flight peak', 'req/replica min/max (mean)', 'min ÷ mean', 'spill %', 'index predicted / visible / model hit %'];
  const rows = out.results.map((r) => {
    const min = Math.min(...r.perReplica.map((p) => p.requests));
    const t = r.indexTracking;
    return [
      r.strategy,
      pct(r.tokenHitRate),
      (100 * r.tokenHitRate / best).toFixed(0),
      secs(r.ttftMs.p50),
      secs(r.ttftMs.p95),
      secs(r.ttftMs.p99),
      ll ? (r.ttftMs.p95 / ll.ttftMs.p95).toFixed(2) : '-',
      String(r.inFlight.peak),
      `${min}/${r.requestsPerReplica.max} (${r.requestsPerReplica.mean.toFixed(0)})`,
      r.minRequestShare.toFixed(2),
      pct(r.spillRate),
      t ? `${pct(t.predictedHitRate)} / ${pct(t.visibleHitRate)} / ${pct(t.modelHitRate)}` : '',
    ];
  });
  const blank = head.slice(2).map(() => '');
  rows.push(['bound: 1 replica, infinite cache', pct(out.bound.tokenHitRate), ...blank]);
  if (out.cacheBound) rows.push([`bound: 1 replica, ${out.replicas}× KV`, pct(out.cacheBound.tokenHitRate), ...blank]);
  return markdownTable(head, rows);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const parts: string[] = [];
  for (const arg of process.argv.slice(2)) {
    const at = arg.lastIndexOf('=');
    if (at < 0) throw new Error(`expected "<title>=<file>", got ${arg}`);
    parts.push(`**${arg.slice(0, at)}**\n\n${docTable(JSON.parse(readFileSync(arg.slice(at + 1), 'utf8')) as Out)}\n`);
  }
  process.stdout.write(parts.join('\n'));
}
