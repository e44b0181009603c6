// End to end: the Responses API in front of vLLM with its default flags, whose Responses store is
// off (VLLM_ENABLE_RESPONSES_API_STORE unset; the mock's `vllm` profile, tools/mock-engine/
// responses-api.ts). A follow-up or retrieve of a response the router knows it made reaches the
// replica that made it, which answers 404 like for any unknown id; the client gets an error that
// names the flag (http/apis/responses/store.ts). An id the router never saw stays the router's own
// 404, and DELETE (vLLM has none) is answered by the router. Issue #26 item 4. Only 127.0.0.1;
// every wait bounded.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { routerConfig, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';

let mocks: MockVllm[] = [];
let router: RouterHandle;

const post = (path: string, body: unknown) =>
  fetch(`${router.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
const send = (path: string, method: string) => fetch(`${router.url}${path}`, { method, headers: { authorization: `Bearer ${TEST_KEY}` } });
/** The previous_response_id of the last POST /v1/responses each replica saw. */
const lastFollowUps = () => mocks.map((m) => (m.stats().lastPostByPath['/v1/responses']?.body as { previous_response_id?: string } | undefined)?.previous_response_id);

beforeAll(async () => {
  mocks = await startMocks(2, { profile: 'vllm', decodeMsPerToken: 1 });
  router = await startRouter({ config: routerConfig({ replicas: mocks, strategy: 'round-robin', keys: ['none'] }) });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.all(mocks.map((m) => m.close()));
});

describe('Responses against vLLM with its store off (the default)', () => {
  it('a follow-up and a retrieve of a response the router made get a 404 naming VLLM_ENABLE_RESPONSES_API_STORE=1', async () => {
    const created = await post('/v1/responses', { model: MODEL, input: 'hello', max_output_tokens: 4 });
    expect(created.status).toBe(200);
    const body = (await created.json()) as { id: string; store: boolean };
    // vLLM turns store off quietly and says so in the response.
    expect(body.store).toBe(false);

    const follow = await post('/v1/responses', { model: MODEL, input: 'and then?', previous_response_id: body.id, max_output_tokens: 4 });
    expect(follow.status).toBe(404);
    const err = ((await follow.json()) as { error: { code: string; param: string; message: string; type: string } }).error;
    expect(err).toMatchObject({ code: 'response_not_stored', param: 'previous_response_id', type: 'invalid_request_error' });
    expect(err.message).toContain('VLLM_ENABLE_RESPONSES_API_STORE=1');
    expect(err.message).toContain(body.id);

    const retrieve = await send(`/v1/responses/${body.id}`, 'GET');
    expect(retrieve.status).toBe(404);
    const rErr = ((await retrieve.json()) as { error: { code: string; param: string; message: string } }).error;
    expect(rErr).toMatchObject({ code: 'response_not_stored', param: 'response_id' });
    expect(rErr.message).toContain('VLLM_ENABLE_RESPONSES_API_STORE=1');
  });

  it('an id the router never made is its own 404 (response_not_found), no engine asked, no flag named', async () => {
    const unknown = `resp_${'a'.repeat(32)}`;
    const follow = await post('/v1/responses', { model: MODEL, input: 'x', previous_response_id: unknown, max_output_tokens: 4 });
    expect(follow.status).toBe(404);
    const err = ((await follow.json()) as { error: { code: string; message: string } }).error;
    expect(err.code).toBe('response_not_found');
    expect(err.message).not.toContain('VLLM_ENABLE_RESPONSES_API_STORE');
    expect(lastFollowUps()).not.toContain(unknown);
  });

  it('DELETE /v1/responses/{id} is answered by the router: a 405 that says vLLM cannot delete, nothing forwarded', async () => {
    const created = (await (await post('/v1/responses', { model: MODEL, input: 'to delete', max_output_tokens: 2 })).json()) as { id: string };
    const seen = mocks.map((m) => m.stats().lastRequest);
    const res = await send(`/v1/responses/${created.id}`, 'DELETE');
    expect(res.status).toBe(405);
    const err = ((await res.json()) as { error: { message: string; param: string } }).error;
    expect(err.param).toBe('response_id');
    expect(err.message).toMatch(/not supported.*vLLM cannot delete/);
    expect(err.message).toContain('/cancel');
    // No replica saw a DELETE (health checks may have come and gone meanwhile, but no DELETE).
    for (const [i, m] of mocks.entries()) {
      const last = m.stats().lastRequest;
      if (last !== seen[i]) expect(last?.method).not.toBe('DELETE');
    }
  });
});
