// A free TCP port on 127.0.0.1, for the local processes the tests, benchmarks and demo start.
// I/O: binds and closes one listening socket.
import { createServer } from 'node:net';

/** A port nothing listens on right now (the OS picks it; another process could still take it before use). */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => res(port));
    });
  });
}
