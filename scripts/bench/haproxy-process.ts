// Debian's HAProxy as a child process for `npm run bench:haproxy`: writes a config into a temp
// dir, starts `haproxy -f cfg -db` on a free 127.0.0.1 port, waits until it accepts, and stops it.
// I/O: a temp dir, one child process, loopback sockets.

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../lib/free-port.js';


export interface HaproxyBackend {
  name: string;
  port: number;
}

/** `balance` lines for the backend: `hdr(X-Session-Id)` with a hash-balance-factor (0 = none), or leastconn. */
export type HaproxyBalance = { kind: 'hash'; factor: number } | { kind: 'leastconn' };

export interface HaproxyHandle {
  port: number;
  config: string;
  stop(): Promise<void>;
}

/** `haproxy -v`, first line, or null when it is not installed. */
export function haproxyVersion(): string | null {
  try {
    return execFileSync('haproxy', ['-v'], { stdio: ['ignore', 'pipe', 'ignore'], timeout: 5_000 }).toString().split('\n')[0]!.trim();
  } catch {
    return null;
  }
}


export function haproxyConfig(port: number, balance: HaproxyBalance, servers: readonly HaproxyBackend[]): string {
  const lines = [
    'global',
    '  nbthread 1',
    '  maxconn 4096',
    '',
    'defaults',
    '  mode http',
    '  timeout connect 2s',
    '  timeout client 60s',
    '  timeout server 60s',
    '  timeout http-keep-alive 60s',
    // Send each SSE chunk at once: without it HAProxy lets the kernel coalesce small writes
    // (MSG_MORE), which holds the first token for tens of ms, and nobody streams LLM tokens so.
    '  option http-no-delay',
    '',
    'frontend fe',
    `  bind 127.0.0.1:${port}`,
    '  default_backend be',
    '',
    'backend be',
  ];
  if (balance.kind === 'leastconn') {
    lines.push('  balance leastconn');
  } else {
    lines.push('  balance hdr(X-Session-Id)', '  hash-type consistent');
    if (balance.factor > 0) lines.push(`  hash-balance-factor ${balance.factor}`);
  }
  // %s: the name of the server that answered, so the client can count per backend.
  lines.push('  http-response set-header X-Backend %s');
  for (const s of servers) lines.push(`  server ${s.name} 127.0.0.1:${s.port}`);
  return lines.join('\n') + '\n';
}

function waitForPort(port: number, child: ChildProcess, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  return new Promise((resolve, reject) => {
    let attempts = 0;
    const tryOnce = () => {
      if (child.exitCode !== null) return reject(new Error(`haproxy exited with code ${child.exitCode}`));
      const sock = connect({ host: '127.0.0.1', port });
      sock.once('connect', () => {
        sock.destroy();
        resolve();
      });
      sock.once('error', () => {
        sock.destroy();
        if (Date.now() > deadline || ++attempts > 200) reject(new Error(`haproxy did not listen on ${port} within ${timeoutMs} ms`));
        else setTimeout(tryOnce, 25);
      });
    };
    tryOnce();
  });
}

export async function startHaproxy(balance: HaproxyBalance, servers: readonly HaproxyBackend[]): Promise<HaproxyHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'bench-haproxy-'));
  const port = await freePort();
  const config = haproxyConfig(port, balance, servers);
  const file = join(dir, 'haproxy.cfg');
  writeFileSync(file, config);
  const child = spawn('haproxy', ['-f', file, '-db'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (d: string) => {
    if (stderr.length < 10_000) stderr += d;
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 3_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await waitForPort(port, child, 5_000);
  } catch (e) {
    await stop();
    throw new Error(`${(e as Error).message}\n${stderr}`);
  }
  return { port, config, stop };
}
