// A zod validation failure as the router's tagged body failure: the first issue, named by its
// path, in the words OpenAI's and Anthropic's APIs use. Pure.

import type { z } from 'zod';
import type { BodyFailure } from '../body.js';

export function firstIssue(error: z.ZodError): BodyFailure {
  const issue = error.issues[0]!;
  const param = issue.path.map(String).join('.') || undefined;
  const missing = issue.code === 'invalid_type' && (issue as { input?: unknown }).input === undefined;
  const message = missing ? `'${param}' is a required property` : `Invalid value for '${param ?? 'body'}': ${issue.message}`;
  return { ok: false, reason: 'invalid_request', message, param };
}

/** Validate `body` against a schema; the first issue becomes a 400 naming the field. */
export function validateWith(schema: z.ZodType, body: Record<string, unknown>): { ok: true } | BodyFailure {
  const res = schema.safeParse(body);
  return res.success ? { ok: true } : firstIssue(res.error);
}
