// The post-deploy check behind `npm run deploy:verify <URL>`: asks the deployed router itself
// whether it can serve. /healthz (configuration and the cache-salt key), every pool's replicas as
// its coordinator sees them after its own health checks (GET /admin/pools/:pool with the admin
// token), and, given a tenant key, one streamed answer through the router. Every request has a
// timeout and the wait for first health rounds is bounded. I/O: HTTP to the router only.

export interface VerifyOptions {
  /** The router's base URL, e.g. https://llm.example.com (no trailing slash needed). */
  url: string;
  adminToken: string;
  /** A tenant key: also send one streamed chat completion through the router. */
  tenantKey?: string;
  /** The model for that request (default: the first model of the first pool). */
  model?: string;
  /** Per-request timeout (default 10 s). */
  timeoutMs?: number;
  /** How long to wait for every replica's first health check (default 30 s). */
  waitMs?: number;
  fetch?: typeof fetch;
  log?: (line: string) => void;
}

export interface ReplicaVerdict {
  pool: string;
  id: string;
  url: string;
  state: 'ok' | 'down' | 'draining' | 'unchecked';
  detail: string;
}

export interface VerifyResult {
  ok: boolean;
  healthz: string;
  replicas: ReplicaVerdict[];
  stream?: { ok: boolean; detail: string };
  problems: string[];
}

interface PoolListing {
  pools: { name: string; models: string[]; replicas: number; healthy: number }[];
}
interface ReplicaView {
  id: string;
  url: string;
  draining: boolean;
  healthy: boolean;
  lastCheckAt: number;
  lastCheckError: string | null;
}

export async function verifyDeployment(o: VerifyOptions): Promise<VerifyResult> {
  const base = o.url.replace(/\/+$/, '');
  const f = o.fetch ?? fetch;
  const log = o.log ?? (() => {});
  const timeoutMs = o.timeoutMs ?? 10_000;
  const problems: string[] = [];
  const get = async (path: string, auth?: string): Promise<{ status: number; text: string }> => {
    const res = await f(base + path, { headers: auth ? { authorization: `Bearer ${auth}` } : {}, signal: AbortSignal.timeout(timeoutMs), redirect: 'manual' });
    return { status: res.status, text: await res.text() };
  };

  // 1. /healthz: the configuration parsed and the cache-salt key is set.
  let healthz = 'unreachable';
  try {
    const h = await get('/healthz');
    healthz = h.status === 200 ? 'ok' : `${h.status} ${h.text.slice(0, 200)}`;
    if (h.status !== 200) problems.push(`/healthz answered ${healthz} (misconfigured: the Worker's logs name the field; docs/deploy.md)`);
  } catch (e) {
    problems.push(`/healthz: ${errorText(e)} (is the route or custom domain in place?)`);
  }
  log(`healthz: ${healthz}`);

  // 2. Pools and their replicas, as each coordinator's health checks see them.
  let listing: PoolListing | undefined;
  try {
    const l = await get('/admin/pools', o.adminToken);
    if (l.status === 200) listing = JSON.parse(l.text) as PoolListing;
    else problems.push(`GET /admin/pools answered ${l.status}${l.status === 401 ? ' (ADMIN_TOKEN is not the deployed one)' : l.status === 429 ? ' (this address is over the failed-credential budget; wait)' : ''}`);
  } catch (e) {
    problems.push(`GET /admin/pools: ${errorText(e)}`);
  }
  const replicas: ReplicaVerdict[] = [];
  if (listing) {
    const deadline = Date.now() + (o.waitMs ?? 30_000);
    for (const pool of listing.pools) {
      let views: ReplicaView[] = [];
      // A coordinator that just started has not checked its replicas yet: poll, bounded.
      for (let attempt = 0; attempt < 1_000; attempt++) {
        try {
          const p = await get(`/admin/pools/${encodeURIComponent(pool.name)}`, o.adminToken);
          if (p.status !== 200) {
            problems.push(`GET /admin/pools/${pool.name} answered ${p.status}`);
            break;
          }
          views = (JSON.parse(p.text) as { replicas: ReplicaView[] }).replicas;
        } catch (e) {
          problems.push(`GET /admin/pools/${pool.name}: ${errorText(e)}`);
          break;
        }
        if (views.every((r) => r.draining || r.lastCheckAt > 0) || Date.now() >= deadline) break;
        await new Promise((r) => setTimeout(r, 500));
      }
      if (views.length === 0) problems.push(`pool ${pool.name} has no replicas (add them: PUT /admin/pools/${pool.name}/replicas/<id>)`);
      for (const r of views) {
        const v = verdictOf(pool.name, r);
        replicas.push(v);
        log(`${pool.name}/${r.id} ${r.url}: ${v.state}${v.detail ? ` (${v.detail})` : ''}`);
        if (v.state === 'down' || v.state === 'unchecked') problems.push(`${pool.name}/${r.id} ${r.url}: ${v.state}${v.detail ? `: ${v.detail}` : ''}`);
      }
    }
  }

  // 3. One streamed answer through the router, as a tenant.
  let stream: VerifyResult['stream'];
  if (o.tenantKey) {
    const model = o.model ?? listing?.pools[0]?.models[0];
    stream = model ? await streamOnce(f, base, o.tenantKey, model, timeoutMs) : { ok: false, detail: 'no model to ask (no pools listed; pass --model)' };
    log(`stream (${model ?? '?'}): ${stream.ok ? 'ok' : 'failed'}: ${stream.detail}`);
    if (!stream.ok) problems.push(`streamed request: ${stream.detail}`);
  }
  return { ok: problems.length === 0, healthz, replicas, ...(stream ? { stream } : {}), problems };
}

function verdictOf(pool: string, r: ReplicaView): ReplicaVerdict {
  const base = { pool, id: r.id, url: r.url };
  if (r.draining) return { ...base, state: 'draining', detail: 'takes no new requests' };
  if (r.lastCheckAt === 0) return { ...base, state: 'unchecked', detail: 'no health check has run yet' };
  if (r.healthy) return { ...base, state: 'ok', detail: '' };
  return { ...base, state: 'down', detail: hintFor(r.lastCheckError) };
}

/** What a failed check usually means behind Cloudflare (docs/deploy.md, "Troubleshooting"). */
function hintFor(error: string | null): string {
  if (!error) return 'failed its health checks';
  const hints: [RegExp, string][] = [
    [/\b401\b|\b403\b/, 'the origin refused the credentials: check the auth reference\'s secret (vLLM --api-key, or the Access service token and its policy)'],
    [/\b52[0-9]\b/, 'Cloudflare could not reach the origin: is cloudflared running and the Tunnel\'s service http://localhost:8000?'],
    [/\b530\b|1016/, 'the hostname does not resolve (DNS record or Tunnel route missing)'],
    [/timeout|timed out/i, 'no answer within healthTimeoutMs'],
  ];
  const hint = hints.find(([re]) => re.test(error))?.[1];
  return hint ? `${error}: ${hint}` : error;
}

async function streamOnce(f: typeof fetch, base: string, key: string, model: string, timeoutMs: number): Promise<{ ok: boolean; detail: string }> {
  const started = Date.now();
  try {
    const res = await f(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model, stream: true, max_tokens: 8, messages: [{ role: 'user', content: 'Say hello.' }] }),
      signal: AbortSignal.timeout(timeoutMs * 3),
    });
    if (res.status !== 200 || !res.body) return { ok: false, detail: `${res.status} ${(await res.text()).slice(0, 300)}` };
    const replica = res.headers.get('x-prefix-router-replica');
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let text = '';
    let firstTokenMs: number | null = null;
    for (let i = 0; i < 10_000; i++) {
      const { value, done } = await reader.read();
      if (done) break;
      text += value;
      if (firstTokenMs === null && /"content":"[^"]/.test(text)) firstTokenMs = Date.now() - started;
      if (text.includes('data: [DONE]')) break;
    }
    await reader.cancel().catch(() => {});
    if (firstTokenMs === null) return { ok: false, detail: `the stream carried no content (${text.slice(0, 200)})` };
    return { ok: true, detail: `first token after ${firstTokenMs} ms${replica ? ` from replica ${replica}` : ''}` };
  } catch (e) {
    return { ok: false, detail: errorText(e) };
  }
}

function errorText(e: unknown): string {
  const err = e as Error & { cause?: { code?: string } };
  return `${err.name === 'TimeoutError' ? 'timed out' : err.message}${err.cause?.code ? ` (${err.cause.code})` : ''}`;
}
