// Shared tail of the benchmark scripts: write one script's section of docs/benchmarks.md in place
// (other sections untouched, an optional hand-written "### Reading" kept), and run main() with a
// clear exit status and a hard time bound. I/O: reads and writes docs/benchmarks.md.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/**
 * Replace (or append) the section that starts with `heading` (a `## …` line) by `body`. With
 * `keepReading`, a `### Reading` subsection already in the file survives the rewrite.
 */
export function writeBenchSection(heading: string, body: string, opts: { keepReading?: boolean } = {}): void {
  const file = join(ROOT, 'docs/benchmarks.md');
  const current = existsSync(file) ? readFileSync(file, 'utf8') : '# Benchmarks\n\nEach section gives the commands that produced its numbers.\n';
  const start = current.indexOf(heading);
  if (start < 0) {
    writeFileSync(file, current.replace(/\n*$/, '\n\n') + body + '\n');
    return;
  }
  const after = current.indexOf('\n## ', start + heading.length);
  const old = current.slice(start, after < 0 ? undefined : after + 1);
  const readingAt = opts.keepReading ? old.indexOf('\n### Reading') : -1;
  const reading = readingAt < 0 ? '' : old.slice(readingAt + 1).replace(/\n*$/, '\n');
  writeFileSync(file, current.slice(0, start) + body + '\n' + (reading ? '\n' + reading : '') + (after < 0 ? '' : (opts.keepReading ? '\n' : '') + current.slice(after + 1)));
}

/**
 * A benchmark's report: the table on stdout, each goal line (`- MET: …`) on the progress log, and,
 * with `write`, the script's section of docs/benchmarks.md replaced by it.
 */
export function emitBenchReport(section: string, out: string, goalLines: readonly string[], write: boolean, log: (msg: string) => void): void {
  process.stdout.write(out + '\n');
  for (const g of goalLines) log(g.slice(2));
  if (write) {
    writeBenchSection(section, out);
    log('wrote docs/benchmarks.md');
  }
}

/** A benchmark's hard time bound: exit 2 with a message once `ms` have passed (does not keep the process alive). */
export function giveUpAfter(ms: number, log: (msg: string) => void): void {
  setTimeout(() => {
    log(`took longer than ${Number((ms / 60_000).toFixed(1))} minutes; giving up`);
    process.exit(2);
  }, ms).unref();
}

/** Run a script's main: exit 0 when it resolves, 1 with the stack when it throws. */
export function runMain(main: () => Promise<void>, log: (msg: string) => void): void {
  main().then(
    () => process.exit(0),
    (e: unknown) => {
      log(`failed: ${(e as Error).stack ?? String(e)}`);
      process.exit(1);
    },
  );
}
