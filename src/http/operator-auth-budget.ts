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
  return clientBucket(c.req.header('cf-connecting-ip'));
}

/**
 * The bucket an address's failures count in: an IPv4 address alone, an IPv6 address by its /64.
 * A /64 is the smallest allocation an IPv6 client is given (one LAN; RFC 6177 recommends /56 or
 * /48 per site), so counting single IPv6 addresses would let one client guess from 2^64 of them.
 * An IPv4-mapped IPv6 address counts as its IPv4 address. What does not parse counts as itself.
 */
export function clientBucket(ip: string | undefined): string {
  if (ip === undefined || ip === '') return 'unknown';
  if (!ip.includes(':')) return ip;
  const hextets = expandIPv6(ip.toLowerCase());
  if (hextets === null) return ip;
  if (hextets.slice(0, 5).every((h) => h === 0) && hextets[5] === 0xffff) return `${hextets[6]! >> 8}.${hextets[6]! & 255}.${hextets[7]! >> 8}.${hextets[7]! & 255}`;
  return `${hextets.slice(0, 4).map((h) => h.toString(16)).join(':')}::/64`;
}

/** The eight 16-bit groups of an IPv6 address (`::` and a trailing dotted IPv4 allowed), or null. */
function expandIPv6(ip: string): number[] | null {
  const zone = ip.indexOf('%');
  if (zone >= 0) ip = ip.slice(0, zone);
  let tail: number[] = [];
  const dotted = /^(.*:)(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(ip);
  if (dotted) {
    const b = dotted.slice(2).map(Number);
    if (b.some((x) => x > 255)) return null;
    tail = [(b[0]! << 8) | b[1]!, (b[2]! << 8) | b[3]!];
    ip = dotted[1]!.endsWith('::') ? dotted[1]! : dotted[1]!.slice(0, -1);
  }
  const halves = ip.split('::');
  if (halves.length > 2) return null;
  const parse = (part: string): number[] | null => {
    if (part === '') return [];
    const out: number[] = [];
    for (const g of part.split(':')) {
      if (!/^[0-9a-f]{1,4}$/.test(g)) return null;
      out.push(parseInt(g, 16));
    }
    return out;
  };
  const head = parse(halves[0]!);
  const rest = halves.length === 2 ? parse(halves[1]!) : [];
  if (head === null || rest === null) return null;
  const known = head.length + rest.length + tail.length;
  if (halves.length === 1 ? known !== 8 : known > 7) return null;
  return [...head, ...new Array<number>(8 - known).fill(0), ...rest, ...tail];
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
