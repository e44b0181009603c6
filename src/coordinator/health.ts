// Replica health: active checks (`GET /health` with the origin's auth, HAProxy fall/rise) and
// passive exclusion from real traffic (NGINX max_fails within a window, then out for a timeout).
// I/O: health-check fetches to the replicas.

import { replicaEndpoint, type PoolRuntime } from '../config.js';
import { resolveOriginAuth } from '../origin/origin-auth.js';
import { runLimited } from './origin-fetch.js';
import { unpinEngines } from './replicas.js';
import { boundPool, type PoolState, type ReplicaLive } from './state.js';

/** One round of active health checks over every replica, at most healthConcurrency at once. */
export async function checkHealth(s: PoolState, pool: PoolRuntime): Promise<void> {
  await runLimited(s.replicas.map((r) => () => checkOne(s, r, pool)), pool.healthConcurrency);
}

export async function checkOne(s: PoolState, r: ReplicaLive, pool: PoolRuntime): Promise<void> {
  const url = r.url;
  const ok = await probe(s.env, r, pool.healthTimeoutMs);
  // Removed or moved meanwhile: the answer is about an origin it no longer is (scrapeOne too).
  if (!s.replicas.includes(r) || r.url !== url) return;
  r.lastCheckAt = Date.now();
  if (ok === null) {
    r.lastCheckError = null;
    r.consecutiveOks++;
    r.consecutiveFails = 0;
    if (!r.activeUp && r.consecutiveOks >= pool.rise) {
      r.activeUp = true;
      s.pickState.invalidate();
    }
  } else {
    r.lastCheckError = ok;
    r.consecutiveFails++;
    r.consecutiveOks = 0;
    if (r.activeUp && r.consecutiveFails >= pool.fall) {
      r.activeUp = false;
      s.pickState.invalidate();
      // A replica that went down may come back with an empty cache, and with other engines:
      // forget what each engine held, and pin nothing there until a scrape names its engines.
      unpinEngines(s, r);
    }
  }
}

/** A request on `r` failed for a reason that is the replica's: maxFails of them within failWindowMs take it out for failTimeoutMs. */
export function notePassiveFailure(s: PoolState, r: ReplicaLive, now: number): void {
  const pool = boundPool(s);
  if (!pool) return;
  r.failTimes = r.failTimes.filter((t) => t > now - pool.failWindowMs);
  r.failTimes.push(now);
  if (r.failTimes.length >= pool.maxFails) {
    r.passiveDownUntil = now + pool.failTimeoutMs;
    r.failTimes = [];
    s.pickState.invalidate();
  }
}

/** null when healthy, else why not. */
async function probe(env: Env, r: ReplicaLive, timeoutMs: number): Promise<string | null> {
  const auth = resolveOriginAuth(env, r.auth);
  if (!auth.ok) return auth.problem;
  try {
    // The timeout starts here, when the fetch leaves (runLimited holds the rest back); a redirect is a failure.
    const res = await fetch(replicaEndpoint(r.url, '/health'), { headers: auth.headers, redirect: 'manual', signal: AbortSignal.timeout(timeoutMs) });
    await res.body?.cancel();
    return res.ok ? null : res.status >= 300 && res.status < 400 ? `redirect (status ${res.status}) not followed` : `status ${res.status}`;
  } catch (e) {
    return (e as Error).name === 'TimeoutError' ? 'timeout' : 'connection failed';
  }
}
