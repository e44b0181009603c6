// Flow control at the edge (issue #29), the request's part: its priority band (the tenant record's,
// or the `x-prefix-router-priority` header within what the record allows), its cost in the pool's
// fairness unit and the tenant's fair-share weight; the coordinator's queue (coordinator/queue.ts)
// orders by them. A band the pool does not have, or one the tenant may not use, is the client's
// error (400, naming the header and the band). Pure: reads the header value and body handed in.

import { flowControlActive, type PoolRuntime } from '../config.js';
import { requestCost } from '../core/index.js';
import { DEFAULT_COMPLETION_CHARGE, estimatePromptTokens, requestedMaxTokens } from '../quota/limits.js';
import type { TenantRecord } from './tenant-records.js';

export const PRIORITY_HEADER = 'x-prefix-router-priority';

export type QueuePlan = { ok: true; queue?: { band: string; cost: number; weight: number } } | { ok: false; message: string };

/**
 * The request's queue particulars in `pool`, or the 400's message. A pool without flow control
 * ignores the header (nothing waits there) but still refuses a malformed one.
 * `promptTokens`/`completionTokens`: the route's own estimates (the keyless APIs'); default the body's.
 */
export function planQueue(pool: PoolRuntime, tenant: Pick<TenantRecord, 'weight' | 'priority' | 'priorities'>, header: string | undefined, body: Record<string, unknown>, estimate?: { promptTokens?: number; completionTokens?: number }): QueuePlan {
  const fc = pool.flowControl;
  const names = fc.bands.map((b) => b.name);
  // The tenant's own band; a record naming a band this pool lacks gets the pool's default.
  const own = tenant.priority !== undefined && names.includes(tenant.priority) ? tenant.priority : fc.defaultBand;
  let band = own;
  if (header !== undefined) {
    const asked = header.trim().toLowerCase();
    if (!names.includes(asked)) return { ok: false, message: `Invalid ${PRIORITY_HEADER} header: unknown priority band "${printable(header)}" (this pool's bands: ${names.join(', ')})` };
    const allowed = tenant.priorities ?? names.slice(names.indexOf(own));
    if (!allowed.includes(asked)) return { ok: false, message: `Invalid ${PRIORITY_HEADER} header: this API key may not use priority band "${asked}" (allowed: ${allowed.filter((b) => names.includes(b)).join(', ') || 'none'})` };
    band = asked;
  }
  if (!flowControlActive(pool)) return { ok: true };
  const prompt = estimate?.promptTokens ?? estimatePromptTokens(body);
  const output = estimate?.completionTokens ?? requestedMaxTokens(body) ?? DEFAULT_COMPLETION_CHARGE;
  return { ok: true, queue: { band, cost: requestCost(fc.fairness, prompt, output), weight: tenant.weight ?? 1 } };
}

/** At most 64 printable ASCII characters of a client's value, for an error message. */
function printable(v: string): string {
  return v.replace(/[^\x20-\x7e]/g, '?').slice(0, 64);
}
