// The mock replica's keyless endpoints (tools/mock-engine/keyless.ts): vLLM's response shapes and
// error bodies, deterministic answers, and a tokenizer that round-trips.
import { describe, expect, it } from 'vitest';
import { answerKeyless, keylessApiFor, type KeylessResult } from '../../../tools/mock-engine/keyless.js';

const ctx = { models: ['m', 'other'], maxModelLen: 4096, now: 1_767_225_600 };
const ok = (r: KeylessResult) => {
  if (!r.ok) throw new Error(`expected a 200, got ${JSON.stringify(r.error)}`);
  return r.body as Record<string, unknown>;
};
const err = (r: KeylessResult) => {
  if (r.ok) throw new Error('expected an error');
  return r.error;
};

describe('mock keyless endpoints', () => {
  it('routes vLLM\'s paths, aliases included', () => {
    expect(['/v1/embeddings', '/v1/rerank', '/rerank', '/v2/rerank', '/v1/score', '/score', '/tokenize', '/detokenize', '/v1/tokenize'].map(keylessApiFor)).toEqual(['embeddings', 'rerank', 'rerank', 'rerank', 'score', 'score', 'tokenize', 'detokenize', null]);
  });

  it('embeddings: EmbeddingResponse, unit vectors, the same text the same vector, base64 = float32 LE of the floats', () => {
    const body = ok(answerKeyless('embeddings', JSON.stringify({ model: 'm', input: ['hello', 'world'] }), ctx));
    expect(body).toMatchObject({ object: 'list', created: ctx.now, model: 'm', usage: { prompt_tokens: 4, total_tokens: 4, completion_tokens: 0 } });
    expect(String(body.id)).toMatch(/^embd-/);
    const data = body.data as { index: number; object: string; embedding: number[] }[];
    expect(data.map((d) => [d.index, d.object, d.embedding.length])).toEqual([
      [0, 'embedding', 32],
      [1, 'embedding', 32],
    ]);
    expect(Math.hypot(...data[0]!.embedding)).toBeCloseTo(1, 5);
    const again = ok(answerKeyless('embeddings', JSON.stringify({ model: 'm', input: 'hello', encoding_format: 'base64', dimensions: 32 }), ctx));
    const b64 = (again.data as { embedding: string }[])[0]!.embedding;
    const floats = new Float32Array(new Uint8Array(Buffer.from(b64, 'base64')).buffer);
    expect(Array.from(floats)).toEqual(data[0]!.embedding);
  });

  it('rerank: best first, top_n, document text back', () => {
    const body = ok(answerKeyless('rerank', JSON.stringify({ model: 'm', query: 'red fox', documents: ['blue whale', 'red fox', 'a red car'], top_n: 2 }), ctx));
    expect((body.results as { index: number; relevance_score: number; document: { text: string } }[]).map((r) => [r.index, r.document.text, r.relevance_score])).toEqual([
      [1, 'red fox', 1],
      [2, 'a red car', 0.25],
    ]);
    expect(body.usage).toEqual({ prompt_tokens: expect.any(Number), total_tokens: expect.any(Number) });
  });

  it('score: 1:N and N:N pairing, every request shape vLLM accepts', () => {
    const oneToMany = ok(answerKeyless('score', JSON.stringify({ model: 'm', text_1: 'a b', text_2: ['a b', 'c'] }), ctx));
    expect((oneToMany.data as { score: number }[]).map((d) => d.score)).toEqual([1, 0]);
    for (const pair of [['data_1', 'data_2'], ['queries', 'documents'], ['queries', 'items']]) {
      const b = ok(answerKeyless('score', JSON.stringify({ model: 'm', [pair[0]!]: ['x', 'y'], [pair[1]!]: ['x', 'z'] }), ctx));
      expect((b.data as { index: number; object: string }[]).map((d) => [d.index, d.object])).toEqual([
        [0, 'score'],
        [1, 'score'],
      ]);
    }
    expect(err(answerKeyless('score', JSON.stringify({ model: 'm', text_1: ['a', 'b'], text_2: ['a', 'b', 'c'] }), ctx)).status).toBe(400);
  });

  it('tokenize → detokenize round-trips; BOS unless add_special_tokens is false; token_strs on request', () => {
    const t = ok(answerKeyless('tokenize', JSON.stringify({ model: 'm', prompt: 'Grüße', return_token_strs: true }), ctx)) as { count: number; tokens: number[]; token_strs: string[]; max_model_len: number };
    expect(t.tokens[0]).toBe(1);
    expect(t.count).toBe(t.tokens.length);
    expect(t.token_strs[0]).toBe('<s>');
    expect(t.max_model_len).toBe(4096);
    expect(ok(answerKeyless('detokenize', JSON.stringify({ model: 'm', tokens: t.tokens }), ctx))).toEqual({ prompt: 'Grüße' });
    const plain = ok(answerKeyless('tokenize', JSON.stringify({ model: 'm', prompt: 'ab', add_special_tokens: false }), ctx));
    expect(plain.tokens).toEqual([100, 101]);
  });

  it('vLLM\'s errors: 400 BadRequestError naming the field, 404 NotFoundError for an unknown model', () => {
    expect(err(answerKeyless('embeddings', '{"model":"m"}', ctx))).toMatchObject({ status: 400, type: 'BadRequestError', param: 'input' });
    expect(err(answerKeyless('embeddings', '{"model":"m","input":"x","encoding_format":"bytes"}', ctx))).toMatchObject({ status: 400, param: 'encoding_format' });
    expect(err(answerKeyless('rerank', '{"model":"m","query":"q","documents":[]}', ctx))).toMatchObject({ status: 400, param: 'documents' });
    expect(err(answerKeyless('tokenize', '{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}', ctx)).status).toBe(400);
    expect(err(answerKeyless('detokenize', '{"model":"m","tokens":[999]}', ctx))).toMatchObject({ status: 400, param: 'tokens' });
    expect(err(answerKeyless('embeddings', '{"model":"nope","input":"x"}', ctx))).toMatchObject({ status: 404, type: 'NotFoundError', param: 'model' });
    expect(err(answerKeyless('score', 'not json', ctx)).status).toBe(400);
  });
});
