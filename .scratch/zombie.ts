// Diagnostic: does a preempted/paused request keep its engine slot after the router released it?
import { startMockPool } from '../scripts/bench/mock-pool.js';
import { routerConfig, startRouter, TEST_ORIGIN_API_KEY, TEST_TENANTS } from '../test/helpers/router.js';

const preempt = process.argv[2] ?? 'streams';
const pool = await startMockPool(Number(process.env.R ?? 2), { apiKey: TEST_ORIGIN_API_KEY, models: ['demo-model'], maxRunning: Number(process.env.S ?? 2), decodeMsPerToken: 30, prefillTokensPerSec: 10_000, profile: 'vllm' });
const router = await startRouter({
  config: routerConfig({
    replicas: pool.mocks, strategy: 'bounded-hash:1.25', keys: ['header:x-session-id'],
    poolOverrides: { healthIntervalMs: 2000, healthTimeoutMs: 1500, fall: 3, maxInFlightPerReplica: Number(process.env.S ?? 2), flowControl: { enabled: true, bands: [{ name: 'normal', maxQueueMs: 3000, maxQueueLength: 128 }], defaultBand: 'normal', preempt: preempt !== 'off', preemptStreams: preempt === 'streams', shareReserve: Number(process.env.RES ?? 0) } },
    overrides: { traceLog: true, firstTokenTimeoutMs: 60000, idleTimeoutMs: 60000 },
  }),
});
const [N, Q] = [TEST_TENANTS[0]!, TEST_TENANTS[1]!];
const prompt = 'x'.repeat(4800);
let stop = false;
async function one(key: string, session: string): Promise<{ ttft: number; id: string }> {
  const id = crypto.randomUUID();
  const t = performance.now();
  const res = await fetch(`${router.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-session-id': session, 'x-request-id': id }, body: JSON.stringify({ model: 'demo-model', stream: true, max_tokens: 16, messages: [{ role: 'user', content: `${session} ${prompt}` }] }) });
  const reader = res.body!.getReader();
  let ttft = -1;
  const dec = new TextDecoder();
  for (;;) { const r = await reader.read(); if (r.done) break; if (ttft < 0 && dec.decode(r.value).includes('"content"')) ttft = performance.now() - t; }
  return { ttft, id };
}
const samples: string[] = [];
const t0 = performance.now();
const sampler = (async () => { while (!stop) { const st = await Promise.all(pool.mocks.map((m) => m.stats())); const snap = await (await router.adminFetch('/admin/pools/chat')).json() as { leases: number }; const run = st.reduce((a, s) => a + s.running, 0), wait = st.reduce((a, s) => a + s.waiting, 0); if (wait > 0 || run > snap.leases) samples.push(`${Math.round(performance.now() - t0)} run ${run} wait ${wait} leases ${snap.leases}`); await new Promise((r) => setTimeout(r, 5)); } })();
const heavy = Array.from({ length: Number(process.env.NC ?? 10) }, (_, i) => (async () => { let j = 0; await new Promise((r) => setTimeout(r, 2000)); while (!stop) await one(N.key, `n${i}-${j++}`); })());
const qs: { ttft: number; id: string; at: number }[] = [];
const QRATE = Number(process.env.QR ?? 3);
const qp: Promise<void>[] = [];
const light = (async () => { let j = 0; while (!stop) { const at = Math.round(performance.now() - t0); qp.push(one(Q.key, `q${j++}`).then((x) => void qs.push({ ...x, at }))); await new Promise((r) => setTimeout(r, 1000 / QRATE)); } })();
await new Promise((r) => setTimeout(r, 12_000));
stop = true;
await Promise.allSettled([sampler, ...heavy, light]);
await Promise.allSettled(qp);
const lines = router.traceLines();
const byId = new Map(lines.map((l) => [l.requestId as string, l]));
const sorted = [...qs].sort((a, b) => b.ttft - a.ttft);
console.log('Q n', qs.length, 'p50', Math.round(sorted[Math.floor(qs.length / 2)]!.ttft), 'p99', Math.round(sorted[Math.floor(qs.length / 100)]!.ttft));
console.log('mode', preempt, 'Q worst', sorted.slice(0, 12).map((q) => `@${q.at} ${Math.round(q.ttft)}/${(byId.get(q.id)?.queueMs as number | undefined) ?? '-'}`).join(' '));
console.log('N preempted', lines.filter((l) => l.preempted).map((l) => `${l.tenant}:${l.preempted}:${l.continuations ?? 0}`).join(' '), 'continued', lines.filter((l) => l.continuations).length);
console.log('over-subscribed samples', samples.length, samples.slice(0, 40).join('\n'));
await router.close();
await pool.close();
