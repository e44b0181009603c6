// The keyless APIs as vLLM serves them: embeddings, rerank (/v1/rerank and vLLM's /rerank,
// /v2/rerank aliases), score (/v1/score, /score), tokenize, detokenize. Pure. No prefix to keep:
// the shared path routes them by the pool's fallback strategy (least-load by default), leased
// like any request. The reader is reader.ts, the routes routes.ts.
//
// Request fields and types from vLLM's pydantic models (vllm-project/vllm):
// - pooling/base/protocol.py PoolingBasicRequestMixin (model, user, truncate_prompt_tokens ≥ -1,
//   padding, truncation_side, request_id, priority, mm_processor_kwargs, cache_salt 1-1024),
//   CompletionRequestMixin (`input`: str | list[str] | list[int] | list[list[int]]),
//   ChatRequestMixin (`messages`), EmbedRequestMixin (encoding_format, dimensions, use_activation);
// - pooling/scoring/protocol.py RerankRequest (query, documents, top_n ≥ 0) and ScoreRequest (one
//   pair of text_1/text_2, data_1/data_2, queries/documents or queries/items);
// - serve/tokenize/protocol.py TokenizeCompletionRequest (prompt), TokenizeChatRequest (messages;
//   add_generation_prompt and continue_final_message not both true), DetokenizeRequest (tokens,
//   ints ≥ 0).
// The router needs `model` (it picks the pool), so it is required here though vLLM defaults it.
// Engine control fields never come from a client (fence.ts: `priority`, `request_id`,
// `cache_salt`, `mm_processor_kwargs`, ...); the router's own `request_id` and the tenant's
// `cache_salt` go in instead, as for every dialect.

import { z } from 'zod';
import { engineApiPath, type EngineName, type KeylessApi } from '../../../engines/index.js';
import { estimatePromptTokens, type PromptFields } from '../../../quota/limits.js';
import type { PreparedBody, PrepareBodyOptions } from '../../../proxy/upstream-request.js';
import type { BodyFailure } from '../../body.js';
import { validateWith } from '../issues.js';
import type { Dialect, ValidRequest } from '../dialect.js';
import { fencedBody } from '../fence.js';
import { keylessReader } from './reader.js';

const MAX_ITEMS = 2048; // OpenAI's cap on inputs per embeddings request
const object = z.record(z.string(), z.unknown());
const tokenId = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const message = z.object({ role: z.string().min(1).max(64), content: z.union([z.string(), z.array(z.object({ type: z.string().max(64) }).passthrough()), z.null()]).optional() }).passthrough();
const messages = z.array(message).min(1).max(10_000);

const pooling = {
  model: z.string().min(1).max(256),
  user: z.string().max(512).nullable().optional(),
  truncate_prompt_tokens: z.number().int().min(-1).max(100_000_000).nullable().optional(),
  padding: z.enum(['max_length', 'do_not_pad']).nullable().optional(),
  truncation_side: z.enum(['left', 'right']).nullable().optional(),
  mm_processor_kwargs: object.nullable().optional(),
  cache_salt: z.string().min(1).max(1024).nullable().optional(),
  use_activation: z.boolean().nullable().optional(),
  stream: z.literal(false, { error: 'this API does not stream' }).optional(),
};

const chatOptions = {
  add_generation_prompt: z.boolean().optional(),
  continue_final_message: z.boolean().optional(),
  add_special_tokens: z.boolean().optional(),
  chat_template: z.string().nullable().optional(),
  chat_template_kwargs: object.nullable().optional(),
  media_io_kwargs: object.nullable().optional(),
};

const notBoth = (b: { add_generation_prompt?: boolean; continue_final_message?: boolean }, ctx: z.RefinementCtx) => {
  if (b.add_generation_prompt === true && b.continue_final_message === true) {
    ctx.addIssue({ code: 'custom', path: ['continue_final_message'], message: 'cannot set both `continue_final_message` and `add_generation_prompt` to true' });
  }
};

/** Exactly one of `fields` present (vLLM's request unions are told apart by which fields are set). */
const exactlyOne = (fields: readonly string[]) => (b: Record<string, unknown>, ctx: z.RefinementCtx) => {
  const present = fields.filter((f) => b[f] !== undefined);
  if (present.length === 0) ctx.addIssue({ code: 'custom', path: [fields[0]!], message: `one of ${fields.map((f) => `'${f}'`).join(', ')} is required` });
  else if (present.length > 1) ctx.addIssue({ code: 'custom', path: [present[1]!], message: `only one of ${present.map((f) => `'${f}'`).join(', ')} may be set` });
};

export const embeddingsRequestSchema = z
  .object({
    ...pooling,
    ...chatOptions,
    input: z.union([z.string(), z.array(z.string()).min(1).max(MAX_ITEMS), z.array(tokenId).min(1), z.array(z.array(tokenId).min(1)).min(1).max(MAX_ITEMS)]).optional(),
    messages: messages.optional(),
    encoding_format: z.string().min(1).max(32).optional(),
    dimensions: z.number().int().min(1).max(1_000_000).nullable().optional(),
    embed_dtype: z.string().min(1).max(32).optional(),
    endianness: z.string().min(1).max(32).optional(),
  })
  .passthrough()
  .superRefine((b, ctx) => {
    exactlyOne(['input', 'messages'])(b, ctx);
    notBoth(b, ctx);
  });

const scoreInput = z.union([z.string(), object]);
const scoreInputs = z.union([z.string(), z.array(scoreInput).min(1).max(10_000), object]);

export const rerankRequestSchema = z
  .object({ ...pooling, query: scoreInput, documents: z.union([z.array(scoreInput).min(1).max(10_000), object]), top_n: z.number().int().min(0).max(10_000).optional() })
  .passthrough();

const SCORE_PAIRS: readonly (readonly [string, string])[] = [
  ['text_1', 'text_2'],
  ['data_1', 'data_2'],
  ['queries', 'documents'],
  ['queries', 'items'],
];

export const scoreRequestSchema = z
  .object({ ...pooling, text_1: scoreInputs.optional(), text_2: scoreInputs.optional(), data_1: scoreInputs.optional(), data_2: scoreInputs.optional(), queries: scoreInputs.optional(), documents: scoreInputs.optional(), items: scoreInputs.optional() })
  .passthrough()
  .superRefine((b, ctx) => {
    const complete = SCORE_PAIRS.filter(([a, c]) => b[a] !== undefined && b[c] !== undefined);
    if (complete.length === 1) {
      const [a, c] = complete[0]!;
      const stray = ['text_1', 'text_2', 'data_1', 'data_2', 'queries', 'documents', 'items'].find((f) => f !== a && f !== c && b[f] !== undefined);
      if (stray) ctx.addIssue({ code: 'custom', path: [stray], message: `'${stray}' cannot be combined with '${a}' and '${c}'` });
      return;
    }
    const pairs = SCORE_PAIRS.map(([a, c]) => `${a}/${c}`).join(', ');
    ctx.addIssue({ code: 'custom', path: [complete.length > 1 ? 'documents' : 'text_1'], message: complete.length > 1 ? 'send one pair of inputs, not several' : `one pair of inputs is required: ${pairs}` });
  });

export const tokenizeRequestSchema = z
  .object({
    model: pooling.model,
    stream: pooling.stream,
    ...chatOptions,
    // vLLM takes one string; SGLang also a list of strings (vLLM refuses that itself).
    prompt: z.union([z.string(), z.array(z.string()).min(1).max(MAX_ITEMS)]).optional(),
    messages: messages.optional(),
    return_token_strs: z.boolean().nullable().optional(),
    tools: z.array(z.object({ type: z.string() }).passthrough()).max(1024).nullable().optional(),
    mm_processor_kwargs: object.nullable().optional(),
  })
  .passthrough()
  .superRefine((b, ctx) => {
    exactlyOne(['prompt', 'messages'])(b, ctx);
    notBoth(b, ctx);
  });

export const detokenizeRequestSchema = z.object({ model: pooling.model, stream: pooling.stream, tokens: z.array(tokenId).max(10_000_000) }).passthrough();

const SCHEMAS: Record<KeylessApi, z.ZodType> = {
  embeddings: embeddingsRequestSchema,
  rerank: rerankRequestSchema,
  score: scoreRequestSchema,
  tokenize: tokenizeRequestSchema,
  detokenize: detokenizeRequestSchema,
};

/** The upstream body: the client's JSON, key order and unknown fields kept, engine control fields fenced (fence.ts). */
export function prepareKeylessBody(input: Record<string, unknown>, opts?: PrepareBodyOptions): PreparedBody {
  return { body: JSON.stringify(fencedBody(input, opts)), stripUsageChunk: false };
}

/**
 * Prompt tokens of a keyless request for the admission charge (quota/limits.ts
 * estimatePromptTokens over these APIs' text fields): text over 4 characters a token, a token id
 * as one token; rerank and score count the query once per document, as the engine pairs them.
 * Multimodal data URLs are not counted. Settled from usage.
 */
export function keylessPromptTokens(body: Record<string, unknown>): number {
  return estimatePromptTokens(body, KEYLESS_PROMPT);
}

const KEYLESS_PROMPT: PromptFields = {
  fields: ['input', 'messages', 'prompt', 'query', 'documents', 'text_1', 'text_2', 'data_1', 'data_2', 'queries', 'items', 'tokens'],
  tokenIds: true,
  extraChars(body) {
    const pairs = Array.isArray(body.documents) ? body.documents.length : Array.isArray(body.text_2) ? body.text_2.length : 1;
    const query = typeof body.query === 'string' ? body.query.length : typeof body.text_1 === 'string' ? body.text_1.length : 0;
    return query * Math.max(0, pairs - 1);
  },
};

function keyless(api: KeylessApi, path: string): Dialect {
  return {
    name: api,
    path,
    errors: 'openai',
    validate(body): ValidRequest | BodyFailure {
      const v = validateWith(SCHEMAS[api], body);
      return v.ok ? { ok: true, model: body.model as string, stream: false } : v;
    },
    promptText: () => '',
    prepareBody: prepareKeylessBody,
    reader: () => keylessReader,
    keyless: { api, upstreamPath: (engine: EngineName) => engineApiPath(engine, api, path), promptTokens: keylessPromptTokens },
  };
}

export const embeddingsDialect = keyless('embeddings', '/v1/embeddings');
export const rerankDialects: readonly Dialect[] = ['/v1/rerank', '/rerank', '/v2/rerank'].map((p) => keyless('rerank', p));
export const scoreDialects: readonly Dialect[] = ['/v1/score', '/score'].map((p) => keyless('score', p));
export const tokenizeDialect = keyless('tokenize', '/tokenize');
export const detokenizeDialect = keyless('detokenize', '/detokenize');

export const KEYLESS_DIALECTS: readonly Dialect[] = [embeddingsDialect, ...rerankDialects, ...scoreDialects, tokenizeDialect, detokenizeDialect];
