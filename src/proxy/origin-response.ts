// What the client gets of an origin's answer: never the origin's content type or headers as
// sent (an origin is untrusted: `text/html` would be rendered, `cache-control: public` cached
// for everyone), and an origin error body only as OpenAI JSON with the origin credentials taken
// out. I/O: reads a bounded error body from the upstream response.

import { readUpTo } from './bounded-read.js';

/** Most bytes of an origin's error body read (and passed on when it is JSON). */
export const MAX_ORIGIN_ERROR_BYTES = 64 * 1024;

/** Response headers the router sets on a proxied answer: content type by what was asked, nosniff, no caching. */
export function proxiedResponseHeaders(opts: { sse: boolean; requestId: string; replica?: string | null; clientRequestId?: string | null }): Headers {
  const h = new Headers({
    'content-type': opts.sse ? 'text/event-stream; charset=utf-8' : 'application/json',
    'x-content-type-options': 'nosniff',
    'cache-control': 'no-store',
    'x-request-id': opts.requestId,
  });
  if (opts.replica) h.set('x-prefix-router-replica', opts.replica);
  return h;
}

/**
 * The body to send for an origin's error answer (status ≥ 400): the origin's JSON when it is
 * already an error in the path's shape (vLLM's `{"error": {...}}` or its older `{"object":
 * "error", ...}` on OpenAI paths, `{"type":"error","error":{...}}` on Anthropic's); any other
 * JSON (vLLM's auth middleware `{"error":"Unauthorized"}`, FastAPI's `{"detail": ...}`, an
 * OpenAI-shaped error on an Anthropic path) is re-wrapped in the path's shape keeping its
 * message; anything else becomes an error naming the status. Any origin credential value found in
 * it is replaced: an origin that echoes request headers (a gateway's debug page) must not hand
 * them to a tenant.
 */
export async function originErrorBody(upstream: Response, secrets: readonly string[], timeoutMs: number, shape: OriginErrorShape = openAIErrorShape): Promise<string> {
  const text = await readBounded(upstream, MAX_ORIGIN_ERROR_BYTES, timeoutMs);
  let out: string | null = null;
  if (text !== null) {
    try {
      const v = JSON.parse(text) as unknown;
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
        const obj = v as Record<string, unknown>;
        const explained = shape.explain?.(upstream.status, obj) ?? null;
        if (explained !== null) out = explained;
        else if (shape.isNative(obj)) out = text;
        else {
          const said = messageOf(obj);
          out = shape.wrap(said === null ? `The replica answered ${upstream.status}` : `The replica answered ${upstream.status}: ${said}`, upstream.status);
        }
      }
    } catch {
      // not JSON: wrapped below
    }
  }
  out ??= shape.wrap(`The replica answered ${upstream.status} ${text === null ? 'with an unreadable body' : 'with a body that is not JSON'}`, upstream.status);
  for (const s of secrets) if (s.length >= 4 && out.includes(s)) out = out.split(s).join('[redacted]');
  return out;
}

/** Longest origin message carried into a re-wrapped error. */
const MAX_ORIGIN_MESSAGE_CHARS = 1000;

/** The human-readable message of an error object in any of the shapes engines answer with, or null. */
function messageOf(v: Record<string, unknown>): string | null {
  const e = v.error;
  const candidates = [typeof e === 'object' && e !== null ? (e as Record<string, unknown>).message : e, v.message, v.detail];
  for (const c of candidates) {
    if (typeof c === 'string' && c.length > 0) return c.slice(0, MAX_ORIGIN_MESSAGE_CHARS);
    if (c !== undefined && c !== null && typeof c === 'object') return JSON.stringify(c).slice(0, MAX_ORIGIN_MESSAGE_CHARS);
  }
  return null;
}

/** The error body, in the API's shape, for an origin error whose own body cannot be passed on. */
export type OriginErrorWrap = (message: string, status: number) => string;

/** An API's error shape: how to wrap a message, and whether an origin's JSON already has that shape. */
export interface OriginErrorShape {
  wrap: OriginErrorWrap;
  isNative(v: Record<string, unknown>): boolean;
  /**
   * A clearer body for an origin error the router can explain better than the engine (the
   * Responses store that is off, http/apis/responses/store.ts), or null to pass it on as usual.
   */
  explain?(status: number, v: Record<string, unknown>): string | null;
}

/** OpenAI's error shape (the default; Anthropic paths wrap in theirs, http/apis/anthropic/reader.ts). */
export const openAIOriginError: OriginErrorWrap = (message, status) =>
  JSON.stringify({ error: { message, type: status >= 500 ? 'server_error' : 'invalid_request_error', param: null, code: 'upstream_error' } });

export const openAIErrorShape: OriginErrorShape = {
  wrap: openAIOriginError,
  isNative: (v) => {
    const e = v.error;
    if (typeof e === 'object' && e !== null && typeof (e as Record<string, unknown>).message === 'string') return true;
    // vLLM's older ErrorResponse: {"object":"error","message":…,"type":…,"code":…}
    return v.object === 'error' && typeof v.message === 'string';
  },
};

/** The body as text, at most `limit` bytes (more is cut), or null when it cannot be read in time. */
async function readBounded(res: Response, limit: number, timeoutMs: number): Promise<string | null> {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const r = await readUpTo(reader, limit, Date.now() + timeoutMs);
  void reader.cancel().catch(() => {});
  return r.kind === 'read' ? new TextDecoder().decode(r.bytes) : null;
}
