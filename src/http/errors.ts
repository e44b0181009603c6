// The one mapping from internal failure reasons to HTTP status codes and the OpenAI error
// body `{ "error": { "message", "type", "param", "code" } }`. Nothing else knows status codes.

export type ErrorReason =
  | 'invalid_json'
  | 'invalid_encoding'
  | 'unsupported_media_type'
  | 'body_too_large'
  | 'headers_too_large'
  | 'request_timeout'
  | 'invalid_request'
  | 'model_not_found'
  | 'pool_not_found'
  | 'missing_api_key'
  | 'invalid_api_key'
  | 'pool_not_allowed'
  | 'not_found'
  | 'method_not_allowed'
  | 'admin_unauthorized'
  | 'token_in_query'
  | 'conflict'
  | 'tenant_limit'
  | 'no_healthy_replica'
  | 'upstream_unavailable'
  | 'upstream_timeout'
  | 'misconfigured'
  | 'internal';

interface WireError {
  status: number;
  type: string;
  retryAfter?: boolean;
}

const WIRE: Record<ErrorReason, WireError> = {
  invalid_json: { status: 400, type: 'invalid_request_error' },
  invalid_encoding: { status: 400, type: 'invalid_request_error' },
  unsupported_media_type: { status: 415, type: 'invalid_request_error' },
  body_too_large: { status: 413, type: 'invalid_request_error' },
  headers_too_large: { status: 431, type: 'invalid_request_error' },
  request_timeout: { status: 408, type: 'invalid_request_error' },
  invalid_request: { status: 400, type: 'invalid_request_error' },
  model_not_found: { status: 404, type: 'invalid_request_error' },
  pool_not_found: { status: 404, type: 'invalid_request_error' },
  missing_api_key: { status: 401, type: 'authentication_error' },
  invalid_api_key: { status: 401, type: 'authentication_error' },
  pool_not_allowed: { status: 403, type: 'permission_error' },
  not_found: { status: 404, type: 'invalid_request_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  admin_unauthorized: { status: 401, type: 'authentication_error' },
  token_in_query: { status: 400, type: 'invalid_request_error' },
  conflict: { status: 409, type: 'invalid_request_error' },
  tenant_limit: { status: 429, type: 'rate_limit_error', retryAfter: true },
  no_healthy_replica: { status: 503, type: 'server_error', retryAfter: true },
  upstream_unavailable: { status: 502, type: 'server_error', retryAfter: true },
  upstream_timeout: { status: 504, type: 'server_error', retryAfter: true },
  misconfigured: { status: 500, type: 'server_error' },
  internal: { status: 500, type: 'server_error' },
};

export interface ErrorOptions {
  param?: string | null;
  retryAfterSeconds?: number;
  headers?: Record<string, string>;
}

export function statusOf(reason: ErrorReason): number {
  return WIRE[reason].status;
}

/** Build the OpenAI-shaped error response for `reason`. `message` must never carry secrets. */
export function errorResponse(reason: ErrorReason, message: string, opts: ErrorOptions = {}): Response {
  const wire = WIRE[reason];
  const headers: Record<string, string> = { 'content-type': 'application/json', ...opts.headers };
  if (wire.retryAfter) headers['retry-after'] = String(Math.max(1, Math.ceil(opts.retryAfterSeconds ?? 1)));
  if (wire.status === 401) headers['www-authenticate'] = 'Bearer';
  const body = { error: { message, type: wire.type, param: opts.param ?? null, code: reason } };
  return new Response(JSON.stringify(body), { status: wire.status, headers });
}

/** The JSON body alone, for an SSE error event after streaming has started. */
export function errorBody(reason: ErrorReason, message: string): { error: { message: string; type: string; param: null; code: string } } {
  return { error: { message, type: WIRE[reason].type, param: null, code: reason } };
}

/** The error shape of an API route: OpenAI JSON, or Anthropic's on /v1/messages. */
export type ErrorDialect = 'openai' | 'anthropic';

/**
 * A 429 for a requests- or tokens-per-minute limit, as OpenAI sends it (`type` "requests" or
 * "tokens", `code` "rate_limit_exceeded") or in Anthropic's shape. `retry-after` in whole seconds
 * and `retry-after-ms` exactly (the openai SDK prefers the latter); a request that can never fit
 * (`retryAfterMs` null) says `x-should-retry: false` so SDKs do not retry it.
 */
export function rateLimitResponse(dialect: ErrorDialect, kind: 'requests' | 'tokens', message: string, retryAfterMs: number | null, headers: Record<string, string> = {}): Response {
  const h: Record<string, string> = { 'content-type': 'application/json', ...headers };
  if (retryAfterMs === null) h['x-should-retry'] = 'false';
  else {
    h['retry-after'] = String(Math.max(1, Math.ceil(retryAfterMs / 1000)));
    h['retry-after-ms'] = String(Math.max(1, Math.ceil(retryAfterMs)));
  }
  const body =
    dialect === 'anthropic'
      ? { type: 'error', error: { type: 'rate_limit_error', message } }
      : { error: { message, type: kind, param: null, code: 'rate_limit_exceeded' } };
  return new Response(JSON.stringify(body), { status: 429, headers: h });
}
