// Secrets the router reads (set with `wrangler secret put`; `npm start` passes dev values).
// Bindings, vars and the runtime's types come from `wrangler types`, generated from wrangler.toml
// into .wrangler/types/worker-configuration.d.ts (not committed) by `npm run types`, which
// `npm run typecheck` runs first whenever the file is missing or stale.
declare namespace Cloudflare {
  interface Env {
    /** Admin API and dashboard token (at least 16 characters). */
    ADMIN_TOKEN?: string;
    /** Optional token for scraping /metrics without the admin token. */
    METRICS_TOKEN?: string;
    /** Small deployments: tenants and key hashes as JSON (see docs/operations.md). */
    TENANT_KEYS?: string;
    /** Key of the tenants' vLLM cache_salt (HMAC-SHA256; at least 32 characters, e.g. `openssl rand -base64 32`). */
    CACHE_SALT_KEY?: string;
  }
}
