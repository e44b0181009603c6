// ResponseTap against golden vLLM streams, fed in every chunking we can think of; sseErrorEvent
// against the real openai SDK stream parser.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { APIError } from 'openai/core/error';
import { Stream } from 'openai/core/streaming';
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random';
import { openAIReader } from '../../../src/http/apis/openai-chat/reader';
import { ResponseTap as Tap, sseErrorEvent, type TapOptions as Options, type TapUsage } from '../../../src/proxy/sse-tap';

/** The tap with the Chat Completions / Completions reader (http/apis/openai-chat/reader.ts) for `kind`. */
type TapOptions = Omit<Options, 'reader'> & { kind?: 'chat' | 'completion' };
class ResponseTap extends Tap {
  constructor(o: TapOptions) {
    super({ ...o, reader: openAIReader(o.kind ?? 'chat', o.stripUsageChunk) });
  }
}

const FIXTURES = join(import.meta.dirname, '../../fixtures/sse');
const enc = new TextEncoder();
const dec = new TextDecoder();

interface Golden {
  name: string;
  kind: 'chat' | 'completion';
  /** Index of the first block (event or comment, split at blank lines) that carries content. */
  firstContentBlock: number;
  usage: TapUsage | null;
  events: number;
  sawDone: boolean;
  sawError: boolean;
}

const GOLDEN: Golden[] = [
  { name: 'chat', kind: 'chat', firstContentBlock: 1, usage: { promptTokens: 1234, completionTokens: 14, cachedTokens: 1216 }, events: 17, sawDone: true, sawError: false },
  { name: 'completion', kind: 'completion', firstContentBlock: 0, usage: { promptTokens: 7, completionTokens: 10, cachedTokens: null }, events: 12, sawDone: true, sawError: false },
  { name: 'chat-tool-calls', kind: 'chat', firstContentBlock: 1, usage: { promptTokens: 412, completionTokens: 29, cachedTokens: 400 }, events: 9, sawDone: true, sawError: false },
  { name: 'chat-error', kind: 'chat', firstContentBlock: 1, usage: null, events: 6, sawDone: true, sawError: true },
  { name: 'chat-reasoning-keepalive', kind: 'chat', firstContentBlock: 5, usage: { promptTokens: 98, completionTokens: 6, cachedTokens: null }, events: 8, sawDone: true, sawError: false },
];

// The fixtures use LF; the same streams with the other two line endings SSE allows.
const EOLS = [
  { name: 'LF', eol: '\n' },
  { name: 'CRLF', eol: '\r\n' },
  { name: 'CR', eol: '\r' },
] as const;

function load(name: string, eol: string): Uint8Array {
  return enc.encode(readFileSync(join(FIXTURES, `${name}.txt`), 'utf8').replaceAll('\n', eol));
}

/** Blocks of LF-framed bytes as [start, end) ranges, each ending after its blank line. */
function blocks(bytes: Uint8Array): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  let start = 0;
  for (let i = 1; i < bytes.length; i++) {
    if (bytes[i] === 0x0a && bytes[i - 1] === 0x0a) {
      out.push([start, i + 1]);
      start = i + 1;
    }
  }
  return out;
}

/** Runs `input` through a tap in the given chunks; the clock reads "bytes fed so far". */
function run(input: Uint8Array, cuts: number[], opts: Omit<TapOptions, 'now'>) {
  let fed = 0;
  const tap = new ResponseTap({ ...opts, now: () => fed });
  const out: Uint8Array[] = [];
  let prev = 0;
  for (const cut of [...cuts, input.length]) {
    const chunk = input.slice(prev, cut);
    fed += chunk.length;
    out.push(tap.push(chunk));
    prev = cut;
  }
  out.push(tap.end());
  return { tap, out: Buffer.concat(out) };
}

function randomCuts(len: number, rand: () => number): number[] {
  const cuts: number[] = [];
  let at = 0;
  for (;;) {
    at += 1 + Math.floor(rand() * (rand() < 0.1 ? 400 : 24));
    if (at >= len) return cuts;
    cuts.push(at);
  }
}

const everyByte = (len: number) => Array.from({ length: len - 1 }, (_, i) => i + 1);

describe('ResponseTap: golden vLLM streams', () => {
  for (const g of GOLDEN) {
    const lfUpstream = readFileSync(join(FIXTURES, `${g.name}.upstream.txt`), 'utf8');
    const firstContent = blocks(enc.encode(lfUpstream))[g.firstContentBlock]!;

    for (const { name: eolName, eol } of EOLS) {
      const upstream = load(`${g.name}.upstream`, eol);
      const client = load(`${g.name}.client`, eol);
      // The byte whose arrival completes the first content event: the last byte of its blank
      // line, or with CRLF the CR of it (the tap does not wait for the LF that may follow).
      const endInUpstream = upstreamOffset(lfUpstream, firstContent[1], eol);
      const completesAt = eol === '\r\n' ? endInUpstream - 2 : endInUpstream - 1;
      const ttftFor = (cuts: number[]) => [...cuts, upstream.length].find((b) => b > completesAt);

      const check = (cuts: number[], strip: boolean) => {
        const { tap, out } = run(upstream, cuts, { stream: true, stripUsageChunk: strip, kind: g.kind });
        expect(Buffer.compare(out, Buffer.from(strip ? client : upstream))).toBe(0);
        expect(tap.firstContentAt).toBe(ttftFor(cuts));
        expect(tap.usage).toEqual(g.usage);
        expect(tap.events).toBe(g.events);
        expect(tap.sawDone).toBe(g.sawDone);
        expect(tap.sawError).toBe(g.sawError);
      };

      it(`${g.name} ${eolName}: stripped output equals the golden client stream, split at every byte boundary`, () => {
        for (let p = 1; p < upstream.length; p++) check([p], true);
      });
      it(`${g.name} ${eolName}: unstripped output is the upstream byte for byte, split at every byte boundary`, () => {
        for (let p = 1; p < upstream.length; p++) check([p], false);
      });
      it(`${g.name} ${eolName}: one byte at a time, one chunk, and 200 seeded random chunkings`, () => {
        check(everyByte(upstream.length), true);
        check([], true);
        check([], false);
        const rand = seededRandom(0x5eed + upstream.length);
        for (let i = 0; i < 200; i++) check(randomCuts(upstream.length, rand), i % 2 === 0);
      });
    }

    it(`${g.name}: forwards each event as soon as it completes and holds only the partial one`, () => {
      const upstream = enc.encode(lfUpstream);
      const lfClient = enc.encode(readFileSync(join(FIXTURES, `${g.name}.client.txt`), 'utf8'));
      const text = (b: Uint8Array, [s, e]: [number, number]) => dec.decode(b.subarray(s, e));
      const bs = blocks(upstream);
      const clientBlocks = new Set(blocks(lfClient).map((r) => text(lfClient, r)));
      for (const strip of [true, false]) {
        const tap = new ResponseTap({ stream: true, stripUsageChunk: strip, kind: g.kind, now: () => 0 });
        let forwarded = 0;
        for (let i = 0; i < upstream.length; i++) {
          forwarded += tap.push(upstream.subarray(i, i + 1)).length;
          const fed = i + 1;
          // What the client must have by now: every complete block it is meant to get.
          let due = 0;
          for (const r of bs) {
            if (r[1] <= fed && (!strip || clientBlocks.has(text(upstream, r)))) due += r[1] - r[0];
          }
          expect(forwarded, `after byte ${i}`).toBe(due);
        }
        expect(tap.end().length).toBe(0);
      }
    });
  }

  it('the fixtures exercise multi-byte UTF-8 (so splits land inside characters)', () => {
    const bytes = load('chat.upstream', '\n');
    expect(bytes.some((b) => b >= 0xf0)).toBe(true); // a 4-byte character
    expect(bytes.some((b) => b >= 0xe0 && b < 0xf0)).toBe(true); // a 3-byte one
  });
});

/** Byte offset in the eol-converted upstream of a byte offset in the LF text. */
function upstreamOffset(lfText: string, lfByteOffset: number, eol: string): number {
  const prefix = dec.decode(enc.encode(lfText).subarray(0, lfByteOffset));
  return enc.encode(prefix.replaceAll('\n', eol)).length;
}

const chatChunk = (delta: Record<string, unknown>) =>
  `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;

function tapText(text: string, opts: Partial<TapOptions> = {}) {
  let t = 100;
  const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', now: () => ++t, ...opts });
  const out = Buffer.concat([tap.push(enc.encode(text)), tap.end()]).toString('utf8');
  return { tap, out };
}

describe('ResponseTap: what counts as content (TTFT)', () => {
  it.each([
    ['content', { content: 'x' }, true],
    ['empty content (vLLM role chunk)', { role: 'assistant', content: '' }, false],
    ['null content', { content: null }, false],
    ['tool_calls', { tool_calls: [{ index: 0, function: { arguments: '' } }] }, true],
    ['empty tool_calls', { tool_calls: [] }, false],
    ['reasoning_content', { reasoning_content: 'think' }, true],
    ['reasoning', { reasoning: 'think' }, true],
    ['empty reasoning', { reasoning: '', reasoning_content: '' }, false],
  ])('chat delta %s', (_n, delta, expected) => {
    const { tap } = tapText(chatChunk(delta));
    expect(tap.firstContentAt).toBe(expected ? 101 : null);
  });

  it('takes the clock at the first content event only', () => {
    const { tap } = tapText(chatChunk({ role: 'assistant', content: '' }) + chatChunk({ content: 'a' }) + chatChunk({ content: 'b' }));
    expect(tap.firstContentAt).toBe(101);
  });

  it('completions count choices[].text, not chat deltas', () => {
    const text = (t: string) => `data: {"choices":[{"index":0,"text":${JSON.stringify(t)}}]}\n\n`;
    expect(tapText(text(''), { kind: 'completion' }).tap.firstContentAt).toBeNull();
    expect(tapText(text('hi'), { kind: 'completion' }).tap.firstContentAt).toBe(101);
    expect(tapText(chatChunk({ content: 'x' }), { kind: 'completion' }).tap.firstContentAt).toBeNull();
  });

  it('a content event in a second choice counts', () => {
    const ev = 'data: {"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"y"}}]}\n\n';
    expect(tapText(ev).tap.firstContentAt).toBe(101);
  });
});

describe('ResponseTap: usage chunks', () => {
  const usageOnly = 'data: {"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}\n\n';

  it('strips only the usage-only event, and only when asked', () => {
    expect(tapText(usageOnly + 'data: [DONE]\n\n').out).toBe('data: [DONE]\n\n');
    expect(tapText(usageOnly, { stripUsageChunk: false }).out).toBe(usageOnly);
  });

  it('leaves usage on chunks with choices alone (continuous_usage_stats) and keeps the last one', () => {
    const withChoices = (n: number) =>
      `data: {"choices":[{"index":0,"delta":{"content":"t"}}],"usage":{"prompt_tokens":10,"completion_tokens":${n},"total_tokens":${10 + n}}}\n\n`;
    const nullUsage = 'data: {"choices":[{"index":0,"delta":{"content":"t"}}],"usage":null}\n\n';
    const text = withChoices(1) + nullUsage + withChoices(2);
    const { tap, out } = tapText(text);
    expect(out).toBe(text);
    expect(tap.usage).toEqual({ promptTokens: 10, completionTokens: 2, cachedTokens: null });
  });

  it('cached tokens: prompt_tokens_details when sent, else llama.cpp\'s timings.cache_n, else null (unknown, not 0)', () => {
    const usage = '"usage":{"prompt_tokens":56,"completion_tokens":6,"total_tokens":62}';
    const chunk = (extra: string) => `data: {"choices":[],${usage}${extra}}\n\n`;
    // vLLM without --enable-prompt-tokens-details, SGLang without --enable-cache-report: nothing.
    expect(tapText(chunk('')).tap.usage).toEqual({ promptTokens: 56, completionTokens: 6, cachedTokens: null });
    // llama.cpp: the count only in `timings` next to `usage` (0 is a real report there).
    expect(tapText(chunk(',"timings":{"cache_n":48,"prompt_n":8}')).tap.usage?.cachedTokens).toBe(48);
    expect(tapText(chunk(',"timings":{"cache_n":0,"prompt_n":56}')).tap.usage?.cachedTokens).toBe(0);
    // A llama.cpp that also fills prompt_tokens_details: the usage field wins; a malformed cache_n is ignored.
    const both = 'data: {"choices":[],"usage":{"prompt_tokens":56,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":32}},"timings":{"cache_n":48}}\n\n';
    expect(tapText(both).tap.usage?.cachedTokens).toBe(32);
    expect(tapText(chunk(',"timings":{"cache_n":"48"}')).tap.usage?.cachedTokens).toBeNull();
    // Non-streamed: the same reading of the body.
    const body = new Tap({ stream: false, stripUsageChunk: false, reader: openAIReader('chat', false), now: () => 0 });
    body.push(enc.encode(`{"choices":[],${usage},"timings":{"cache_n":16}}`));
    body.end();
    expect(body.usage?.cachedTokens).toBe(16);
  });

  it('an empty choices event without usage is not the usage chunk', () => {
    const ev = 'data: {"choices":[],"usage":null}\n\n';
    expect(tapText(ev).out).toBe(ev);
  });
});

describe('ResponseTap: errors, [DONE], framing', () => {
  it.each([
    ['an error object', 'data: {"error":{"message":"boom","type":"InternalServerError","code":500}}\n\n'],
    ["vLLM's older flat error", 'data: {"object":"error","message":"boom","type":"BadRequestError","code":400}\n\n'],
    ['an event named error', 'event: error\ndata: {"message":"boom"}\n\n'],
  ])('sees %s', (_n, ev) => {
    const { tap, out } = tapText(ev);
    expect(tap.sawError).toBe(true);
    expect(out).toBe(ev);
  });

  it('a null error field is not an error', () => {
    expect(tapText('data: {"choices":[],"error":null}\n\n').tap.sawError).toBe(false);
  });

  it('sawDone only for [DONE]; non-JSON data passes untouched', () => {
    const { tap, out } = tapText('data: not json\n\n');
    expect(tap.sawDone).toBe(false);
    expect(tap.events).toBe(1);
    expect(out).toBe('data: not json\n\n');
    expect(tapText('data:[DONE]\n\n').tap.sawDone).toBe(true);
  });

  it('a trailing event without its blank line is forwarded (or stripped) at end()', () => {
    const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', now: () => 1 });
    expect(tap.push(enc.encode('data: [DONE]')).length).toBe(0);
    expect(dec.decode(tap.end())).toBe('data: [DONE]');
    expect(tap.sawDone).toBe(true);
    const tap2 = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', now: () => 1 });
    tap2.push(enc.encode('data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n'));
    expect(tap2.end().length).toBe(0);
    expect(tap2.usage).toEqual({ promptTokens: 1, completionTokens: 1, cachedTokens: null });
  });

  it('a dropped CRLF-terminated event takes its final LF with it, even across chunks', () => {
    const usage = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\r\n\r\n';
    const done = 'data: [DONE]\r\n\r\n';
    const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', now: () => 1 });
    const bytes = enc.encode(usage + done);
    const cut = enc.encode(usage).length - 1; // between the final CR and LF
    const out = Buffer.concat([tap.push(bytes.subarray(0, cut)), tap.push(bytes.subarray(cut)), tap.end()]);
    expect(out.toString('utf8')).toBe(done);
  });

  it('mixed line endings inside one stream', () => {
    const text = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\r\n\n: c\r\rdata: [DONE]\n\r\n';
    const { tap, out } = tapText(text);
    expect(out).toBe(': c\r\rdata: [DONE]\n\r\n');
    expect(tap.sawDone).toBe(true);
  });

  it('owns what it holds: a caller reusing its chunk buffer after push() changes nothing', () => {
    const text = chatChunk({ content: 'reuse' }) + 'data: [DONE]\n\n';
    const bytes = enc.encode(text);
    const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', now: () => 1 });
    const buf = new Uint8Array(16);
    const out: Buffer[] = [];
    for (let i = 0; i < bytes.length; i += buf.length) {
      const n = Math.min(buf.length, bytes.length - i);
      buf.set(bytes.subarray(i, i + n));
      out.push(Buffer.from(tap.push(buf.subarray(0, n)))); // copied at once, as a writer would
      buf.fill(0x21);
    }
    out.push(Buffer.from(tap.end()));
    expect(Buffer.concat(out).toString('utf8')).toBe(text);
    expect(tap.sawDone).toBe(true);
  });

  it('push() after end() is a bug and throws', () => {
    const tap = new ResponseTap({ stream: true, stripUsageChunk: false, kind: 'chat', now: () => 1 });
    tap.end();
    expect(() => tap.push(enc.encode('x'))).toThrow(/after end/);
  });
});

describe('ResponseTap: events above maxEventBytes', () => {
  const big = `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 5 }, pad: 'x'.repeat(200) })}\n\n`;
  const small = 'data: {"choices":[{"delta":{"content":"after"}}]}\n\n'; // under 64 bytes
  const text = big + small + 'data: [DONE]\n\n';

  it('the small event really is under the limit', () => expect(enc.encode(small).length).toBeLessThan(64));

  it('is forwarded unparsed (never stripped), before it is complete, and the stream carries on', () => {
    const bytes = enc.encode(text);
    for (const step of [1, 7, 64, bytes.length]) {
      let fed = 0;
      const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', maxEventBytes: 64, now: () => fed });
      const out: Uint8Array[] = [];
      let forwardedBeforeBigEnded = 0;
      for (let i = 0; i < bytes.length; i += step) {
        const chunk = bytes.subarray(i, i + step);
        fed += chunk.length;
        const o = tap.push(chunk);
        out.push(o);
        if (fed < big.length) forwardedBeforeBigEnded += o.length;
      }
      out.push(tap.end());
      expect(Buffer.concat(out).toString('utf8')).toBe(text);
      expect(tap.usage).toBeNull(); // the oversized usage event was not parsed
      expect(tap.oversizedEvents).toBe(1);
      expect(tap.events).toBe(3);
      expect(tap.sawDone).toBe(true);
      // It counts as content, at the moment it was first let through (at most 64 + one chunk in).
      expect(tap.firstContentAt).toBe(Math.min(bytes.length, step * Math.ceil(65 / step)));
      if (step < big.length) expect(forwardedBeforeBigEnded).toBeGreaterThan(0);
    }
  });

  it('holds no more than maxEventBytes plus one chunk of a partial event', () => {
    const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', maxEventBytes: 64, now: () => 0 });
    const bytes = enc.encode(big);
    let forwarded = 0;
    for (let i = 0; i < bytes.length; i++) {
      forwarded += tap.push(bytes.subarray(i, i + 1)).length;
      expect(i + 1 - forwarded).toBeLessThanOrEqual(64);
    }
  });

  it('an event exactly at the limit is still parsed', () => {
    const ev = 'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n';
    const { tap, out } = tapText(ev, { maxEventBytes: enc.encode(ev).length });
    expect(out).toBe('');
    expect(tap.usage).toEqual({ promptTokens: 3, completionTokens: 4, cachedTokens: null });
  });
});

describe('ResponseTap: non-streaming bodies', () => {
  const body = JSON.stringify({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    choices: [{ index: 0, message: { role: 'assistant', content: 'Grüße 👋' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 321, total_tokens: 330, completion_tokens: 9, prompt_tokens_details: { cached_tokens: 304 } },
  });
  const bytes = enc.encode(body);

  it('forwards every chunk immediately and reads usage at end(), at every split', () => {
    for (let p = 1; p < bytes.length; p++) {
      let fed = 0;
      const tap = new ResponseTap({ stream: false, stripUsageChunk: false, kind: 'chat', now: () => fed });
      const a = bytes.subarray(0, p);
      fed += a.length;
      expect(tap.push(a)).toEqual(a);
      expect(tap.usage).toBeNull();
      const b = bytes.subarray(p);
      fed += b.length;
      expect(tap.push(b)).toEqual(b);
      expect(tap.end().length).toBe(0);
      expect(tap.firstContentAt).toBe(p);
      expect(tap.usage).toEqual({ promptTokens: 321, completionTokens: 9, cachedTokens: 304 });
      expect(tap.sawDone).toBe(true);
      expect(tap.sawError).toBe(false);
    }
  });

  it('over the copy cap: still forwarded, usage unknown', () => {
    const tap = new ResponseTap({ stream: false, stripUsageChunk: false, kind: 'chat', now: () => 1, maxBodyBytes: 32 });
    const out = Buffer.concat([tap.push(bytes.subarray(0, 20)), tap.push(bytes.subarray(20)), tap.end()]);
    expect(out.toString('utf8')).toBe(body);
    expect(tap.usage).toBeNull();
  });

  it('an error body sets sawError, not sawDone', () => {
    const tap = new ResponseTap({ stream: false, stripUsageChunk: false, kind: 'chat', now: () => 1 });
    tap.push(enc.encode('{"error":{"message":"bad","type":"BadRequestError","code":400}}'));
    tap.end();
    expect(tap.sawError).toBe(true);
    expect(tap.sawDone).toBe(false);
  });

  it('a truncated body is not done', () => {
    const tap = new ResponseTap({ stream: false, stripUsageChunk: false, kind: 'chat', now: () => 1 });
    tap.push(bytes.subarray(0, 40));
    tap.end();
    expect(tap.sawDone).toBe(false);
    expect(tap.usage).toBeNull();
  });
});

function sseResponse(parts: Uint8Array[]): Response {
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const p of parts) c.enqueue(p);
      c.close();
    },
  });
  return new Response(body, { headers: { 'content-type': 'text/event-stream', 'x-request-id': 'req-1' } });
}

async function consume(parts: Uint8Array[]): Promise<{ items: unknown[]; error: unknown }> {
  const stream = Stream.fromSSEResponse<unknown>(sseResponse(parts), new AbortController());
  const items: unknown[] = [];
  try {
    for await (const item of stream) items.push(item);
  } catch (error) {
    return { items, error };
  }
  return { items, error: null };
}

describe('sseErrorEvent', () => {
  const ev = sseErrorEvent('upstream stalled\n\ndata: [DONE]', 'upstream_error', 'upstream_stalled');

  it('is one OpenAI-shaped error event followed by [DONE]', () => {
    const text = dec.decode(ev);
    const events = text.split('\n\n');
    expect(events).toHaveLength(3);
    expect(events[2]).toBe('');
    expect(events[1]).toBe('data: [DONE]');
    expect(JSON.parse(events[0]!.slice('data: '.length))).toEqual({
      error: { message: 'upstream stalled\n\ndata: [DONE]', type: 'upstream_error', param: null, code: 'upstream_stalled' },
    });
  });

  it('the openai SDK raises APIError on it after the chunks that came before', async () => {
    const first = enc.encode(chatChunk({ content: 'partial' }));
    const { items, error } = await consume([first, ev]);
    expect(items).toHaveLength(1);
    expect(error).toBeInstanceOf(APIError);
    const e = error as APIError;
    expect(e.message).toBe('upstream stalled\n\ndata: [DONE]');
    expect(e.code).toBe('upstream_stalled');
    expect(e.type).toBe('upstream_error');
    expect(e.status).toBeUndefined();
  });

  it('the same stream cut short without the error event ends silently in the SDK (why the event matters)', async () => {
    const { items, error } = await consume([enc.encode(chatChunk({ content: 'partial' }))]);
    expect(items).toHaveLength(1);
    expect(error).toBeNull();
  });

  it('the tap reads it as an error followed by [DONE]', () => {
    const tap = new ResponseTap({ stream: true, stripUsageChunk: true, kind: 'chat', now: () => 1 });
    expect(Buffer.compare(Buffer.concat([tap.push(ev), tap.end()]), Buffer.from(ev))).toBe(0);
    expect(tap.sawError).toBe(true);
    expect(tap.sawDone).toBe(true);
  });
});
