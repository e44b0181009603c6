// Which replica stored each Responses API response, per tenant: the coordinator's table that a
// follow-up (`previous_response_id`), a retrieve, a cancel or a background poll is pinned by.
// I/O: the Durable Object's SQLite storage (it must survive a coordinator restart: the replicas
// keep their stored responses when the coordinator is evicted, and every later turn needs them).
//
// vLLM keeps stored responses in the memory of the instance that made them
// (VLLM_ENABLE_RESPONSES_API_STORE), so only that replica can answer for an id. Rows are keyed by
// (tenant, id): a tenant can reach only ids its own requests produced. Bounded: a TTL
// (`responseAffinityTtlMs`) and a row cap (`responseAffinityMaxEntries`), oldest forgotten first.

const SCHEMA = `CREATE TABLE IF NOT EXISTS response_affinity (tenant TEXT NOT NULL, id TEXT NOT NULL, replica TEXT NOT NULL, expires INTEGER NOT NULL, PRIMARY KEY (tenant, id));
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
    this.#rows = sql.exec<{ n: number }>('SELECT COUNT(*) AS n FROM response_affinity').one().n;
  }

  get size(): number {
    return this.#rows;
  }

  /** The replica that stored `id` for `tenant`, or null when unknown or expired. */
  lookup(tenant: string, id: string, now: number): string | null {
    const row = this.#sql.exec<{ replica: string; expires: number }>('SELECT replica, expires FROM response_affinity WHERE tenant = ? AND id = ?', tenant, id).toArray()[0];
    return row && row.expires > now ? row.replica : null;
  }

  /** Remember (or move, on a retry) `id` as stored by `replica`. */
  record(tenant: string, id: string, replica: string, now: number, ttlMs: number, maxEntries: number): void {
    if (id.length === 0 || id.length > MAX_RESPONSE_ID_CHARS) return;
    const existed = this.#sql.exec('SELECT 1 FROM response_affinity WHERE tenant = ? AND id = ?', tenant, id).toArray().length > 0;
    this.#sql.exec('INSERT OR REPLACE INTO response_affinity (tenant, id, replica, expires) VALUES (?, ?, ?, ?)', tenant, id, replica, now + ttlMs);
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
