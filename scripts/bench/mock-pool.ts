// A pool of mock replicas in a process of its own, for benchmarks whose client must not share an
// event loop with the engines it measures (bench:fairness: hundreds of requests a second from the
// client would delay the mocks' prefill and decode timers, and the other way round).
// `startMockPool(n, options)` spawns this file; it starts `n` mocks on 127.0.0.1 and prints one JSON
// line with their ids and URLs. Stats and resets go over each mock's /_mock/* endpoints.
// I/O: a child process, loopback sockets.

import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';

import { startMockVllm, type MockStats, type MockVllm, type MockVllmOptions } from '../../tools/mock-engine/index.js';
import { killGroup } from '../lib/process-group.js';

export interface PooledMock {
  id: string;
  url: string;
  stats(): Promise<MockStats>;
  reset(): Promise<void>;
}

export interface MockPool {
  mocks: PooledMock[];
  /** The child's pid (its process group). */
  pid: number;
  close(): Promise<void>;
}

/** Start `n` mocks (ids r1..rn) in a child process; options as startMockVllm's (JSON-able). */
export async function startMockPool(n: number, options: MockVllmOptions): Promise<MockPool> {
  const child = spawn(process.execPath, ['--import', 'tsx', new URL(import.meta.url).pathname, String(n), JSON.stringify(options)], { stdio: ['ignore', 'pipe', 'inherit'], detached: true });
  const lines = createInterface({ input: child.stdout! });
  const first = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the mock pool did not start within 30 s')), 30_000);
    lines.once('line', (l) => {
      clearTimeout(timer);
      resolve(l);
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the mock pool exited with ${code} before starting`));
    });
  });
  const list = JSON.parse(first) as { id: string; url: string }[];
  const mocks = list.map(({ id, url }) => ({
    id,
    url,
    async stats() {
      return (await (await fetch(`${url}/_mock/stats`)).json()) as MockStats;
    },
    async reset() {
      const r = await fetch(`${url}/_mock/reset`, { method: 'POST' });
      await r.arrayBuffer();
      if (!r.ok) throw new Error(`reset of ${id} answered ${r.status}`);
    },
  }));
  return { mocks, pid: child.pid!, close: () => killGroup(child) };
}

async function main(): Promise<void> {
  const n = Number(process.argv[2]);
  const options = JSON.parse(process.argv[3] ?? '{}') as MockVllmOptions;
  const started: MockVllm[] = [];
  for (let i = 1; i <= n; i++) started.push(await startMockVllm({ ...options, id: `r${i}`, port: 0 }));
  process.stdout.write(JSON.stringify(started.map((m) => ({ id: m.id, url: m.url }))) + '\n');
  const stop = () => void Promise.allSettled(started.map((m) => m.close())).then(() => process.exit(0));
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e: unknown) => {
    process.stderr.write(`mock-pool: ${(e as Error).stack ?? String(e)}\n`);
    process.exit(1);
  });
}
