// The operators' dashboard in a real browser: four mock vLLM replicas, the router under
// Miniflare (workerd, as `npm start` runs it), Debian's chromium driven by playwright-core. Login
// sets the HttpOnly cookie; every replica shows; the numbers agree with /metrics; the page
// follows live traffic; it loads nothing from outside 127.0.0.1. Screenshot: test-results/.
// I/O: loopback sockets, the workerd process Miniflare spawns, a chromium process group, temp dirs.

import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startMockVllm, type MockVllm } from '../../tools/mock-engine/index.js';
import { startRouter, type RouterHandle } from '../helpers/router.js';

// page.evaluate() bodies run in the browser; the Node tsconfig has no DOM lib, so declare the
// little of it they touch.
interface DomElement {
  readonly dataset: Record<string, string | undefined>;
  readonly textContent: string | null;
  querySelectorAll(selector: string): Iterable<DomElement>;
}
declare const document: { readonly body: DomElement; readonly cookie: string; querySelectorAll(selector: string): Iterable<DomElement> };

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const ADMIN_TOKEN = `dash-admin-${Math.random().toString(36).slice(2)}-${Date.now()}`;
const ORIGIN_API_KEY = `dash-origin-${Math.random().toString(36).slice(2)}`;
const TENANT_KEY = `sk-dash-${Math.random().toString(36).slice(2)}`;
const MODEL = 'demo-model';
const POOLS = ['chat', 'extraction'] as const;

let mocks: MockVllm[] = [];
let router: RouterHandle | undefined;
let context: BrowserContext | undefined;
let page: Page;
let base = '';
const tmpDirs: string[] = [];
const pageRequests: string[] = [];

async function eventually<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs: number, everyMs = 200): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}\n--- router output ---\n${(router?.output() ?? '').slice(-3000)}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

// ---- /metrics --------------------------------------------------------------------------------

type Series = Map<string, number>; // `family{pool,replica}` summed over other labels → value

async function scrapeMetrics(): Promise<{ text: string; get: (family: string, pool: string, replica: string) => number }> {
  const res = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  expect(res.status).toBe(200);
  const text = await res.text();
  const series: Series = new Map();
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)\{pool="([^"]*)",replica="([^"]*)"[^}]*\} (\S+)$/.exec(line);
    if (!m) continue;
    const k = `${m[1]}|${m[2]}|${m[3]}`;
    series.set(k, (series.get(k) ?? 0) + Number(m[4]));
  }
  return { text, get: (f, p, r) => series.get(`${f}|${p}|${r}`) ?? 0 };
}

/** What the dashboard's table shows: pool → replica → field → text. */
async function readTables(): Promise<Record<string, Record<string, Record<string, string>>>> {
  return page.evaluate(() => {
    const out: Record<string, Record<string, Record<string, string>>> = {};
    for (const section of document.querySelectorAll('section[data-pool]')) {
      const pool = (out[section.dataset.pool!] = {} as Record<string, Record<string, string>>);
      for (const row of section.querySelectorAll('tr[data-replica]')) {
        const fields: Record<string, string> = {};
        for (const td of row.querySelectorAll('td[data-field]')) fields[td.dataset.field!] = td.textContent ?? '';
        pool[row.dataset.replica!] = fields;
      }
    }
    return out;
  });
}

const updates = (): Promise<number> => page.evaluate(() => Number(document.body.dataset.updates ?? 0));

async function waitForRender(after: number, timeoutMs = 12_000): Promise<number> {
  await page.waitForFunction((n) => Number(document.body.dataset.updates ?? 0) > n, after, { timeout: timeoutMs, polling: 100 });
  return updates();
}

// ---- traffic -----------------------------------------------------------------------------------

const SYSTEM = 'You are a careful assistant for the dashboard test. '.repeat(40); // ~500 tokens, shared prefix

async function chat(session: string, turn: number, pool?: string): Promise<void> {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TENANT_KEY}`, 'content-type': 'application/json', 'x-session-id': session, ...(pool ? { 'x-pool': pool } : {}) },
    body: JSON.stringify({
      model: MODEL,
      stream: true,
      max_tokens: 16,
      messages: [{ role: 'system', content: SYSTEM }, ...Array.from({ length: turn + 1 }, (_, i) => ({ role: 'user', content: `${session} turn ${i}` }))],
    }),
  });
  expect(res.status).toBe(200);
  await res.text();
}

async function sendTraffic(sessions: number, turns: number, tag: string): Promise<void> {
  await Promise.all(
    Array.from({ length: sessions }, async (_, s) => {
      for (let t = 0; t < turns; t++) await chat(`${tag}-${s}`, t);
    }),
  );
  await chat(`${tag}-x`, 0, 'extraction');
}

// ---- lifecycle ---------------------------------------------------------------------------------

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM}: npm test installs it (scripts/test-deps.ts), or apt-get install chromium, or set CHROMIUM_PATH`);
  // vLLM with --enable-prompt-tokens-details: cached tokens reported when non-zero, left out when 0
  // (a cold prompt), so the table shows both a router hit rate and requests without a cache report.
  for (let i = 1; i <= 4; i++) mocks.push(await startMockVllm({ id: `r${i}`, port: 0, apiKey: ORIGIN_API_KEY, models: [MODEL], decodeMsPerToken: 3, maxRunning: 16, profile: 'vllm-cache-report' }));
  const replicas = mocks.map((m) => ({ id: m.id, url: m.url, auth: 'bearer:ORIGIN_API_KEY' }));
  const config = {
    traceLog: true,
    pools: [
      { name: 'chat', models: [MODEL], strategy: 'bounded-hash:1.25', fallback: 'least-load', keys: ['header:x-session-id', 'tenant'], healthIntervalMs: 1_000, scrapeIntervalMs: 1_000, replicas },
      { name: 'extraction', models: [MODEL], strategy: 'least-load', keys: ['none'], healthIntervalMs: 1_000, scrapeIntervalMs: 1_000, replicas },
    ],
  };
  // The config arrives as a string, which loadConfig parses like the wrangler.toml table.
  router = await startRouter({
    config: JSON.stringify(config),
    secrets: {
      ADMIN_TOKEN,
      ORIGIN_API_KEY,
      // Pools salt the engine's prefix cache per tenant (the default cacheSalt "tenant") and refuse without a key.
      CACHE_SALT_KEY: `dash-cache-salt-${Math.random().toString(36).slice(2)}-0123456789`,
    },
    tenants: [{ key: TENANT_KEY, tenant: 'acme', keyId: 'dash-acme', pools: ['*'], allowPoolHeader: true }],
  });
  base = router.url;

  const userDataDir = mkdtempSync(join(tmpdir(), 'dash-e2e-chromium-'));
  tmpDirs.push(userDataDir);
  // launchPersistentContext: playwright owns --user-data-dir, so a fresh temp dir goes here.
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic'],
    viewport: { width: 1400, height: 1000 },
    timeout: 30_000,
  });
  page = context.pages()[0] ?? (await context.newPage());
  page.on('request', (r) => pageRequests.push(r.url()));
}, 80_000);

afterAll(async () => {
  await context?.close().catch(() => {});
  await router?.close();
  await Promise.allSettled(mocks.map((m) => m.close()));
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
}, 20_000);

// ---- the test ----------------------------------------------------------------------------------

describe('dashboard in a real browser', () => {
  it('login, replicas, numbers equal to /metrics, live updates, no external requests', async () => {
    // 1. The login page, then a wrong token, then the right one.
    await page.goto(`${base}/dashboard`);
    await page.waitForSelector('form[action="/dashboard/login"] input#token[type=password]');
    expect(await page.title()).toContain('sign in');
    await page.fill('#token', 'not-the-admin-token-at-all');
    await page.click('button[type=submit]');
    await page.waitForSelector('.err');
    expect((await context!.cookies()).filter((c) => c.name === 'prefix_router_session')).toHaveLength(0);

    await page.fill('#token', ADMIN_TOKEN);
    await Promise.all([page.waitForURL(`${base}/dashboard`), page.click('button[type=submit]')]);
    await page.waitForSelector('section[data-pool] tr[data-replica]');
    const cookie = (await context!.cookies()).find((c) => c.name === 'prefix_router_session');
    expect(cookie).toBeDefined();
    expect(cookie!.httpOnly).toBe(true);
    expect(cookie!.sameSite).toBe('Strict');
    expect(await page.evaluate(() => document.cookie)).not.toContain('prefix_router_session'); // HttpOnly: invisible to scripts

    // 2. Every replica of every pool shows.
    const first = await readTables();
    expect(Object.keys(first).sort()).toEqual([...POOLS].sort());
    for (const pool of POOLS) expect(Object.keys(first[pool]!).sort()).toEqual(['r1', 'r2', 'r3', 'r4']);

    // 3. Under traffic the page follows: the update counter grows and the requests cells change.
    const u0 = await updates();
    const before = await readTables();
    const traffic = sendTraffic(6, 4, 'live');
    await eventually(
      'the dashboard to show new requests',
      async () => {
        await waitForRender(await updates());
        const now = await readTables();
        return Object.keys(now.chat!).some((r) => now.chat![r]!.requests !== before.chat![r]!.requests);
      },
      30_000,
      0,
    );
    expect(await updates()).toBeGreaterThan(u0);
    await traffic;

    // 4. Once traffic has stopped (no leases held), the table equals /metrics at that moment.
    await eventually('all leases released', async () => {
      const m = await scrapeMetrics();
      return POOLS.every((p) => mocks.every((x) => m.get('prefix_router_in_flight_requests', p, x.id) === 0));
    }, 10_000);
    const m1 = await scrapeMetrics();
    await waitForRender(await updates());
    const shown = await readTables();
    const m2 = await scrapeMetrics();
    const pct = (v: number | null) => (v === null ? '–' : `${(v * 100).toFixed(1)}%`);
    let totalRequests = 0;
    let withoutReport = 0;
    for (const pool of POOLS) {
      for (const { id } of mocks) {
        const requests = m2.get('prefix_router_requests_total', pool, id);
        expect(m1.get('prefix_router_requests_total', pool, id), `${pool}/${id} stable between scrapes`).toBe(requests);
        totalRequests += requests;
        // The router's hit rate counts only the responses whose engine reported cached tokens.
        const prompt = m2.get('prefix_router_cache_reported_prompt_tokens_total', pool, id);
        const cached = m2.get('prefix_router_cached_tokens_total', pool, id);
        const row = shown[pool]![id]!;
        expect(row.requests, `${pool}/${id} requests`).toBe(String(requests));
        expect(row.in_flight, `${pool}/${id} in flight`).toBe(String(m2.get('prefix_router_in_flight_requests', pool, id)));
        expect(row.router_hit, `${pool}/${id} router hit rate`).toBe(pct(prompt > 0 ? cached / prompt : null));
        expect(row.no_cache_report, `${pool}/${id} requests without a cache report`).toBe(String(m2.get('prefix_router_requests_without_cache_report_total', pool, id)));
        withoutReport += m2.get('prefix_router_requests_without_cache_report_total', pool, id);
      }
    }
    // Each session's first turn is cold (0 cached, which the engine leaves out): unknown, not 0%.
    expect(withoutReport).toBeGreaterThan(0);
    expect(totalRequests).toBe(6 * 4 + 1);
    // Sessions come back to their replica, so the router saw prefix-cache hits somewhere.
    expect(mocks.some(({ id }) => m2.get('prefix_router_cached_tokens_total', 'chat', id) > 0)).toBe(true);

    // 5. The data endpoint does not hand replica URLs or auth references to the browser.
    const data = await page.evaluate(async () => (await fetch('/dashboard/data')).text());
    expect(data).not.toContain('ORIGIN_API_KEY');
    for (const x of mocks) expect(data).not.toContain(x.url);

    // 6. Nothing but the router itself was contacted.
    expect(pageRequests.length).toBeGreaterThan(3);
    const external = pageRequests.filter((u) => !u.startsWith(`${base}/`));
    expect(external, 'requests to anything but the router').toEqual([]);

    // 7. The trace log (docs/observability.md): one JSON line per finished request on the Worker's
    // console, written as each request finishes (a little after its client saw the last byte).
    const trace = await eventually(`${totalRequests} trace lines`, async () => {
      const lines = router!.traceLines();
      return lines.length >= totalRequests && lines;
    }, 20_000);
    const routerOut = router!.output();
    expect(trace.length, routerOut.slice(-2000)).toBe(totalRequests);
    for (const t of trace) {
      // earlyConnect is there only when the request went out early (a keyed repeat).
      expect(Object.keys(t).filter((k) => k !== 'earlyConnect')).toEqual(['type', 'ts', 'requestId', 'api', 'upstreamRequestId', 'pool', 'tenant', 'model', 'keyKind', 'keyHash', 'replica', 'status', 'promptTokens', 'cachedTokens', 'completionTokens', 'ttftMs', 'durationMs', 'retried', 'spilled', 'attempts', 'blocks']);
      if ('earlyConnect' in t) expect(['hit', 'miss']).toContain(t.earlyConnect);
      expect(t.status).toBe(200);
    }
    expect(routerOut).not.toContain(ADMIN_TOKEN);
    expect(routerOut).not.toContain(TENANT_KEY);

    // 8. Screenshots: one for this run; UPDATE_DOCS_SCREENSHOT=1 first runs ~45 s of traffic so the
    // charts have lines, and writes docs/dashboard.png.
    mkdirSync(join(ROOT, 'test-results'), { recursive: true });
    if (process.env.UPDATE_DOCS_SCREENSHOT === '1') {
      const end = Date.now() + 45_000;
      for (let round = 0; Date.now() < end; round++) await sendTraffic(8, 3, `docs-${round}`);
      await waitForRender(await updates());
      await page.screenshot({ path: join(ROOT, 'docs/dashboard.png'), fullPage: true });
    }
    await page.screenshot({ path: join(ROOT, 'test-results/dashboard.png'), fullPage: true });
  }, process.env.UPDATE_DOCS_SCREENSHOT === '1' ? 150_000 : 75_000);
});
