// Chat Completions and Completions request bodies: the fields the router relies on (model,
// stream, budgets, messages / prompt); unknown fields pass through to the origin. Pure.

import { z } from 'zod';
import { promptCacheKeySchema, type BodyFailure } from '../../body.js';
import { validateWith } from '../issues.js';

const MAX_STRING = 1_000_000;

const contentPart = z.object({ type: z.string().max(64) }).passthrough();
const message = z
  .object({
    role: z.string().min(1).max(64),
    content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
  })
  .passthrough();

const common = {
  model: z.string().min(1).max(256),
  stream: z.boolean().optional(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).passthrough().nullable().optional(),
  max_tokens: z.number().int().min(0).max(10_000_000).nullable().optional(),
  user: z.string().max(512).optional(),
  prompt_cache_key: promptCacheKeySchema(),
};

export const chatRequestSchema = z
  .object({
    ...common,
    messages: z.array(message).min(1).max(10_000),
    tools: z.array(z.object({ type: z.string() }).passthrough()).max(1024).nullable().optional(),
  })
  .passthrough();

const tokenIds = z.array(z.number().int().min(0).max(2 ** 31));
export const completionRequestSchema = z
  .object({
    ...common,
    prompt: z.union([z.string().max(MAX_STRING * 8), z.array(z.string()).min(1).max(1024), tokenIds.min(1), z.array(tokenIds.min(1)).min(1).max(1024)]),
  })
  .passthrough();

export type ChatRequest = z.infer<typeof chatRequestSchema>;
export type CompletionRequest = z.infer<typeof completionRequestSchema>;
export type OpenAIKind = 'chat' | 'completion';

/** Validate the fields the router relies on; the original object (with unknown fields) is what gets forwarded. */
export function validateRequest(kind: OpenAIKind, body: Record<string, unknown>): { ok: true } | BodyFailure {
  return validateWith(kind === 'chat' ? chatRequestSchema : completionRequestSchema, body);
}

