// The mock's Anthropic Messages API, as vLLM serves it (entrypoints/anthropic): POST /v1/messages
// (streaming and not) and POST /v1/messages/count_tokens, with Anthropic's error bodies. The
// request is rendered with the same chat template as /v1/chat/completions, so the prefix cache
// is shared across the APIs as in vLLM (which converts a Messages request to a chat request).
//
// Usage as vLLM reports it since PR #40912: input_tokens = prompt − cached,
// cache_read_input_tokens = cached, cache_creation_input_tokens = 0.

import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';

import type { ParsedRequest } from './openai-format.js';
import { ANTHROPIC_RANK_STATUS, anthropicInBandError, type ProfileBehaviour } from './profiles.js';
import { contentText, countTokens, renderChatPrompt } from './prompt.js';
import { namedEvent, type Counts, type Finish, type WireFormat } from './wire-format.js';

type Json = Record<string, unknown>;

export interface MessagesHost {
  readonly models: readonly string[];
  readonly maxModelLen: number;
  readonly behaviour: ProfileBehaviour;
  /**
   * `rankHeader`: the request's X-data-parallel-rank (vLLM's Messages endpoint runs through its
   * chat path, which reads it); `tokenFaults`: the mid-stream faults (drop, stall, in-band error
   * after N tokens) apply, as on that chat path.
   */
  generate(p: ParsedRequest, format: WireFormat, signal: AbortSignal, res: ServerResponse | null, rankHeader?: string | string[], tokenFaults?: boolean): Promise<void>;
  /** vLLM's message for a rank header out of range, or null (data-parallel.ts). */
  rankProblem(rankHeader: string | string[] | undefined): string | null;
  /** Send a stream's 200 and headers now (the engine's stream headers). */
  openStream(res: ServerResponse): void;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
}

/** Anthropic's error body, as vLLM's translate_error_response writes it. */
function error(res: ServerResponse, status: number, message: string, type = 'invalid_request_error'): void {
  send(res, status, { type: 'error', error: { type, message } });
}

interface Parsed {
  model: string;
  prompt: string;
  maxTokens: number | null;
  stream: boolean;
  stop: string[];
}

function parse(raw: string, host: MessagesHost, needMaxTokens: boolean, res: ServerResponse): Parsed | null {
  let b: Json;
  try {
    const v: unknown = JSON.parse(raw);
    if (!v || typeof v !== 'object' || Array.isArray(v)) return error(res, 400, 'Request body must be a JSON object'), null;
    b = v as Json;
  } catch (e) {
    return error(res, 400, `JSON decode error: ${(e as Error).message}`), null;
  }
  if (typeof b.model !== 'string' || b.model === '') return error(res, 400, 'model: Field required'), null;
  if (!host.models.includes(b.model)) return error(res, 404, `The model \`${b.model}\` does not exist.`, 'not_found_error'), null;
  if (!Array.isArray(b.messages) || b.messages.length === 0) return error(res, 400, 'messages must contain at least one item'), null;
  let maxTokens: number | null = null;
  if (needMaxTokens) {
    if (!Number.isInteger(b.max_tokens) || (b.max_tokens as number) < 1) return error(res, 400, 'max_tokens must be positive'), null;
    maxTokens = b.max_tokens as number;
  }
  const messages: Json[] = [];
  const system = typeof b.system === 'string' ? b.system : contentText(b.system);
  if (system !== '') messages.push({ role: 'system', content: system });
  for (const m of b.messages as Json[]) {
    if (!m || typeof m !== 'object' || typeof m.role !== 'string') return error(res, 400, 'messages: each message needs a role'), null;
    messages.push({ role: m.role, content: contentText(m.content) });
  }
  const tools = Array.isArray(b.tools) ? (b.tools as Json[]).map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } })) : undefined;
  const prompt = renderChatPrompt({ messages, tools });
  if (countTokens(prompt) + (maxTokens ?? 0) > host.maxModelLen) return error(res, 400, `This model's maximum context length is ${host.maxModelLen} tokens.`), null;
  const stop = Array.isArray(b.stop_sequences) ? b.stop_sequences.filter((s): s is string => typeof s === 'string' && s !== '') : [];
  return { model: b.model, prompt, maxTokens, stream: b.stream === true, stop };
}

const STOP_REASON = (done: Finish): string => (done.reason === 'length' ? 'max_tokens' : done.stopReason ? 'stop_sequence' : 'end_turn');

export class MessagesApi {
  constructor(private readonly host: MessagesHost) {}

  async create(req: IncomingMessage, raw: string, res: ServerResponse): Promise<void> {
    const p = parse(raw, this.host, true, res);
    if (!p) return;
    const rankProblem = this.host.rankProblem(req.headers['x-data-parallel-rank']);
    if (rankProblem) {
      if (!this.host.behaviour.rankErrorInBand) return error(res, 400, rankProblem);
      // vLLM: the rank is checked inside AsyncLLM.generate, after a stream's 200 went out; the
      // Messages converter turns the chat error chunk into its own `event: error` (profiles.ts).
      if (p.stream) {
        this.host.openStream(res);
        res.end(anthropicInBandError({ status: 400, type: 'BadRequestError', message: rankProblem }));
        return;
      }
      return error(res, ANTHROPIC_RANK_STATUS, rankProblem, 'internal_error');
    }
    const id = `msg_${randomUUID().replace(/-/g, '')}`;
    const usage = (c: Counts) => ({
      input_tokens: c.promptTokens - c.cachedTokens,
      output_tokens: c.completionTokens,
      cache_read_input_tokens: c.cachedTokens,
      cache_creation_input_tokens: 0,
    });
    const format: WireFormat = {
      open: (c) => [
        namedEvent('message_start', {
          type: 'message_start',
          message: { id, type: 'message', role: 'assistant', model: p.model, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage(c), output_tokens: 0 } },
        }),
        namedEvent('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }),
        namedEvent('ping', { type: 'ping' }),
      ],
      delta: (text) => (text === '' ? [] : [namedEvent('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } })]),
      close: (_text, done, c) => [
        namedEvent('content_block_stop', { type: 'content_block_stop', index: 0 }),
        namedEvent('message_delta', { type: 'message_delta', delta: { stop_reason: STOP_REASON(done), stop_sequence: done.stopReason }, usage: usage(c) }),
        namedEvent('message_stop', { type: 'message_stop' }),
      ],
      // vLLM's converter fails on the chat path's error chunk and says so in its own error event
      // (entrypoints/anthropic/serving.py message_stream_converter, `except Exception`).
      inBandError: (message) => namedEvent('error', { type: 'error', error: { type: 'internal_error', message } }),
      full: (text, done, c) => ({
        id,
        type: 'message',
        role: 'assistant',
        model: p.model,
        content: [{ type: 'text', text }],
        stop_reason: STOP_REASON(done),
        stop_sequence: done.stopReason,
        usage: usage(c),
      }),
    };
    const clientGone = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) clientGone.abort();
    });
    const parsed: ParsedRequest = { kind: 'chat', model: p.model, prompt: p.prompt, maxTokens: p.maxTokens!, stream: p.stream, includeUsage: true, stop: p.stop };
    await this.host.generate(parsed, format, clientGone.signal, res, req.headers['x-data-parallel-rank'], true);
  }

  countTokens(raw: string, res: ServerResponse): void {
    const p = parse(raw, this.host, false, res);
    if (!p) return;
    const n = countTokens(p.prompt);
    send(res, 200, { input_tokens: n, context_management: { original_input_tokens: n } });
  }
}
