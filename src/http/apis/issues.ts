// A zod validation failure as the router's tagged body failure: the first issue, named by its
// path, in the words OpenAI's and Anthropic's APIs use; one wording for every dialect. Pure.

import type { z } from 'zod';
import type { BodyFailure } from '../body.js';

function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}

/**
 * "'x' is a required property" only when the field is absent (zod 4 leaves the input out of its
 * issues, so the body is looked up along the issue's path), "Invalid type for 'x': expected a
 * number, but got a string instead." for a value of the wrong JSON type (OpenAI's wording), else
 * "Invalid value for 'x': …".
 */
export function firstIssue(error: z.ZodError, body: unknown): BodyFailure {
  const issue = error.issues[0]!;
  const param = issue.path.map(String).join('.') || undefined;
  let value: unknown = body;
  for (const k of issue.path) value = value !== null && typeof value === 'object' && Object.hasOwn(value, k as PropertyKey) ? (value as Record<PropertyKey, unknown>)[k as PropertyKey] : undefined;
  let message: string;
  if (issue.code === 'invalid_type' && value === undefined) message = `'${param}' is a required property`;
  else if (issue.code === 'invalid_type') {
    const expected = String((issue as { expected?: unknown }).expected ?? 'another type');
    message = `Invalid type for '${param ?? 'body'}': expected ${/^[aeiou]/.test(expected) ? 'an' : 'a'} ${expected}, but got ${jsonType(value)} instead.`;
  } else message = `Invalid value for '${param ?? 'body'}': ${issue.message}`;
  return { ok: false, reason: 'invalid_request', message, param };
}

/** Validate `body` against a schema; the first issue becomes a 400 naming the field. */
export function validateWith(schema: z.ZodType, body: Record<string, unknown>): { ok: true } | BodyFailure {
  const res = schema.safeParse(body);
  return res.success ? { ok: true } : firstIssue(res.error, body);
}
