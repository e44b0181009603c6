// The router's parsers on the golden engine transcripts (test/fixtures/engines/<profile>/, one
// per mock engine profile, written by tools/mock-engine/transcripts.ts): the SSE tap (TTFT point,
// usage, cached tokens, errors, [DONE]) and the engine metric parsers (extractEngineSample,
// kvCapacity). Each expectation is what the engine's bytes mean (llama.cpp's timings.cache_n and
// vLLM's data-parallel cache_config_info totals included, issue #26 items 3 and 4).

import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { extractEngineSample, kvCapacity } from '../../../src/engines/index.js';
import { parsePromText } from '../../../src/engines/prom-text.js';
import { ResponseTap } from '../../../src/proxy/sse-tap.js';
import { openAIReader } from '../../../src/http/apis/openai-chat/reader.js';
import { anthropicReader } from '../../../src/http/apis/anthropic/reader.js';
import { refusesEngineRank, refusesEngineRankConverted } from '../../../src/engines/vllm.js';

type Profile = 'legacy' | 'vllm' | 'vllm-cache-report' | 'sglang' | 'sglang-cache-report' | 'llama.cpp';
const PROFILES: readonly Profile[] = ['legacy', 'vllm', 'vllm-cache-report', 'sglang', 'sglang-cache-report', 'llama.cpp'];

const read = (profile: Profile, name: string): string => readFileSync(join(import.meta.dirname, '../../fixtures/engines', profile, name), 'utf8');

// The transcripts' request: 56 prompt tokens, 6 generated. The warm stream found 48 of them in
// the prefix cache (3 blocks of 16); the cold non-streamed request none.
const PROMPT = 56;
const COMPLETION = 6;
const WARM_CACHED = 48;

/**
 * What the engine's bytes say about cached tokens, per profile: a number it reported, or null
 * where it reported nothing (vLLM without --enable-prompt-tokens-details, SGLang without
 * --enable-cache-report, and with those flags a count of 0, which both leave out).
 */
const CACHED_WARM: Record<Profile, number | null> = {
  legacy: WARM_CACHED,
  vllm: null,
  'vllm-cache-report': WARM_CACHED,
  sglang: null,
  'sglang-cache-report': WARM_CACHED,
  'llama.cpp': WARM_CACHED, // timings.cache_n
};
const CACHED_COLD: Record<Profile, number | null> = {
  legacy: 0,
  vllm: null,
  'vllm-cache-report': null,
  sglang: null,
  'sglang-cache-report': null,
  'llama.cpp': 0, // timings.cache_n
};

/** Feeds a stream event by event; the clock is the index of the event being pushed. */
function tapStream(text: string): { tap: ResponseTap; out: string; firstContentEvent: number } {
  let index = -1;
  const tap = new ResponseTap({ stream: true, stripUsageChunk: true, reader: openAIReader('chat', true), now: () => index });
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  let out = '';
  const events = text.split(/(?<=\n\n)/);
  for (const ev of events) {
    index++;
    out += dec.decode(tap.push(enc.encode(ev)));
  }
  out += dec.decode(tap.end());
  const firstContentEvent = events.findIndex((ev) => {
    if (!ev.startsWith('data: {')) return false;
    const o = JSON.parse(ev.slice(6)) as { choices?: { delta?: { content?: unknown } }[] };
    const c = o.choices?.[0]?.delta?.content;
    return typeof c === 'string' && c !== '';
  });
  return { tap, out, firstContentEvent };
}

function tapBody(text: string): ResponseTap {
  const tap = new ResponseTap({ stream: false, stripUsageChunk: false, reader: openAIReader('chat', false), now: () => 0 });
  tap.push(new TextEncoder().encode(text));
  tap.end();
  return tap;
}


describe('SSE tap on each profile', () => {
  for (const profile of PROFILES) {
    describe(profile, () => {
      it('streamed chat: TTFT at the first content event, usage from the final chunk, [DONE], the usage chunk stripped', () => {
        const { tap, out, firstContentEvent } = tapStream(read(profile, 'chat-stream.sse'));
        expect(firstContentEvent).toBeGreaterThan(0);
        expect(tap.firstContentAt).toBe(firstContentEvent);
        expect(tap.usage?.promptTokens).toBe(PROMPT);
        expect(tap.usage?.completionTokens).toBe(COMPLETION);
        expect(tap.sawDone).toBe(true);
        expect(tap.sawError).toBe(false);
        expect(out).not.toContain('"usage"');
        expect(out.endsWith('data: [DONE]\n\n')).toBe(true);
      });

      const cachedCase = (name: string, file: string, expected: number | null, stream: boolean) => {
        it(name, () => {
          const tap = stream ? tapStream(read(profile, file)).tap : tapBody(read(profile, file));
          expect(tap.usage?.cachedTokens).toBe(expected);
        });
      };
      cachedCase('streamed chat: cached tokens as the engine reported them, null where it did not', 'chat-stream.sse', CACHED_WARM[profile], true);
      cachedCase('non-streamed chat (cold): cached tokens as reported, null where absent', 'chat.json', CACHED_COLD[profile], false);

      it('non-streamed chat: usage read from the body', () => {
        const tap = tapBody(read(profile, 'chat.json'));
        expect(tap.sawDone).toBe(true);
        expect(tap.sawError).toBe(false);
        expect(tap.usage?.promptTokens).toBe(PROMPT);
        expect(tap.usage?.completionTokens).toBe(COMPLETION);
      });

      it('an engine failure after two tokens: content seen, then the error (vLLM and SGLang close with [DONE], llama.cpp without)', () => {
        const { tap } = tapStream(read(profile, 'chat-error.sse'));
        expect(tap.firstContentAt).not.toBeNull();
        expect(tap.sawError).toBe(true);
        expect(tap.sawDone).toBe(profile !== 'llama.cpp');
        expect(tap.usage).toBeNull();
      });

      it('an engine failure before the first token: no TTFT, an error (in-band after a 200, or llama.cpp\'s plain 500)', () => {
        if (profile === 'llama.cpp') {
          const tap = tapBody(read(profile, 'chat-error-first.json'));
          expect(tap.sawError).toBe(true);
          expect(tap.usage).toBeNull();
          return;
        }
        const { tap } = tapStream(read(profile, 'chat-error-first.sse'));
        expect(tap.firstContentAt).toBeNull();
        expect(tap.sawError).toBe(true);
        expect(tap.sawDone).toBe(true);
      });
    });
  }
});

describe("a stale data-parallel rank on the Messages API (rank 2 of a server with engines [0, 2))", () => {
  for (const profile of ['vllm', 'vllm-cache-report'] as const) {
    it(`${profile}: streamed, a 200 whose one event is the converter's error; the tap sees an error before any content, and the router knows it for a rank refusal`, () => {
      const meta = JSON.parse(read(profile, 'meta.json')) as { transcripts: Record<string, { status: number }> };
      expect(meta.transcripts['messages-rank-error.sse']!.status).toBe(200);
      const text = read(profile, 'messages-rank-error.sse');
      const tap = new ResponseTap({ stream: true, stripUsageChunk: false, reader: anthropicReader(), now: () => 0 });
      tap.push(new TextEncoder().encode(text));
      tap.end();
      expect(tap.sawError).toBe(true);
      expect(tap.firstContentAt).toBeNull();
      // No message_stop after it: the converter's generator ends at its except.
      expect(tap.sawDone).toBe(false);
      const data = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
      expect(data).toHaveLength(1);
      expect(refusesEngineRankConverted(data[0]!)).toBe(true);
      // The rank itself did not survive pydantic's cut.
      expect(refusesEngineRank(data[0]!, 2)).toBe(false);
    });
    it(`${profile}: not streamed, a 500 internal_error carrying vLLM's whole message`, () => {
      const meta = JSON.parse(read(profile, 'meta.json')) as { transcripts: Record<string, { status: number }> };
      expect(meta.transcripts['messages-rank-error.json']!.status).toBe(500);
      expect(refusesEngineRank(read(profile, 'messages-rank-error.json'), 2)).toBe(true);
    });
  }
  it('legacy: the old mock\'s 400, either way', () => {
    const meta = JSON.parse(read('legacy', 'meta.json')) as { transcripts: Record<string, { status: number }> };
    expect(meta.transcripts['messages-rank-error.sse']!.status).toBe(400);
    expect(refusesEngineRank(read('legacy', 'messages-rank-error.sse'), 2)).toBe(true);
  });
});

describe('engine metric parsers on each profile', () => {
  // Four requests of 56 prompt tokens; three of them found 48 cached (cold, warm, error-first, error).
  const QUERIES = 4 * PROMPT;
  const HITS = 3 * WARM_CACHED;
  const BLOCKS = 64; // per engine (tools/mock-engine/transcripts.ts TRANSCRIPT_CACHE_BLOCKS)
  const metrics = (p: Profile) => parsePromText(read(p, 'metrics.txt'));

  for (const profile of ['legacy', 'vllm', 'vllm-cache-report'] as const) {
    it(`${profile}: vLLM's token counters, two data-parallel engines`, () => {
      const s = extractEngineSample(metrics(profile), 0);
      expect(s.generation).toBe('v1-tokens');
      expect(s.prefixQueries).toBe(QUERIES);
      expect(s.prefixHits).toBe(HITS);
      expect(s.engines).toBe(2);
      expect(s.waiting).toBe(0);
      expect(s.running).toBe(0);
    });
  }

  // The legacy profile wrote each engine's own blocks on its label until the router read the label
  // as vLLM writes it (issue #26 item 4); its data-parallel metrics now follow vLLM, so it reads
  // like the vllm profiles below.
  for (const profile of ['legacy', 'vllm', 'vllm-cache-report'] as const) {
    it(`${profile}: each engine is the server's total over the engines, not the label's figure`, () => {
      const kv = kvCapacity(metrics(profile))!;
      expect(kv.engines.map((e) => [e.engine, e.numGpuBlocks])).toEqual([
        ['0', BLOCKS],
        ['1', BLOCKS],
      ]);
      expect(kv.totalBlocks).toBe(2 * BLOCKS);
      expect(extractEngineSample(metrics(profile), 0).numGpuBlocks).toBe(2 * BLOCKS);
    });

    it(`${profile}: every engine's cache_config_info says the server's total (what the transcript carries)`, () => {
      const labels = read(profile, 'metrics.txt').split('\n').filter((l) => l.startsWith('vllm:cache_config_info{'));
      expect(labels).toHaveLength(2);
      for (const l of labels) expect(l).toContain(`num_gpu_blocks="${2 * BLOCKS}"`);
    });
  }

  for (const profile of ['sglang', 'sglang-cache-report'] as const) {
    it(`${profile}: SGLang's prompt and cached token counters, its token pool as blocks of one token`, () => {
      const s = extractEngineSample(metrics(profile), 0);
      expect(s.generation).toBe('sglang-tokens');
      expect(s.prefixQueries).toBe(QUERIES);
      expect(s.prefixHits).toBe(HITS);
      expect(s.blockSize).toBe(1);
      expect(s.numGpuBlocks).toBe(BLOCKS * 16);
      expect(kvCapacity(metrics(profile))).toBeNull();
    });
  }

  it("llama.cpp: processed and cached prompt counters (queries = processed + cached)", () => {
    const s = extractEngineSample(metrics('llama.cpp'), 0);
    expect(s.generation).toBe('llamacpp-tokens');
    expect(s.prefixQueries).toBe(QUERIES);
    expect(s.prefixHits).toBe(HITS);
    expect(s.engines).toBe(1);
    expect(kvCapacity(metrics('llama.cpp'))).toBeNull();
  });
});
