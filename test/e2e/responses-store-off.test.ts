// End to end: the Responses API in front of vLLM with its default flags, whose Responses store is
// off (VLLM_ENABLE_RESPONSES_API_STORE unset; the mock's `vllm` profile, tools/mock-engine/
// responses-api.ts). A follow-up or retrieve of a response the router knows it made reaches the
// replica that made it, which answers 404 like for any unknown id; the client gets an error that
// names the flag (http/apis/responses/store.ts). An id the router never saw stays the router's own
// 404, and DELETE (vLLM has none) is answered by the router. Issue #26 item 4. Only 127.0.0.1;
// every wait bounded.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import type { PoolSnapshot } from '../../src/coordinator/types.js';
import { startMockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, TEST_ORIGIN_API_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';

let mocks: MockVllm[] = [];
let router: RouterHandle;

const post = (path: string, body: unknown) =>
  fetch(`${router.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
const send = (path: string, method: string) => fetch(`${router.url}${path}`, { method, headers: { authorization: `Bearer ${TEST_KEY}` } });
/** The previous_response_id of the last POST /v1/responses each replica saw. */
const lastFollowUps = () => mocks.map((m) => (m.stats().lastPostByPath['/v1/responses']?.body as { previous_response_id?: string } | undefined)?.previous_response_id);

/** Each replica's count of responses it answered store: false for (the admin snapshot). */
const notStoredBy = async (r: RouterHandle = router): Promise<Record<string, number>> =>
  Object.fromEntries(((await (await r.adminFetch('/admin/pools/chat')).json()) as PoolSnapshot).replicas.map((x) => [x.id, (x.stats as { responsesNotStored?: number }).responsesNotStored ?? 0]));

beforeAll(async () => {
  mocks = await startMocks(2, { profile: 'vllm', decodeMsPerToken: 1 });
  router = await startRouter({ config: routerConfig({ replicas: mocks, strategy: 'round-robin', keys: ['none'] }) });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.all(mocks.map((m) => m.close()));
});

describe('Responses against vLLM with its store off (the default)', () => {
  it("store off is seen at creation (the answer says store: false): the follow-up and the retrieve get response_not_stored at once, no replica asked; the replica's count and the trace say so", async () => {
    const created = await post('/v1/responses', { model: MODEL, input: 'hello', max_output_tokens: 4 });
    expect(created.status).toBe(200);
    const maker = created.headers.get('x-prefix-router-replica');
    const body = (await created.json()) as { id: string; store: boolean };
    // vLLM turns store off quietly and says so in the response.
    expect(body.store).toBe(false);
    // The replica's signal (admin snapshot) and the request's trace warning.
    await eventually(async () => expect((await notStoredBy())[maker!]).toBe(1), { timeoutMs: 10_000 });
    await eventually(() => expect(router.traceLines().some((t) => t.warning === 'responses_store_off')).toBe(true), { timeoutMs: 10_000 });
    const seen = mocks.map((m) => m.stats().requestsTotal);

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
    // Answered by the router: no replica saw either (health checks aside, which are not /v1).
    expect(lastFollowUps()).not.toContain(body.id);
    for (const [i, m] of mocks.entries()) if (m.stats().requestsTotal !== seen[i]) expect(m.stats().lastRequest?.path).not.toMatch(/^\/v1\//);
  });

  it('a streamed creation is seen the same way (response.created says store: false)', async () => {
    const res = await post('/v1/responses', { model: MODEL, input: 'streamed', max_output_tokens: 4, stream: true });
    expect(res.status).toBe(200);
    const text = await res.text();
    const id = /"id":"(resp_[^"]+)"/.exec(text)![1]!;
    // Marked when the creating request's lease is released, just after its stream ends (a follow-up
    // sent before that reaches the replica and gets the same error from its 404: store.ts).
    await eventually(() => expect(router.traceLines().filter((t) => t.warning === 'responses_store_off')).toHaveLength(2), { timeoutMs: 10_000 });
    await eventually(async () => expect(Object.values(await notStoredBy()).reduce((a, b) => a + b, 0)).toBe(2), { timeoutMs: 10_000 });
    const follow = await post('/v1/responses', { model: MODEL, input: 'next', previous_response_id: id, max_output_tokens: 4 });
    expect(follow.status).toBe(404);
    expect(((await follow.json()) as { error: { code: string } }).error.code).toBe('response_not_stored');
    expect(lastFollowUps()).not.toContain(id);
  });

  it('store: false asked by the client is no warning: the id is not recorded, a follow-up is the router\'s own 404', async () => {
    const before = Object.values(await notStoredBy()).reduce((a, b) => a + b, 0);
    const created = (await (await post('/v1/responses', { model: MODEL, input: 'no store', max_output_tokens: 2, store: false })).json()) as { id: string };
    const follow = await post('/v1/responses', { model: MODEL, input: 'x', previous_response_id: created.id, max_output_tokens: 2 });
    expect(((await follow.json()) as { error: { code: string } }).error.code).toBe('response_not_found');
    expect(Object.values(await notStoredBy()).reduce((a, b) => a + b, 0)).toBe(before);
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

describe('a replica whose store was on at creation and lost the response later (a restart)', () => {
  let m: MockVllm;
  let r: RouterHandle;
  afterAll(async () => {
    await r?.close();
    await m?.close();
  });

  it("the follow-up reaches it, and its 404 is explained (response_not_stored, naming the flag); no store-off warning at creation", async () => {
    m = await startMockVllm({ id: 'kept', port: 0, apiKey: TEST_ORIGIN_API_KEY, models: [MODEL], responsesStore: true, decodeMsPerToken: 1 });
    r = await startRouter({ config: routerConfig({ replicas: [m], strategy: 'round-robin', keys: ['none'] }) });
    const postTo = (body: unknown) => fetch(`${r.url}/v1/responses`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const created = (await (await postTo({ model: MODEL, input: 'kept', max_output_tokens: 2 })).json()) as { id: string; store: boolean };
    expect(created.store).toBe(true);
    // The store empties (a restart): the router still believes the response is there.
    m.reset();
    const follow = await postTo({ model: MODEL, input: 'next', previous_response_id: created.id, max_output_tokens: 2 });
    expect(follow.status).toBe(404);
    expect(((await follow.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'response_not_stored', message: expect.stringContaining('VLLM_ENABLE_RESPONSES_API_STORE=1') });
    expect((m.stats().lastPostByPath['/v1/responses']?.body as { previous_response_id?: string }).previous_response_id).toBe(created.id);
    expect((await notStoredBy(r)).kept).toBe(0);
    expect(r.traceLines().some((t) => t.warning === 'responses_store_off')).toBe(false);
  });
});
