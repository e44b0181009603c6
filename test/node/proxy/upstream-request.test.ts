// Upstream request builders: header filtering and origin auth, body preparation, origin-auth secrets.
import { describe, expect, it } from 'vitest';
import {
  FORWARDED_REQUEST_HEADERS,
  HOP_BY_HOP_HEADERS,
  UpstreamHeaderError,
  buildUpstreamHeaders,
  parseOriginAuthSecret,
  upstreamExtraHeaders,
  type OriginAuth,
} from '../../../src/proxy/upstream-request';
import { prepareOpenAIBody } from '../../../src/http/apis/openai-chat/body';

const NONE: OriginAuth = { kind: 'none' };

function clientHeaders(extra: Record<string, string> = {}): Headers {
  return new Headers({
    'content-type': 'application/json',
    accept: 'text/event-stream',
    'user-agent': 'OpenAI/JS 6.49.0',
    'x-request-id': 'req-123',
    'x-session-id': 'sess-9',
    traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
    authorization: 'Bearer sk-tenant-key',
    cookie: 'session=abc',
    host: 'router.example.com',
    'content-length': '123',
    'accept-encoding': 'gzip, br',
    'x-forwarded-for': '203.0.113.7',
    'x-forwarded-proto': 'https',
    'x-real-ip': '203.0.113.7',
    forwarded: 'for=203.0.113.7',
    'cf-connecting-ip': '203.0.113.7',
    'cf-ray': '8f00000000000000-AMS',
    'cf-access-client-id': 'client-forged-id',
    'x-api-key': 'sk-other',
    'api-key': 'sk-azure-style',
    'openai-organization': 'org-1',
    'x-stainless-lang': 'js',
    'keep-alive': 'timeout=5',
    te: 'trailers',
    trailer: 'x-checksum',
    upgrade: 'h2c',
    'proxy-authorization': 'Basic Zm9vOmJhcg==',
    ...extra,
  });
}

const names = (h: Headers) => [...h.keys()].sort();

describe('buildUpstreamHeaders', () => {
  it('forwards exactly the allowlisted client headers, values unchanged', () => {
    const h = buildUpstreamHeaders(clientHeaders(), NONE);
    expect(names(h)).toEqual(['accept', 'content-type', 'traceparent', 'user-agent']);
    expect(h.get('accept')).toBe('text/event-stream');
    expect(h.get('user-agent')).toBe('OpenAI/JS 6.49.0');
    // The client's session id never goes as sent (issue #26 item 4): only the router's tag of it.
    expect(h.get('x-session-id')).toBeNull();
    // The client's request id is the engine's id in vLLM: the router sends its own (extra).
    expect(h.get('x-request-id')).toBeNull();
  });

  it('x-session-id goes only as the session tag the caller passes (the per-tenant HMAC), never the raw value', () => {
    const tag = 'AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdE';
    const h = buildUpstreamHeaders(clientHeaders(), NONE, undefined, undefined, tag);
    expect(h.get('x-session-id')).toBe(tag);
    expect([...h.values()]).not.toContain('sess-9');
    expect(buildUpstreamHeaders(clientHeaders(), NONE, undefined, undefined, null).has('x-session-id')).toBe(false);
    // A pool cannot route the raw header around it: forwardHeaders never carries it (forward-headers.ts).
    expect(buildUpstreamHeaders(clientHeaders(), NONE, undefined, ['x-work-hint']).has('x-session-id')).toBe(false);
  });

  it("vLLM's X-Vllm-Priority never goes from a client (it overrides the fenced body priority)", () => {
    const h = buildUpstreamHeaders(clientHeaders({ 'X-Vllm-Priority': '-100' }), NONE, upstreamExtraHeaders('up-1', 'req-1'));
    expect(h.has('x-vllm-priority')).toBe(false);
  });

  it("vLLM's data-parallel rank goes only as the lease's, never as the client's", () => {
    const forged = clientHeaders({ 'X-Data-Parallel-Rank': '1' });
    expect(buildUpstreamHeaders(forged, NONE, upstreamExtraHeaders('up-1', 'req-1')).has('x-data-parallel-rank')).toBe(false);
    const pinned = buildUpstreamHeaders(forged, NONE, upstreamExtraHeaders('up-1', 'req-1', 0));
    expect(pinned.get('x-data-parallel-rank')).toBe('0');
    expect(pinned.get('x-request-id')).toBe('up-1');
    expect(upstreamExtraHeaders('u', 'c', 3)).toEqual({ 'x-request-id': 'u', 'x-client-request-id': 'c', 'x-data-parallel-rank': '3' });
    expect(upstreamExtraHeaders('u', 'c', -1)).not.toHaveProperty('x-data-parallel-rank');
  });

  it('a pool\'s forwardHeaders are added; origin auth still overrides a name it sets', () => {
    const h = buildUpstreamHeaders(clientHeaders({ 'x-work-hint': 'batch', 'x-origin-key': 'forged' }), { kind: 'headers', headers: { 'x-origin-key': 'real' } }, undefined, ['x-work-hint', 'x-origin-key']);
    expect(h.get('x-work-hint')).toBe('batch');
    expect(h.get('x-origin-key')).toBe('real');
    expect(buildUpstreamHeaders(clientHeaders({ 'x-work-hint': 'batch' }), NONE).has('x-work-hint')).toBe(false);
  });

  it('never forwards client credentials, addresses, hop-by-hop or body-framing headers', () => {
    const h = buildUpstreamHeaders(clientHeaders(), NONE);
    for (const name of [
      'authorization',
      'cookie',
      'host',
      'content-length',
      'accept-encoding',
      'x-forwarded-for',
      'x-forwarded-proto',
      'x-real-ip',
      'forwarded',
      'cf-connecting-ip',
      'cf-ray',
      'cf-access-client-id',
      'x-api-key',
      'api-key',
      'openai-organization',
      ...HOP_BY_HOP_HEADERS,
    ]) {
      expect(h.has(name), name).toBe(false);
    }
  });

  it('Connection is never forwarded, and does not change what else is (the runtime strips it before the Worker; test/e2e/security/origin-hardening.test.ts)', () => {
    const h = buildUpstreamHeaders(clientHeaders({ connection: 'keep-alive, X-Session-Id ,  user-agent' }), NONE, undefined, undefined, 'tag-1');
    expect(h.has('connection')).toBe(false);
    expect(h.get('x-session-id')).toBe('tag-1');
    expect(h.get('accept')).toBe('text/event-stream');
  });

  it('bearer origin auth replaces the client Authorization', () => {
    const h = buildUpstreamHeaders(clientHeaders(), { kind: 'bearer', token: 'origin-token' });
    expect(h.get('authorization')).toBe('Bearer origin-token');
  });

  it('header origin auth is set, and overrides client and extra headers of the same name', () => {
    const auth: OriginAuth = { kind: 'headers', headers: { 'CF-Access-Client-Id': 'id.access', 'CF-Access-Client-Secret': 's3cr3t', 'User-Agent': 'router' } };
    const h = buildUpstreamHeaders(clientHeaders(), auth, { 'cf-access-client-secret': 'from-extra', 'x-router': '1' });
    expect(h.get('cf-access-client-id')).toBe('id.access');
    expect(h.get('cf-access-client-secret')).toBe('s3cr3t');
    expect(h.get('user-agent')).toBe('router');
    expect(h.get('x-router')).toBe('1');
    expect(h.has('authorization')).toBe(false);
  });

  it('extra overrides forwarded client headers', () => {
    const h = buildUpstreamHeaders(clientHeaders(), NONE, { 'X-Request-Id': 'router-req-1' });
    expect(h.get('x-request-id')).toBe('router-req-1');
  });

  it('rejects CR/LF in values without echoing the value', () => {
    const secret = 'tok\r\nX-Injected: 1';
    for (const call of [
      () => buildUpstreamHeaders(new Headers(), { kind: 'bearer', token: secret }),
      () => buildUpstreamHeaders(new Headers(), { kind: 'headers', headers: { 'X-Key': secret } }),
      () => buildUpstreamHeaders(new Headers(), NONE, { 'x-key': secret }),
      () => buildUpstreamHeaders(new Headers(), NONE, { 'x-key': 'caf\u00e9\u4e16' }), // not a ByteString
    ]) {
      let thrown: unknown;
      try {
        call();
      } catch (e) {
        thrown = e;
      }
      expect(thrown).toBeInstanceOf(UpstreamHeaderError);
      const text = `${String(thrown)} ${JSON.stringify(thrown)} ${(thrown as Error).stack}`;
      expect(text).not.toContain('tok');
      expect(text).not.toContain('Injected');
      expect(text).not.toContain('caf');
    }
  });

  it('rejects hop-by-hop or malformed names from the proxy itself, naming only valid names', () => {
    expect(() => buildUpstreamHeaders(new Headers(), NONE, { Connection: 'close' })).toThrow(UpstreamHeaderError);
    let e: unknown;
    try {
      buildUpstreamHeaders(new Headers(), { kind: 'headers', headers: { 'bad name secretish': 'v' } });
    } catch (err) {
      e = err;
    }
    expect(e).toBeInstanceOf(UpstreamHeaderError);
    expect((e as UpstreamHeaderError).header).toBe('(invalid name)');
    expect(String(e)).not.toContain('secretish');
  });

  it('the allowlist is what the docs say', () => {
    expect([...FORWARDED_REQUEST_HEADERS].sort()).toEqual(['accept', 'content-type', 'traceparent', 'tracestate', 'user-agent']);
  });
});

describe('prepareOpenAIBody: engine control fields, cache_salt, request id', () => {
  const body = { model: 'm', priority: -100, kv_transfer_params: { do_remote_prefill: true }, ec_transfer_params: { do_remote_encode: true, remote_host: '10.0.0.1' }, request_id: 'victim-id', cache_salt: 'other-tenant', vllm_xargs: { a: 1 }, rid: 'x', id_slot: 0, logits_processors: ['os.system'], temperature: 0.2, messages: [{ role: 'user', content: 'hi' }] };
  it('strips control fields, overwrites cache_salt and request_id, keeps sampling fields in order', () => {
    const out = JSON.parse(prepareOpenAIBody(body, { cacheSalt: 'SALT', requestId: 'router-1' }).body);
    expect(Object.keys(out)).toEqual(['model', 'temperature', 'messages', 'cache_salt', 'request_id']);
    expect(out.cache_salt).toBe('SALT');
    expect(out.request_id).toBe('router-1');
  });
  it('no salt: the client\'s cache_salt is still removed; a pool may allow priority', () => {
    const out = JSON.parse(prepareOpenAIBody(body, { allowEngineFields: ['priority'] }).body);
    expect(out.cache_salt).toBeUndefined();
    expect(out.request_id).toBeUndefined();
    expect(out.priority).toBe(-100);
    expect(out.kv_transfer_params).toBeUndefined();
  });
});

describe('prepareOpenAIBody', () => {
  const parse = (s: string) => JSON.parse(s) as Record<string, unknown>;

  it('streaming without stream_options: appends include_usage at the end, keeps everything else in order', () => {
    const input = { model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true, vendor_x: { a: 1 }, top_k: 20 };
    const snapshot = JSON.stringify(input);
    const { body, stripUsageChunk } = prepareOpenAIBody(input);
    expect(stripUsageChunk).toBe(true);
    expect(body).toBe(
      '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"vendor_x":{"a":1},"top_k":20,"stream_options":{"include_usage":true}}',
    );
    expect(JSON.stringify(input)).toBe(snapshot); // input untouched
  });

  it('keeps stream_options in place and its other fields in order', () => {
    const input = { stream: true, stream_options: { foo: 'bar', include_usage: false, baz: 2 }, model: 'm' };
    const { body, stripUsageChunk } = prepareOpenAIBody(input);
    expect(stripUsageChunk).toBe(true);
    expect(body).toBe('{"stream":true,"stream_options":{"foo":"bar","include_usage":true,"baz":2},"model":"m"}');
    expect(input.stream_options.include_usage).toBe(false);
  });

  it('stream_options: null is treated as absent, in place', () => {
    const { body } = prepareOpenAIBody({ stream: true, stream_options: null, n: 1 });
    expect(body).toBe('{"stream":true,"stream_options":{"include_usage":true},"n":1}');
  });

  it('client asked for usage: body unchanged, nothing stripped', () => {
    const input = { model: 'm', stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } };
    const { body, stripUsageChunk } = prepareOpenAIBody(input);
    expect(stripUsageChunk).toBe(false);
    expect(body).toBe(JSON.stringify(input));
  });

  it("stream_options without include_usage: vLLM defaults it to true, so the client gets its usage (and continuous_usage_stats) and nothing is stripped (issue #26 item 7)", () => {
    // vLLM's StreamOptions: include_usage: bool | None = True. The key is written out for engines
    // whose default may differ, so the router reads usage either way.
    const a = prepareOpenAIBody({ stream: true, stream_options: { continuous_usage_stats: true }, model: 'm' });
    expect(a.stripUsageChunk).toBe(false);
    expect(a.body).toBe('{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true},"model":"m"}');
    const b = prepareOpenAIBody({ stream: true, stream_options: {}, model: 'm' });
    expect(b).toEqual({ body: '{"stream":true,"stream_options":{"include_usage":true},"model":"m"}', stripUsageChunk: false });
  });

  it('on an SGLang or llama.cpp pool, stream_options without include_usage asked for nothing: usage requested for the router, stripped again', () => {
    // SGLang: StreamOptions.include_usage: Optional[bool] = False (python/sglang/srt/entrypoints/
    // openai/protocol.py); llama.cpp: json_value(stream_opt, "include_usage", false).
    const a = prepareOpenAIBody({ stream: true, stream_options: {}, model: 'm' }, { streamOptionsIncludeUsage: false });
    expect(a).toEqual({ body: '{"stream":true,"stream_options":{"include_usage":true},"model":"m"}', stripUsageChunk: true });
    const b = prepareOpenAIBody({ stream: true, stream_options: { continuous_usage_stats: true }, model: 'm' }, { streamOptionsIncludeUsage: false });
    expect(b).toEqual({ body: '{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true},"model":"m"}', stripUsageChunk: true });
    // Asked explicitly: the same on every engine.
    expect(prepareOpenAIBody({ stream: true, stream_options: { include_usage: true } }, { streamOptionsIncludeUsage: false }).stripUsageChunk).toBe(false);
  });

  it('continuous_usage_stats with include_usage false or null is sent as false (vLLM would not have applied it)', () => {
    for (const iu of [false, null]) {
      const { body, stripUsageChunk } = prepareOpenAIBody({ stream: true, stream_options: { include_usage: iu, continuous_usage_stats: true }, model: 'm' });
      expect(stripUsageChunk).toBe(true);
      expect(body).toBe('{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false},"model":"m"}');
    }
  });

  it('non-streaming and stream:false are unchanged', () => {
    for (const input of [{ model: 'm', prompt: 'x' }, { model: 'm', stream: false, stream_options: { include_usage: false } }]) {
      const { body, stripUsageChunk } = prepareOpenAIBody(input);
      expect(stripUsageChunk).toBe(false);
      expect(body).toBe(JSON.stringify(input));
    }
  });

  it('requestUsage: false leaves a stream alone', () => {
    const input = { stream: true, model: 'm' };
    expect(prepareOpenAIBody(input, { requestUsage: false })).toEqual({ body: JSON.stringify(input), stripUsageChunk: false });
  });

  it('an invalid stream_options is left for the origin to reject', () => {
    for (const so of ['yes', [1], 3]) {
      const input = { stream: true, stream_options: so };
      expect(prepareOpenAIBody(input)).toEqual({ body: JSON.stringify(input), stripUsageChunk: false });
    }
  });

  it('an own "__proto__" key from JSON.parse survives as data, in place', () => {
    const input = parse('{"model":"m","__proto__":{"polluted":true},"stream":true}');
    const { body } = prepareOpenAIBody(input);
    expect(body).toBe('{"model":"m","__proto__":{"polluted":true},"stream":true,"stream_options":{"include_usage":true}}');
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('unicode and numbers round-trip', () => {
    const input = { messages: [{ role: 'user', content: 'héllo 世界 👋 "q" \\ \n' }], temperature: 0.7, seed: 12345678901, stream: true };
    expect(parse(prepareOpenAIBody(input).body)).toEqual({ ...input, stream_options: { include_usage: true } });
  });
});

describe('parseOriginAuthSecret', () => {
  // Short on purpose: V8's JSON.parse message quotes up to ~10 characters either side of the error.
  const SECRET = 'zSECRETz';
  const expectNoSecret = (r: unknown) => expect(JSON.stringify(r)).not.toContain('SECRET');

  it('none ignores the secret', () => {
    expect(parseOriginAuthSecret(undefined, 'none')).toEqual({ ok: true, auth: { kind: 'none' } });
  });

  it('bearer: the raw token, trimmed', () => {
    expect(parseOriginAuthSecret(`  ${SECRET}\n`, 'bearer')).toEqual({ ok: true, auth: { kind: 'bearer', token: SECRET } });
  });

  it.each([
    [undefined, 'missing_secret'],
    ['', 'missing_secret'],
    [' \n', 'missing_secret'],
    [`Bearer ${SECRET}`, 'invalid_bearer_token'],
    [`${SECRET}\r\nX-Evil: 1`, 'invalid_bearer_token'],
    [`${SECRET}\u00e9`, 'invalid_bearer_token'],
  ])('bearer %j → %s, without the value in the result', (raw, reason) => {
    const r = parseOriginAuthSecret(raw, 'bearer');
    expect(r).toMatchObject({ ok: false, reason });
    expectNoSecret(r);
  });

  it('headers: Cloudflare Access service token', () => {
    const raw = JSON.stringify({ 'CF-Access-Client-Id': 'abc.access', 'CF-Access-Client-Secret': ` ${SECRET} ` });
    expect(parseOriginAuthSecret(raw, 'headers')).toEqual({
      ok: true,
      auth: { kind: 'headers', headers: { 'CF-Access-Client-Id': 'abc.access', 'CF-Access-Client-Secret': SECRET } },
    });
  });

  it.each([
    [`{"CF-Access-Client-Secret": ${SECRET}}`, 'invalid_json'],
    [`{"k": ${SECRET}}`, 'invalid_json'],
    [`["${SECRET}"]`, 'not_an_object'],
    [`"${SECRET}"`, 'not_an_object'],
    ['{}', 'no_headers'],
    [`{"X-Key: ${SECRET}": "v"}`, 'invalid_header_name'],
    [`{"": "${SECRET}"}`, 'invalid_header_name'],
    [`{"Host": "${SECRET}"}`, 'forbidden_header_name'],
    [`{"Transfer-Encoding": "${SECRET}"}`, 'forbidden_header_name'],
    [`{"X-Key": "${SECRET}", "x-key": "${SECRET}"}`, 'duplicate_header_name'],
    [`{"X-Key": "${SECRET}\\r\\nX-Evil: 1"}`, 'invalid_header_value'],
    [`{"X-Key": "${SECRET}\\u0000"}`, 'invalid_header_value'],
    [`{"X-Key": "${SECRET}\\u4e16"}`, 'invalid_header_value'],
    ['{"X-Key": 12345}', 'invalid_header_value'],
    ['{"X-Key": "  "}', 'invalid_header_value'],
  ])('headers %s → %s, without the value in the result', (raw, reason) => {
    const r = parseOriginAuthSecret(raw, 'headers');
    expect(r).toMatchObject({ ok: false, reason });
    expectNoSecret(r);
    if (!r.ok) expect(r.message.length).toBeGreaterThan(10);
  });

  it('names a valid header name in the message, an invalid one only by position', () => {
    const bad = parseOriginAuthSecret('{"X-Ok": "v", "X-Key: leaked": "v"}', 'headers');
    expect(bad.ok || bad.message).toContain('entry 2');
    expect(bad.ok || bad.message).not.toContain('leaked');
    const forbidden = parseOriginAuthSecret('{"Content-Length": "1"}', 'headers');
    expect(forbidden.ok || forbidden.message).toContain('"Content-Length"');
  });

  it('a parsed secret builds headers without throwing', () => {
    const r = parseOriginAuthSecret('{"CF-Access-Client-Id": "a", "CF-Access-Client-Secret": "b"}', 'headers');
    expect(r.ok).toBe(true);
    if (r.ok) expect(buildUpstreamHeaders(new Headers(), r.auth).get('cf-access-client-secret')).toBe('b');
  });
});
