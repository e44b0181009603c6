// Progress lines for long runs (demo:traffic, benchmarks, the simulator): on a terminal one line
// redrawn in place, in a log or a pipe one line per step, never runs of `\r` glued into one line.
// I/O: writes to the stream it is given (stderr by default).

export interface Progress {
  /** Work in progress: redrawn on a terminal; in a log at most one line per `logEveryMs`. */
  update(line: string): void;
  /** A finished step: its own line on a terminal and in a log. */
  step(line: string): void;
  /** Clears a pending redrawn line (call before printing anything else to the same stream). */
  done(): void;
}

export interface ProgressOptions {
  /** Default process.stderr. */
  stream?: NodeJS.WriteStream;
  /** Prefix of every line, e.g. `bench:soak`. */
  label?: string;
  /** Override the terminal check (tests). */
  tty?: boolean;
  /** Off a terminal, the least time between two `update` lines. Default 5 s; 0 prints each one, Infinity none (steps only). */
  logEveryMs?: number;
  /** On a terminal, the least time between two redraws (callers may update per request). Default 100 ms. */
  ttyEveryMs?: number;
  /** Clock, for tests. */
  now?: () => number;
}

export function progress(opts: ProgressOptions = {}): Progress {
  const stream = opts.stream ?? process.stderr;
  const tty = opts.tty ?? (stream.isTTY === true && process.env.TERM !== 'dumb');
  const logEveryMs = opts.logEveryMs ?? 5_000;
  const now = opts.now ?? Date.now;
  const prefix = opts.label ? `${opts.label} ` : '';
  let pending = false; // a redrawn line is on screen without its newline
  const ttyEveryMs = opts.ttyEveryMs ?? 100;
  let lastLogged = -Infinity;
  let lastDrawn = -Infinity;
  let lastLine = '';
  const columns = () => (tty && stream.columns ? stream.columns : Infinity);
  // A line wider than the terminal wraps, and `\r` then redraws only its last row.
  const fit = (s: string) => (s.length < columns() ? s : `${s.slice(0, Math.max(0, columns() - 2))}…`);
  return {
    update(line) {
      const text = prefix + line;
      if (tty) {
        const t = now();
        if (t - lastDrawn < ttyEveryMs) return;
        lastDrawn = t;
        stream.write(`\r\x1b[K${fit(text)}`);
        pending = true;
        return;
      }
      if (text === lastLine || logEveryMs === Infinity) return;
      const t = now();
      if (t - lastLogged < logEveryMs) return;
      lastLogged = t;
      lastLine = text;
      stream.write(`${text}\n`);
    },
    step(line) {
      const text = prefix + line;
      stream.write(tty ? `\r\x1b[K${text}\n` : `${text}\n`);
      pending = false;
      lastLine = text;
      lastLogged = now();
    },
    done() {
      if (tty && pending) stream.write('\r\x1b[K');
      pending = false;
    },
  };
}
