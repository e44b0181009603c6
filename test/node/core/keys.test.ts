// Routing keys: source specs, first-present-wins resolution, and the canonical prompt that
// `prefix:<bytes>` hashes.
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random.js';
import { hashString, murmur3, utf8 } from '../../../src/core/hash.js';
import {
  canonicalPrompt,
  DEFAULT_PREFIX_BYTES,
  DEFAULT_SESSION_HEADER,
  formatKeySource,
  MAX_HEADER_KEY_CHARS,
  parseKeySource,
  resolveRoutingKey,
  stableStringify,
  type KeyInput,
  type KeySource,
} from '../../../src/core/keys.js';

/** The same value with object keys re-inserted in a random order at every depth. */
function shuffleKeys(value: unknown, rnd: () => number): unknown {
  if (Array.isArray(value)) return value.map((v) => shuffleKeys(v, rnd));
  if (value === null || typeof value !== 'object') return value;
  const entries = Object.entries(value as Record<string, unknown>);
  for (let i = entries.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [entries[i], entries[j]] = [entries[j]!, entries[i]!];
  }
  return Object.fromEntries(entries.map(([k, v]) => [k, shuffleKeys(v, rnd)]));
}

const headers =
  (h: Record<string, string>): KeyInput['header'] =>
  (name) => {
    for (const [k, v] of Object.entries(h)) if (k.toLowerCase() === name.toLowerCase()) return v;
    return null;
  };

const chatBody = {
  model: 'llama',
  tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
  messages: [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: [{ type: 'text', text: 'Weather in Oslo?' }, { type: 'image_url', image_url: { url: 'https://x/y.png', detail: 'low' } }] },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: '3°C' },
  ],
};

describe('parseKeySource', () => {
  it.each<[string, KeySource]>([
    ['header:x-session-id', { kind: 'header', name: 'x-session-id' }],
    ['header:X-Conversation-ID', { kind: 'header', name: 'x-conversation-id' }],
    ['header', { kind: 'header', name: DEFAULT_SESSION_HEADER }],
    ['  header:x-a  ', { kind: 'header', name: 'x-a' }],
    ['tenant', { kind: 'tenant' }],
    ['prefix:4096', { kind: 'prefix', bytes: 4096 }],
    ['prefix:1', { kind: 'prefix', bytes: 1 }],
    ['prefix:1048576', { kind: 'prefix', bytes: 1 << 20 }],
    ['prefix', { kind: 'prefix', bytes: DEFAULT_PREFIX_BYTES }],
    ['none', { kind: 'none' }],
  ])('%j', (spec, want) => {
    expect(parseKeySource(spec)).toEqual(want);
  });

  it('round-trips through formatKeySource', () => {
    for (const spec of ['header:x-session-id', 'tenant', 'prefix:512', 'none']) expect(formatKeySource(parseKeySource(spec))).toBe(spec);
    expect(formatKeySource(parseKeySource('header'))).toBe(`header:${DEFAULT_SESSION_HEADER}`);
    expect(formatKeySource(parseKeySource('prefix'))).toBe(`prefix:${DEFAULT_PREFIX_BYTES}`);
  });

  it.each([
    ['header:', /not a valid header name/],
    ['header:x session', /not a valid header name/],
    ['header:x-a:b', /too many parts/],
    ['tenant:acme', /takes no argument/],
    ['none:1', /takes no argument/],
    ['prefix:0', /prefix bytes/],
    ['prefix:-5', /prefix bytes/],
    ['prefix:1.5', /prefix bytes/],
    ['prefix:abc', /prefix bytes/],
    ['prefix:', /prefix bytes/],
    ['prefix:1048577', /prefix bytes/],
    ['cookie:sid', /unknown key source/],
    ['', /unknown key source/],
    ['Tenant', /unknown key source/],
  ])('rejects %j', (spec, msg) => {
    expect(() => parseKeySource(spec)).toThrow(RangeError);
    expect(() => parseKeySource(spec)).toThrow(msg);
  });
});

describe('resolveRoutingKey', () => {
  const order = ['header:x-session-id', 'tenant', 'prefix:4096', 'none'].map(parseKeySource);
  const body = { messages: [{ role: 'user', content: 'hello' }] };

  it('takes the first source present, in order, and reports which one', () => {
    const all: KeyInput = { header: headers({ 'X-Session-Id': 'sess-1' }), tenant: 'acme', body };
    expect(resolveRoutingKey(order, all)).toEqual({ kind: 'header', hash: hashString('sess-1') });
    const noHeader: KeyInput = { header: headers({}), tenant: 'acme', body };
    expect(resolveRoutingKey(order, noHeader)).toEqual({ kind: 'tenant', hash: hashString('tenant\u0000acme') });
    const onlyBody: KeyInput = { header: headers({}), tenant: null, body };
    const pk = resolveRoutingKey(order, onlyBody);
    expect(pk.kind).toBe('prefix');
    expect(pk.hash).toBe(hashString(canonicalPrompt(body)));
    const nothing: KeyInput = { header: headers({}), tenant: undefined, body: { model: 'm' } };
    expect(resolveRoutingKey(order, nothing)).toEqual({ kind: 'none', hash: null });
  });

  it('respects a different order', () => {
    const input: KeyInput = { header: headers({ 'x-session-id': 'sess-1' }), tenant: 'acme', body };
    expect(resolveRoutingKey(['tenant', 'header'].map(parseKeySource), input).kind).toBe('tenant');
    expect(resolveRoutingKey(['prefix:64', 'header'].map(parseKeySource), input).kind).toBe('prefix');
  });

  it('stops at `none`: later sources are not consulted', () => {
    const input: KeyInput = { header: headers({ 'x-session-id': 's' }), tenant: 'acme', body };
    expect(resolveRoutingKey(['none', 'header', 'tenant'].map(parseKeySource), input)).toEqual({ kind: 'none', hash: null });
    expect(resolveRoutingKey([], input)).toEqual({ kind: 'none', hash: null });
  });

  it('skips an empty or whitespace-only header and trims the value', () => {
    const src = [parseKeySource('header:x-session-id'), parseKeySource('tenant')];
    expect(resolveRoutingKey(src, { header: headers({ 'x-session-id': '   ' }), tenant: 't', body }).kind).toBe('tenant');
    expect(resolveRoutingKey(src, { header: headers({ 'x-session-id': '' }), tenant: 't', body }).kind).toBe('tenant');
    expect(resolveRoutingKey(src, { header: headers({ 'x-session-id': '  abc ' }), tenant: 't', body }).hash).toBe(hashString('abc'));
  });

  it('looks the header up by the configured lower-case name', () => {
    const seen: string[] = [];
    resolveRoutingKey([parseKeySource('header:X-Conv')], { header: (n) => (seen.push(n), null), body });
    expect(seen).toEqual(['x-conv']);
  });

  it('truncates very long header values before hashing', () => {
    const long = 'a'.repeat(MAX_HEADER_KEY_CHARS) + 'tail-1';
    const other = 'a'.repeat(MAX_HEADER_KEY_CHARS) + 'tail-2';
    const src = [parseKeySource('header')];
    const k1 = resolveRoutingKey(src, { header: headers({ 'x-session-id': long }), body });
    expect(k1.hash).toBe(hashString('a'.repeat(MAX_HEADER_KEY_CHARS)));
    expect(resolveRoutingKey(src, { header: headers({ 'x-session-id': other }), body }).hash).toBe(k1.hash);
  });

  it('keeps tenant keys apart from a session header with the same text, and tenants apart from each other', () => {
    const h = resolveRoutingKey([parseKeySource('header')], { header: headers({ 'x-session-id': 'acme' }), body }).hash;
    const t = resolveRoutingKey([parseKeySource('tenant')], { header: headers({}), tenant: 'acme', body }).hash;
    const t2 = resolveRoutingKey([parseKeySource('tenant')], { header: headers({}), tenant: 'acme2', body }).hash;
    expect(h).not.toBe(t);
    expect(t).not.toBe(t2);
  });

  it('prefix:N uses only the first N bytes of the canonical prompt', () => {
    const N = 64;
    const src = [parseKeySource(`prefix:${N}`)];
    const shared = 'S'.repeat(200);
    const a = { messages: [{ role: 'system', content: shared }, { role: 'user', content: 'question one' }] };
    const b = { messages: [{ role: 'system', content: shared }, { role: 'user', content: 'a completely different question' }] };
    const ka = resolveRoutingKey(src, { header: headers({}), body: a });
    const kb = resolveRoutingKey(src, { header: headers({}), body: b });
    expect(ka.kind).toBe('prefix');
    expect(ka.hash).toBe(kb.hash);
    expect(ka.hash).toBe(murmur3(utf8(canonicalPrompt(a)).subarray(0, N)));
    // A difference at byte N−1 (inside the prefix) changes the key; one at byte N does not.
    const text = canonicalPrompt(a);
    const bytes = utf8(text);
    expect(bytes.length).toBeGreaterThan(N);
    const atByte = (i: number) => {
      const c = Uint8Array.from(bytes);
      c[i] = c[i] === 0x58 ? 0x59 : 0x58;
      return murmur3(c, 0, 0, N);
    };
    expect(atByte(N - 1)).not.toBe(ka.hash);
    expect(atByte(N)).toBe(ka.hash);
    const inside = { messages: [{ role: 'system', content: 'T' + shared.slice(1) }, { role: 'user', content: 'question one' }] };
    expect(resolveRoutingKey(src, { header: headers({}), body: inside }).hash).not.toBe(ka.hash);
    // A prompt shorter than N hashes all of its bytes.
    const short = { messages: [{ role: 'user', content: 'hi' }] };
    expect(resolveRoutingKey(src, { header: headers({}), body: short }).hash).toBe(hashString(canonicalPrompt(short)));
  });

  it('prefix counts bytes, not characters (multi-byte UTF-8)', () => {
    const src = [parseKeySource('prefix:10')];
    // 'π' is 2 bytes: the prompt "user\u0002ππππππ…" crosses byte 10 inside the third π.
    const a = { messages: [{ role: 'user', content: 'ππππππππ' }] };
    const b = { messages: [{ role: 'user', content: 'πππππππX' }] };
    const ka = resolveRoutingKey(src, { header: headers({}), body: a }).hash;
    expect(ka).toBe(murmur3(utf8(canonicalPrompt(a)).subarray(0, 10)));
    expect(resolveRoutingKey(src, { header: headers({}), body: b }).hash).toBe(ka);
  });

  it('skips prefix when the body carries no prompt', () => {
    const src = ['prefix', 'tenant'].map(parseKeySource);
    for (const body of [null, undefined, 'text', 42, {}, { model: 'm' }, { messages: [] }, { tools: [] }]) {
      expect(resolveRoutingKey(src, { header: headers({}), tenant: 't', body }).kind).toBe('tenant');
    }
  });
});

describe('canonicalPrompt', () => {
  it('is the same for the same request with object keys in any order (tools, content parts, tool calls)', () => {
    const rnd = seededRandom(17);
    const want = canonicalPrompt(chatBody);
    const wantHash = resolveRoutingKey([parseKeySource('prefix:100000')], { header: headers({}), body: chatBody }).hash;
    for (let n = 0; n < 50; n++) {
      const shuffled = shuffleKeys(chatBody, rnd);
      expect(canonicalPrompt(shuffled)).toBe(want);
      expect(resolveRoutingKey([parseKeySource('prefix:100000')], { header: headers({}), body: shuffled }).hash).toBe(wantHash);
    }
    // The shuffle really did reorder keys in the JSON text.
    const texts = new Set(Array.from({ length: 20 }, () => JSON.stringify(shuffleKeys(chatBody, rnd))));
    expect(texts.size).toBeGreaterThan(1);
  });

  it('puts the tools first, then each message in order', () => {
    const text = canonicalPrompt(chatBody);
    expect(text.startsWith('tools')).toBe(true);
    const iTools = text.indexOf('get_weather');
    const iSystem = text.indexOf('You are terse.');
    const iUser = text.indexOf('Weather in Oslo?');
    const iTool = text.indexOf('3°C');
    expect(0 <= iTools && iTools < iSystem && iSystem < iUser && iUser < iTool).toBe(true);
    // Field order in the body does not matter: messages before tools gives the same text.
    const { tools, ...rest } = chatBody;
    expect(canonicalPrompt({ messages: rest.messages, tools })).toBe(text);
  });

  it('changes when a tool schema, role, message order or content changes', () => {
    const base = canonicalPrompt(chatBody);
    const variants = [
      { ...chatBody, tools: [{ ...chatBody.tools[0]!, function: { ...chatBody.tools[0]!.function, description: 'Weather' } }] },
      { ...chatBody, tools: undefined },
      { ...chatBody, messages: [chatBody.messages[1]!, chatBody.messages[0]!, ...chatBody.messages.slice(2)] },
      { ...chatBody, messages: [{ role: 'developer', content: 'You are terse.' }, ...chatBody.messages.slice(1)] },
      { ...chatBody, messages: [{ role: 'system', content: 'You are terse!' }, ...chatBody.messages.slice(1)] },
      { ...chatBody, messages: chatBody.messages.slice(0, 3) },
    ];
    const seen = new Set([base]);
    for (const v of variants) {
      const t = canonicalPrompt(v);
      expect(seen.has(t), JSON.stringify(v).slice(0, 80)).toBe(false);
      seen.add(t);
    }
  });

  it('keeps message boundaries: "ab"+"c" differs from "a"+"bc"', () => {
    const x = canonicalPrompt({ messages: [{ role: 'user', content: 'ab' }, { role: 'user', content: 'c' }] });
    const y = canonicalPrompt({ messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'bc' }] });
    expect(x).not.toBe(y);
  });

  it('ignores fields outside the prompt (model, sampling, stream options)', () => {
    const a = canonicalPrompt({ ...chatBody, model: 'a', temperature: 0.1, stream: true });
    const b = canonicalPrompt({ ...chatBody, model: 'b', temperature: 0.9, max_tokens: 5 });
    expect(a).toBe(b);
  });

  it('uses `prompt` for completions (string or token array), and messages win over prompt', () => {
    expect(canonicalPrompt({ model: 'm', prompt: 'Once upon a time' })).toBe('Once upon a time');
    expect(canonicalPrompt({ prompt: [1, 2, 3] })).toBe('[1,2,3]');
    expect(canonicalPrompt({ prompt: 'abc' })).not.toBe(canonicalPrompt({ prompt: 'abd' }));
    const both = canonicalPrompt({ messages: [{ role: 'user', content: 'm' }], prompt: 'p' });
    expect(both).toBe(canonicalPrompt({ messages: [{ role: 'user', content: 'm' }] }));
  });

  it('returns "" for bodies without a prompt and skips non-object messages', () => {
    for (const b of [null, undefined, 1, 'x', [], {}, { model: 'm' }]) expect(canonicalPrompt(b)).toBe('');
    expect(canonicalPrompt({ messages: [null, 3, { role: 'user', content: 'x' }] })).toBe(canonicalPrompt({ messages: [{ role: 'user', content: 'x' }] }));
  });
});

describe('stableStringify', () => {
  it('sorts keys at every depth, drops undefined fields, keeps array order', () => {
    expect(stableStringify({ b: 1, a: { d: [3, { z: 1, y: 2 }], c: undefined } })).toBe('{"a":{"d":[3,{"y":2,"z":1}]},"b":1}');
    expect(stableStringify([2, 1])).toBe('[2,1]');
    expect(stableStringify(undefined)).toBe('null');
    expect(stableStringify('s"q')).toBe(JSON.stringify('s"q'));
    expect(JSON.parse(stableStringify(chatBody))).toEqual(JSON.parse(JSON.stringify(chatBody)));
  });
});

describe('body:<field> (prompt_cache_key)', () => {
  const src = ['header:x-session-id', 'body:prompt_cache_key', 'tenant', 'prefix:4096'].map(parseKeySource);
  const none = headers({});

  it('parses and formats; a field name is required and must be a plain top-level name', () => {
    expect(parseKeySource('body:prompt_cache_key')).toEqual({ kind: 'body', field: 'prompt_cache_key' });
    expect(formatKeySource(parseKeySource('body:prompt_cache_key'))).toBe('body:prompt_cache_key');
    for (const bad of ['body', 'body:', 'body:Prompt', 'body:a.b', 'body:__proto__x:y', `body:${'a'.repeat(65)}`]) expect(() => parseKeySource(bad)).toThrow(RangeError);
  });

  it('sits after the session header and ahead of the tenant', () => {
    const body = { prompt_cache_key: 'conv-42', messages: [{ role: 'user', content: 'hi' }] };
    expect(resolveRoutingKey(src, { header: headers({ 'x-session-id': 's' }), tenant: 'acme', body }).kind).toBe('header');
    const k = resolveRoutingKey(src, { header: none, tenant: 'acme', body });
    expect(k).toEqual({ kind: 'body', hash: hashString('body\u0000prompt_cache_key\u0000acme\u0000conv-42') });
    expect(resolveRoutingKey(src, { header: none, tenant: 'acme', body: { messages: body.messages } }).kind).toBe('tenant');
  });

  it('is namespaced per tenant: the same value from two tenants is two keys', () => {
    const body = { prompt_cache_key: 'shared-id' };
    const a = resolveRoutingKey(src, { header: none, tenant: 'acme', body });
    const b = resolveRoutingKey(src, { header: none, tenant: 'evil', body });
    expect(a.kind).toBe('body');
    expect(a.hash).not.toBe(b.hash);
    expect(resolveRoutingKey(src, { header: none, tenant: 'acme', body }).hash).toBe(a.hash);
  });

  it('ignores a value that is not a non-blank string, and inherited properties', () => {
    for (const v of [null, 42, '', '   ', ['x'], { a: 1 }, true]) {
      expect(resolveRoutingKey(src, { header: none, tenant: 'acme', body: { prompt_cache_key: v } }).kind).toBe('tenant');
    }
    const inherited = Object.create({ prompt_cache_key: 'from-prototype' }) as Record<string, unknown>;
    expect(resolveRoutingKey(src, { header: none, tenant: 'acme', body: inherited }).kind).toBe('tenant');
    expect(resolveRoutingKey(src, { header: none, tenant: 'acme', body: ['not', 'an', 'object'] }).kind).toBe('tenant');
  });

  it('hashes at most MAX_BODY_KEY_CHARS characters', () => {
    const long = 'k'.repeat(1000);
    const a = resolveRoutingKey(src, { header: none, tenant: 't', body: { prompt_cache_key: long } });
    const b = resolveRoutingKey(src, { header: none, tenant: 't', body: { prompt_cache_key: long + 'tail' } });
    expect(a.hash).toBe(b.hash);
  });
});

describe('prefix keys hash the first N bytes without encoding the whole prompt', () => {
  it('hashUtf8Prefix equals murmur3 of the first N bytes of the full encoding, also when byte N splits a character', async () => {
    const { hashUtf8Prefix } = await import('../../../src/core/keys.js');
    const { murmur3, utf8 } = await import('../../../src/core/hash.js');
    const rand = seededRandom(17);
    const alphabet = ['a', 'é', '€', '😀', '\ud800', 'z', '中'];
    for (let t = 0; t < 500; t++) {
      const text = Array.from({ length: Math.floor(rand() * 40) }, () => alphabet[Math.floor(rand() * alphabet.length)]).join('');
      const limit = 1 + Math.floor(rand() * 60);
      const bytes = utf8(text);
      expect(hashUtf8Prefix(text, limit)).toBe(murmur3(bytes, 0, 0, Math.min(bytes.length, limit)));
    }
  });

  it('a prefix key stops reading messages once it has N bytes: later turns never change it', () => {
    const sources = [parseKeySource('prefix:64')];
    const first = { messages: [{ role: 'system', content: 'x'.repeat(100) }, { role: 'user', content: 'hello' }] };
    const later = { messages: [...first.messages, { role: 'assistant', content: 'y'.repeat(10_000) }] };
    const a = resolveRoutingKey(sources, { header: () => null, body: first });
    const b = resolveRoutingKey(sources, { header: () => null, body: later });
    expect(a.hash).toBe(b.hash);
    expect(canonicalPrompt(later, 64).length).toBeLessThan(canonicalPrompt(later).length);
    expect(canonicalPrompt(later).startsWith(canonicalPrompt(later, 64))).toBe(true);
  });
});
