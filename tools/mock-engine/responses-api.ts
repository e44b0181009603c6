// The mock's OpenAI Responses API, as vLLM serves it: POST /v1/responses (streaming, not, and
// `background`), GET /v1/responses/{id} (`?stream=true` replays a background response's events),
// POST /v1/responses/{id}/cancel; no DELETE (a 405, as FastAPI answers a method a path lacks).
// Stored responses live in this instance's memory only, so any other replica answers 404 for
// them, as vLLM does. The store is the profile's (profiles.ts `responsesStore`): vLLM's is off
// unless VLLM_ENABLE_RESPONSES_API_STORE=1 (responses/serving.py `enable_store`); then
// `store: true` is quietly dropped, `background` is a 400 and `previous_response_id` a 404.
//
// Shapes follow vllm/entrypoints/openai/responses (protocol.py ResponsesResponse, serving.py
// responses_stream_generator and _process_simple_streaming_events): `event: <type>` + `data:`
// with `type` and `sequence_number`; the response id is the request's `request_id` when given.

import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';

import { parseCacheSalt, type ParsedRequest } from './openai-format.js';
import type { ProfileBehaviour } from './profiles.js';
import { contentText, countTokens, renderChatPrompt } from './prompt.js';
import { namedEvent, type Counts, type Finish, type WireFormat } from './wire-format.js';

type Json = Record<string, unknown>;
type Status = 'queued' | 'in_progress' | 'completed' | 'incomplete' | 'cancelled' | 'failed';

/** What the Responses API needs from the replica. */
export interface ResponsesHost {
  readonly models: readonly string[];
  readonly maxModelLen: number;
  readonly behaviour: ProfileBehaviour;
  /** `tokenFaults`: the mid-stream faults (drop, stall, in-band error after N tokens) apply. */
  generate(p: ParsedRequest, format: WireFormat, signal: AbortSignal, res: ServerResponse | null, rankHeader?: string | string[], tokenFaults?: boolean): Promise<void>;
}

interface Stored {
  response: Json;
  /** The conversation as messages, the assistant's answer last: what a follow-up continues. */
  messages: Json[];
  abort: AbortController;
  /** Background responses: every event so far, for `GET ?stream=true`. */
  events: Array<{ type: string; text: string }>;
  waiters: Array<() => void>;
}

/** vLLM's ErrorResponse. */
function error(res: ServerResponse, status: number, message: string, type = 'invalid_request_error', param: string | null = null): void {
  send(res, status, { error: { message, type, param, code: status } });
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
}

/** vLLM's _make_not_found_error (param `response_id` in current releases; the legacy mock sent none). */
const notFound = (res: ServerResponse, id: string, b: ProfileBehaviour): void =>
  error(res, 404, `Response with id '${id}' not found.`, 'invalid_request_error', b.profile === 'legacy' ? null : 'response_id');

export class ResponsesApi {
  readonly #store = new Map<string, Stored>();

  constructor(private readonly host: ResponsesHost) {}

  get storedCount(): number {
    return this.#store.size;
  }

  clear(): void {
    for (const s of this.#store.values()) s.abort.abort();
    this.#store.clear();
  }

  async create(req: IncomingMessage, raw: string, res: ServerResponse): Promise<void> {
    let b: Json;
    try {
      const v: unknown = JSON.parse(raw);
      if (!v || typeof v !== 'object' || Array.isArray(v)) return error(res, 400, 'Request body must be a JSON object');
      b = v as Json;
    } catch (e) {
      return error(res, 400, `JSON decode error: ${(e as Error).message}`);
    }
    const model = typeof b.model === 'string' && b.model !== '' ? b.model : this.host.models[0]!;
    if (!this.host.models.includes(model)) return error(res, 404, `The model \`${model}\` does not exist.`, 'NotFoundError', 'model');
    if (b.input === undefined) return error(res, 400, 'input: Field required', 'invalid_request_error', 'input');

    const b_ = this.host.behaviour;
    // _validate_create_responses_input (responses/serving.py): background needs the store, and
    // `store` defaults to true; this check comes before previous_response_id is looked up.
    if (!b_.responsesStore && b.store !== false && b.background === true) {
      return error(
        res,
        400,
        'This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, ' +
          'set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.',
        'invalid_request_error',
        'background',
      );
    }
    let history: Json[] = [];
    const prevId = typeof b.previous_response_id === 'string' ? b.previous_response_id : null;
    if (prevId !== null) {
      const prev = this.#store.get(prevId);
      if (!prev) return notFound(res, prevId, this.host.behaviour);
      history = prev.messages;
    }
    const messages: Json[] = [...history];
    if (typeof b.instructions === 'string' && b.instructions !== '' && history.length === 0) messages.push({ role: 'system', content: b.instructions });
    if (typeof b.input === 'string') messages.push({ role: 'user', content: b.input });
    else if (Array.isArray(b.input)) {
      for (const it of b.input as Json[]) {
        if (!it || typeof it !== 'object') continue;
        if (typeof it.role === 'string') messages.push({ role: it.role, content: contentText(it.content) });
        else if (it.type === 'function_call_output') messages.push({ role: 'tool', content: String(it.output ?? '') });
        else if (it.type === 'function_call') messages.push({ role: 'assistant', content: `${String(it.name)}(${String(it.arguments)})` });
      }
    } else return error(res, 400, 'input: Input should be a valid string or list', 'invalid_request_error', 'input');

    const maxTokens = b.max_output_tokens == null ? 16 : Number(b.max_output_tokens);
    if (!Number.isInteger(maxTokens) || maxTokens < 1) return error(res, 400, 'max_output_tokens must be at least 1', 'invalid_request_error', 'max_output_tokens');
    // A last input item that is an assistant message (or reasoning) with status in_progress or
    // incomplete is continued, not closed: vLLM's should_continue_final_message
    // (vllm/entrypoints/openai/responses/utils.py, PR #32100) turns on continue_final_message.
    const last = Array.isArray(b.input) ? (b.input as Json[])[b.input.length - 1] : undefined;
    const continueFinal = !!last && typeof last === 'object' && ['message', 'reasoning'].includes(String(last.type ?? 'message')) && (last.status === 'in_progress' || last.status === 'incomplete');
    const prompt = renderChatPrompt({ messages, tools: b.tools }, continueFinal);
    if (countTokens(prompt) + maxTokens > this.host.maxModelLen) return error(res, 400, `This model's maximum context length is ${this.host.maxModelLen} tokens.`);
    // ResponsesRequest.check_cache_salt_support (vllm/entrypoints/openai/engine/protocol.py).
    const salt = parseCacheSalt(b);
    if ('status' in salt) return error(res, 400, salt.message, 'invalid_request_error', 'cache_salt');
    // Without the store, `store: true` is turned off quietly and the response says so.
    const store = b.store !== false && b_.responsesStore;
    const background = b.background === true;
    if (background && !store) return error(res, 400, 'background mode needs store=true');
    const stream = b.stream === true;
    const id = typeof b.request_id === 'string' && b.request_id !== '' ? b.request_id : `resp_${randomUUID().replace(/-/g, '')}`;
    if (this.#store.has(id)) return error(res, 400, `Response id '${id}' already exists.`);

    const created = Math.floor(Date.now() / 1000);
    const itemId = `msg_${randomUUID().replace(/-/g, '')}`;
    const response = (status: Status, text: string | null, c: Counts | null): Json => ({
      id,
      object: 'response',
      created_at: created,
      model,
      status,
      background,
      instructions: typeof b.instructions === 'string' ? b.instructions : null,
      max_output_tokens: b.max_output_tokens ?? null,
      previous_response_id: prevId,
      output:
        text === null
          ? []
          : [{ id: itemId, type: 'message', role: 'assistant', status: status === 'completed' ? 'completed' : 'incomplete', content: [{ type: 'output_text', text, annotations: [], logprobs: [] }] }],
      parallel_tool_calls: true,
      tool_choice: b.tool_choice ?? 'auto',
      tools: Array.isArray(b.tools) ? b.tools : [],
      temperature: typeof b.temperature === 'number' ? b.temperature : 1,
      top_p: typeof b.top_p === 'number' ? b.top_p : 1,
      text: { format: { type: 'text' } },
      truncation: 'disabled',
      store,
      metadata: b.metadata ?? null,
      reasoning: null,
      service_tier: 'auto',
      user: null,
      error: null,
      incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
      usage:
        c === null
          ? null
          : {
              input_tokens: c.promptTokens,
              input_tokens_details: { cached_tokens: c.cachedTokens },
              output_tokens: c.completionTokens,
              output_tokens_details: { reasoning_tokens: 0 },
              total_tokens: c.promptTokens + c.completionTokens,
            },
    });

    const abort = new AbortController();
    const entry: Stored = { response: response(background ? 'queued' : 'in_progress', null, null), messages, abort, events: [], waiters: [] };
    if (store) this.#store.set(id, entry);
    let seq = 0;
    const ev = (type: string, data: Json): string => {
      const text = namedEvent(type, { type, sequence_number: seq++, ...data });
      if (background) {
        entry.events.push({ type, text });
        for (const w of entry.waiters.splice(0)) w();
      }
      return text;
    };
    const part = (t: string) => ({ type: 'output_text', text: t, annotations: [], logprobs: [] });
    const statusOf = (done: Finish | null): Status => (entry.response.status === 'cancelled' ? 'cancelled' : done === null ? 'failed' : done.reason === 'length' && b.max_output_tokens != null ? 'incomplete' : 'completed');
    const format: WireFormat = {
      open: () => [
        ...((entry.response = { ...entry.response, status: 'in_progress' }), []),
        ev('response.created', { response: response('in_progress', null, null) }),
        ev('response.in_progress', { response: response('in_progress', null, null) }),
        ev('response.output_item.added', { output_index: 0, item: { id: itemId, type: 'message', role: 'assistant', status: 'in_progress', content: [] } }),
        ev('response.content_part.added', { output_index: 0, item_id: itemId, content_index: 0, part: part('') }),
      ],
      delta: (text) => (text === '' ? [] : [ev('response.output_text.delta', { output_index: 0, item_id: itemId, content_index: 0, delta: text, logprobs: [] })]),
      close: (text, done, c) => {
        const final = response(statusOf(done), text, c);
        return [
          ev('response.output_text.done', { output_index: 0, item_id: itemId, content_index: 0, text, logprobs: [] }),
          ev('response.content_part.done', { output_index: 0, item_id: itemId, content_index: 0, part: part(text) }),
          ev('response.output_item.done', { output_index: 0, item: (final.output as Json[])[0] }),
          // vLLM's responses_stream_generator ends with response.completed whatever the status.
          ev(final.status === 'incomplete' && b_.responsesIncompleteEvent ? 'response.incomplete' : 'response.completed', { response: final }),
        ];
      },
      // A mid-stream engine failure as the Responses stream's error event (openai ResponseErrorEvent).
      inBandError: (message) => ev('error', { code: 'internal_error', message, param: null }),
      full: (text, done, c) => response(statusOf(done), text, c),
      finished: (text, done, c) => {
        entry.response = response(statusOf(done), done === null && entry.response.status !== 'cancelled' ? null : text, done === null ? null : c);
        entry.messages = [...messages, { role: 'assistant', content: text }];
        if (background && done === null) {
          entry.events.push({ type: 'response.failed', text: namedEvent('response.failed', { type: 'response.failed', sequence_number: seq++, response: entry.response }) });
          for (const w of entry.waiters.splice(0)) w();
        }
      },
    };
    const parsed: ParsedRequest = { kind: 'chat', model, prompt, maxTokens, stream: background ? true : stream, includeUsage: true, stop: [], ...(salt.salt !== undefined ? { cacheSalt: salt.salt } : {}) };

    if (background) {
      // Answer at once with the queued response; the generation runs detached from this connection.
      send(res, 200, entry.response);
      void this.host.generate(parsed, format, abort.signal, null).catch(() => {});
      return;
    }
    const clientGone = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) clientGone.abort();
    });
    await this.host.generate(parsed, format, AbortSignal.any([clientGone.signal, abort.signal]), res, undefined, true);
  }

  /** GET /v1/responses/{id}: the stored response, or with `stream=true` its events after `starting_after`. */
  async retrieve(id: string, query: URLSearchParams, res: ServerResponse): Promise<void> {
    const entry = this.#store.get(id);
    if (!entry) return notFound(res, id, this.host.behaviour);
    if (query.get('stream') !== 'true') return send(res, 200, entry.response);
    if (entry.response.background !== true) return error(res, 400, 'Cannot stream a response that was not created with background=true.');
    const after = query.has('starting_after') ? Number(query.get('starting_after')) : -1;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    let i = Math.max(0, after + 1);
    let open = true;
    res.on('close', () => (open = false));
    for (;;) {
      while (open && i < entry.events.length) {
        const e = entry.events[i++]!;
        res.write(e.text);
        if (e.type === 'response.completed' || e.type === 'response.incomplete' || e.type === 'response.failed') {
          res.end();
          return;
        }
      }
      if (!open || ['cancelled', 'failed', 'completed', 'incomplete'].includes(String(entry.response.status))) {
        res.end();
        return;
      }
      await new Promise<void>((r) => entry.waiters.push(r));
    }
  }

  /** POST /v1/responses/{id}/cancel: only a background response still queued or running. */
  cancel(id: string, res: ServerResponse): void {
    const entry = this.#store.get(id);
    if (!entry) return notFound(res, id, this.host.behaviour);
    const status = entry.response.status;
    if (status !== 'queued' && status !== 'in_progress') return error(res, 400, 'Cannot cancel a synchronous response.');
    entry.response = { ...entry.response, status: 'cancelled' };
    entry.abort.abort();
    for (const w of entry.waiters.splice(0)) w();
    send(res, 200, entry.response);
  }
}
