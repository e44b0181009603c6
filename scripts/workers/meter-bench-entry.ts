// Worker entry for `npm run bench:meter` (bundled by test/helpers/router.ts, never deployed;
// type-checked with the Workers types, as src/ is): the router's Durable Objects, and a fetch
// handler that drives one TenantMeter or one UsageRegistry shard. I/O: RPCs.
//
//   GET /?mode=settle&n=&batch=&conc=&tenant=   n settles in calls of `batch` (earlier + 1), conc chains at once
//   GET /?mode=report&n=&tenants=&conc=&shard=  n usage reports to one registry shard, from `tenants` meters
//   GET /?mode=constants                         the outbox window and batch size, the meter's report delay
//   GET /?mode=outbox&ms=&perTick=&tenant=      settles delivered through a SettleOutbox (its real window) for ms,
//                                               perTick every 10 ms: how many meter calls they cost

export { PoolCoordinator, RouterGuard, TenantMeter, UsageRegistry } from '../../src/index.js';
import type { SettleRequest, UsageReport } from '../../src/quota/tenant-meter.js';
import { SETTLE_BATCH_MAX, SETTLE_WINDOW_MS, SettleOutbox } from '../../src/quota/settle-outbox.js';
import { REPORT_DELAY_MS } from '../../src/quota/tenant-meter.js';
import { shardStub } from '../../src/quota/registry-shards.js';
import { emptyUsage } from '../../src/quota/usage.js';
import type { TenantMeter } from '../../src/index.js';

const limits = { requestsPerMinute: 1_000_000_000, tokensPerMinute: 1_000_000_000_000 };

let seq = 0;
const settleOf = (tenant: string): SettleRequest & { id: string } => ({
  id: `b${++seq}-${Math.random().toString(36).slice(2)}`,
  tenant,
  model: 'bench-model',
  limits,
  charged: 600,
  used: 300,
  limited: true,
  usage: { promptTokens: 200, cachedTokens: 150, completionTokens: 100 },
});

const meterOf = (env: Env, tenant: string) => env.TENANT_METER.get(env.TENANT_METER.idFromName(tenant)) as unknown as DurableObjectStub<TenantMeter>;

/** `conc` chains of calls at once; each call of `chain(i)` is awaited before the next. */
async function chains(n: number, conc: number, call: (i: number) => Promise<unknown>): Promise<number> {
  let next = 0;
  let ok = 0;
  await Promise.all(
    Array.from({ length: conc }, async () => {
      for (let i = next++; i < n; i = next++) {
        await call(i);
        ok++;
      }
    }),
  );
  return ok;
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const q = new URL(request.url).searchParams;
    const num = (k: string, d: number, max: number) => Math.max(1, Math.min(max, Number(q.get(k) ?? d)));
    const mode = q.get('mode');
    const tenant = q.get('tenant') ?? 'bench-tenant';
    try {
      if (mode === 'constants') return Response.json({ window: SETTLE_WINDOW_MS, batchMax: SETTLE_BATCH_MAX, reportDelay: REPORT_DELAY_MS });
      if (mode === 'settle') {
        const n = num('n', 1000, 1_000_000);
        const batch = num('batch', 1, 200);
        const stub = meterOf(env, tenant);
        const calls = await chains(Math.ceil(n / batch), num('conc', 1, 64), () => {
          const s = Array.from({ length: batch }, () => settleOf(tenant));
          return stub.settle(batch > 1 ? { ...s[0]!, earlier: s.slice(1) } : s[0]!);
        });
        return Response.json({ calls, settles: calls * batch });
      }
      if (mode === 'report') {
        const n = num('n', 1000, 1_000_000);
        const tenants = num('tenants', 100, 100_000);
        const stub = shardStub(env, Number(q.get('shard') ?? 0));
        const seqs = new Map<number, number>();
        const hour = Math.floor(Date.now() / 3_600_000) * 3_600_000;
        const calls = await chains(n, num('conc', 1, 64), (i) => {
          const t = i % tenants;
          const s = (seqs.get(t) ?? 0) + 1;
          seqs.set(t, s);
          const r: UsageReport = { tenant: `${tenant}-${t}`, seq: s, rows: [{ hour, model: 'bench-model', usage: { ...emptyUsage(), requests: 5, promptTokens: 1000, completionTokens: 500 } }], state: null, at: Date.now() };
          return stub.report(r);
        });
        return Response.json({ calls });
      }
      if (mode === 'outbox') {
        const ms = num('ms', 2000, 20_000);
        const perTick = num('perTick', 10, 1000);
        const box = new SettleOutbox();
        const stub = meterOf(env, tenant);
        const pending: Promise<unknown>[] = [];
        const t0 = Date.now();
        let settles = 0;
        while (Date.now() - t0 < ms) {
          for (let i = 0; i < perTick; i++, settles++) box.deliver(stub, settleOf(tenant), (p) => pending.push(p));
          await new Promise((r) => setTimeout(r, 10));
        }
        const deliveredAt = Date.now() - t0;
        await Promise.all(pending);
        return Response.json({ settles, ms: deliveredAt, calls: box.counters.calls, delivered: box.counters.delivered, failedCalls: box.counters.failedCalls, backlog: box.backlog(tenant) });
      }
      return Response.json({ error: `unknown mode ${mode}` }, { status: 400 });
    } catch (e) {
      return Response.json({ error: e instanceof Error ? e.message : String(e) }, { status: 500 });
    }
  },
} satisfies ExportedHandler<Env>;
