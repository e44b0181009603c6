// promtool (Debian's `prometheus` package) for the Node-side tests: the /metrics lint and the
// rule-file checks. `npm test` installs it first (scripts/test-deps.ts), so a missing promtool
// fails the test there and in CI; only a bare `npx vitest run <file>` on a machine without it
// skips, loudly. I/O: promtool child processes.
import { spawnSync } from 'node:child_process';

export interface PromtoolResult {
  status: number | null;
  /** stdout then stderr, trimmed. */
  output: string;
}

/** Runs `promtool <args>`; undefined when promtool is not on PATH. */
export function promtool(args: string[], input?: string): PromtoolResult | undefined {
  const r = spawnSync('promtool', args, { input, encoding: 'utf8', timeout: 30_000 });
  if (r.error && (r.error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
  if (r.error) throw r.error;
  return { status: r.status, output: `${r.stdout ?? ''}${r.stderr ?? ''}`.trim() };
}

/**
 * For a test whose promtool run came back undefined: throws under CI or `npm test` (where
 * promtool must be there), otherwise warns loudly and returns so the caller can skip.
 */
export function promtoolMissing(what: string): void {
  if (process.env.CI || process.env.npm_lifecycle_event === 'test') {
    throw new Error(`promtool is not on PATH, so ${what} cannot run; npm test installs it (scripts/test-deps.ts), or apt-get install prometheus`);
  }
  console.warn(`\n!!!!! promtool not found: ${what} was SKIPPED (it fails under npm test and in CI).\n!!!!! npm test installs it (scripts/test-deps.ts), or: apt-get install prometheus\n`);
}
