// Replica URLs: which origins a Worker on Cloudflare's edge can reach (https to a hostname on one
// of Cloudflare's HTTPS ports; no IP literals; no private, link-local or metadata addresses;
// loopback only for a local run), their stored form and how an API path joins them. Pure: the
// URL parser and zod only. The configuration (src/config.ts) and the admin API validate with it.

import { z } from 'zod';

export const replicaUrlSchema = z
  .string()
  .superRefine((s, ctx) => {
    const problem = replicaUrlProblem(s);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  })
  .transform(normalizeReplicaUrl);

/**
 * The stored form of an accepted replica URL: scheme, host, port and path as the URL parser
 * normalised them, without a trailing slash (`https://GW.example.com:443/vllm-1/` →
 * `https://gw.example.com/vllm-1`), so what the snapshot shows is what is fetched.
 */
export function normalizeReplicaUrl(s: string): string {
  const u = new URL(s);
  return `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, '')}`;
}

/** A replica's base URL joined with an API path: the base's own path is kept (`https://gw/vllm-1` + `/v1/models`). */
export function replicaEndpoint(base: string, path: string): string {
  return base.replace(/\/+$/, '') + path;
}

/**
 * HTTPS ports Cloudflare's proxy serves (developers.cloudflare.com/fundamentals/reference/network-ports/,
 * "HTTPS ports supported by Cloudflare"). With `allow_custom_ports` (on by default since compatibility
 * date 2024-09-02, src/content/compatibility-flags/allow-custom-ports.md in cloudflare/cloudflare-docs) a
 * Worker's fetch to a host proxied by Cloudflare ("orange clouded", which Tunnel and Access hostnames
 * are) may name only these ports: any other is ignored and the request goes to 443. Miniflare honours
 * every port, so `https://vllm.example.com:8000` works locally and reaches :443 on the edge.
 */
export const CLOUDFLARE_HTTPS_PORTS = [443, 2053, 2083, 2087, 2096, 8443] as const;

/**
 * Where the configuration will run. `edge` (what `npm run deploy:check` validates): every origin
 * must be reachable from Cloudflare's network. `local` (`npm start`, tests, and the Worker itself,
 * which cannot tell Miniflare from the edge): the same rules, except that loopback origins
 * (127.0.0.0/8, ::1, localhost) are accepted over http or https on any port. On the edge a loopback
 * origin reaches nothing (an IP address, and not one of the deployment's), so accepting it at run
 * time costs a replica that is always down, never a request to somewhere else.
 */
export type OriginTarget = 'edge' | 'local';

/**
 * Why a replica URL is not acceptable, or null. https to a hostname on one of Cloudflare's HTTPS
 * ports; no IP addresses; plain http and any port only for loopback, and only for a `local` target.
 */
export function replicaUrlProblem(s: string, target: OriginTarget = 'local'): string | null {
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    return 'is not a URL';
  }
  if (s.includes('\\')) return 'must not contain a backslash';
  if (u.username || u.password || s.includes('@')) return 'must not carry credentials (use an auth reference)';
  if (u.search || u.hash) return 'must not have a query or fragment';
  if (u.protocol !== 'https:' && u.protocol !== 'http:') return 'must use https';
  // A trailing dot names the same host (`metadata.google.internal.`).
  const host = u.hostname.replace(/^\[|\]$/g, '').toLowerCase().replace(/\.$/, '');
  // 127.0.0.0/8 as an address only: `127.0.0.1.example.com` is a public name that resolves anywhere.
  const loopback = host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
  // The URL parser turns `2130706433`, `0x7f.1`, `0251.0376.0251.0376` or fullwidth digits into a
  // dotted quad; only the plain spelling is accepted, so what an operator reads is what is fetched.
  const oddlyWritten = IPV4.test(host) && writtenHost(s) !== host;
  if (loopback) {
    if (oddlyWritten) return 'must write an IPv4 address as four decimal numbers (a.b.c.d)';
    if (target === 'edge') return `is a loopback address (${host}), which only a local run can reach: the edge cannot. Use the replica's public hostname (a Cloudflare Tunnel public hostname in front of it: docs/deploy.md)`;
    return null;
  }
  if (u.protocol === 'http:') return 'must use https (plain http is allowed only for a loopback origin in local development; on the edge put vLLM behind a Cloudflare Tunnel hostname: docs/deploy.md)';
  if (isPrivateHost(host)) return 'points at a private, link-local or metadata address';
  if (oddlyWritten) return 'must write an IPv4 address as four decimal numbers (a.b.c.d)';
  // Workers subrequests cannot go to IP addresses (developers.cloudflare.com/workers/platform/known-issues/,
  // "Fetch to IP addresses"); Miniflare fetches them, so only this check says so before a deploy.
  if (IPV4.test(host) || host.includes(':')) return `is an IP address (${host}): Workers subrequests can only go to hostnames, not IP addresses. Create a DNS record (A/AAAA, or a Cloudflare Tunnel public hostname) for it and use that name`;
  const port = u.port === '' ? 443 : Number(u.port);
  if (!(CLOUDFLARE_HTTPS_PORTS as readonly number[]).includes(port)) {
    return `uses port ${port}, which Cloudflare's proxy does not serve for HTTPS (${CLOUDFLARE_HTTPS_PORTS.join(', ')}): a Worker's request to a proxied hostname (Tunnel, Access) on another port silently goes to 443. Serve the replica on 443, e.g. a Tunnel public hostname whose service is http://localhost:${port} (docs/deploy.md)`;
  }
  return null;
}

const IPV4 = /^(\d+)\.(\d+)\.(\d+)\.(\d+)$/;

/** The host as written in the URL string: between `//` (after any userinfo) and the port or path. */
function writtenHost(s: string): string {
  const m = /^\s*[a-z][a-z0-9+.-]*:[\\/]*([^/?#\\]*)/i.exec(s.replace(/[\t\n\r]/g, ''));
  const authority = (m?.[1] ?? '').slice((m?.[1] ?? '').lastIndexOf('@') + 1);
  return authority.replace(/:\d*$/, '').toLowerCase().replace(/\.$/, '');
}

/**
 * IPv4 ranges no replica may be in (RFC 6890 special-purpose): this network, private, shared
 * (CGNAT), link-local (cloud metadata), IETF protocol assignments, the three documentation nets,
 * benchmarking (198.18.0.0/15), multicast, reserved and broadcast. Loopback is decided by the caller.
 */
function isBlockedV4(a: number, b: number, c: number): boolean {
  return (
    a === 0 ||
    a === 10 ||
    a === 127 ||
    (a === 100 && b >= 64 && b <= 127) ||
    (a === 169 && b === 254) ||
    (a === 172 && b >= 16 && b <= 31) ||
    (a === 192 && b === 0 && (c === 0 || c === 2)) ||
    (a === 192 && b === 168) ||
    (a === 198 && (b === 18 || b === 19)) ||
    (a === 198 && b === 51 && c === 100) ||
    (a === 203 && b === 0 && c === 113) ||
    a >= 224
  );
}

/** The eight 16-bit groups of an IPv6 address as the URL parser writes it (compressed, lower case, no dotted quad). */
function ipv6Groups(host: string): number[] | null {
  const [head, tail, more] = host.split('::');
  if (more !== undefined) return null;
  const h = head ? head.split(':') : [];
  const t = tail !== undefined && tail !== '' ? tail.split(':') : [];
  const fill = tail === undefined ? 0 : 8 - h.length - t.length;
  if (fill < 0) return null;
  const groups = [...h, ...Array(fill).fill('0'), ...t].map((g) => parseInt(g, 16));
  return groups.length === 8 && groups.every((g) => Number.isInteger(g) && g >= 0 && g <= 0xffff) ? groups : null;
}

function isPrivateHost(host: string): boolean {
  if (host === 'metadata.google.internal' || host.endsWith('.internal') || host.endsWith('.local') || host.endsWith('.localhost')) return true;
  const v4 = host.match(IPV4);
  if (v4) return isBlockedV4(Number(v4[1]), Number(v4[2]), Number(v4[3]));
  if (host.includes(':')) {
    // Unspecified, loopback, IPv4-mapped (::ffff:0:0/96) and -compatible (::/96), NAT64 (64:ff9b::/96,
    // 64:ff9b:1::/48), link-local (fe80::/10), site-local (fec0::/10), unique local (fc00::/7),
    // multicast (ff00::/8), documentation (2001:db8::/32), Teredo (2001::/32): all refused.
    if (host.startsWith('::') || host.startsWith('64:ff9b:') || /^f[c-f]/.test(host) || /^2001:(db8|0?):/.test(host)) return true;
    const g = ipv6Groups(host);
    if (!g) return true;
    // 6to4 (2002::/16) carries an IPv4 address in groups 1-2: refused when that address is.
    if (g[0] === 0x2002) return isBlockedV4(g[1]! >> 8, g[1]! & 0xff, g[2]! >> 8) || (g[1]! >> 8) === 127;
    return false;
  }
  // A single label (`metadata`, `instance-data`) resolves through the local search domain, never
  // to a public origin; numeric forms the URL parser did not normalise are refused outright.
  return !host.includes('.') || /^0x/i.test(host) || /^\d+$/.test(host);
}
