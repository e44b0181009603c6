// Replays a session workload (session-workload.ts) against one HTTP endpoint in real time and
// measures what each backend got, from the client side: every response names its backend in a
// header. Streaming chat with the growing history (the assistant's streamed answer is appended,
// so the next turn hits the replica's prefix cache when it lands there). I/O: loopback HTTP.

import { setMaxListeners } from 'node:events';
import { Agent, request as httpRequest } from 'node:http';

import type { Workload } from './session-workload.js';

export interface ReplayTarget {
  port: number;
  headers: Record<string, string>;
  /** Response header naming the backend that served the request. */
  backendHeader: string;
}

export interface RequestRecord {
  session: number;
  turn: number;
  backend: string | null;
  /** ms since the run started. */
  sentMs: number;
  endMs: number;
  ttftMs: number | null;
  ok: boolean;
  /** Requests this client had outstanding when it sent this one. */
  inFlightAtSend: number;
}

export interface ReplayResult {
  records: RequestRecord[];
  wallS: number;
  /** Turns never sent because the deadline passed. */
  notSent: number;
  errors: number;
  firstError: string | null;
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (ms <= 0 || signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });

interface Answer {
  backend: string | null;
  ttftMs: number | null;
  content: string;
}

/** One streaming chat request; resolves with the streamed content, or throws. */
function streamChat(agent: Agent, t: ReplayTarget, sessionId: string, body: string, started: number, signal: AbortSignal): Promise<Answer> {
  return new Promise((resolve, reject) => {
    let ttftMs: number | null = null;
    let content = '';
    let buf = '';
    const req = httpRequest(
      {
        agent,
        host: '127.0.0.1',
        port: t.port,
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'x-session-id': sessionId, ...t.headers },
        timeout: 20_000,
        signal,
      },
      (res) => {
        const h = res.headers[t.backendHeader.toLowerCase()];
        const backend = typeof h === 'string' ? h : null;
        if (res.statusCode !== 200) {
          res.resume();
          reject(new Error(`status ${res.statusCode} from ${backend ?? '?'}`));
          return;
        }
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          buf += chunk;
          for (let at = buf.indexOf('\n\n'); at >= 0; at = buf.indexOf('\n\n')) {
            const event = buf.slice(0, at);
            buf = buf.slice(at + 2);
            if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
            try {
              const j = JSON.parse(event.slice(6)) as { choices?: { delta?: { content?: string } }[] };
              const d = j.choices?.[0]?.delta?.content;
              if (typeof d === 'string' && d !== '') {
                if (ttftMs === null) ttftMs = performance.now() - started;
                content += d;
              }
            } catch {
              // not JSON: ignore the event
            }
          }
        });
        res.on('end', () => resolve({ backend, ttftMs, content }));
        res.on('error', reject);
        res.on('aborted', () => reject(new Error('response aborted')));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * Replay every session on its schedule. Stops sending at `deadlineMs` after the start and aborts
 * whatever is still outstanding at `deadlineMs + graceMs`. `onProgress` is called about once a second.
 */
export async function replay(
  w: Workload,
  t: ReplayTarget,
  opts: { model: string; deadlineMs: number; graceMs: number; onProgress?: (sent: number, inFlight: number, elapsedS: number) => void },
): Promise<ReplayResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity });
  const stopSending = new AbortController();
  const abortAll = new AbortController();
  // Every outstanding request and sleeping session listens on these.
  setMaxListeners(0, stopSending.signal, abortAll.signal);
  const records: RequestRecord[] = [];
  let inFlight = 0;
  let notSent = 0;
  let errors = 0;
  let firstError: string | null = null;
  const t0 = performance.now();
  const timers = [
    setTimeout(() => stopSending.abort(), opts.deadlineMs),
    setTimeout(() => abortAll.abort(), opts.deadlineMs + opts.graceMs),
    setInterval(() => opts.onProgress?.(records.length + inFlight, inFlight, (performance.now() - t0) / 1000), 1_000),
  ];

  const runSession = async (i: number) => {
    const s = w.sessions[i]!;
    const messages: { role: string; content: string }[] = [{ role: 'system', content: s.system }];
    await sleep(t0 + s.startS * 1000 - performance.now(), stopSending.signal);
    for (let j = 0; j < s.turns.length; j++) {
      if (stopSending.signal.aborted) {
        notSent += s.turns.length - j;
        return;
      }
      const turn = s.turns[j]!;
      messages.push({ role: 'user', content: turn.user });
      const body = JSON.stringify({ model: opts.model, stream: true, max_tokens: turn.maxTokens, messages });
      const started = performance.now();
      const rec: RequestRecord = { session: i, turn: j, backend: null, sentMs: started - t0, endMs: 0, ttftMs: null, ok: false, inFlightAtSend: inFlight };
      inFlight++;
      let answer = '';
      try {
        const a = await streamChat(agent, t, s.id, body, started, abortAll.signal);
        rec.backend = a.backend;
        rec.ttftMs = a.ttftMs;
        rec.ok = a.backend !== null;
        answer = a.content;
        if (!rec.ok) throw new Error(`no ${t.backendHeader} header`);
      } catch (e) {
        errors++;
        firstError ??= (e as Error).message;
      } finally {
        inFlight--;
        rec.endMs = performance.now() - t0;
        records.push(rec);
      }
      messages.push({ role: 'assistant', content: answer });
      if (j + 1 < s.turns.length) await sleep(turn.thinkS * 1000, stopSending.signal);
    }
  };

  try {
    await Promise.all(w.sessions.map((_, i) => runSession(i)));
  } finally {
    for (const x of timers) clearTimeout(x);
    agent.destroy();
  }
  return { records, wallS: (performance.now() - t0) / 1000, notSent, errors, firstError };
}

// ---- metrics ----------------------------------------------------------------------------------

export interface ReplayMetrics {
  requests: number;
  errors: number;
  notSent: number;
  wallS: number;
  /** Mean of the client's outstanding requests seen by each new request. */
  inFlightAtSends: number;
  /** Requests per backend, max ÷ mean over all backends (those that got none count as 0). */
  reqSpread: number;
  /** Per-backend peak concurrent requests (client-side intervals), max ÷ mean, and the max. */
  peakSpread: number;
  peakMax: number;
  /** Share of sessions served by more than one backend (sessions with at least one answer). */
  split: number;
  /** Share of answered turns on their session's most used backend. */
  main: number;
  ttftP50: number;
  ttftP95: number;
  /** Mean time from send to the end of the stream (ms). */
  meanDurationMs: number;
  perBackend: Record<string, { requests: number; peak: number }>;
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

export function summarize(r: ReplayResult, backends: readonly string[]): ReplayMetrics {
  const ok = r.records.filter((x) => x.ok && x.backend !== null);
  const perBackend: Record<string, { requests: number; peak: number }> = {};
  for (const b of backends) perBackend[b] = { requests: 0, peak: 0 };
  const intervals = new Map<string, { t: number; d: number }[]>();
  for (const x of ok) {
    const b = (perBackend[x.backend!] ??= { requests: 0, peak: 0 });
    b.requests++;
    let ev = intervals.get(x.backend!);
    if (!ev) intervals.set(x.backend!, (ev = []));
    ev.push({ t: x.sentMs, d: +1 }, { t: x.endMs, d: -1 });
  }
  for (const [b, ev] of intervals) {
    ev.sort((a, c) => a.t - c.t || a.d - c.d);
    let cur = 0;
    let peak = 0;
    for (const e of ev) peak = Math.max(peak, (cur += e.d));
    perBackend[b]!.peak = peak;
  }
  const reqs = Object.values(perBackend).map((x) => x.requests);
  const peaks = Object.values(perBackend).map((x) => x.peak);
  const mean = (a: number[]) => a.reduce((x, y) => x + y, 0) / a.length;

  const bySession = new Map<number, Map<string, number>>();
  for (const x of ok) {
    let m = bySession.get(x.session);
    if (!m) bySession.set(x.session, (m = new Map()));
    m.set(x.backend!, (m.get(x.backend!) ?? 0) + 1);
  }
  let split = 0;
  let mainTurns = 0;
  for (const m of bySession.values()) {
    if (m.size > 1) split++;
    mainTurns += Math.max(...m.values());
  }
  const ttfts = ok.map((x) => x.ttftMs).filter((x): x is number => x !== null).sort((a, b) => a - b);
  return {
    requests: ok.length,
    errors: r.errors,
    notSent: r.notSent,
    wallS: r.wallS,
    inFlightAtSends: r.records.length ? mean(r.records.map((x) => x.inFlightAtSend)) : NaN,
    reqSpread: Math.max(...reqs) / mean(reqs),
    peakSpread: Math.max(...peaks) / mean(peaks),
    peakMax: Math.max(...peaks),
    split: bySession.size ? split / bySession.size : NaN,
    main: ok.length ? mainTurns / ok.length : NaN,
    ttftP50: percentile(ttfts, 50),
    ttftP95: percentile(ttfts, 95),
    meanDurationMs: ok.length ? mean(ok.map((x) => x.endMs - x.sentMs)) : NaN,
    perBackend,
  };
}
