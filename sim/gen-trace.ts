// `npm run gen-trace -- --class <name> --out file.jsonl [--seed S] [--sessions N] [--duration s] [--rate r]`:
// write a synthetic workload in the simulator's JSONL format (a header line, then one request
// a line with 16-token block ids). I/O: writes the output file. Classes: docs/simulator.md.

import { createWriteStream } from 'node:fs';
import { parseArgs } from 'node:util';
import { CLASS_DEFAULTS, WORKLOAD_CLASSES, generateWorkload, type WorkloadClass } from './workloads.js';

const USAGE = `usage: npm run gen-trace -- --class <${WORKLOAD_CLASSES.join('|')}> --out file.jsonl [--seed S] [--sessions N] [--duration s] [--rate r]`;

function fail(msg: string): never {
  process.stderr.write(`gen-trace: ${msg}\n${USAGE}\n`);
  process.exit(2);
}

const { values: a } = (() => {
  try {
    return parseArgs({ options: { class: { type: 'string' }, out: { type: 'string' }, seed: { type: 'string' }, sessions: { type: 'string' }, duration: { type: 'string' }, rate: { type: 'string' } }, strict: true });
  } catch (e) {
    fail((e as Error).message);
  }
})();
if (!a.class || !(WORKLOAD_CLASSES as readonly string[]).includes(a.class)) fail(`--class must be one of ${WORKLOAD_CLASSES.join(', ')}`);
if (!a.out) fail('--out is required');
const num = (name: string, v: string | undefined, integer: boolean): number | undefined => {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || (integer ? !Number.isInteger(n) : n <= 0) || (name !== 'seed' && n <= 0)) fail(`--${name}: bad value "${v}"`);
  return n;
};
const cls = a.class as WorkloadClass;
const seed = num('seed', a.seed, true) ?? 1;
const records = generateWorkload(cls, { seed, sessions: num('sessions', a.sessions, true), durationSec: num('duration', a.duration, false), rate: num('rate', a.rate, false) });
const out = createWriteStream(a.out);
out.write(JSON.stringify({ type: 'header', format: 'prefix-router-trace', version: 1, block_tokens: 16, class: cls, seed, about: CLASS_DEFAULTS[cls].about }) + '\n');
for (const r of records) out.write(JSON.stringify(r) + '\n');
out.end(() => {
  const sessions = new Set(records.map((r) => r.session)).size;
  const span = records.length > 0 ? records[records.length - 1]!.timestamp / 1000 : 0;
  process.stderr.write(`gen-trace: ${records.length} requests, ${sessions} sessions over ${span.toFixed(0)} s (${cls}, seed ${seed}) → ${a.out}\n`);
});
