// Never break a stream (issue #28), Responses API: on a pool with `continueResponses`, a
// /v1/responses text stream that breaks after its first token (a killed connection, the engine's
// error event, a stall past idleTimeoutMs) is continued on another replica through vLLM's
// partial-message input (an assistant item with status in_progress) and spliced into the client's
// stream: one response id and item id, sequence numbers consecutive, the text token-exact against
// an uninterrupted run, the final response's output and usage as that run's. What cannot be
// continued (logprobs) ends with the error event saying why (the SDK yields it as an `error` event). Router under Miniflare, three mock
// vLLM replicas (store off, vLLM's default); the openai SDK streams. 127.0.0.1 only.

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockFaults, MockVllm } from '../../tools/mock-engine/index.js';
import { startContinuationRig, type ContinuationRig } from '../helpers/continuation-rig.js';
import { eventually, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';
const IDLE_MS = 1_000;
const MAX_TOKENS = 24;
const CUT = 5;

let rig: ContinuationRig;
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  rig = await startContinuationRig(3, { overrides: { idleTimeoutMs: IDLE_MS, maxContinuations: 2 }, poolOverrides: { maxFails: 100, continueResponses: true } });
  ({ mocks, router } = rig);
}, 60_000);

afterAll(async () => rig?.close());

interface Streamed {
  types: string[];
  seqs: number[];
  responseIds: Set<string>;
  itemIds: Set<string>;
  text: string;
  doneText: string | null;
  final: OpenAI.Responses.Response | null;
  error: Error | null;
  replica: string | null;
  requestId: string;
}

let seq = 0;

async function respond(session: string, extra: Record<string, unknown> = {}): Promise<Streamed> {
  const requestId = `rcont-${++seq}-${session}`;
  const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 20_000, defaultHeaders: { 'x-session-id': session, 'x-request-id': requestId } });
  const out: Streamed = { types: [], seqs: [], responseIds: new Set(), itemIds: new Set(), text: '', doneText: null, final: null, error: null, replica: null, requestId };
  try {
    const { data: stream, response } = await client.responses
      .create({ model: MODEL, stream: true, store: false, max_output_tokens: MAX_TOKENS, instructions: 'Be terse.', input: [{ role: 'user', content: `tell me about ${session}` }], ...extra } as OpenAI.Responses.ResponseCreateParamsStreaming)
      .withResponse();
    out.replica = response.headers.get('x-prefix-router-replica');
    for await (const ev of stream) {
      out.types.push(ev.type);
      out.seqs.push(ev.sequence_number);
      if ('response' in ev && ev.response) out.responseIds.add(ev.response.id);
      if ('item_id' in ev) out.itemIds.add(ev.item_id);
      if (ev.type === 'response.output_text.delta') out.text += ev.delta;
      if (ev.type === 'response.output_text.done') out.doneText = ev.text;
      if (ev.type === 'response.completed') out.final = ev.response;
      // The SDK yields a Responses error event (it has no `error` field to throw on).
      if (ev.type === 'error') out.error = new Error(ev.message);
    }
  } catch (e) {
    if (!(e instanceof Error)) throw e;
    out.error = e;
  }
  return out;
}

const trace = (requestId: string) => rig.trace(requestId);

const finalText = (r: OpenAI.Responses.Response | null) => {
  const item = r?.output[0];
  return item && item.type === 'message' && item.content[0]?.type === 'output_text' ? item.content[0].text : null;
};

describe('a /v1/responses text stream broken after its first token is continued on another replica', () => {
  const cases: { kind: string; faults: Partial<MockFaults>; clear: Partial<MockFaults> }[] = [
    { kind: 'connection dropped', faults: { dropAfterTokens: CUT }, clear: { dropAfterTokens: null } },
    { kind: 'engine error event', faults: { inBandErrorAfter: CUT }, clear: { inBandErrorAfter: null } },
    { kind: 'stall past idleTimeoutMs', faults: { stallAfterTokens: CUT }, clear: { stallAfterTokens: null } },
  ];
  for (const c of cases) {
    it(`${c.kind}: token-exact text, one response and item id, consecutive sequence numbers, output and usage as uninterrupted`, async () => {
      const session = `resp-${c.kind.replace(/\W+/g, '-')}`;
      const ref = await respond(session);
      expect(ref.error).toBeNull();
      const home = mocks.find((m) => m.id === ref.replica)!;
      home.setFaults(c.faults);
      let got: Streamed;
      try {
        got = await respond(session);
      } finally {
        home.setFaults(c.clear);
      }
      expect(got.error).toBeNull();
      expect(got.text.length).toBeGreaterThan(CUT * 4);
      expect(got.text).toBe(ref.text);
      expect(got.types).toEqual(ref.types);
      expect(got.seqs).toEqual(got.seqs.map((_, i) => i));
      expect(got.responseIds.size).toBe(1);
      expect(got.itemIds.size).toBe(1);
      expect(got.doneText).toBe(ref.text);
      expect(finalText(got.final)).toBe(ref.text);
      expect(got.final!.status).toBe(ref.final!.status);
      expect(got.final!.max_output_tokens).toBe(MAX_TOKENS);
      expect({ i: got.final!.usage!.input_tokens, o: got.final!.usage!.output_tokens, t: got.final!.usage!.total_tokens }).toEqual({ i: ref.final!.usage!.input_tokens, o: ref.final!.usage!.output_tokens, t: ref.final!.usage!.total_tokens });
      const t = await trace(got.requestId);
      expect(t).toMatchObject({ status: 200, continuations: 1, reprefillTokens: CUT, completionTokens: ref.final!.usage!.output_tokens });
      expect(t.replica).not.toBe(home.id);
      expect(t.segments).toEqual([
        { replica: home.id, completionTokens: CUT },
        { replica: t.replica, completionTokens: ref.final!.usage!.output_tokens - CUT },
      ]);
      await eventually(() => expect(home.stats().activeStreams).toBe(0), { timeoutMs: 10_000 });
    });
  }
});

describe('what is not continued ends as today, with the reason in the error event', () => {
  it('logprobs asked for: the stream ends with the error event naming logprobs', async () => {
    const session = 'resp-not-logprobs';
    const extra = { include: ['message.output_text.logprobs'] };
    const ref = await respond(session, extra);
    expect(ref.error).toBeNull();
    const home = mocks.find((m) => m.id === ref.replica)!;
    home.setFaults({ dropAfterTokens: CUT });
    let got: Streamed;
    try {
      got = await respond(session, extra);
    } finally {
      home.setFaults({ dropAfterTokens: null });
    }
    expect(got.error).not.toBeNull();
    expect(got.types.at(-1)).toBe('error');
    expect(got.error!.message).toContain('not continued on another replica: logprobs');
    expect(got.text.length).toBeGreaterThan(0);
    expect(await trace(got.requestId)).toMatchObject({ notContinued: 'logprobs', attempts: 1 });
  });
});
