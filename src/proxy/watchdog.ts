// The copy loop's watchdog: one per streamed response. It ends the wait for the pending upstream
// read or client write when that operation outlives its window or the client's abort signal
// fires. No I/O; one timer and one abort listener per stream.
//
// Why not `race()` per operation: a stream is dozens to thousands of reads and writes, and a
// timer plus an abort listener armed and disarmed around each one was a measurable share of the
// router's CPU per request (bench:proxy). Here an operation costs a timestamp and one promise;
// a periodic check compares the pending operation's age with its window. The price is precision:
// a timeout is noticed between its window and its window plus one check period (a quarter of the
// shortest window), which is fine for windows that exist to catch a dead peer, not to meter time.

import type { Raced } from './race.js';

const ABORT: Raced<never> = { kind: 'abort' };
const TIMEOUT: Raced<never> = { kind: 'timeout' };
/** Shortest check period, so tiny windows (tests) do not turn the check into a busy loop. */
const MIN_CHECK_MS = 10;

export class StreamWatchdog {
  readonly #signal: AbortSignal | undefined;
  readonly #timer: ReturnType<typeof setInterval>;
  // The pending operation: how to end its wait, when it started, and its window.
  #wake: ((r: Raced<never>) => void) | null = null;
  #since = 0;
  #limitMs = Infinity;
  #aborted = false;

  /** `windowsMs`: every window `wait()` will be called with (sets the check period). */
  constructor(signal: AbortSignal | undefined, windowsMs: readonly number[]) {
    this.#signal = signal;
    signal?.addEventListener('abort', this.#onAbort, { once: true });
    this.#timer = setInterval(this.#check, Math.max(MIN_CHECK_MS, Math.min(...windowsMs) / 4));
  }

  /** Wait for `p`, at most about `limitMs` and not past the client's abort. Never rejects. */
  wait<T>(p: Promise<T>, limitMs: number): Promise<Raced<T>> {
    if (this.#aborted || this.#signal?.aborted) {
      p.catch(() => {});
      return Promise.resolve(ABORT);
    }
    this.#since = Date.now();
    this.#limitMs = limitMs;
    return new Promise<Raced<T>>((resolve) => {
      this.#wake = resolve;
      p.then(
        (value) => resolve({ kind: 'value', value }),
        (error: unknown) => resolve({ kind: 'error', error }),
      );
    });
  }

  /** Stop the timer and the listener; call once the stream is over. */
  dispose(): void {
    clearInterval(this.#timer);
    this.#signal?.removeEventListener('abort', this.#onAbort);
    this.#wake = null;
  }

  // A wake after the operation settled is a no-op: a promise resolves once.
  readonly #onAbort = (): void => {
    this.#aborted = true;
    this.#wake?.(ABORT);
  };

  readonly #check = (): void => {
    if (this.#wake !== null && Date.now() - this.#since >= this.#limitMs) this.#wake(TIMEOUT);
  };
}
