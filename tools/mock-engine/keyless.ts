// The mock replica's keyless endpoints, in vLLM's wire formats: POST /v1/embeddings, /v1/rerank
// (also /rerank, /v2/rerank), /v1/score (also /score), /tokenize, /detokenize. Pure: a request
// body in, a status and a JSON body out; server.ts routes and counts them.
//
// Response shapes from vLLM's pydantic models (vllm-project/vllm): pooling/embed (EmbeddingResponse:
// id "embd-…", object "list", created, model, data[{index, object "embedding", embedding}], usage),
// pooling/scoring/protocol.py (RerankResponse: id, model, usage{prompt_tokens, total_tokens},
// results[{index, document{text}, relevance_score}] best first, `top_n` of them when > 0;
// ScoreResponse: data[{index, object "score", score}]), serve/tokenize/protocol.py
// (TokenizeResponse: count, max_model_len, tokens, token_strs; DetokenizeResponse: prompt).
// Errors as vLLM's ErrorResponse (openai-format.ts errorBody): 400 BadRequestError, 404 NotFoundError.
//
// The model behind them is a toy: an embedding is a unit vector drawn from a hash of the text (the
// same text always gives the same vector, on every replica); rerank and score are the word overlap
// (Jaccard) of the two texts; the tokenizer is byte-level (one token per UTF-8 byte, ids offset
// by 3 after <pad>=0, <s>=1, </s>=2), so tokenize and detokenize round-trip. Usage counts the same
// 4-character tokens as the chat endpoints.

import { randomUUID } from 'node:crypto';
import { hashString } from '../../src/core/hash.js';
import type { WireError } from './openai-format.js';
import { contentText, countTokens, renderChatPrompt } from './prompt.js';

export type KeylessApi = 'embeddings' | 'rerank' | 'score' | 'tokenize' | 'detokenize';

/** The keyless API behind a POST path, or null. */
export function keylessApiFor(path: string): KeylessApi | null {
  switch (path) {
    case '/v1/embeddings':
      return 'embeddings';
    case '/v1/rerank':
    case '/rerank':
    case '/v2/rerank':
      return 'rerank';
    case '/v1/score':
    case '/score':
      return 'score';
    case '/tokenize':
      return 'tokenize';
    case '/detokenize':
      return 'detokenize';
    default:
      return null;
  }
}

export type KeylessResult = { ok: true; body: unknown; promptTokens: number } | { ok: false; error: WireError };

export interface KeylessContext {
  models: readonly string[];
  maxModelLen: number;
  /** Seconds since the epoch, for `created`. */
  now: number;
}

const DEFAULT_DIMENSIONS = 32;
const SPECIAL_TOKENS = 3; // <pad>, <s>, </s>
const BOS = 1;

const bad = (message: string, param: string | null = null): KeylessResult => ({ ok: false, error: { status: 400, type: 'BadRequestError', message, param } });

export function answerKeyless(api: KeylessApi, raw: string, ctx: KeylessContext): KeylessResult {
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch (err) {
    return bad(`JSON decode error: ${(err as Error).message}`);
  }
  if (!isRecord(parsed)) return bad('Request body must be a JSON object');
  const b = parsed;
  // vLLM serves the default model when `model` is absent.
  let model = ctx.models[0]!;
  if (b.model !== undefined && b.model !== null) {
    if (typeof b.model !== 'string' || !ctx.models.includes(b.model)) return { ok: false, error: { status: 404, type: 'NotFoundError', message: `The model \`${String(b.model)}\` does not exist.`, param: 'model' } };
    model = b.model;
  }
  switch (api) {
    case 'embeddings':
      return embeddings(b, model, ctx);
    case 'rerank':
      return rerank(b, model);
    case 'score':
      return score(b, model, ctx);
    case 'tokenize':
      return tokenize(b, ctx);
    case 'detokenize':
      return detokenize(b);
  }
}

function embeddings(b: Record<string, unknown>, model: string, ctx: KeylessContext): KeylessResult {
  let texts: string[];
  if (b.messages !== undefined) {
    if (!Array.isArray(b.messages) || b.messages.length === 0) return bad('messages: Input should be a non-empty list', 'messages');
    texts = [renderChatPrompt({ messages: b.messages, tools: b.tools })];
  } else {
    const input = b.input;
    if (typeof input === 'string') texts = [input];
    else if (Array.isArray(input) && input.length > 0 && input.every((x) => typeof x === 'string')) texts = input as string[];
    else if (Array.isArray(input) && input.length > 0 && input.every(isTokenId)) texts = [tokensToText(input as number[])];
    else if (Array.isArray(input) && input.length > 0 && input.every((x) => Array.isArray(x) && x.length > 0 && x.every(isTokenId))) texts = (input as number[][]).map(tokensToText);
    else return bad('input: Input should be a valid string, a list of strings, or token ids', 'input');
  }
  const format = b.encoding_format ?? 'float';
  if (format !== 'float' && format !== 'base64') return bad("encoding_format: Input should be 'float' or 'base64'", 'encoding_format');
  const dims = b.dimensions ?? null;
  if (dims !== null && !(Number.isInteger(dims) && (dims as number) >= 1 && (dims as number) <= 4096)) return bad('dimensions: must be a positive integer', 'dimensions');
  const n = (dims as number | null) ?? DEFAULT_DIMENSIONS;
  let promptTokens = 0;
  const data = texts.map((t, index) => {
    promptTokens += countTokens(t);
    const v = embed(t, n);
    return { index, object: 'embedding', embedding: format === 'base64' ? Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64') : Array.from(v) };
  });
  if (promptTokens > ctx.maxModelLen * texts.length) return bad(`This model's maximum context length is ${ctx.maxModelLen} tokens.`, 'input');
  return { ok: true, promptTokens, body: { id: `embd-${randomUUID()}`, object: 'list', created: ctx.now, model, data, usage: usage(promptTokens) } };
}

function rerank(b: Record<string, unknown>, model: string): KeylessResult {
  if (typeof b.query !== 'string') return bad('query: Input should be a valid string', 'query');
  if (!Array.isArray(b.documents) || b.documents.length === 0) return bad('documents: Input should be a non-empty list', 'documents');
  const docs = b.documents.map(docText);
  const topN = b.top_n === undefined ? 0 : b.top_n;
  if (!Number.isInteger(topN) || (topN as number) < 0) return bad('top_n: Input should be a non-negative integer', 'top_n');
  const query = b.query;
  const scored = docs.map((text, index) => ({ index, document: { text }, relevance_score: overlap(query, text) }));
  scored.sort((x, y) => y.relevance_score - x.relevance_score || x.index - y.index);
  const results = (topN as number) > 0 ? scored.slice(0, topN as number) : scored;
  const promptTokens = docs.reduce((s, d) => s + countTokens(query) + countTokens(d), 0);
  return { ok: true, promptTokens, body: { id: `rerank-${randomUUID()}`, model, usage: { prompt_tokens: promptTokens, total_tokens: promptTokens }, results } };
}

const SCORE_PAIRS = [
  ['text_1', 'text_2'],
  ['data_1', 'data_2'],
  ['queries', 'documents'],
  ['queries', 'items'],
] as const;

function score(b: Record<string, unknown>, model: string, ctx: KeylessContext): KeylessResult {
  const pair = SCORE_PAIRS.find(([a, c]) => b[a] !== undefined && b[c] !== undefined);
  if (!pair) return bad('one pair of inputs is required: text_1/text_2, data_1/data_2, queries/documents or queries/items', 'text_1');
  const left = asTexts(b[pair[0]]);
  const right = asTexts(b[pair[1]]);
  if (!left || !right) return bad(`${pair[0]}, ${pair[1]}: Input should be a string or a non-empty list of strings`, pair[0]);
  // vLLM pairs one text with many (1:N) or two lists of equal length item by item (N:N).
  let pairs: [string, string][];
  if (left.length === 1) pairs = right.map((r) => [left[0]!, r]);
  else if (left.length === right.length) pairs = left.map((l, i) => [l, right[i]!]);
  else return bad(`${pair[0]} and ${pair[1]} must have the same length, or ${pair[0]} one item`, pair[1]);
  let promptTokens = 0;
  const data = pairs.map(([l, r], index) => {
    promptTokens += countTokens(l) + countTokens(r);
    return { index, object: 'score', score: overlap(l, r) };
  });
  return { ok: true, promptTokens, body: { id: `score-${randomUUID()}`, object: 'list', created: ctx.now, model, data, usage: usage(promptTokens) } };
}

function tokenize(b: Record<string, unknown>, ctx: KeylessContext): KeylessResult {
  let text: string;
  let special: boolean;
  if (b.messages !== undefined) {
    if (!Array.isArray(b.messages) || b.messages.length === 0) return bad('messages: Input should be a non-empty list', 'messages');
    if (b.add_generation_prompt === true && b.continue_final_message === true) return bad('Cannot set both `continue_final_message` and `add_generation_prompt` to True.');
    text = renderChatPrompt({ messages: b.messages, tools: b.tools });
    if (b.add_generation_prompt === false) text = text.replace(/<\|assistant\|>\n$/, '');
    special = b.add_special_tokens === true; // the chat template adds them
  } else {
    if (typeof b.prompt !== 'string') return bad('prompt: Input should be a valid string', 'prompt');
    text = b.prompt;
    special = b.add_special_tokens !== false;
  }
  const tokens = [...(special ? [BOS] : []), ...[...Buffer.from(text, 'utf8')].map((byte) => byte + SPECIAL_TOKENS)];
  const body: Record<string, unknown> = { count: tokens.length, max_model_len: ctx.maxModelLen, tokens };
  if (b.return_token_strs === true) body.token_strs = tokens.map(tokenStr);
  return { ok: true, promptTokens: tokens.length, body };
}

function detokenize(b: Record<string, unknown>): KeylessResult {
  if (!Array.isArray(b.tokens) || !b.tokens.every(isTokenId)) return bad('tokens: Input should be a list of non-negative integers', 'tokens');
  const ids = b.tokens as number[];
  const bad256 = ids.find((t) => t >= 256 + SPECIAL_TOKENS);
  if (bad256 !== undefined) return bad(`Token id ${bad256} is out of vocabulary`, 'tokens');
  return { ok: true, promptTokens: ids.length, body: { prompt: tokensToText(ids) } };
}

/** A deterministic unit vector for `text`. */
function embed(text: string, n: number): Float32Array {
  const v = new Float32Array(n);
  let norm = 0;
  for (let i = 0; i < n; i++) {
    const x = (hashString(`${i}\u0000${text}`) / 0xffffffff) * 2 - 1;
    v[i] = x;
    norm += x * x;
  }
  const s = norm > 0 ? 1 / Math.sqrt(norm) : 0;
  for (let i = 0; i < n; i++) v[i] = v[i]! * s;
  return v;
}

/** Jaccard overlap of the lower-cased word sets, 0..1. */
function overlap(a: string, b: string): number {
  const words = (s: string) => new Set(s.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? []);
  const x = words(a);
  const y = words(b);
  if (x.size === 0 && y.size === 0) return 0;
  let both = 0;
  for (const w of x) if (y.has(w)) both++;
  return both / (x.size + y.size - both);
}

function tokensToText(ids: readonly number[]): string {
  const bytes = ids.filter((t) => t >= SPECIAL_TOKENS && t < 256 + SPECIAL_TOKENS).map((t) => t - SPECIAL_TOKENS);
  return Buffer.from(bytes).toString('utf8');
}

function tokenStr(id: number): string {
  if (id < SPECIAL_TOKENS) return ['<pad>', '<s>', '</s>'][id]!;
  const byte = id - SPECIAL_TOKENS;
  return byte >= 0x20 && byte < 0x7f ? String.fromCharCode(byte) : `<0x${byte.toString(16).toUpperCase().padStart(2, '0')}>`;
}

function asTexts(v: unknown): string[] | null {
  if (typeof v === 'string') return [v];
  if (Array.isArray(v) && v.length > 0) return v.map(docText);
  if (isRecord(v)) return [docText(v)];
  return null;
}

/** A document or score input: a string, or a multimodal part whose text is used. */
function docText(d: unknown): string {
  if (typeof d === 'string') return d;
  if (isRecord(d)) return contentText(d.content ?? [d]);
  return '';
}

function usage(promptTokens: number) {
  return { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null };
}

function isTokenId(x: unknown): x is number {
  return typeof x === 'number' && Number.isInteger(x) && x >= 0;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
