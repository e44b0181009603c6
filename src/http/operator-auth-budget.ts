// Operator authentication's failure budget (the Worker's half of coordinator/router-guard.ts,
// which keeps the counts): failed admin bearer tokens and dashboard logins are counted per
// client (CF-Connecting-IP, which Cloudflare's edge sets and a client cannot), and a client over
// its budget gets 429 even with the right token.
// I/O: one RPC to the RouterGuard object per operator credential check.

import type { RouterGuardImpl } from '../coordinator/router-guard.js';
import type { AppContext } from './context.js';

export function guardStub(env: Env): DurableObjectStub<RouterGuardImpl> {
  return env.ROUTER_GUARD.get(env.ROUTER_GUARD.idFromName('global')) as unknown as DurableObjectStub<RouterGuardImpl>;
}

/** The client a failure is counted against. */
export function clientOf(c: AppContext): string {
  return c.req.header('cf-connecting-ip') ?? 'unknown';
}

/**
 * Record one operator credential check; returns the retry-after seconds when the client is over
 * its budget, else null. The guard's own failure does not lock operators out: it is logged and
 * the check goes on (the credential itself was still verified in constant time).
 */
export async function overAuthBudget(c: AppContext, scope: 'admin' | 'login', failed: boolean): Promise<number | null> {
  const config = c.get('config');
  try {
    const v = await guardStub(c.env).admit(`${scope}:${clientOf(c)}`, failed, config.authFailureLimit, config.authFailureWindowMs);
    return v.ok ? null : Math.max(1, Math.ceil(v.retryAfterMs / 1000));
  } catch (e) {
    console.error(JSON.stringify({ type: 'guard_failed', message: e instanceof Error ? e.message : String(e) }));
    return null;
  }
}
