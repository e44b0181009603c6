// RouterGuard: one Durable Object for the whole router (`idFromName('global')`) that holds what
// operator authentication must agree on across isolates: failed-credential counts per client
// (the admin API, /metrics, the dashboard login) and the dashboard sessions revoked by logout.
// Counters are soft state in memory (an eviction forgives a client early); revoked sessions are
// persisted in SQLite until they would have expired anyway. I/O: DO storage only.

import { DurableObject } from 'cloudflare:workers';

export interface GuardVerdict {
  /** False: the client is over its failure budget; answer 429 whatever it sent. */
  ok: boolean;
  retryAfterMs: number;
}

interface Window {
  start: number;
  failures: number;
}

const MAX_CLIENTS = 50_000;

export class RouterGuardImpl extends DurableObject<Env> {
  private readonly windows = new Map<string, Window>();
  private readonly revoked = new Map<string, number>();
  private readonly sql: SqlStorage;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec('CREATE TABLE IF NOT EXISTS revoked_sessions (id TEXT PRIMARY KEY, expires INTEGER NOT NULL)');
    const now = Date.now();
    this.sql.exec('DELETE FROM revoked_sessions WHERE expires <= ?', now);
    for (const r of this.sql.exec<{ id: string; expires: number }>('SELECT id, expires FROM revoked_sessions').toArray()) this.revoked.set(r.id, r.expires);
  }

  /**
   * One credential check by `client` (fixed window of `windowMs`, at most `maxFailures` failed
   * ones): a client over the budget is refused even with the right credential, so guessing
   * cannot go on more slowly and still learn which guess was right.
   */
  admit(client: string, failed: boolean, maxFailures: number, windowMs: number): GuardVerdict {
    const now = Date.now();
    let w = this.windows.get(client);
    if (!w || now - w.start >= windowMs) {
      if (!w && this.windows.size >= MAX_CLIENTS) this.sweep(now, windowMs);
      w = { start: now, failures: 0 };
      this.windows.set(client, w);
    }
    const over = w.failures >= maxFailures;
    if (failed) w.failures++;
    return { ok: !over, retryAfterMs: over ? w.start + windowMs - now : 0 };
  }

  /** Logout: the session id is refused until it expires. */
  revokeSession(id: string, expires: number): void {
    if (typeof id !== 'string' || !/^[0-9a-f]{32}$/.test(id)) return;
    this.revoked.set(id, expires);
    this.sql.exec('INSERT OR REPLACE INTO revoked_sessions (id, expires) VALUES (?, ?)', id, expires);
  }

  isSessionRevoked(id: string): boolean {
    const exp = this.revoked.get(id);
    if (exp === undefined) return false;
    if (exp <= Date.now()) {
      this.revoked.delete(id);
      this.sql.exec('DELETE FROM revoked_sessions WHERE id = ?', id);
      return false;
    }
    return true;
  }

  private sweep(now: number, windowMs: number): void {
    for (const [k, w] of this.windows) if (now - w.start >= windowMs) this.windows.delete(k);
    if (this.windows.size >= MAX_CLIENTS) this.windows.clear();
  }
}
