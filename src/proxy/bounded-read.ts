// Read a body into memory up to a byte cap and a deadline: the one capped reader behind the
// request body (http/body.ts readLimited) and an origin's error answer (origin-response.ts).
// I/O: reads the stream it is given; it never cancels it (each caller decides what is left).

import { race } from './race.js';

export type BoundedRead =
  /** `ended`: the body ended before `maxBytes` arrived; else `bytes` are its first `maxBytes` and `total` what was read. */
  | { kind: 'read'; ended: boolean; bytes: Uint8Array; total: number }
  | { kind: 'timeout' }
  | { kind: 'error' };

/** Read until the body ends or at least `maxBytes` have arrived, each read raced against `deadline` (epoch ms). */
export async function readUpTo(reader: ReadableStreamDefaultReader<Uint8Array>, maxBytes: number, deadline: number): Promise<BoundedRead> {
  const chunks: Uint8Array[] = [];
  let total = 0;
  let ended = false;
  try {
    while (total < maxBytes) {
      const r = await race(reader.read(), Math.max(0, deadline - Date.now()));
      if (r.kind !== 'value') return { kind: r.kind === 'timeout' ? 'timeout' : 'error' };
      if (r.value.done) {
        ended = true;
        break;
      }
      chunks.push(r.value.value);
      total += r.value.value.byteLength;
    }
  } catch {
    return { kind: 'error' };
  }
  const bytes = new Uint8Array(Math.min(total, maxBytes));
  let off = 0;
  for (const c of chunks) {
    const part = c.subarray(0, Math.min(c.byteLength, bytes.byteLength - off));
    bytes.set(part, off);
    off += part.byteLength;
    if (off >= bytes.byteLength) break;
  }
  return { kind: 'read', ended, bytes, total };
}
