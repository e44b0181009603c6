// Never break a stream (issue #28), Anthropic Messages: a /v1/messages text stream that breaks
// after its first token (a killed connection, the engine's error event, a stall past
// idleTimeoutMs) is continued on another replica's chat path and spliced into the client's
// stream: one message_start and one message id, the text block's index kept, the text
// token-exact against an uninterrupted run, stop_reason and the message_delta usage as that run's.
// What cannot be continued (a tool_choice that forces a tool) ends with the error event saying
// why. Router under Miniflare, three mock vLLM replicas (deterministic at temperature 0); the
// @anthropic-ai/sdk streams. 127.0.0.1 only.

import Anthropic from '@anthropic-ai/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockFaults, MockVllm } from '../../tools/mock-engine/index.js';
import { startContinuationRig, type ContinuationRig } from '../helpers/continuation-rig.js';
import { eventually, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';
const IDLE_MS = 1_000;
const MAX_TOKENS = 24;
const CUT = 5;
const SYSTEM = [{ type: 'text' as const, text: 'You are terse. '.repeat(8) }];

let rig: ContinuationRig;
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  // vLLM's /v1/messages ignores cache_salt: the pool opts in to Messages (tenant-isolation.ts).
  rig = await startContinuationRig(3, { overrides: { idleTimeoutMs: IDLE_MS, maxContinuations: 2 }, poolOverrides: { maxFails: 100, messagesSharedCache: true } });
  ({ mocks, router } = rig);
}, 60_000);

afterAll(async () => rig?.close());

interface Streamed {
  events: string[];
  messageIds: string[];
  text: string;
  deltaIndexes: Set<number>;
  stopReason: string | null | undefined;
  stopSequence: string | null | undefined;
  inputTokens: number | null;
  outputTokens: number | null;
  /** The whole prompt in OpenAI's sense: input + cache read + cache creation (the split differs between a cold and a warm replica). */
  promptTokens: number | null;
  error: Error | null;
  replica: string | null;
  requestId: string;
}

let seq = 0;

async function messages(session: string, extra: Partial<Anthropic.MessageCreateParamsStreaming> = {}): Promise<Streamed> {
  const requestId = `acont-${++seq}-${session}`;
  const client = new Anthropic({ baseURL: router.url, apiKey: TEST_KEY, maxRetries: 0, timeout: 20_000, defaultHeaders: { 'x-session-id': session, 'x-request-id': requestId } });
  const out: Streamed = { events: [], messageIds: [], text: '', deltaIndexes: new Set(), stopReason: undefined, stopSequence: undefined, inputTokens: null, outputTokens: null, promptTokens: null, error: null, replica: null, requestId };
  let start: Anthropic.Usage | null = null;
  try {
    const { data: stream, response } = await client.messages
      .create({
        model: MODEL,
        max_tokens: MAX_TOKENS,
        stream: true,
        system: SYSTEM,
        messages: [
          { role: 'user', content: `first question about ${session}` },
          { role: 'assistant', content: [{ type: 'text', text: 'an earlier answer' }] },
          { role: 'user', content: [{ type: 'text', text: `tell me about ${session}` }, { type: 'text', text: ' in detail' }] },
        ],
        ...extra,
      })
      .withResponse();
    out.replica = response.headers.get('x-prefix-router-replica');
    for await (const ev of stream) {
      out.events.push(ev.type);
      if (ev.type === 'message_start') {
        out.messageIds.push(ev.message.id);
        start = ev.message.usage;
      } else if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') {
        out.text += ev.delta.text;
        out.deltaIndexes.add(ev.index);
      } else if (ev.type === 'message_delta') {
        out.stopReason = ev.delta.stop_reason;
        out.stopSequence = ev.delta.stop_sequence;
        const u = ev.usage as Anthropic.MessageDeltaUsage & Partial<Anthropic.Usage>;
        out.outputTokens = u.output_tokens;
        out.inputTokens = u.input_tokens ?? start?.input_tokens ?? null;
        out.promptTokens = (out.inputTokens ?? 0) + (u.cache_read_input_tokens ?? start?.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? start?.cache_creation_input_tokens ?? 0);
      }
    }
  } catch (e) {
    if (!(e instanceof Error)) throw e;
    out.error = e;
  }
  return out;
}

const trace = (requestId: string) => rig.trace(requestId);

function withFaultOnHome(session: string, faults: Partial<MockFaults>, clear: Partial<MockFaults>, extra: Partial<Anthropic.MessageCreateParamsStreaming> = {}): Promise<{ ref: Streamed; got: Streamed; home: MockVllm }> {
  // Consistent hashing sends the same session to the same replica first.
  return rig.withFaultOnHome(() => messages(session, extra), (ref) => mocks.find((m) => m.id === ref.replica)!, faults, clear);
}

describe('a /v1/messages text stream broken after its first token is continued on another replica', () => {
  const cases: { kind: string; faults: Partial<MockFaults>; clear: Partial<MockFaults> }[] = [
    { kind: 'connection dropped', faults: { dropAfterTokens: CUT }, clear: { dropAfterTokens: null } },
    { kind: 'engine error event', faults: { inBandErrorAfter: CUT }, clear: { inBandErrorAfter: null } },
    { kind: 'stall past idleTimeoutMs', faults: { stallAfterTokens: CUT }, clear: { stallAfterTokens: null } },
  ];
  for (const c of cases) {
    it(`${c.kind}: token-exact text, one message_start, the block index kept, stop_reason and usage as the uninterrupted run's`, async () => {
      const { ref, got, home } = await withFaultOnHome(`msg-${c.kind.replace(/\W+/g, '-')}`, c.faults, c.clear);
      expect(got.error).toBeNull();
      expect(got.text.length).toBeGreaterThan(CUT * 4);
      expect(got.text).toBe(ref.text);
      // The event sequence as one replica writes it: no second message_start, one block, one stop.
      expect(got.events).toEqual(ref.events);
      expect(got.messageIds).toHaveLength(1);
      expect(got.deltaIndexes).toEqual(new Set([0]));
      expect(got.stopReason).toBe(ref.stopReason);
      expect(got.stopSequence).toBe(ref.stopSequence);
      expect(got.outputTokens).toBe(ref.outputTokens);
      expect(got.promptTokens).toBe(ref.promptTokens);
      const t = await trace(got.requestId);
      expect(t).toMatchObject({ status: 200, continuations: 1, completionTokens: ref.outputTokens, promptTokens: ref.promptTokens, reprefillTokens: CUT });
      expect(t.replica).not.toBe(home.id);
      expect(t.segments).toEqual([
        { replica: home.id, completionTokens: CUT },
        { replica: t.replica, completionTokens: ref.outputTokens! - CUT },
      ]);
      if (c.kind.startsWith('stall')) expect(t.continuationGapMs as number).toBeGreaterThanOrEqual(IDLE_MS - 50);
      await eventually(() => expect(home.stats().activeStreams).toBe(0), { timeoutMs: 10_000 });
    });
  }

  it('a stop sequence the continuation reaches: stop_reason stop_sequence and the string, as uninterrupted', async () => {
    // The mock's answer cycles through four words: tokens 2 and 3 first occur there, after a cut at 2.
    const probe = await messages('msg-stop');
    const words = probe.text.split(' ').filter(Boolean);
    const stop = `${words[2]!} ${words[3]!}`;
    const { ref, got } = await withFaultOnHome('msg-stop', { dropAfterTokens: 2 }, { dropAfterTokens: null }, { stop_sequences: [stop] });
    expect(ref.stopReason).toBe('stop_sequence');
    expect(ref.stopSequence).toBe(stop);
    expect(got.error).toBeNull();
    expect(got.text).toBe(ref.text);
    expect(got.stopReason).toBe('stop_sequence');
    expect(got.stopSequence).toBe(stop);
    expect(got.outputTokens).toBe(ref.outputTokens);
    expect(await trace(got.requestId)).toMatchObject({ continuations: 1 });
  });

  it('a stop sequence split by the break: given back to the continuing engine whole, it stops where the uninterrupted run did', async () => {
    // The client has "w0 w1 " when the stream breaks before token 2; "w1 w2" completes with token 2.
    const words = (await messages('msg-stop-seam')).text.split(' ').filter(Boolean);
    const stop = `${words[1]!} ${words[2]!}`;
    const { ref, got } = await withFaultOnHome('msg-stop-seam', { dropAfterTokens: 2 }, { dropAfterTokens: null }, { stop_sequences: [stop] });
    expect(ref.stopReason).toBe('stop_sequence');
    expect(got.error).toBeNull();
    expect(got.text).toBe(ref.text);
    expect(got.stopReason).toBe('stop_sequence');
    expect(got.stopSequence).toBe(stop);
    expect(got.outputTokens).toBe(ref.outputTokens);
    expect(await trace(got.requestId)).toMatchObject({ continuations: 1, reprefillTokens: 1 });
  });
});

describe('what is not continued ends as today, with the reason in the error event', () => {
  it('tool_choice forcing a tool (structured output on vLLM): the SDK raises the error naming guided_decoding', async () => {
    const session = 'msg-not-guided';
    const extra = { tools: [{ name: 'lookup', input_schema: { type: 'object' as const, properties: {} } }], tool_choice: { type: 'any' as const } };
    const ref = await messages(session, extra);
    expect(ref.error).toBeNull();
    const home = mocks.find((m) => m.id === ref.replica)!;
    home.setFaults({ dropAfterTokens: CUT });
    let got: Streamed;
    try {
      got = await messages(session, extra);
    } finally {
      home.setFaults({ dropAfterTokens: null });
    }
    expect(got.error).not.toBeNull();
    expect(got.error!.message).toContain('not continued on another replica: guided_decoding');
    expect(got.text.length).toBeGreaterThan(0);
    const t = await trace(got.requestId);
    expect(t).toMatchObject({ notContinued: 'guided_decoding', attempts: 1 });
    expect(t.continuations).toBeUndefined();
  });
});
