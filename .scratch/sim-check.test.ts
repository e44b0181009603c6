import { it } from 'vitest';
import { simulate } from '../sim/engine.js';
import { resolveProfile } from '../sim/profile.js';
import { parseKeySpec, parseTrace, routingKey } from '../sim/trace.js';
function stream(tenant: string, fromMs: number, gapMs: number, count: number, prompt = 512, output = 64): string[] {
  return Array.from({ length: count }, (_, i) => { const id = `${tenant}-${i}`; const base = [...id].reduce((a, c) => (a * 31 + c.charCodeAt(0)) >>> 0, 7) % 1_000_000; return JSON.stringify({ timestamp: fromMs + i * gapMs, input_length: prompt, output_length: output, hash_ids: Array.from({ length: prompt / 16 }, (_, j) => base * 64 + j), session: id, tenant, block_tokens: 16 }); });
}
it('x', () => {
  const lines = [...stream('heavy', 0, 100, 40, 64, 128), ...stream('light', 100, 400, 10, 64, 16)].sort((a, b) => JSON.parse(a).timestamp - JSON.parse(b).timestamp);
  const t = parseTrace(lines.join('\n'), 'x');
  const keys = t.requests.map((r) => routingKey(r, parseKeySpec('session')));
  for (const fc of [{ maxInFlightPerReplica: 4 }, { maxInFlightPerReplica: 4, preempt: true }, { maxInFlightPerReplica: 4, preemptStreams: true }]) {
    const r = simulate(t, { strategy: 'bounded-hash:1.25', replicas: 2, keys, seed: 3, profile: resolveProfile({ maxRunning: 4 }), flowControl: fc });
    console.log(JSON.stringify(fc), 'preempted', r.flow.preempted, 'paused', r.flow.paused, 'out', r.outputTokens, JSON.stringify(r.flow.tenants.map((x) => [x.tenant, x.queueWaitP50Ms, x.queueWaitP99Ms, x.refused])), 'span', r.spanMs);
  }
});
