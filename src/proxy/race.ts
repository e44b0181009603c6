// Race a promise against a named timeout and an abort signal, without leaking timers.
// No I/O. For one-off waits (the upstream's first byte, the request body); the copy loop's
// per-chunk reads and writes use one StreamWatchdog per stream instead (watchdog.ts), for the
// same reason: client disconnects do not reliably reject reads or writes (WORKERD-NOTES.md).

export type Raced<T> = { kind: 'value'; value: T } | { kind: 'timeout' } | { kind: 'abort' } | { kind: 'error'; error: unknown };

export function race<T>(p: Promise<T>, timeoutMs: number, signal?: AbortSignal): Promise<Raced<T>> {
  if (signal?.aborted) {
    p.catch(() => {});
    return Promise.resolve({ kind: 'abort' });
  }
  return new Promise((resolve) => {
    let settled = false;
    const finish = (r: Raced<T>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(r);
    };
    const onAbort = () => finish({ kind: 'abort' });
    const timer = setTimeout(() => finish({ kind: 'timeout' }), timeoutMs);
    signal?.addEventListener('abort', onAbort, { once: true });
    p.then(
      (value) => finish({ kind: 'value', value }),
      (error) => finish({ kind: 'error', error }),
    );
  });
}
