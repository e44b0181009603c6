// scripts/bench/mock-pool.ts: mock replicas in a process of their own (bench:fairness), reached
// over their /_mock/* endpoints, and gone with their process group on close.
import { describe, expect, it } from 'vitest';

import { startMockPool } from '../../scripts/bench/mock-pool.js';
import { groupAlive } from '../../scripts/lib/process-group.js';
import { eventually } from '../helpers/router.js';

describe('mock pool in a child process', () => {
  it('starts n mocks with the options given, serves stats and reset, and closes its process group', async () => {
    const pool = await startMockPool(2, { apiKey: 'k', models: ['m'], maxRunning: 3, decodeMsPerToken: 1 });
    let pid: number | undefined;
    try {
      expect(pool.mocks.map((m) => m.id)).toEqual(['r1', 'r2']);
      for (const m of pool.mocks) expect(m.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const res = await fetch(`${pool.mocks[0]!.url}/v1/completions`, { method: 'POST', headers: { authorization: 'Bearer k', 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', prompt: 'hello there', max_tokens: 2 }) });
      expect(res.status).toBe(200);
      await res.json();
      expect((await pool.mocks[0]!.stats()).completionRequestsTotal).toBe(1);
      expect((await pool.mocks[1]!.stats()).completionRequestsTotal).toBe(0);
      await pool.mocks[0]!.reset();
      expect((await pool.mocks[0]!.stats()).completionRequestsTotal).toBe(0);
      pid = pool.pid;
      expect(pid).toBeGreaterThan(0);
    } finally {
      await pool.close();
    }
    expect(groupAlive(pid!)).toBe(false);
    await eventually(async () => expect(await fetch(`${pool.mocks[0]!.url}/health`).then(() => 'up', () => 'down')).toBe('down'));
  });
});
