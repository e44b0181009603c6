// The tap with the Responses and Anthropic readers (http/apis/responses/reader.ts,
// http/apis/anthropic/reader.ts) over streams in the engines' wire formats, fed in random chunkings
// and all three SSE line endings: bytes pass unchanged, TTFT at the first content delta, usage
// (cached tokens included), the response id, completion and errors. The error events the proxy
// writes are checked against the official SDKs' stream parsers.
import Anthropic from '@anthropic-ai/sdk';
import { Stream } from 'openai/core/streaming';
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random';
import { anthropicReader } from '../../../src/http/apis/anthropic/reader';
import { responsesReader, storedResponseReader } from '../../../src/http/apis/responses/reader';
import { ResponseTap, type EventReader } from '../../../src/proxy/sse-tap';

const enc = new TextEncoder();
const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

const RESP_ID = 'resp_0123456789abcdef0123456789abcdef';
const response = (status: string, usage: unknown) => ({ id: RESP_ID, object: 'response', status, output: [], usage });
/** A vLLM Responses stream: created, in_progress, item/part added, 3 deltas (the first empty), done events, completed. */
const RESPONSES_STREAM = [
  ev('response.created', { sequence_number: 0, response: response('in_progress', null) }),
  ev('response.in_progress', { sequence_number: 1, response: response('in_progress', null) }),
  ev('response.output_item.added', { sequence_number: 2, output_index: 0, item: { id: 'msg_1', type: 'message', role: 'assistant', content: [] } }),
  ev('response.content_part.added', { sequence_number: 3, output_index: 0, item_id: 'msg_1', content_index: 0, part: { type: 'output_text', text: '' } }),
  ev('response.output_text.delta', { sequence_number: 4, item_id: 'msg_1', output_index: 0, content_index: 0, delta: '' }),
  ev('response.output_text.delta', { sequence_number: 5, item_id: 'msg_1', output_index: 0, content_index: 0, delta: 'Hello' }),
  ev('response.output_text.delta', { sequence_number: 6, item_id: 'msg_1', output_index: 0, content_index: 0, delta: ' wörld ✓' }),
  ev('response.output_text.done', { sequence_number: 7, item_id: 'msg_1', output_index: 0, content_index: 0, text: 'Hello wörld ✓' }),
  ev('response.completed', { sequence_number: 8, response: response('completed', { input_tokens: 120, input_tokens_details: { cached_tokens: 96 }, output_tokens: 3, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 123 }) }),
];

/** An Anthropic stream as vLLM sends it (usage in message_start and message_delta, cache reads split out). */
const ANTHROPIC_STREAM = [
  ev('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 40, output_tokens: 0, cache_read_input_tokens: 80 } } }),
  ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  ev('ping', {}),
  ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: '' } }),
  ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hi ☃' } }),
  ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: ' there' } }),
  ev('content_block_stop', { index: 0 }),
  ev('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { input_tokens: 40, output_tokens: 2, cache_read_input_tokens: 80, cache_creation_input_tokens: 0 } }),
  ev('message_stop', {}),
];

function run(blocks: string[], reader: EventReader, eol: string, rand: () => number) {
  const text = blocks.join('').replaceAll('\n', eol);
  const bytes = enc.encode(text);
  // The clock reads the chunk being pushed as [start, end) byte offsets, so a test can check which
  // block's end fell inside the chunk that set TTFT.
  let chunkAt: [number, number] = [0, 0];
  const ends: number[] = [];
  let at = 0;
  for (const b of blocks) ends.push((at += enc.encode(b.replaceAll('\n', eol)).length));
  let ttftChunk: [number, number] | null = null;
  const tap = new ResponseTap({ stream: true, stripUsageChunk: false, now: () => ((ttftChunk ??= chunkAt), chunkAt[1]), reader });
  const out: Uint8Array[] = [];
  for (let i = 0; i < bytes.length; ) {
    const n = 1 + Math.floor(rand() * (rand() < 0.2 ? 300 : 20));
    const chunk = bytes.slice(i, i + n);
    chunkAt = [i, i + chunk.length];
    out.push(tap.push(chunk));
    i += n;
  }
  out.push(tap.end());
  /** TTFT was taken in the chunk that completed block `k` (a CRLF-framed event is complete at its last CR). */
  const ttftAtBlock = (k: number): boolean => {
    const done = ends[k]! - eol.length + 1;
    return ttftChunk !== null && ttftChunk[0] < done && done <= ttftChunk[1];
  };
  return { tap, out: Buffer.concat(out).toString('utf8'), text, ttftAtBlock };
}

describe('Responses reader', () => {
  for (const eol of ['\n', '\r\n', '\r']) {
    it(`stream (${JSON.stringify(eol)}), 40 random chunkings`, () => {
      const rand = seededRandom(7);
      for (let k = 0; k < 40; k++) {
        const { tap, out, text, ttftAtBlock } = run(RESPONSES_STREAM, responsesReader, eol, rand);
        expect(out).toBe(text);
        expect(ttftAtBlock(5)).toBe(true); // the first non-empty delta
        expect(tap.responseId).toBe(RESP_ID);
        expect(tap.usage).toEqual({ promptTokens: 120, completionTokens: 3, cachedTokens: 96 });
        expect(tap.sawDone).toBe(true);
        expect(tap.sawError).toBe(false);
      }
    });
  }

  it('response.failed and error events are errors; incomplete is done', () => {
    const rand = seededRandom(1);
    expect(run([RESPONSES_STREAM[0]!, ev('response.failed', { response: response('failed', null) })], responsesReader, '\n', rand).tap.sawError).toBe(true);
    expect(run([ev('error', { code: 'x', message: 'boom', param: null, sequence_number: 1 })], responsesReader, '\n', rand).tap.sawError).toBe(true);
    const inc = run([RESPONSES_STREAM[0]!, ev('response.incomplete', { response: response('incomplete', { input_tokens: 5, output_tokens: 1 }) })], responsesReader, '\n', rand).tap;
    expect(inc.sawDone).toBe(true);
    expect(inc.usage).toEqual({ promptTokens: 5, completionTokens: 1, cachedTokens: null });
  });

  it('non-streaming: id, usage, done; an error body is an error', () => {
    const tap = new ResponseTap({ stream: false, stripUsageChunk: false, now: () => 1, reader: responsesReader });
    tap.push(enc.encode(JSON.stringify(response('completed', { input_tokens: 10, input_tokens_details: { cached_tokens: 8 }, output_tokens: 2 }))));
    tap.end();
    expect(tap.responseId).toBe(RESP_ID);
    expect(tap.usage).toEqual({ promptTokens: 10, completionTokens: 2, cachedTokens: 8 });
    expect(tap.sawDone).toBe(true);
    const bad = new ResponseTap({ stream: false, stripUsageChunk: false, now: () => 1, reader: responsesReader });
    bad.push(enc.encode('{"error":{"message":"Response with id \'x\' not found.","type":"invalid_request_error","code":404}}'));
    bad.end();
    expect(bad.sawError).toBe(true);
    expect(bad.responseId).toBeNull();
  });

  it('a stored response (retrieve, replay, cancel) is read without usage: its tokens were counted when it was made', () => {
    const { tap, out, text } = run(RESPONSES_STREAM, storedResponseReader, '\n', seededRandom(3));
    expect(out).toBe(text);
    expect(tap.sawDone).toBe(true);
    expect(tap.usage).toBeNull();
    const body = new ResponseTap({ stream: false, stripUsageChunk: false, now: () => 1, reader: storedResponseReader });
    body.push(enc.encode(JSON.stringify(response('completed', { input_tokens: 10, output_tokens: 2 }))));
    body.end();
    expect(body.usage).toBeNull();
    expect(body.responseId).toBe(RESP_ID);
  });

  it('the error event the proxy writes reaches an openai SDK stream as a Responses error event', async () => {
    const bytes = responsesReader.errorEvent('Replica sent nothing for 100 ms', 'server_error', 'upstream_timeout');
    const events: unknown[] = [];
    for await (const e of Stream.fromSSEResponse(new Response(bytes), new AbortController())) events.push(e);
    expect(events).toEqual([{ type: 'error', code: 'upstream_timeout', message: 'Replica sent nothing for 100 ms', param: null, sequence_number: 0 }]);
  });
});

describe('Anthropic reader', () => {
  for (const eol of ['\n', '\r\n', '\r']) {
    it(`stream (${JSON.stringify(eol)}), 40 random chunkings`, () => {
      const rand = seededRandom(9);
      for (let k = 0; k < 40; k++) {
        const { tap, out, text, ttftAtBlock } = run(ANTHROPIC_STREAM, anthropicReader(), eol, rand);
        expect(out).toBe(text);
        expect(ttftAtBlock(4)).toBe(true);
        // Anthropic's input_tokens excludes the cache reads: prompt = 40 + 80.
        expect(tap.usage).toEqual({ promptTokens: 120, completionTokens: 2, cachedTokens: 80 });
        expect(tap.sawDone).toBe(true);
        expect(tap.sawError).toBe(false);
      }
    });
  }

  it('older vLLM (no cache fields): input_tokens is the whole prompt, cached unknown', () => {
    const tap = new ResponseTap({ stream: false, stripUsageChunk: false, now: () => 1, reader: anthropicReader() });
    tap.push(enc.encode('{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":33,"output_tokens":4}}'));
    tap.end();
    expect(tap.usage).toEqual({ promptTokens: 33, completionTokens: 4, cachedTokens: null });
    expect(tap.sawDone).toBe(true);
  });

  it('an error event and an error body are errors; count_tokens is not usage', () => {
    expect(run([ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } })], anthropicReader(), '\n', seededRandom(2)).tap.sawError).toBe(true);
    const body = new ResponseTap({ stream: false, stripUsageChunk: false, now: () => 1, reader: anthropicReader() });
    body.push(enc.encode('{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}'));
    body.end();
    expect(body.sawError).toBe(true);
    const count = new ResponseTap({ stream: false, stripUsageChunk: false, now: () => 1, reader: anthropicReader() });
    count.push(enc.encode('{"input_tokens":12}'));
    count.end();
    expect(count.usage).toBeNull();
    expect(count.sawDone).toBe(true);
  });

  it('the error event the proxy writes makes the Anthropic SDK throw', async () => {
    const bytes = anthropicReader().errorEvent('Replica connection failed mid-response', 'server_error', 'upstream_unavailable');
    const client = new Anthropic({ apiKey: 'k', baseURL: 'http://127.0.0.1:9', maxRetries: 0, fetch: async () => new Response(bytes, { headers: { 'content-type': 'text/event-stream' } }) });
    const stream = await client.messages.create({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'x' }], stream: true });
    const err = await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toMatch(/Replica connection failed mid-response/);
  });
});
