// Revoked API keys as a pool's coordinator holds them: `tenant/keyId` strings pushed by the admin
// API's revoke call, persisted in the object's SQLite storage (they survive eviction and restarts)
// and held in memory for the check in every acquire. I/O: DO SQLite only.

/** A revocation is kept this long: past every cache that could still hold the key (tenantCacheMs ≤ 5 min, KV's own ≤ 1 min). */
export const REVOCATION_TTL_MS = 7 * 24 * 3600_000;
/** Most revocations kept per coordinator; the oldest go first. */
const MAX_REVOCATIONS = 100_000;

export class RevocationList {
  private readonly ids = new Map<string, number>();

  constructor(private readonly sql: SqlStorage) {
    sql.exec('CREATE TABLE IF NOT EXISTS revoked_keys (key_id TEXT PRIMARY KEY, at INTEGER NOT NULL)');
    const now = Date.now();
    sql.exec('DELETE FROM revoked_keys WHERE at < ?', now - REVOCATION_TTL_MS);
    for (const row of sql.exec<{ key_id: string; at: number }>('SELECT key_id, at FROM revoked_keys ORDER BY at').toArray()) this.ids.set(row.key_id, row.at);
  }

  has(keyId: string): boolean {
    return this.ids.size > 0 && this.ids.has(keyId);
  }

  /** Add (idempotent); returns how many are held now. */
  add(keyIds: readonly string[], now: number): number {
    for (const id of keyIds) {
      if (typeof id !== 'string' || id.length === 0 || id.length > 200) continue;
      this.ids.set(id, now);
      this.sql.exec('INSERT OR REPLACE INTO revoked_keys (key_id, at) VALUES (?, ?)', id, now);
    }
    if (this.ids.size > MAX_REVOCATIONS) {
      for (const [id] of this.ids) {
        if (this.ids.size <= MAX_REVOCATIONS) break;
        this.ids.delete(id);
        this.sql.exec('DELETE FROM revoked_keys WHERE key_id = ?', id);
      }
    }
    return this.ids.size;
  }
}
