// The request's part of flow control (src/http/flow-control.ts): its band from the tenant record or
// the x-prefix-router-priority header within what the record allows, its cost, the tenant's weight.
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.js';
import { planQueue } from '../../../src/http/flow-control.js';
import { tenantRecordSchema } from '../../../src/http/tenant-records.js';

const pool = (over: Record<string, unknown> = {}) =>
  parseConfig({ pools: [{ name: 'p', models: ['m'], maxInFlightPerReplica: 4, replicas: [{ id: 'r', url: 'https://a.example.com' }], ...over }] }).pools[0]!;
const body = { model: 'm', max_tokens: 100, messages: [{ role: 'user', content: 'x'.repeat(400) }] };

describe('planQueue', () => {
  it('defaults: the pool default band, cost = prompt estimate + max_tokens, weight 1', () => {
    expect(planQueue(pool(), {}, undefined, body)).toEqual({ ok: true, queue: { band: 'normal', cost: expect.any(Number), weight: 1 } });
    const r = planQueue(pool(), {}, undefined, body);
    expect(r.ok && r.queue!.cost).toBeGreaterThan(100);
    const req = planQueue(pool({ flowControl: { fairness: 'requests' } }), { weight: 3 }, undefined, body);
    expect(req).toEqual({ ok: true, queue: { band: 'normal', cost: 1, weight: 3 } });
  });

  it('the header may pick the tenant\'s own band or one below, not above; priorities override', () => {
    expect(planQueue(pool(), {}, 'LOW', body)).toMatchObject({ ok: true, queue: { band: 'low' } });
    expect(planQueue(pool(), {}, 'high', body)).toEqual({ ok: false, message: expect.stringMatching(/x-prefix-router-priority.*may not use priority band "high" \(allowed: normal, low\)/) });
    expect(planQueue(pool(), { priority: 'high' }, 'high', body)).toMatchObject({ ok: true, queue: { band: 'high' } });
    expect(planQueue(pool(), { priority: 'high' }, undefined, body)).toMatchObject({ ok: true, queue: { band: 'high' } });
    expect(planQueue(pool(), { priorities: ['low'] }, 'normal', body)).toMatchObject({ ok: false });
    expect(planQueue(pool(), { priorities: ['high', 'low'] }, 'high', body)).toMatchObject({ ok: true, queue: { band: 'high' } });
  });

  it('an unknown band is refused naming it (control bytes shown as ?), even in a pool without flow control', () => {
    expect(planQueue(pool(), {}, 'gold\u0001', body)).toEqual({ ok: false, message: expect.stringContaining('unknown priority band "gold?"') });
    expect(planQueue(pool({ flowControl: { enabled: false } }), {}, 'gold', body)).toMatchObject({ ok: false });
    expect(planQueue(pool({ flowControl: { enabled: false } }), {}, 'low', body)).toEqual({ ok: true });
    // No bound: nothing waits, no queue particulars.
    expect(planQueue(pool({ maxInFlightPerReplica: undefined }), {}, undefined, body)).toEqual({ ok: true });
  });

  it('tenant records: weight 1-1000, band names', () => {
    expect(tenantRecordSchema.safeParse({ id: 't', pools: ['*'], weight: 3, priority: 'high', priorities: ['high', 'low'] }).success).toBe(true);
    expect(tenantRecordSchema.safeParse({ id: 't', pools: ['*'], weight: 0 }).success).toBe(false);
    expect(tenantRecordSchema.safeParse({ id: 't', pools: ['*'], weight: 1001 }).success).toBe(false);
    expect(tenantRecordSchema.safeParse({ id: 't', pools: ['*'], priority: 'Gold Star' }).success).toBe(false);
  });
});
