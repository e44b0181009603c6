import { exports } from 'cloudflare:workers';
import { describe, expect, it } from 'vitest';

describe('worker entry', () => {
  it('answers /healthz', async () => {
    const res = await exports.default.fetch('http://router/healthz');
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: 'ok' });
  });
});
