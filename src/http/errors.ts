// The one mapping from internal failure reasons to HTTP status codes and the error bodies of the
// two wire shapes: OpenAI's `{ "error": { "message", "type", "param", "code" } }` on OpenAI paths,
// Anthropic's `{ "type": "error", "error": { "type", "message" } }` on /v1/messages. One
// exhaustive table per shape; the status is the same in both. Nothing else knows status codes.

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
  | 'response_not_found'
  | 'response_replica_gone'
  | 'response_replica_unavailable'
  | 'tenant_limit'
  | 'auth_rate_limited'
  | 'no_healthy_replica'
  | 'queue_full'
  | 'queue_timeout'
  | 'queue_full_over_share'
  | 'queue_timeout_over_share'
  | 'queue_lost'
  | 'upstream_unavailable'
  | 'upstream_timeout'
  | 'misconfigured'
  | 'internal';

/** Which API's error body a path speaks (its dialect's, http/apis/). */
export type ErrorShape = 'openai' | 'anthropic';

/** Anthropic's error types (https://docs.anthropic.com/en/api/errors). */
export type AnthropicErrorType =
  | 'invalid_request_error'
  | 'authentication_error'
  | 'permission_error'
  | 'not_found_error'
  | 'request_too_large'
  | 'rate_limit_error'
  | 'api_error'
  | 'timeout_error'
  | 'overloaded_error';

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
  response_not_found: { status: 404, type: 'invalid_request_error' },
  response_replica_gone: { status: 404, type: 'invalid_request_error' },
  response_replica_unavailable: { status: 409, type: 'invalid_request_error', retryAfter: true },
  tenant_limit: { status: 429, type: 'rate_limit_error', retryAfter: true },
  auth_rate_limited: { status: 429, type: 'rate_limit_error', retryAfter: true },
  no_healthy_replica: { status: 503, type: 'server_error', retryAfter: true },
  // Flow control (coordinator/queue.ts, docs/operations.md "Flow control"): the pool is saturated
  // (503), or the tenant holds more than its fair share of it (429).
  queue_full: { status: 503, type: 'server_error', retryAfter: true },
  queue_timeout: { status: 503, type: 'server_error', retryAfter: true },
  queue_full_over_share: { status: 429, type: 'rate_limit_error', retryAfter: true },
  queue_timeout_over_share: { status: 429, type: 'rate_limit_error', retryAfter: true },
  queue_lost: { status: 503, type: 'server_error', retryAfter: true },
  upstream_unavailable: { status: 502, type: 'server_error', retryAfter: true },
  upstream_timeout: { status: 504, type: 'server_error', retryAfter: true },
  misconfigured: { status: 500, type: 'server_error' },
  internal: { status: 500, type: 'server_error' },
};

// Anthropic answers an overloaded service with 529 overloaded_error; the router keeps its own 503
// (the same status on every path, for metrics and operators) with that type, which the Anthropic
// SDKs retry like any 5xx.
const ANTHROPIC: Record<ErrorReason, AnthropicErrorType> = {
  invalid_json: 'invalid_request_error',
  invalid_encoding: 'invalid_request_error',
  unsupported_media_type: 'invalid_request_error',
  body_too_large: 'request_too_large',
  headers_too_large: 'invalid_request_error',
  request_timeout: 'timeout_error',
  invalid_request: 'invalid_request_error',
  model_not_found: 'not_found_error',
  pool_not_found: 'not_found_error',
  missing_api_key: 'authentication_error',
  invalid_api_key: 'authentication_error',
  pool_not_allowed: 'permission_error',
  not_found: 'not_found_error',
  method_not_allowed: 'invalid_request_error',
  admin_unauthorized: 'authentication_error',
  token_in_query: 'invalid_request_error',
  conflict: 'invalid_request_error',
  response_not_found: 'not_found_error',
  response_replica_gone: 'not_found_error',
  response_replica_unavailable: 'invalid_request_error',
  tenant_limit: 'rate_limit_error',
  auth_rate_limited: 'rate_limit_error',
  no_healthy_replica: 'overloaded_error',
  queue_full: 'overloaded_error',
  queue_timeout: 'overloaded_error',
  queue_full_over_share: 'rate_limit_error',
  queue_timeout_over_share: 'rate_limit_error',
  queue_lost: 'overloaded_error',
  upstream_unavailable: 'api_error',
  upstream_timeout: 'timeout_error',
  misconfigured: 'api_error',
  internal: 'api_error',
};

export interface ErrorOptions {
  param?: string | null;
  retryAfterSeconds?: number;
  headers?: Record<string, string>;
  /** The body's shape; default OpenAI's. */
  shape?: ErrorShape;
}

export function statusOf(reason: ErrorReason): number {
  return WIRE[reason].status;
}

/** Build the error response for `reason` in `opts.shape`. `message` must never carry secrets. */
export function errorResponse(reason: ErrorReason, message: string, opts: ErrorOptions = {}): Response {
  const wire = WIRE[reason];
  const headers: Record<string, string> = { 'content-type': 'application/json', ...opts.headers };
  if (wire.retryAfter) headers['retry-after'] = String(Math.max(1, Math.ceil(opts.retryAfterSeconds ?? 1)));
  if (wire.status === 401) headers['www-authenticate'] = 'Bearer';
  const body = opts.shape === 'anthropic' ? anthropicErrorBody(reason, message) : { error: { message, type: wire.type, param: opts.param ?? null, code: reason } };
  return new Response(JSON.stringify(body), { status: wire.status, headers });
}

/** Anthropic's error body: `{ "type": "error", "error": { "type", "message" } }`. */
export function anthropicErrorBody(reason: ErrorReason, message: string): { type: 'error'; error: { type: AnthropicErrorType; message: string } } {
  return { type: 'error', error: { type: ANTHROPIC[reason], message } };
}

/** The JSON body alone, for an SSE error event after streaming has started. */
export function errorBody(reason: ErrorReason, message: string): { error: { message: string; type: string; param: null; code: string } } {
  return { error: { message, type: WIRE[reason].type, param: null, code: reason } };
}

/**
 * A 429 for a requests- or tokens-per-minute limit, as OpenAI sends it (`type` "requests" or
 * "tokens", `code` "rate_limit_exceeded") or in Anthropic's shape. `retry-after` in whole seconds
 * and `retry-after-ms` exactly (the openai SDK prefers the latter); a request that can never fit
 * (`retryAfterMs` null) says `x-should-retry: false` so SDKs do not retry it.
 */
export function rateLimitResponse(dialect: ErrorShape, kind: 'requests' | 'tokens', message: string, retryAfterMs: number | null, headers: Record<string, string> = {}): Response {
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
