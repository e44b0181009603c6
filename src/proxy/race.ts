// Race a promise against a named timeout and an abort signal, without leaking timers.
// No I/O. For one-off waits (the upstream's first byte, the request body); the copy loop's
// per-chunk reads and writes use one StreamWatchdog per stream instead (watchdog.ts), for the
// same reason: client disconnects do not reliably reject reads or writes (WORKERD-NOTES.md).

export type Raced<T> = { kind: 'value'; value: T } | { kind: 'timeout' } | { kind: 'abort' } | { kind: 'error'; error: unknown };

/** `preempt`: flow control took the request's slot back (proxy/preemption.ts): `preempted`, after a client abort. */
export function race<T>(p: Promise<T>, timeoutMs: number, signal?: AbortSignal): Promise<Raced<T>>;
export function race<T>(p: Promise<T>, timeoutMs: number, signal: AbortSignal | undefined, preempt: AbortSignal | undefined): Promise<Raced<T> | { kind: 'preempted' }>;
export function race<T>(p: Promise<T>, timeoutMs: number, signal?: AbortSignal, preempt?: AbortSignal): Promise<Raced<T> | { kind: 'preempted' }> {
  if (signal?.aborted || preempt?.aborted) {
    p.catch(() => {});
    return Promise.resolve({ kind: signal?.aborted ? 'abort' : 'preempted' });
  }
  return new Promise((resolve) => {
    let settled = false;
    const finish = (r: Raced<T> | { kind: 'preempted' }) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      preempt?.removeEventListener('abort', onPreempt);
      resolve(r);
    };
    const onAbort = () => finish({ kind: 'abort' });
    const onPreempt = () => finish({ kind: 'preempted' });
    const timer = setTimeout(() => finish({ kind: 'timeout' }), timeoutMs);
    signal?.addEventListener('abort', onAbort, { once: true });
    preempt?.addEventListener('abort', onPreempt, { once: true });
    p.then(
      (value) => finish({ kind: 'value', value }),
      (error) => finish({ kind: 'error', error }),
    );
  });
}
