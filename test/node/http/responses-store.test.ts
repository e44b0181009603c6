// The Responses store explanation (src/http/apis/responses/store.ts) through the origin error
// reader (src/proxy/origin-response.ts): a replica's 404 for a response the router knows it made
// names vLLM's store flag; any other error passes as before.
import { describe, expect, it } from 'vitest';
import { storeErrorShape } from '../../../src/http/apis/responses/store.js';
import { originErrorBody } from '../../../src/proxy/origin-response.js';

const ID = `resp_${'1'.repeat(32)}`;
const json = (status: number, body: unknown) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });
// vLLM's _make_not_found_error (responses/serving.py): the same for a store that is off and an id it never made.
const notFound = { error: { message: `Response with id '${ID}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } };

describe('storeErrorShape', () => {
  it("explains vLLM's 404 for the pinned id: the flag, the param the client sent, code response_not_stored", async () => {
    const out = JSON.parse(await originErrorBody(json(404, notFound), [], 1000, storeErrorShape(ID, 'previous_response_id'))) as { error: Record<string, string> };
    expect(out.error).toMatchObject({ type: 'invalid_request_error', param: 'previous_response_id', code: 'response_not_stored' });
    expect(out.error.message).toContain('VLLM_ENABLE_RESPONSES_API_STORE=1');
    expect(out.error.message).toContain(ID);
  });

  it('leaves other errors alone: another status, a 404 about something else (the model), a non-JSON body', async () => {
    const shape = storeErrorShape(ID, 'response_id');
    const model404 = { error: { message: 'The model `m` does not exist.', type: 'NotFoundError', param: 'model', code: 404 } };
    expect(JSON.parse(await originErrorBody(json(404, model404), [], 1000, shape))).toEqual(model404);
    const bad = { error: { message: `Response with id '${ID}' not found.`, type: 'invalid_request_error', param: null, code: 400 } };
    expect(JSON.parse(await originErrorBody(json(400, bad), [], 1000, shape))).toEqual(bad);
    const text = JSON.parse(await originErrorBody(new Response('nope', { status: 404 }), [], 1000, shape)) as { error: { code: string } };
    expect(text.error.code).toBe('upstream_error');
  });
});
