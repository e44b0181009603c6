// Helpers for the coordinator's own fetches to origins (health checks, metrics scrapes): a bounded
// pool of concurrent tasks and a size-capped body read. I/O: only what the tasks and the body do.

/**
 * Run tasks with at most `limit` in progress at once, in order. A task's own timeout should start
 * inside it (when its fetch leaves), not when it is queued. Rejections are the tasks' own business:
 * each should catch; one that throws does not stop the others.
 */
export async function runLimited(tasks: readonly (() => Promise<void>)[], limit: number): Promise<void> {
  let next = 0;
  const lane = async () => {
    while (next < tasks.length) {
      const task = tasks[next++]!;
      try {
        await task();
      } catch (e) {
        console.error(JSON.stringify({ type: 'origin_task_failed', message: (e as Error).message }));
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, tasks.length)) }, lane));
}

/** The body as text, at most `maxBytes` of it: reading stops there and the rest is cancelled. */
export async function readCapped(res: Response, maxBytes: number): Promise<string> {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const room = maxBytes - total;
      parts.push(value.byteLength > room ? value.subarray(0, room) : value);
      total += Math.min(value.byteLength, room);
      if (total >= maxBytes) {
        await reader.cancel().catch(() => {});
        break;
      }
    }
  } finally {
    reader.releaseLock();
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  // A cut in the middle of a UTF-8 sequence decodes to U+FFFD, which the parser skips with its line.
  return new TextDecoder().decode(out);
}
