// The demos' shared pieces (demo:traffic, demo:responses): the check that a router is running,
// and the per-replica table of hit rate and TTFT they print. I/O: one fetch, stdout.

/** One request as the demos measure it. */
export interface DemoSample {
  replica: string;
  ttftMs: number;
  promptTokens: number;
  cachedTokens: number;
}

export interface DemoSummary {
  hit: number;
  p50: number;
  p95: number;
}

/** The q-quantile of `xs` (nearest rank), NaN for none. */
export const pct = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};

/** Exit with the command to run when no router answers at `url`. */
export async function requireRouter(url: string): Promise<void> {
  const health = await fetch(`${url}/healthz`).catch(() => null);
  if (!health?.ok) {
    console.error(`No router at ${url}: start it first with \`npm start\`.`);
    process.exit(1);
  }
}

/**
 * Print `label`, then a row per replica and one for all: requests, token hit rate (cached ÷
 * prompt tokens), TTFT p50 and p95, and an optional extra column. Returns the all-row figures.
 */
export function reportPerReplica<S extends DemoSample>(label: string, samples: S[], extra?: { header: string; value: (xs: S[]) => string }): DemoSummary {
  const byReplica = new Map<string, S[]>();
  for (const s of samples) byReplica.set(s.replica, [...(byReplica.get(s.replica) ?? []), s]);
  console.log(`\n${label}`);
  console.log(`replica  requests  hit rate  TTFT p50  TTFT p95${extra ? `  ${extra.header}` : ''}`);
  const row = (id: string, xs: S[]): DemoSummary => {
    const hit = xs.reduce((a, s) => a + s.cachedTokens, 0) / Math.max(1, xs.reduce((a, s) => a + s.promptTokens, 0));
    const t = xs.map((s) => s.ttftMs);
    const more = extra ? `  ${extra.value(xs).padStart(extra.header.length)}` : '';
    console.log(`${id.padEnd(8)} ${String(xs.length).padStart(8)}  ${(hit * 100).toFixed(1).padStart(7)}%  ${pct(t, 0.5).toFixed(1).padStart(6)}ms  ${pct(t, 0.95).toFixed(1).padStart(6)}ms${more}`);
    return { hit, p50: pct(t, 0.5), p95: pct(t, 0.95) };
  };
  for (const [id, xs] of [...byReplica.entries()].sort()) row(id, xs);
  return row('all', samples);
}
