// Simulator traces with other tools' field names (session_id, conversation_id, tenant_id, user),
// and a chosen key that matches nothing: refused, not replayed as a silent least-load.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { keyCoverage, parseKeySpec, parseTrace, routingKey } from '../../../sim/trace.js';

const line = (extra: Record<string, unknown>, t = 0) => JSON.stringify({ timestamp: t, input_length: 1024, output_length: 8, hash_ids: [1, 2], ...extra });
const keysOf = (text: string, source: string) => {
  const trace = parseTrace(text);
  return { trace, keys: trace.requests.map((r) => routingKey(r, parseKeySpec(source))) };
};

const dir = mkdtempSync(join(tmpdir(), 'trace-fields-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('trace key fields', () => {
  it('reads sessions from session_id / conversation_id and tenants from tenant_id / user', () => {
    const text = [line({ session_id: 'a', tenant_id: 't1' }, 0), line({ conversation_id: 'b', user: 'u7' }, 1), line({ sessionId: 42, user_id: 'u8' }, 2)].join('\n');
    const trace = parseTrace(text);
    expect(trace.requests.map((r) => [r.session, r.tenant])).toEqual([['a', 't1'], ['b', 'u7'], ['42', 'u8']]);
    expect(trace.keyFields.session).toEqual({ session_id: 1, conversation_id: 1, sessionId: 1 });
    expect(trace.keyFields.tenant).toEqual({ tenant_id: 1, user: 1, user_id: 1 });
    expect(trace.format).toBe('generated');
  });

  it('prefers our own names when a line has several, and the same id keys the same way under any name', () => {
    const trace = parseTrace([line({ session: 'ours', session_id: 'theirs', tenant: 'x', user: 'y' }), line({ conversation_id: 'ours' }, 1)].join('\n'));
    expect(trace.requests[0]).toMatchObject({ session: 'ours', tenant: 'x' });
    const spec = parseKeySpec('session');
    expect(routingKey(trace.requests[0]!, spec)).toBe(routingKey(trace.requests[1]!, spec));
  });

  it('a key that matches no request is refused, one that matches few is a warning, none is a choice', () => {
    const bare = [line({}, 0), line({}, 1), line({}, 2), line({}, 3)].join('\n');
    const none = keysOf(bare, 'session');
    const refused = keyCoverage(none.trace, 'session', none.keys);
    expect(refused.verdict).toBe('refuse');
    expect(refused.message).toContain('session_id');
    expect(refused.message).toContain('its first request has timestamp, input_length, output_length, hash_ids');
    expect(keyCoverage(none.trace, 'tenant', keysOf(bare, 'tenant').keys).verdict).toBe('refuse');
    expect(keyCoverage(none.trace, 'none', keysOf(bare, 'none').keys).verdict).toBe('ok');
    expect(keyCoverage(none.trace, 'prefix:1blocks', keysOf(bare, 'prefix:1blocks').keys).verdict).toBe('ok');

    const few = keysOf([line({ session_id: 'a' }, 0), line({}, 1), line({}, 2), line({ tenant_id: 't' }, 3)].join('\n'), 'session');
    const warned = keyCoverage(few.trace, 'session', few.keys);
    expect(warned).toMatchObject({ keyed: 1, total: 4, verdict: 'warn' });
    expect(warned.message).toContain('session_id on 1');
    expect(warned.message).toContain('--key tenant'); // the trace has tenants: suggested

    const half = keysOf([line({ session_id: 'a' }, 0), line({ session_id: 'b' }, 1), line({}, 2), line({}, 3)].join('\n'), 'session');
    expect(keyCoverage(half.trace, 'session', half.keys).verdict).toBe('ok');
  });

  it('npm run simulate refuses --key session on a trace without sessions, and reports the field it used', () => {
    const bare = join(dir, 'bare.jsonl');
    writeFileSync(bare, Array.from({ length: 20 }, (_, i) => line({}, i * 100)).join('\n'));
    const run = (file: string, key: string) =>
      spawnSync(process.execPath, ['--import', 'tsx', 'sim/simulate.ts', '--trace', file, '--key', key, '--strategies', 'hash', '--replicas', '2', '--no-progress'], { encoding: 'utf8', timeout: 60_000 });
    const r = run(bare, 'session');
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('no request has one');
    expect(r.stdout).toBe('');

    const withIds = join(dir, 'ids.jsonl');
    writeFileSync(withIds, Array.from({ length: 20 }, (_, i) => line({ conversation_id: `c${i % 4}` }, i * 100)).join('\n'));
    const ok = run(withIds, 'session');
    expect(ok.status, ok.stderr).toBe(0);
    expect(ok.stdout).toContain('key session from conversation_id (100% keyed)');
  });
});
