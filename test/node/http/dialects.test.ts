// The Responses and Anthropic dialects (src/http/apis/): validation errors, the prompt text their
// prefix keys and blocks hash (order, key-order independence, what is left out), the session
// identity a Messages request carries, and the router's pool-tagged response ids.
import { describe, expect, it } from 'vitest';
import { countTokensDialect, messagesDialect, messagesPromptText } from '../../../src/http/apis/anthropic';
import { errorShapeFor } from '../../../src/http/apis/index';
import { newResponseId, poolTag, poolTagOf, responsesDialect, responsesPromptText } from '../../../src/http/apis/responses';

describe('Responses dialect', () => {
  it('validates what the router relies on, naming the field', () => {
    expect(responsesDialect.validate({ model: 'm', input: 'hi' })).toEqual({ ok: true, model: 'm', stream: false });
    expect(responsesDialect.validate({ model: 'm', input: [{ role: 'user', content: 'hi' }], stream: true })).toEqual({ ok: true, model: 'm', stream: true });
    expect(responsesDialect.validate({ model: 'm' })).toMatchObject({ ok: false, reason: 'invalid_request', param: 'input' });
    expect(responsesDialect.validate({ input: 'x' })).toMatchObject({ ok: false, param: 'model' });
    expect(responsesDialect.validate({ model: 'm', input: 'x', previous_response_id: 'a/b' })).toMatchObject({ ok: false, param: 'previous_response_id' });
    expect(responsesDialect.validate({ model: 'm', input: 'x', background: true, store: false })).toMatchObject({ ok: false, param: 'background' });
  });

  it('prompt text: tools, instructions, then input items; key order does not matter; a follow-up has none', () => {
    const a = responsesPromptText({ tools: [{ type: 'function', name: 'f', parameters: { b: 1, a: 2 } }], instructions: 'be brief', input: [{ role: 'user', content: 'q' }, { type: 'function_call_output', call_id: 'c1', output: 'r' }] });
    const b = responsesPromptText({ input: [{ content: 'q', role: 'user' }, { output: 'r', call_id: 'c1', type: 'function_call_output' }], instructions: 'be brief', tools: [{ parameters: { a: 2, b: 1 }, name: 'f', type: 'function' }] });
    expect(a).toBe(b);
    expect(a.indexOf('tools')).toBeLessThan(a.indexOf('be brief'));
    expect(a.indexOf('be brief')).toBeLessThan(a.indexOf('q'));
    expect(responsesPromptText({ input: 'hello' })).toContain('hello');
    expect(responsesPromptText({ input: 'hello', previous_response_id: 'resp_x' })).toBe('');
  });

  it('response ids carry the pool tag and the control field request_id is the router\'s', () => {
    const id = newResponseId('chat');
    expect(id).toMatch(/^resp_[0-9a-f]{32}$/);
    expect(poolTagOf(id)).toBe(poolTag('chat'));
    expect(poolTag('chat')).not.toBe(poolTag('batch'));
    expect(poolTagOf('resp_short')).toBeNull();
    const body = JSON.parse(responsesDialect.forRequest(id).prepareBody({ model: 'm', input: 'x', request_id: 'client-chosen', priority: -100 }, {}).body) as Record<string, unknown>;
    expect(body.request_id).toBe(id);
    expect(body.priority).toBeUndefined();
  });
});

describe('Anthropic dialect', () => {
  it('validates Messages and count_tokens requests', () => {
    const ok = { model: 'm', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] };
    expect(messagesDialect.validate(ok)).toEqual({ ok: true, model: 'm', stream: false });
    expect(messagesDialect.validate({ ...ok, stream: true })).toEqual({ ok: true, model: 'm', stream: true });
    expect(messagesDialect.validate({ model: 'm', messages: ok.messages })).toMatchObject({ ok: false, param: 'max_tokens' });
    expect(messagesDialect.validate({ ...ok, messages: [] })).toMatchObject({ ok: false, param: 'messages' });
    expect(messagesDialect.validate({ ...ok, system: 5 })).toMatchObject({ ok: false, param: 'system' });
    expect(countTokensDialect.validate({ model: 'm', messages: ok.messages })).toEqual({ ok: true, model: 'm', stream: false });
    // count_tokens never streams, whatever the body says.
    expect(countTokensDialect.validate({ model: 'm', messages: ok.messages, stream: true })).toEqual({ ok: true, model: 'm', stream: false });
  });

  it('prompt text: tools, system, messages; cache_control marks change nothing', () => {
    const plain = messagesPromptText({ system: [{ type: 'text', text: 'sys' }], tools: [{ name: 't', input_schema: {} }], messages: [{ role: 'user', content: [{ type: 'text', text: 'hello' }] }] });
    const marked = messagesPromptText({
      system: [{ type: 'text', text: 'sys', cache_control: { type: 'ephemeral' } }],
      tools: [{ name: 't', input_schema: {}, cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: [{ type: 'text', text: 'hello', cache_control: { type: 'ephemeral' } }] }],
    });
    expect(marked).toBe(plain);
    expect(plain.indexOf('"t"')).toBeLessThan(plain.indexOf('sys'));
    expect(plain.indexOf('sys')).toBeLessThan(plain.indexOf('hello'));
  });

  it('session identity: Claude Code\'s header, else metadata.user_id', () => {
    const sid = (headers: Record<string, string>, body: Record<string, unknown>) => messagesDialect.sessionId!({ headers: new Headers(headers), body });
    expect(sid({ 'x-claude-code-session-id': 'abc-123' }, { metadata: { user_id: 'u' } })).toBe('abc-123');
    expect(sid({}, { metadata: { user_id: 'user_x_account_y_session_z' } })).toBe('user_x_account_y_session_z');
    expect(sid({ 'x-claude-code-session-id': 'has space' }, {})).toBeUndefined();
    expect(sid({}, {})).toBeUndefined();
  });

  it('errors on /v1/messages paths are Anthropic-shaped, elsewhere OpenAI-shaped', () => {
    expect(errorShapeFor('/v1/messages')).toBe('anthropic');
    expect(errorShapeFor('/v1/messages/count_tokens')).toBe('anthropic');
    expect(errorShapeFor('/v1/messagesx')).toBe('openai');
    expect(errorShapeFor('/v1/responses')).toBe('openai');
  });
});

describe('origin errors without a usable body, in the path\'s shape', () => {
  it('Anthropic paths wrap them as Anthropic errors; OpenAI paths as OpenAI errors', async () => {
    const { anthropicOriginError } = await import('../../../src/http/apis/anthropic/reader');
    const { originErrorBody } = await import('../../../src/proxy/origin-response');
    const html = () => new Response('<html>bad gateway</html>', { status: 502 });
    expect(JSON.parse(await originErrorBody(html(), [], 1000, messagesDialect.originError))).toEqual({ type: 'error', error: { type: 'api_error', message: 'The replica answered 502 with a body that is not JSON' } });
    expect(JSON.parse(await originErrorBody(html(), [], 1000))).toMatchObject({ error: { type: 'server_error', code: 'upstream_error' } });
    expect(JSON.parse(anthropicOriginError('m', 404))).toEqual({ type: 'error', error: { type: 'not_found_error', message: 'm' } });
    expect(JSON.parse(anthropicOriginError('m', 400)).error.type).toBe('invalid_request_error');
    // A JSON object from the origin (vLLM's own Anthropic error) passes as it is.
    const own = new Response('{"type":"error","error":{"type":"invalid_request_error","message":"too long"}}', { status: 400 });
    expect(JSON.parse(await originErrorBody(own, [], 1000, messagesDialect.originError))).toEqual({ type: 'error', error: { type: 'invalid_request_error', message: 'too long' } });
  });

  it('an origin JSON error in another shape is re-wrapped in the path\'s shape, keeping its message', async () => {
    const { originErrorBody } = await import('../../../src/proxy/origin-response');
    const res = (status: number, body: string) => new Response(body, { status, headers: { 'content-type': 'application/json' } });
    // vLLM's auth middleware answers {"error":"Unauthorized"}; an OpenAI-shaped error on an Anthropic path.
    expect(JSON.parse(await originErrorBody(res(401, '{"error":"Unauthorized"}'), [], 1000, messagesDialect.originError))).toEqual({ type: 'error', error: { type: 'authentication_error', message: 'The replica answered 401: Unauthorized' } });
    expect(JSON.parse(await originErrorBody(res(400, '{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}'), [], 1000, messagesDialect.originError))).toEqual({ type: 'error', error: { type: 'invalid_request_error', message: 'The replica answered 400: bad' } });
    // On OpenAI paths: OpenAI's shape and vLLM's older ErrorResponse pass; FastAPI's detail and a bare string error are wrapped.
    const openai = '{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}';
    expect(await originErrorBody(res(400, openai), [], 1000)).toBe(openai);
    const older = '{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}';
    expect(await originErrorBody(res(400, older), [], 1000)).toBe(older);
    expect(JSON.parse(await originErrorBody(res(404, '{"detail":"Not Found"}'), [], 1000))).toEqual({ error: { message: 'The replica answered 404: Not Found', type: 'invalid_request_error', param: null, code: 'upstream_error' } });
    expect(JSON.parse(await originErrorBody(res(401, '{"error":"Unauthorized"}'), [], 1000)).error.message).toBe('The replica answered 401: Unauthorized');
    // A credential echoed in a re-wrapped message is still redacted.
    expect(await originErrorBody(res(400, '{"detail":"bad key sk-origin-secret-1"}'), ['sk-origin-secret-1'], 1000)).not.toContain('sk-origin-secret-1');
  });
});

describe('data-parallel pinning per dialect', () => {
  it("vLLM ignores X-data-parallel-rank on /v1/responses only: that dialect (and its bound copies) opts out", () => {
    expect(responsesDialect.noEnginePin).toBe(true);
    expect(responsesDialect.forRequest('resp_1').noEnginePin).toBe(true);
    // The Messages endpoint runs through vLLM's chat serving, which reads the rank.
    expect(messagesDialect.noEnginePin).toBeUndefined();
  });
});
