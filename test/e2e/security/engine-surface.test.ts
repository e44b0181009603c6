// Abuse suite, the tenant boundary round three (issue #30): what a hostile tenant could still push
// through to a shared engine. Numbers sent as strings (vLLM's request models parse in pydantic's
// lax mode and would run "9" as 9) are refused by type on every bounded field, before anything is
// forwarded; a template hidden inside `chat_template_kwargs` and `media_io_kwargs` never reach an
// engine, on any dialect; two tenants on one engine share no cached block (the mock partitions its
// prefix cache by cache_salt as vLLM does). Router under Miniflare on loopback with mock vLLM replicas.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { randomBytes } from 'node:crypto';

import { TEST_TENANTS } from '../../helpers/router.js';
import { MODEL, OTHER_MODEL, startRig, waitHealthy, type Rig } from '../../helpers/security-rig.js';

let rig: Rig;

beforeAll(async () => {
  // The Messages API is refused on tenant-salted vLLM pools unless the pool opts in (vLLM drops
  // cache_salt there): opted in here, so the fence is shown on that dialect too.
  // `batch` (OTHER_MODEL) has one replica: two tenants' identical prompts meet on one engine there.
  rig = await startRig({
    mocks: 2,
    // vLLM with --enable-prompt-tokens-details: the salt test reads per-request cached tokens.
    mockOptions: { decodeMsPerToken: 2, maxRunning: 64, models: [MODEL, OTHER_MODEL], profile: 'vllm-cache-report' },
    tenants: [...TEST_TENANTS, { key: `sk-e2e-initech-${randomBytes(9).toString('base64url')}`, tenant: 'initech', keyId: 'e2e-initech', pools: ['*'] }],
    poolOverrides: { messagesSharedCache: true },
  });
  await waitHealthy(rig);
}, 60_000);

afterAll(async () => {
  await rig?.close();
});

const acme = () => rig.tenants[0]!.key;

function post(path: string, body: Record<string, unknown>) {
  return rig.fetchText(path, {
    method: 'POST',
    headers: { authorization: `Bearer ${acme()}`, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify(body),
  }, `POST ${path}`);
}

/** The body a mock last received on `path` that carries `marker` (the request this test sent). */
function bodyWith(path: string, marker: string): Record<string, unknown> {
  const seen = rig.mocks.map((m) => m.stats().lastPostByPath[path]).filter((r) => r !== undefined && JSON.stringify(r.body).includes(marker));
  expect(seen.length, `no mock received ${path} with ${marker}`).toBe(1);
  return seen[0]!.body as Record<string, unknown>;
}

describe('numbers sent as strings (item 1)', () => {
  const chat = { model: MODEL, messages: [{ role: 'user', content: 'hi' }] };
  const cases: [string, Record<string, unknown>, string][] = [
    ['/v1/chat/completions', { ...chat, n: '9' }, 'n'],
    ['/v1/chat/completions', { ...chat, n: '1000' }, 'n'],
    ['/v1/chat/completions', { ...chat, best_of: '64' }, 'best_of'],
    ['/v1/chat/completions', { ...chat, max_completion_tokens: '1000000' }, 'max_completion_tokens'],
    ['/v1/chat/completions', { ...chat, max_tokens: '1000000' }, 'max_tokens'],
    ['/v1/chat/completions', { ...chat, min_tokens: '40000' }, 'min_tokens'],
    ['/v1/chat/completions', { ...chat, n: true }, 'n'],
    ['/v1/chat/completions', { ...chat, max_tokens: ['5'] }, 'max_tokens'],
    ['/v1/completions', { model: MODEL, prompt: 'hi', n: '9', best_of: '64' }, 'n'],
    ['/v1/responses', { model: MODEL, input: 'hi', max_output_tokens: '1000000' }, 'max_output_tokens'],
    ['/v1/messages', { model: MODEL, max_tokens: '1000000', messages: [{ role: 'user', content: 'hi' }] }, 'max_tokens'],
  ];
  it.each(cases)('%s %j: a 400 naming the field in the dialect\'s shape, nothing forwarded', async (path, body, param) => {
    const before = rig.completions();
    const res = await post(path, body);
    expect(res.status, res.text).toBe(400);
    const err = JSON.parse(res.text) as { type?: string; error: { type: string; message: string; param?: string } };
    if (path === '/v1/messages') {
      expect(err.type).toBe('error');
      expect(err.error.type).toBe('invalid_request_error');
    } else {
      expect(err.error.param).toBe(param);
    }
    expect(err.error.message).toContain(`Invalid type for '${param}'`);
    // A sentinel after it: once it is answered, anything the refused one sent would have arrived.
    expect((await post('/v1/chat/completions', { ...chat, max_tokens: 1 })).status).toBe(200);
    expect(rig.completions() - before, 'requests that reached an engine (the sentinel only)').toBe(1);
  });

  it('the same numbers as numbers within bounds still pass, and null means the default', async () => {
    const res = await post('/v1/chat/completions', { ...chat, n: 1, max_tokens: 2, min_tokens: null, best_of: null });
    expect(res.status, res.text).toBe(200);
  });
});

describe('nested template keys (item 2)', () => {
  const nested = { chat_template_kwargs: { chat_template: '{% for i in range(10**9) %}{% endfor %}', enable_thinking: false }, media_io_kwargs: { video: { num_frames: 100000 } } };
  const say = (path: string) => `nested keys on ${path}`;
  const dialects: [string, Record<string, unknown>][] = [
    ['/v1/chat/completions', { model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: say('/v1/chat/completions') }], ...nested }],
    ['/tokenize', { model: MODEL, messages: [{ role: 'user', content: say('/tokenize') }], ...nested }],
    ['/v1/embeddings', { model: MODEL, messages: [{ role: 'user', content: say('/v1/embeddings') }], ...nested }],
    ['/v1/responses', { model: MODEL, input: say('/v1/responses'), max_output_tokens: 1, store: false, ...nested }],
    ['/v1/messages', { model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: say('/v1/messages') }], ...nested }],
  ];
  it.each(dialects)('%s: chat_template inside chat_template_kwargs and media_io_kwargs never reach the engine; the template\'s own switches do', async (path, body) => {
    const res = await post(path, body);
    expect(res.status, res.text).toBeLessThan(500);
    const got = bodyWith(path, say(path));
    expect(got.media_io_kwargs, 'media_io_kwargs').toBeUndefined();
    expect(got.chat_template, 'chat_template').toBeUndefined();
    expect(got.chat_template_kwargs).toEqual({ enable_thinking: false });
  });
});

describe('cache salts on one engine (item 4)', () => {
  it('two tenants sending the same prompt to one replica: each hits only its own cached blocks', async () => {
    const prompt = `${'A shared system prompt every tenant of this SaaS sends verbatim. '.repeat(20)}What is new?`;
    const ask = async (tenant: string) => {
      const res = await rig.fetchText('/v1/chat/completions', {
        method: 'POST',
        headers: { authorization: `Bearer ${rig.keyOf(tenant)}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: OTHER_MODEL, max_tokens: 2, messages: [{ role: 'user', content: prompt }] }),
      }, `cache salt ${tenant}`);
      expect(res.status, res.text).toBe(200);
      // With --enable-prompt-tokens-details vLLM sends the details only for a non-zero count
      // (`if self.enable_prompt_tokens_details and num_cached_tokens:`): absent here means 0.
      return (JSON.parse(res.text) as { usage: { prompt_tokens_details?: { cached_tokens: number } } }).usage.prompt_tokens_details?.cached_tokens ?? 0;
    };
    expect(await ask('acme')).toBe(0);
    expect(await ask('acme'), "acme's own repeat hits its blocks").toBeGreaterThan(0);
    expect(await ask('initech'), "initech sees none of acme's blocks").toBe(0);
    expect(await ask('initech')).toBeGreaterThan(0);
  });
});
