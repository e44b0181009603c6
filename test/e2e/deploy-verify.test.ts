// `npm run deploy:verify` (scripts/lib/deploy-verify.ts, scripts/deploy-verify.ts) against a local
// router under Miniflare with mock replicas: every replica healthy and a streamed answer is a pass;
// a dead replica, a draining one, a wrong admin token and a missing router are each named. The
// CLI's exit codes are checked once each. Only 127.0.0.1; every wait bounded.

import { spawn } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { verifyDeployment } from '../../scripts/lib/deploy-verify.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_ADMIN_TOKEN, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  mocks = await startMocks(3, { decodeMsPerToken: 2 });
  router = await startRouter({ config: routerConfig({ replicas: mocks.map((m) => ({ id: m.id, url: m.url })) }) });
});

afterAll(async () => {
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
});

/** The CLI in a child process; asynchronous, since the mock replicas answer from this process's event loop. */
function runCli(args: string[], env: Record<string, string>): Promise<{ status: number | null; out: string }> {
  return new Promise((done, fail) => {
    const child = spawn(join(ROOT, 'node_modules', '.bin', 'tsx'), [join(ROOT, 'scripts/deploy-verify.ts'), ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', fail);
    child.on('close', (status) => {
      clearTimeout(timer);
      done({ status, out });
    });
  });
}

describe('deploy:verify against a local router', () => {
  it('passes with every replica healthy and a streamed answer, naming each replica', async () => {
    const lines: string[] = [];
    const r = await verifyDeployment({ url: router.url, adminToken: TEST_ADMIN_TOKEN, tenantKey: TEST_KEY, waitMs: 10_000, timeoutMs: 5_000, log: (l) => lines.push(l) });
    expect(r.problems).toEqual([]);
    expect(r.ok).toBe(true);
    expect(r.healthz).toBe('ok');
    expect(r.replicas.map((v) => `${v.pool}/${v.id}:${v.state}`).sort()).toEqual(['chat/r1:ok', 'chat/r2:ok', 'chat/r3:ok']);
    expect(r.stream?.ok).toBe(true);
    expect(r.stream?.detail).toMatch(/first token after \d+ ms from replica r[123]/);
    expect(lines.join('\n')).toMatch(/chat\/r1 http:\/\/127\.0\.0\.1:\d+: ok/);
  });

  it('the CLI exits 0 on a healthy router, 1 with a wrong admin token, 2 without one', async () => {
    const good = await runCli([router.url, '--wait', '10', '--timeout', '5'], { ADMIN_TOKEN: TEST_ADMIN_TOKEN, PREFIX_ROUTER_TENANT_KEY: TEST_KEY });
    expect(good.out).toMatch(/deploy:verify: ok \(3 replicas healthy, a streamed answer came back\)/);
    expect(good.status).toBe(0);
    const wrong = await runCli([router.url, '--wait', '0'], { ADMIN_TOKEN: 'not-the-admin-token-0123456789', PREFIX_ROUTER_TENANT_KEY: '' });
    expect(wrong.out).toMatch(/GET \/admin\/pools answered 401 \(ADMIN_TOKEN is not the deployed one\)/);
    expect(wrong.status).toBe(1);
    expect((await runCli([router.url], { ADMIN_TOKEN: '' })).status).toBe(2);
  });

  it('names a replica that is down and one that is draining; an unreachable router fails within its timeout', async () => {
    const drain = await router.adminFetch('/admin/pools/chat/replicas/r2', { method: 'PATCH', body: JSON.stringify({ draining: true }) });
    expect(drain.status).toBe(200);
    await mocks[2]!.close();
    await eventually(
      async () => {
        const snap = (await (await router.adminFetch('/admin/pools/chat')).json()) as { replicas: { id: string; healthy: boolean }[] };
        expect(snap.replicas.find((x) => x.id === 'r3')!.healthy).toBe(false);
      },
      { timeoutMs: 10_000, intervalMs: 200 },
    );
    const r = await verifyDeployment({ url: router.url, adminToken: TEST_ADMIN_TOKEN, waitMs: 5_000, timeoutMs: 5_000 });
    expect(r.ok).toBe(false);
    const byId = Object.fromEntries(r.replicas.map((v) => [v.id, v]));
    expect(byId.r1!.state).toBe('ok');
    expect(byId.r2!.state).toBe('draining');
    expect(byId.r3!.state).toBe('down');
    expect(r.problems).toHaveLength(1);
    expect(r.problems[0]).toMatch(/^chat\/r3 http:\/\/127\.0\.0\.1:\d+: down/);

    const t0 = Date.now();
    const gone = await verifyDeployment({ url: 'http://127.0.0.1:9', adminToken: TEST_ADMIN_TOKEN, waitMs: 0, timeoutMs: 2_000 });
    expect(gone.ok).toBe(false);
    expect(gone.healthz).toBe('unreachable');
    expect(gone.problems[0]).toMatch(/^\/healthz: /);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });
});
