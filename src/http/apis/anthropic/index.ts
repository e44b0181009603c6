// Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as vLLM and
// SGLang serve it. Pure. Errors on these paths are Anthropic-shaped (isAnthropicPath, errors.ts);
// the routes are in routes.ts, the stream reader and error shape in reader.ts.
//
// Session identity: Claude Code (v2.1.86 and later) sends `X-Claude-Code-Session-Id` on every
// request, one UUID per session; older versions and the Anthropic SDKs' users carry it in
// `metadata.user_id` (Claude Code: `user_<hash>_account_<id>_session_<uuid>`, or a JSON string
// with a `session_id`). Either is one conversation's stable key.

import { z } from 'zod';
import { stableStringify } from '../../../core/index.js';
import { anthropicErrorShape, anthropicReader } from './reader.js';
import { AnthropicAnswer } from './continuation.js';
import type { BodyFailure } from '../../body.js';
import type { Dialect, DialectRequest } from '../dialect.js';
import { fencedBody } from '../fence.js';
import { firstIssue } from '../issues.js';

/** Anthropic's paths (`/v1/messages` and below): every answer there, errors included, is in Anthropic's shape. */
export function isAnthropicPath(path: string): boolean {
  return path === '/v1/messages' || path.startsWith('/v1/messages/');
}

export const CLAUDE_CODE_SESSION_HEADER = 'x-claude-code-session-id';
const SESSION_VALUE = /^[\x21-\x7e]{1,256}$/;

const block = z.object({ type: z.string().min(1).max(64) }).passthrough();
const content = z.union([z.string(), z.array(block).max(10_000)]);
const message = z.object({ role: z.string().min(1).max(64), content }).passthrough();
const common = {
  model: z.string().min(1).max(256),
  messages: z.array(message).min(1).max(10_000),
  system: z.union([z.string(), z.array(block).max(10_000)]).nullable().optional(),
  tools: z.array(z.object({ name: z.string().min(1).max(256) }).passthrough()).max(1024).nullable().optional(),
};

export const messagesRequestSchema = z
  .object({
    ...common,
    max_tokens: z.number().int().min(1).max(10_000_000),
    stream: z.boolean().nullable().optional(),
    metadata: z.object({ user_id: z.string().max(512).nullable().optional() }).passthrough().nullable().optional(),
  })
  .passthrough();

export const countTokensRequestSchema = z.object(common).passthrough();

const SEP_PART = '\u0001';
const SEP_FIELD = '\u0002';

/** Text of `system`: a string, or its text blocks in order. */
function systemText(system: unknown): string {
  if (typeof system === 'string') return system;
  if (!Array.isArray(system)) return '';
  let s = '';
  for (const b of system) if (b && typeof b === 'object' && typeof (b as { text?: unknown }).text === 'string') s += (b as { text: string }).text;
  return s;
}

/**
 * The prompt in the order vLLM renders a Messages request (it converts it to a chat request):
 * tool schemas, the system prompt, then each message's role and content blocks. `cache_control`
 * marks are left out: they change nothing in what the engine computes.
 */
export function messagesPromptText(body: Record<string, unknown>): string {
  let out = '';
  if (Array.isArray(body.tools) && body.tools.length > 0) out += 'tools' + SEP_FIELD + stableStringify(body.tools.map(withoutCacheControl)) + SEP_PART;
  const system = systemText(body.system);
  if (system !== '') out += 'system' + SEP_FIELD + system + SEP_PART;
  if (Array.isArray(body.messages)) {
    for (const m of body.messages) {
      if (m === null || typeof m !== 'object') continue;
      const msg = m as Record<string, unknown>;
      const c = msg.content;
      out += String(msg.role ?? '') + SEP_FIELD + (typeof c === 'string' ? c : Array.isArray(c) ? stableStringify(c.map(withoutCacheControl)) : '') + SEP_PART;
    }
  }
  return out;
}

function withoutCacheControl(v: unknown): unknown {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return v;
  const { cache_control: _cc, ...rest } = v as Record<string, unknown>;
  return rest;
}

function sessionId(req: DialectRequest): string | undefined {
  const h = req.headers.get(CLAUDE_CODE_SESSION_HEADER)?.trim();
  if (h && SESSION_VALUE.test(h)) return h;
  const md = req.body.metadata;
  const user = md && typeof md === 'object' && !Array.isArray(md) ? (md as { user_id?: unknown }).user_id : undefined;
  return typeof user === 'string' && user.trim() !== '' ? user.trim().slice(0, 256) : undefined;
}

function validator(schema: z.ZodType, streams: boolean) {
  return (body: Record<string, unknown>): { ok: true; model: string; stream: boolean } | BodyFailure => {
    const res = schema.safeParse(body);
    if (!res.success) return firstIssue(res.error, body);
    return { ok: true, model: body.model as string, stream: streams && body.stream === true };
  };
}

export const messagesDialect: Dialect = {
  name: 'messages',
  path: '/v1/messages',
  errors: 'anthropic',
  validate: validator(messagesRequestSchema, true),
  sessionId,
  promptText: messagesPromptText,
  // Usage comes with message_start and message_delta unasked.
  prepareBody: (body, opts) => ({ body: JSON.stringify(fencedBody(body, opts)), stripUsageChunk: false }),
  reader: () => anthropicReader(),
  originError: anthropicErrorShape,
  // A stream broken after its first token continues on another replica's chat path (continuation.ts).
  continuation: (body) => new AnthropicAnswer(body),
};

export const countTokensDialect: Dialect = {
  ...messagesDialect,
  name: 'count_tokens',
  path: '/v1/messages/count_tokens',
  validate: validator(countTokensRequestSchema, false),
  continuation: undefined,
  // count_tokens never streams: a `stream` field is the origin's to refuse, not a stream for the tap.
  prepareBody: (body, opts) => ({ body: JSON.stringify(fencedBody(body, opts)), stripUsageChunk: false }),
};
