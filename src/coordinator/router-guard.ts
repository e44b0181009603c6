// RouterGuard: one Durable Object for the whole router (`idFromName('global')`) that holds what
// operator authentication must agree on across isolates: failed-credential counts per client
// (the admin API, /metrics, the dashboard login) and the dashboard sessions revoked by logout.
// Both live in SQLite: an object with no request for 10 s is hibernated and its memory discarded
// (cloudflare-docs durable-objects/concepts/durable-object-lifecycle.mdx), so counts kept only in
// memory forgave every guess spaced more than 10 s apart. I/O: DO storage only.

import { DurableObject } from 'cloudflare:workers';

export interface GuardVerdict {
  /** False: the client is over its failure budget; answer 429 whatever it sent. */
  ok: boolean;
  retryAfterMs: number;
}

type Window = {
  start: number;
  failures: number;
};

/** Clients whose failure window is kept; past it the oldest windows are dropped (forgiven early). */
const MAX_CLIENTS = 50_000;
/** Expired windows are deleted at most this often (on a failure). */
const PRUNE_EVERY_MS = 60_000;

export class RouterGuardImpl extends DurableObject<Env> {
  private readonly revoked = new Map<string, number>();
  private readonly sql: SqlStorage;
  private lastPrune = 0;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec('CREATE TABLE IF NOT EXISTS revoked_sessions (id TEXT PRIMARY KEY, expires INTEGER NOT NULL)');
    this.sql.exec('CREATE TABLE IF NOT EXISTS auth_windows (client TEXT PRIMARY KEY, start INTEGER NOT NULL, failures INTEGER NOT NULL)');
    this.sql.exec('CREATE INDEX IF NOT EXISTS auth_windows_start ON auth_windows (start)');
    const now = Date.now();
    this.sql.exec('DELETE FROM revoked_sessions WHERE expires <= ?', now);
    for (const r of this.sql.exec<{ id: string; expires: number }>('SELECT id, expires FROM revoked_sessions').toArray()) this.revoked.set(r.id, r.expires);
  }

  /**
   * One credential check by `client` (fixed window of `windowMs`, at most `maxFailures` failed
   * ones): a client over the budget is refused even with the right credential, so guessing
   * cannot go on more slowly and still learn which guess was right. The window is read from and
   * a failure written to storage (SQLite reads are in-process; a failed credential is rare enough
   * that its write, which holds the answer until durable, costs nothing that matters).
   */
  admit(client: string, failed: boolean, maxFailures: number, windowMs: number): GuardVerdict {
    const now = Date.now();
    let w = this.sql.exec<Window>('SELECT start, failures FROM auth_windows WHERE client = ?', client).toArray()[0];
    if (!w || now - w.start >= windowMs) w = { start: now, failures: 0 };
    const over = w.failures >= maxFailures;
    if (failed) {
      this.sql.exec('INSERT OR REPLACE INTO auth_windows (client, start, failures) VALUES (?, ?, ?)', client, w.start, w.failures + 1);
      if (now - this.lastPrune >= PRUNE_EVERY_MS) this.prune(now, windowMs);
    }
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

  /** Expired windows go; beyond MAX_CLIENTS the oldest go too. */
  private prune(now: number, windowMs: number): void {
    this.lastPrune = now;
    this.sql.exec('DELETE FROM auth_windows WHERE start <= ?', now - windowMs);
    const n = this.sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM auth_windows').one().n;
    if (n > MAX_CLIENTS) this.sql.exec('DELETE FROM auth_windows WHERE client IN (SELECT client FROM auth_windows ORDER BY start LIMIT ?)', n - MAX_CLIENTS);
  }
}
