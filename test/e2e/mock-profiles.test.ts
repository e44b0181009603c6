// The mock's engine profiles over loopback (tools/mock-engine/profiles.ts): when headers go out,
// usage and cached tokens per flag, stream_options rules, in-band errors and the token faults,
// error bodies, data-parallel labels, the Responses store, and deterministic answers.

import { afterAll, describe, expect, it } from 'vitest';

import { dataEvents } from '../helpers/sse.js';

import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../tools/mock-engine/index.js';
import { parseCliArgs } from '../../tools/mock-engine/cli-args.js';

const started: MockVllm[] = [];
async function start(options: MockVllmOptions = {}): Promise<MockVllm> {
  const m = await startMockVllm({ port: 0, ...options });
  started.push(m);
  return m;
}
afterAll(async () => {
  await Promise.all(started.map((m) => m.close()));
});

function post(m: MockVllm, path: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
  return fetch(`${m.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal });
}


// 200 characters of content render to a 56-token chat prompt (3 full blocks): the second
// identical request hits 48 tokens.
const LONG = 'The quick brown fox jumps over the lazy dog near the riverbank at dawn. '.repeat(3).slice(0, 200);
const chat = (extra: Record<string, unknown> = {}) => ({ model: 'demo-model', messages: [{ role: 'user', content: LONG }], max_tokens: 6, ...extra });

function contentOf(events: string[]): string {
  let text = '';
  for (const e of events) {
    if (e === '[DONE]') continue;
    const o = JSON.parse(e) as { choices?: { delta?: { content?: string | null } }[] };
    text += o.choices?.[0]?.delta?.content ?? '';
  }
  return text;
}

describe('header timing', () => {
  it('vLLM sends 200 and its headers before queueing and prefill; SGLang (its kick-started generator), the legacy mock and llama.cpp with the first chunk', async () => {
    for (const [profile, headersFirst] of [['vllm', true], ['sglang', false], ['legacy', false], ['llama.cpp', false]] as const) {
      const m = await start({ profile, faults: { stallBeforeMs: 400 } });
      const t0 = performance.now();
      const res = await post(m, '/v1/chat/completions', chat({ stream: true }));
      const headersAt = performance.now() - t0;
      expect(res.status).toBe(200);
      await res.text();
      const doneAt = performance.now() - t0;
      if (headersFirst) {
        expect(headersAt, profile).toBeLessThan(300);
        expect(doneAt, profile).toBeGreaterThanOrEqual(390);
      } else {
        expect(headersAt, profile).toBeGreaterThanOrEqual(390);
      }
    }
  });

  it('headersFirst overrides the profile', async () => {
    const m = await start({ profile: 'legacy', headersFirst: true, faults: { stallBeforeMs: 400 } });
    const t0 = performance.now();
    const res = await post(m, '/v1/chat/completions', chat({ stream: true }));
    expect(performance.now() - t0).toBeLessThan(300);
    await res.text();
  });
});

describe('usage and cached tokens', () => {
  async function twice(profile: MockVllmOptions['profile'], body: Record<string, unknown>) {
    const m = await start({ profile });
    const first = await (await post(m, '/v1/chat/completions', body)).text();
    const second = await (await post(m, '/v1/chat/completions', body)).text();
    return [first, second];
  }
  const lastUsage = (text: string): Record<string, unknown> => {
    const ev = dataEvents(text).filter((e) => e !== '[DONE]').map((e) => JSON.parse(e) as Record<string, unknown>);
    return ev[ev.length - 1]!;
  };

  it('vllm (default flags) and sglang never send prompt_tokens_details', async () => {
    for (const profile of ['vllm', 'sglang'] as const) {
      const [a, b] = await twice(profile, chat({ stream: true, stream_options: { include_usage: true } }));
      for (const t of [a!, b!]) {
        const u = lastUsage(t).usage as Record<string, unknown>;
        expect(u.prompt_tokens, profile).toBe(56);
        expect(u, profile).not.toHaveProperty('prompt_tokens_details');
      }
    }
  });

  it('--enable-prompt-tokens-details / --enable-cache-report: the details only when something was cached', async () => {
    for (const profile of ['vllm-cache-report', 'sglang-cache-report'] as const) {
      const [a, b] = await twice(profile, chat({ stream: true, stream_options: { include_usage: true } }));
      expect(lastUsage(a!).usage, profile).not.toHaveProperty('prompt_tokens_details');
      expect((lastUsage(b!).usage as { prompt_tokens_details: unknown }).prompt_tokens_details, profile).toEqual({ cached_tokens: 48 });
      const [c, d] = await twice(profile, chat());
      expect((JSON.parse(c!) as { usage: object }).usage).not.toHaveProperty('prompt_tokens_details');
      expect((JSON.parse(d!) as { usage: { prompt_tokens_details: unknown } }).usage.prompt_tokens_details).toEqual({ cached_tokens: 48 });
    }
  });

  it('llama.cpp: usage without details, the cached count in timings.cache_n on the last chunk', async () => {
    const [a, b] = await twice('llama.cpp', chat({ stream: true, stream_options: { include_usage: true } }));
    const first = lastUsage(a!);
    const second = lastUsage(b!);
    expect(first.usage).toEqual({ completion_tokens: 6, prompt_tokens: 56, total_tokens: 62 });
    expect((first.timings as { cache_n: number }).cache_n).toBe(0);
    expect((second.timings as { cache_n: number; prompt_n: number }).cache_n).toBe(48);
    expect((second.timings as { prompt_n: number }).prompt_n).toBe(8);
    expect(second.usage).not.toHaveProperty('prompt_tokens_details');
    expect(a!.endsWith('data: [DONE]\n\n')).toBe(true);
  });

  it('legacy: cached_tokens always, 0 included', async () => {
    const [a] = await twice('legacy', chat({ stream: true, stream_options: { include_usage: true } }));
    expect((lastUsage(a!).usage as { prompt_tokens_details: unknown }).prompt_tokens_details).toEqual({ cached_tokens: 0 });
  });

  it('stream_options present means usage on vLLM (include_usage defaults to true), not on SGLang (false), llama.cpp or the legacy mock', async () => {
    for (const [profile, usage] of [['vllm', true], ['sglang', false], ['llama.cpp', false], ['legacy', false]] as const) {
      const m = await start({ profile });
      const events = dataEvents(await (await post(m, '/v1/chat/completions', chat({ stream: true, stream_options: {} }))).text());
      const hasUsage = events.some((e) => e !== '[DONE]' && 'usage' in (JSON.parse(e) as object));
      expect(hasUsage, profile).toBe(usage);
      const none = dataEvents(await (await post(m, '/v1/chat/completions', chat({ stream: true }))).text());
      expect(none.some((e) => e !== '[DONE]' && 'usage' in (JSON.parse(e) as object)), profile).toBe(false);
    }
  });

  it('vLLM refuses stream_options without stream (a 400); an empty object passes, as Python truthiness has it', async () => {
    const m = await start({ profile: 'vllm' });
    const res = await post(m, '/v1/chat/completions', chat({ stream_options: { include_usage: true } }));
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({ error: { message: 'Stream options can only be defined when `stream=True`.', type: 'BadRequestError', param: 'stream_options', code: 400 } });
    expect((await post(m, '/v1/chat/completions', chat({ stream_options: {} }))).status).toBe(200);
    const legacy = await start({ profile: 'legacy' });
    expect((await post(legacy, '/v1/chat/completions', chat({ stream_options: { include_usage: true } }))).status).toBe(200);
  });
});

describe('cache_salt', () => {
  it('vLLM caps it at 1024 characters (a 400); the legacy mock does not', async () => {
    const m = await start({ profile: 'vllm' });
    expect((await post(m, '/v1/chat/completions', chat({ cache_salt: 'x'.repeat(1024) }))).status).toBe(200);
    const res = await post(m, '/v1/chat/completions', chat({ cache_salt: 'x'.repeat(1025) }));
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: { param: 'cache_salt', code: 400 } });
    const legacy = await start({ profile: 'legacy' });
    expect((await post(legacy, '/v1/chat/completions', chat({ cache_salt: 'x'.repeat(1025) }))).status).toBe(200);
  });
});

describe('in-band errors and token faults', () => {
  it('vLLM: an engine failure before the first token is a 200 with an error event, then [DONE]', async () => {
    const m = await start({ profile: 'vllm', faults: { inBandErrorAfter: 0 } });
    const res = await post(m, '/v1/chat/completions', chat({ stream: true }));
    expect(res.status).toBe(200);
    expect(dataEvents(await res.text())).toEqual([JSON.stringify({ error: { message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 } }), '[DONE]']);
    expect(m.stats().injectedInBandErrors).toBe(1);
    expect(m.stats().abortedByClient).toBe(0);
  });

  it('vLLM: after N tokens the stream carries N tokens, then the error event and [DONE]', async () => {
    const m = await start({ profile: 'vllm', faults: { inBandErrorAfter: 3 } });
    const events = dataEvents(await (await post(m, '/v1/chat/completions', chat({ stream: true }))).text());
    const clean = await start({ profile: 'vllm' });
    const full = contentOf(dataEvents(await (await post(clean, '/v1/chat/completions', chat({ stream: true }))).text()));
    expect(events.at(-1)).toBe('[DONE]');
    expect(JSON.parse(events.at(-2)!)).toHaveProperty('error.code', 500);
    const text = contentOf(events.slice(0, -2));
    expect(text.length).toBeGreaterThan(0);
    expect(full.startsWith(text)).toBe(true);
    expect(events.slice(0, -2).filter((e) => (JSON.parse(e) as { choices: { delta: { content?: string } }[] }).choices[0]!.delta.content).length).toBe(3);
  });

  it('SGLang wraps its flat error body; llama.cpp answers a failed first result as HTTP 500 and ends a later error without [DONE]', async () => {
    const sg = await start({ profile: 'sglang', faults: { inBandErrorAfter: 0 } });
    expect(dataEvents(await (await post(sg, '/v1/chat/completions', chat({ stream: true }))).text())).toEqual([
      JSON.stringify({ error: { object: 'error', message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 } }),
      '[DONE]',
    ]);
    const lc = await start({ profile: 'llama.cpp', faults: { inBandErrorAfter: 0 } });
    const first = await post(lc, '/v1/chat/completions', chat({ stream: true }));
    expect(first.status).toBe(500);
    expect(first.headers.get('content-type')).toBe('application/json');
    expect(await first.json()).toEqual({ error: { code: 500, message: 'Internal server error', type: 'server_error' } });
    lc.setFaults({ inBandErrorAfter: 2 });
    const later = dataEvents(await (await post(lc, '/v1/chat/completions', chat({ stream: true }))).text());
    expect(later.at(-1)).toBe(JSON.stringify({ error: { code: 500, message: 'Internal server error', type: 'server_error' } }));
    expect(later).not.toContain('[DONE]');
  });

  it('a non-streamed request whose engine fails is a 500', async () => {
    const m = await start({ profile: 'vllm', faults: { inBandErrorAfter: 2 } });
    const res = await post(m, '/v1/chat/completions', chat());
    expect(res.status).toBe(500);
    expect(await res.json()).toEqual({ error: { message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 } });
  });

  it('dropAfterTokens: the client gets the headers and N tokens, then a broken connection', async () => {
    const m = await start({ profile: 'vllm', faults: { dropAfterTokens: 2 } });
    const res = await post(m, '/v1/chat/completions', chat({ stream: true }));
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = '';
    const dec = new TextDecoder();
    await expect(
      (async () => {
        for (let i = 0; i < 100; i++) {
          const { done, value } = await reader.read();
          if (done) return 'ended';
          text += dec.decode(value, { stream: true });
        }
        return 'too long';
      })(),
    ).rejects.toThrow();
    const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
    expect(events).not.toContain('[DONE]');
    expect(events.filter((e) => (JSON.parse(e) as { choices: { delta: { content?: string } }[] }).choices[0]!.delta.content).length).toBeLessThanOrEqual(2);
    expect(m.stats().droppedConnections).toBe(1);
  });

  it('stallAfterTokens: N tokens, then nothing until the client leaves', async () => {
    const m = await start({ profile: 'vllm', faults: { stallAfterTokens: 2 } });
    const ac = new AbortController();
    const res = await post(m, '/v1/chat/completions', chat({ stream: true }), {}, ac.signal);
    const reader = res.body!.getReader();
    const dec = new TextDecoder();
    let text = '';
    const deadline = Date.now() + 3_000;
    while (Date.now() < deadline && (text.match(/"content":"[^"]+"/g) ?? []).length < 2) {
      const { value } = await reader.read();
      text += dec.decode(value, { stream: true });
    }
    const more = await Promise.race([reader.read().then(() => 'data'), new Promise((r) => setTimeout(() => r('silent'), 300))]);
    expect(more).toBe('silent');
    expect(m.stats().running).toBe(1);
    ac.abort();
    for (let i = 0; i < 200 && m.stats().running > 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(m.stats().running).toBe(0);
  });

  it('a stale data-parallel rank on a vLLM stream is a 200 with an error event; on the legacy mock and non-streamed a 400', async () => {
    const m = await start({ profile: 'vllm', dataParallelSize: 2 });
    const res = await post(m, '/v1/chat/completions', chat({ stream: true }), { 'x-data-parallel-rank': '5' });
    expect(res.status).toBe(200);
    expect(dataEvents(await res.text())).toEqual([
      JSON.stringify({ error: { message: 'data_parallel_rank 5 is out of range [0, 2).', type: 'BadRequestError', param: null, code: 400 } }),
      '[DONE]',
    ]);
    expect((await post(m, '/v1/chat/completions', chat(), { 'x-data-parallel-rank': '5' })).status).toBe(400);
    const legacy = await start({ profile: 'legacy', dataParallelSize: 2 });
    expect((await post(legacy, '/v1/chat/completions', chat({ stream: true }), { 'x-data-parallel-rank': '5' })).status).toBe(400);
  });

  it("a stale data-parallel rank on vLLM's Messages stream is a 200 whose one event is the converter's error (pydantic's text, the rank cut away), with no message_stop", async () => {
    const m = await start({ profile: 'vllm', dataParallelSize: 2 });
    const body = { model: 'demo-model', max_tokens: 2, stream: true, messages: [{ role: 'user', content: 'hello' }] };
    const res = await post(m, '/v1/messages', body, { 'x-data-parallel-rank': '5' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const text = await res.text();
    expect(text.startsWith('event: error\ndata: ')).toBe(true);
    const events = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
    expect(events).toHaveLength(1);
    expect(text.endsWith('\n\n')).toBe(true);
    const ev = JSON.parse(events[0]!) as { type: string; error: { type: string; message: string } };
    expect(ev).toMatchObject({ type: 'error', error: { type: 'internal_error' } });
    expect(ev.error.message.split('\n').slice(0, 3)).toEqual([
      '2 validation errors for ChatCompletionStreamResponse',
      'model',
      "  Field required [type=missing, input_value={'error': {'message': 'da...am': None, 'code': 400}}, input_type=dict]",
    ]);
    expect(ev.error.message).not.toContain('data_parallel_rank 5');
    // The legacy mock keeps its 400.
    const legacy = await start({ profile: 'legacy', dataParallelSize: 2 });
    expect((await post(legacy, '/v1/messages', body, { 'x-data-parallel-rank': '5' })).status).toBe(400);
  });
});

describe("vLLM's --sse-keep-alive-interval (sseKeepAliveMs)", () => {
  it('writes `: keep-alive` while the stream is idle, before the first chunk too; other engines have no such flag', async () => {
    const m = await start({ profile: 'vllm', sseKeepAliveMs: 20, faults: { stallBeforeMs: 200 } });
    const text = await (await post(m, '/v1/chat/completions', chat({ stream: true }))).text();
    const before = text.slice(0, text.indexOf('data: '));
    expect(before.length).toBeGreaterThan(0);
    expect(before.split(': keep-alive\n\n').join('')).toBe('');
    expect(m.stats().keepAlivesSent).toBeGreaterThanOrEqual(2);
    // Off by default, as in vLLM.
    const plain = await start({ profile: 'vllm', faults: { stallBeforeMs: 100 } });
    expect(await (await post(plain, '/v1/chat/completions', chat({ stream: true }))).text()).not.toContain(': keep-alive');
    for (const profile of ['sglang', 'llama.cpp', 'legacy'] as const) await expect(startMockVllm({ port: 0, profile, sseKeepAliveMs: 20 })).rejects.toThrow(/no such flag/);
  });
});

describe('error bodies', () => {
  it('401 per engine', async () => {
    for (const [profile, body] of [
      ['vllm', { error: 'Unauthorized' }],
      ['sglang', { error: 'Unauthorized' }],
      ['llama.cpp', { error: { code: 401, message: 'Invalid API Key', type: 'authentication_error' } }],
    ] as const) {
      const m = await start({ profile, apiKey: 'k' });
      const res = await post(m, '/v1/chat/completions', chat(), { authorization: 'Bearer wrong' });
      expect(res.status, profile).toBe(401);
      expect(await res.json(), profile).toEqual(body);
    }
  });

  it('4xx shapes: vLLM nested, SGLang flat, llama.cpp nested with its own fields', async () => {
    const bodies: Record<string, unknown> = {};
    for (const profile of ['vllm', 'sglang', 'llama.cpp'] as const) {
      const m = await start({ profile });
      const res = await post(m, '/v1/chat/completions', { messages: [] });
      expect(res.status, profile).toBe(400);
      bodies[profile] = await res.json();
    }
    expect(bodies.vllm).toEqual({ error: { message: 'messages: Input should be a non-empty list', type: 'BadRequestError', param: 'messages', code: 400 } });
    expect(bodies.sglang).toEqual({ object: 'error', message: 'messages: Input should be a non-empty list', type: 'BadRequestError', param: 'messages', code: 400 });
    expect(bodies['llama.cpp']).toEqual({ error: { code: 400, message: 'messages: Input should be a non-empty list', type: 'invalid_request_error' } });
  });
});

describe('metrics', () => {
  it("vLLM's cache_config_info carries the server's total num_gpu_blocks on every engine's label; the legacy mock too", async () => {
    const v = await start({ profile: 'vllm', dataParallelSize: 2, cacheBlocks: 100 });
    const text = await (await fetch(`${v.url}/metrics`)).text();
    const labels = text.split('\n').filter((l) => l.startsWith('vllm:cache_config_info{'));
    expect(labels).toHaveLength(2);
    for (const l of labels) expect(l).toContain('num_gpu_blocks="200"');
    const legacy = await start({ profile: 'legacy', dataParallelSize: 2, cacheBlocks: 100 });
    const old = (await (await fetch(`${legacy.url}/metrics`)).text()).split('\n').filter((l) => l.startsWith('vllm:cache_config_info{'));
    // legacy wrote each engine's own blocks until the router read the label as vLLM writes it (issue #26 item 4).
    expect(old).toHaveLength(2);
    for (const l of old) expect(l).toContain('num_gpu_blocks="200"');
  });

  it("each profile's /metrics uses its engine's names", async () => {
    for (const [profile, name] of [['vllm', 'vllm:prefix_cache_hits_total'], ['sglang', 'sglang:cached_tokens_total'], ['llama.cpp', 'llamacpp:prompt_tokens_cached_total']] as const) {
      const m = await start({ profile });
      expect(await (await fetch(`${m.url}/metrics`)).text(), profile).toContain(name);
    }
  });
});

describe('Responses store', () => {
  const input = { model: 'demo-model', input: 'hello there', max_output_tokens: 4 };

  it('vllm: off by default: store quietly false, previous_response_id a 404, background a 400, nothing to GET', async () => {
    const m = await start({ profile: 'vllm' });
    const res = await post(m, '/v1/responses', input);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { id: string; store: boolean; usage: { input_tokens_details: { cached_tokens: number } } };
    expect(body.store).toBe(false);
    expect(body.usage.input_tokens_details).toEqual({ cached_tokens: 0 });
    expect((await fetch(`${m.url}/v1/responses/${body.id}`)).status).toBe(404);
    const follow = await post(m, '/v1/responses', { ...input, previous_response_id: body.id });
    expect(follow.status).toBe(404);
    expect(await follow.json()).toEqual({ error: { message: `Response with id '${body.id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } });
    const bg = await post(m, '/v1/responses', { ...input, background: true });
    expect(bg.status).toBe(400);
    expect(((await bg.json()) as { error: { param: string; message: string } }).error).toMatchObject({ param: 'background', message: expect.stringContaining('VLLM_ENABLE_RESPONSES_API_STORE=1') });
    expect((await fetch(`${m.url}/v1/responses/${body.id}`, { method: 'DELETE' })).status).toBe(405);
  });

  it('responsesStore: true keeps responses and continues from them', async () => {
    const m = await start({ profile: 'vllm', responsesStore: true });
    const first = (await (await post(m, '/v1/responses', input)).json()) as { id: string; store: boolean };
    expect(first.store).toBe(true);
    expect((await post(m, '/v1/responses', { ...input, previous_response_id: first.id })).status).toBe(200);
  });

  it('a vLLM stream ends with response.completed even for an incomplete response; the legacy mock with response.incomplete', async () => {
    for (const [profile, last] of [['vllm', 'response.completed'], ['legacy', 'response.incomplete']] as const) {
      const m = await start({ profile });
      const text = await (await post(m, '/v1/responses', { ...input, stream: true })).text();
      const events = [...text.matchAll(/^event: (.+)$/gm)].map((x) => x[1]);
      expect(events.at(-1), profile).toBe(last);
      expect(text, profile).toContain('"status":"incomplete"');
    }
  });
});

describe('deterministic answers', () => {
  it('token i depends only on the request: the same on every profile and replica, and a shorter answer is a prefix of a longer one', async () => {
    const texts: string[] = [];
    for (const profile of ['legacy', 'vllm', 'sglang', 'llama.cpp'] as const) {
      const m = await start({ profile });
      const long = (await (await post(m, '/v1/chat/completions', chat({ max_tokens: 12, temperature: 0 }))).json()) as { choices: { message: { content: string } }[] };
      const short = (await (await post(m, '/v1/chat/completions', chat({ max_tokens: 5, temperature: 0 }))).json()) as { choices: { message: { content: string } }[] };
      expect(long.choices[0]!.message.content.startsWith(short.choices[0]!.message.content), profile).toBe(true);
      texts.push(long.choices[0]!.message.content);
    }
    expect(new Set(texts).size).toBe(1);
  });
});

describe('CLI', () => {
  it('parses --profile and the new fault flags, and refuses an unknown profile', () => {
    const r = parseCliArgs(['--profile', 'vllm-cache-report', '--responses-store', '--in-band-error-after', '3', '--drop-after-tokens', '4', '--stall-after-tokens', '5']);
    expect(r).toMatchObject({ help: false, options: { profile: 'vllm-cache-report', responsesStore: true, faults: { inBandErrorAfter: 3, dropAfterTokens: 4, stallAfterTokens: 5 } } });
    expect(() => parseCliArgs(['--profile', 'tgi'])).toThrow(/--profile must be one of/);
    expect(() => parseCliArgs(['--headers-first', '--no-headers-first'])).toThrow(/contradict/);
  });
});
