// Which replica stored each Responses API response, per tenant: the coordinator's table that a
// follow-up (`previous_response_id`), a retrieve, a cancel or a background poll is pinned by.
// I/O: the Durable Object's SQLite storage (it must survive a coordinator restart: the replicas
// keep their stored responses when the coordinator is evicted, and every later turn needs them).
//
// vLLM keeps stored responses in the memory of the instance that made them
// (VLLM_ENABLE_RESPONSES_API_STORE), so only that replica can answer for an id. Rows are keyed by
// (tenant, id): a tenant can reach only ids its own requests produced. Bounded: a TTL
// (`responseAffinityTtlMs`) and a row cap (`responseAffinityMaxEntries`), oldest forgotten first.
// A row whose replica answered `store: false` (its store is off) is kept, marked not stored: a
// later follow-up of it is refused at once with the reason, not sent to a replica that will 404.

const SCHEMA = `CREATE TABLE IF NOT EXISTS response_affinity (tenant TEXT NOT NULL, id TEXT NOT NULL, replica TEXT NOT NULL, expires INTEGER NOT NULL, stored INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS response_affinity_expires ON response_affinity (expires);`;

/** Longest response id kept; vLLM's are `resp_` + 32 hex. */
export const MAX_RESPONSE_ID_CHARS = 256;
/** Expired rows deleted per write, so cleanup never costs one request much. */
const PRUNE_BATCH = 64;

export class ResponseAffinity {
  readonly #sql: SqlStorage;
  #rows: number;

  constructor(sql: SqlStorage) {
    this.#sql = sql;
    sql.exec(SCHEMA);
    // Tables made before the `stored` column: added in place (every old row was stored as far as anyone knew).
    const columns = sql.exec<{ name: string }>('PRAGMA table_info(response_affinity)').toArray();
    if (!columns.some((c) => c.name === 'stored')) sql.exec('ALTER TABLE response_affinity ADD COLUMN stored INTEGER NOT NULL DEFAULT 1');
    this.#rows = sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM response_affinity').one().n;
  }

  get size(): number {
    return this.#rows;
  }

  /** The replica that stored `id` for `tenant`, or null when unknown or expired. */
  lookup(tenant: string, id: string, now: number): string | null {
    return this.find(tenant, id, now)?.replica ?? null;
  }

  /** The row of `id` for `tenant`: its replica and whether that replica stored it; null when unknown or expired. */
  find(tenant: string, id: string, now: number): { replica: string; stored: boolean } | null {
    const row = this.#sql.exec<{ replica: string; expires: number; stored: number }>('SELECT replica, expires, stored FROM response_affinity WHERE tenant = ? AND id = ?', tenant, id).toArray()[0];
    return row && row.expires > now ? { replica: row.replica, stored: row.stored !== 0 } : null;
  }

  /** The replica answered `store: false` for `id`: keep the row (its TTL), marked not stored. */
  markNotStored(tenant: string, id: string): void {
    this.#sql.exec('UPDATE response_affinity SET stored = 0 WHERE tenant = ? AND id = ?', tenant, id);
  }

  /** Remember (or move, on a retry) `id` as stored by `replica`. */
  record(tenant: string, id: string, replica: string, now: number, ttlMs: number, maxEntries: number): void {
    if (id.length === 0 || id.length > MAX_RESPONSE_ID_CHARS) return;
    const existed = this.#sql.exec('SELECT 1 FROM response_affinity WHERE tenant = ? AND id = ?', tenant, id).toArray().length > 0;
    this.#sql.exec('INSERT OR REPLACE INTO response_affinity (tenant, id, replica, expires, stored) VALUES (?, ?, ?, ?, 1)', tenant, id, replica, now + ttlMs);
    if (!existed) this.#rows++;
    this.#prune(now, maxEntries);
  }

  #prune(now: number, maxEntries: number): void {
    const expired = this.#sql.exec<{ r: number }>('SELECT rowid AS r FROM response_affinity WHERE expires <= ? LIMIT ?', now, PRUNE_BATCH).toArray();
    const over = Math.max(0, this.#rows - expired.length - maxEntries);
    const oldest = over > 0 ? this.#sql.exec<{ r: number }>('SELECT rowid AS r FROM response_affinity WHERE expires > ? ORDER BY expires LIMIT ?', now, over).toArray() : [];
    for (const batch of [expired, oldest]) {
      if (batch.length === 0) continue;
      this.#sql.exec(`DELETE FROM response_affinity WHERE rowid IN (${batch.map(() => '?').join(',')})`, ...batch.map((x) => x.r));
      this.#rows -= batch.length;
    }
  }
}
