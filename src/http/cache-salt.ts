// The engine's prefix-cache partition per tenant: vLLM's `cache_salt` (CVE-2025-46570) set to a
// keyed HMAC-SHA256 of the tenant id under the router secret CACHE_SALT_KEY, so no client can
// choose, guess or share another tenant's salt, and rotating the key re-partitions every cache.
// The client's session header goes upstream the same way: a per-tenant HMAC of it, never the raw
// value (`sessionTagFor`). I/O: WebCrypto only; salts are cached per isolate (bounded).

import type { PoolRuntime } from '../config.js';

/** Shortest CACHE_SALT_KEY accepted (a 256-bit key written as base64 is 43-44 characters). */
export const MIN_CACHE_SALT_KEY_CHARS = 32;

export type CacheSaltResult = { ok: true; salt: string | null } | { ok: false; message: string };

/** Why the deployment cannot salt caches, or null: a pool needs salts and CACHE_SALT_KEY is unusable. */
export function cacheSaltProblem(env: { CACHE_SALT_KEY?: string }, pools: readonly PoolRuntime[]): string | null {
  if (!pools.some((p) => p.cacheSalt !== 'off')) return null;
  const key = env.CACHE_SALT_KEY;
  if (typeof key !== 'string' || key.trim().length < MIN_CACHE_SALT_KEY_CHARS) {
    return `CACHE_SALT_KEY is ${typeof key === 'string' ? `shorter than ${MIN_CACHE_SALT_KEY_CHARS} characters` : 'not set'}; pools with cacheSalt "tenant" or "shared" refuse requests until it is (wrangler secret put CACHE_SALT_KEY, e.g. openssl rand -base64 32)`;
  }
  return null;
}

let imported: { raw: string; key: Promise<CryptoKey> } | undefined;
const salts = new Map<string, string>();
const MAX_CACHED = 10_000;

/**
 * The `cache_salt` for a request of `tenant` to `pool`: `tenant` pools salt by tenant, `shared`
 * pools by pool (their tenants share prefixes with each other, not with other pools' requests on
 * the same replicas), `off` pools send none. A missing or short key fails: a salt nobody keyed
 * would be guessable, and an unsalted request would share the cache silently.
 */
export async function cacheSaltFor(env: { CACHE_SALT_KEY?: string }, pool: PoolRuntime, tenant: string): Promise<CacheSaltResult> {
  if (pool.cacheSalt === 'off') return { ok: true, salt: null };
  const raw = env.CACHE_SALT_KEY;
  if (typeof raw !== 'string' || raw.trim().length < MIN_CACHE_SALT_KEY_CHARS) return { ok: false, message: cacheSaltProblem(env, [pool])! };
  const subject = pool.cacheSalt === 'shared' ? `shared\u0000${pool.name}` : `tenant\u0000${tenant}`;
  const key = keyFor(raw);
  const hit = salts.get(subject);
  if (hit !== undefined) return { ok: true, salt: hit };
  const salt = await mac(await key, subject);
  if (salts.size >= MAX_CACHED) salts.delete(salts.keys().next().value!);
  salts.set(subject, salt);
  return { ok: true, salt };
}

/**
 * What the origin gets for the client's session header: base64url(HMAC-SHA256(CACHE_SALT_KEY,
 * "session" ‖ tenant ‖ value)), 43 characters, or null (nothing is sent) when there is no value
 * or no usable key. The newest vLLM reads `X-Session-ID`; a raw value would let two tenants that
 * pick the same id (or a tenant that guesses another's) meet under one session upstream and would
 * hand the origin (its logs, its own router) an identifier the tenant chose. The tag keeps a
 * session's requests together upstream, per tenant, and says nothing about the value.
 */
export async function sessionTagFor(env: { CACHE_SALT_KEY?: string }, tenant: string, value: string | null | undefined): Promise<string | null> {
  if (value === null || value === undefined || value === '') return null;
  const raw = env.CACHE_SALT_KEY;
  if (typeof raw !== 'string' || raw.trim().length < MIN_CACHE_SALT_KEY_CHARS) return null;
  return mac(await keyFor(raw), `session\u0000${tenant}\u0000${value}`);
}

/** The HMAC key for CACHE_SALT_KEY, imported once per isolate (a new key drops the cached salts). */
function keyFor(raw: string): Promise<CryptoKey> {
  if (imported?.raw !== raw) {
    imported = { raw, key: crypto.subtle.importKey('raw', new TextEncoder().encode(raw.trim()), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']) };
    salts.clear();
  }
  return imported.key;
}

async function mac(key: CryptoKey, subject: string): Promise<string> {
  const bytes = new Uint8Array(await crypto.subtle.sign('HMAC', key, new TextEncoder().encode(subject)));
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
