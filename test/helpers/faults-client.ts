// Streaming chat clients for the fault suite: one request through fetch (optionally aborted
// with an AbortController before the headers or after k chunks) or through a raw socket that is
// closed (FIN) or reset (RST) after k chunks. Each ends in one outcome class. Every wait is
// bounded by `timeoutMs`. I/O: loopback sockets only.

import { connect } from 'node:net';

export type AbortMode = 'none' | 'fetch-before-headers' | 'fetch-mid-stream' | 'raw-fin' | 'raw-rst';

export type OutcomeClass =
  /** 200 and a complete stream ending in [DONE] without an error event. */
  | 'ok'
  /** The client aborted on purpose (and the request had not completed before). */
  | 'aborted'
  /** A non-200 HTTP status (status says which). */
  | 'http'
  /** 200, then an SSE `data: {"error":…}` event (a failure after the first byte). */
  | 'sse_error'
  /** The connection failed or the stream ended without [DONE] and without an error event. */
  | 'network'
  /** Nothing conclusive within timeoutMs. */
  | 'timeout';

export interface ChatRequest {
  base: string;
  port: number;
  apiKey: string;
  session: string;
  requestId: string;
  messages: { role: string; content: string }[];
  maxTokens: number;
  abort: AbortMode;
  /** For before-headers: ms after the request went out; for the others: chunks to read first. */
  abortAt: number;
  timeoutMs: number;
  /** Default demo-model. */
  model?: string;
  /** Sent as well (the fault run's test-only cf header). */
  extraHeaders?: Record<string, string>;
}

export interface Outcome {
  cls: OutcomeClass;
  status: number | null;
  replica: string | null;
  /** Text of the assistant reply (complete streams only). */
  reply: string;
  errorCode: string | null;
  ms: number;
}

function body(r: ChatRequest): string {
  return JSON.stringify({ model: r.model ?? 'demo-model', stream: true, max_tokens: r.maxTokens, messages: r.messages });
}

function headers(r: ChatRequest): Record<string, string> {
  return { authorization: `Bearer ${r.apiKey}`, 'content-type': 'application/json', 'x-session-id': r.session, 'x-request-id': r.requestId, ...r.extraHeaders };
}

/** Scan SSE text: reply text, an error event, [DONE]. */
function scanSse(text: string): { reply: string; error: string | null; done: boolean; chunks: number } {
  let reply = '';
  let error: string | null = null;
  let done = false;
  let chunks = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    const data = line.slice(6).trim();
    if (data === '[DONE]') {
      done = true;
      continue;
    }
    chunks++;
    try {
      const v = JSON.parse(data) as { error?: { code?: string | null; type?: string }; choices?: { delta?: { content?: string } }[] };
      if (v.error) error = String(v.error.code ?? v.error.type ?? 'error');
      else reply += v.choices?.[0]?.delta?.content ?? '';
    } catch {
      /* partial line at the end of a cut stream */
    }
  }
  return { reply, error, done, chunks };
}

export async function fetchChat(r: ChatRequest): Promise<Outcome> {
  const t0 = Date.now();
  const ac = new AbortController();
  let abortedByUs = false;
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    ac.abort();
  }, r.timeoutMs);
  let beforeTimer: NodeJS.Timeout | undefined;
  if (r.abort === 'fetch-before-headers') {
    beforeTimer = setTimeout(() => {
      abortedByUs = true;
      ac.abort();
    }, r.abortAt);
  }
  const out = (cls: OutcomeClass, status: number | null, replica: string | null, reply = '', errorCode: string | null = null): Outcome => {
    clearTimeout(timer);
    clearTimeout(beforeTimer);
    return { cls, status, replica, reply, errorCode, ms: Date.now() - t0 };
  };
  let res: Response;
  try {
    res = await fetch(`${r.base}/v1/chat/completions`, { method: 'POST', headers: headers(r), body: body(r), signal: ac.signal });
  } catch {
    return out(abortedByUs ? 'aborted' : timedOut ? 'timeout' : 'network', null, null);
  }
  const replica = res.headers.get('x-prefix-router-replica');
  if (res.status !== 200) {
    const text = await res.text().catch(() => '');
    return out('http', res.status, replica, '', errorCodeOf(text));
  }
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = '';
  let reads = 0;
  try {
    for (;;) {
      if (r.abort === 'fetch-mid-stream' && reads >= r.abortAt) {
        abortedByUs = true;
        ac.abort();
        await reader.cancel().catch(() => {});
        return out('aborted', 200, replica);
      }
      const { value, done } = await reader.read();
      if (done) break;
      reads++;
      text += dec.decode(value, { stream: true });
    }
  } catch {
    if (abortedByUs) return out('aborted', 200, replica);
    if (timedOut) return out('timeout', 200, replica);
    const s = scanSse(text);
    return s.error ? out('sse_error', 200, replica, s.reply, s.error) : out('network', 200, replica);
  }
  const s = scanSse(text);
  if (s.error) return out('sse_error', 200, replica, s.reply, s.error);
  if (!s.done) return out('network', 200, replica, s.reply);
  return out('ok', 200, replica, s.reply);
}

/** HTTP/1.1 over a raw socket; after `abortAt` SSE chunks, destroy() (FIN) or resetAndDestroy() (RST). */
export function rawChat(r: ChatRequest): Promise<Outcome> {
  const t0 = Date.now();
  const b = body(r);
  const h = headers(r);
  const head =
    `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:${r.port}\r\nconnection: close\r\ncontent-length: ${Buffer.byteLength(b)}\r\n` +
    Object.entries(h)
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('') +
    '\r\n';
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port: r.port });
    let received = '';
    let settled = false;
    const finish = (cls: OutcomeClass, status: number | null, errorCode: string | null = null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      const m = /x-prefix-router-replica: (\S+)/i.exec(received);
      resolve({ cls, status, replica: m ? m[1]! : null, reply: '', errorCode, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => {
      socket.destroy();
      finish('timeout', null);
    }, r.timeoutMs);
    socket.on('error', () => finish('network', null));
    socket.on('connect', () => socket.write(head + b));
    socket.on('data', (buf: Buffer) => {
      received += buf.toString('latin1');
      const res = splitResponse(received);
      if (!res) return;
      if (res.status !== 200) {
        // The error's code is in its JSON body, as fetchChat reads it (a 504 must say
        // upstream_timeout): wait for the whole body (content-length, else the close).
        const length = /\r\ncontent-length: *(\d+)/i.exec(res.head);
        if (length && res.body.length < Number(length[1])) return;
        socket.destroy();
        finish('http', res.status, errorCodeOf(res.body));
        return;
      }
      const s = scanSse(res.body);
      if (s.error) {
        socket.destroy();
        finish('sse_error', 200, s.error);
      } else if (s.done) {
        socket.destroy();
        finish('ok', 200);
      } else if (s.chunks >= r.abortAt) {
        if (r.abort === 'raw-rst') socket.resetAndDestroy();
        else socket.destroy();
        finish('aborted', 200);
      }
    });
    socket.on('close', () => {
      const res = splitResponse(received);
      if (res && res.status !== 0 && res.status !== 200) finish('http', res.status, errorCodeOf(res.body));
      finish('network', null);
    });
  });
}

/** A raw HTTP/1.1 answer read so far (latin1, one character a byte): status, head, body; null before the end of the head. */
function splitResponse(received: string): { status: number; head: string; body: string } | null {
  const sep = received.indexOf('\r\n\r\n');
  if (sep < 0) return null;
  return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(received)?.[1] ?? 0), head: received.slice(0, sep), body: received.slice(sep + 4) };
}

/** `error.code` of an OpenAI error body, or null (not JSON, or no code). */
function errorCodeOf(text: string): string | null {
  try {
    return (JSON.parse(text) as { error?: { code?: string } }).error?.code ?? null;
  } catch {
    return null;
  }
}
