// Small statistics helpers for the simulator. Pure.

/** Nearest-rank percentile (q in [0, 1]) of the finite values; NaN when there are none. */
export function percentile(values: ArrayLike<number>, q: number): number {
  const xs: number[] = [];
  for (let i = 0; i < values.length; i++) if (Number.isFinite(values[i]!)) xs.push(values[i]!);
  if (xs.length === 0) return NaN;
  xs.sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil(q * xs.length));
  return xs[rank - 1]!;
}

export function mean(values: ArrayLike<number>): number {
  let s = 0;
  let n = 0;
  for (let i = 0; i < values.length; i++) {
    if (!Number.isFinite(values[i]!)) continue;
    s += values[i]!;
    n++;
  }
  return n > 0 ? s / n : NaN;
}
