// Never break a stream (issue #28): a plain-text Chat Completions or Completions stream that
// breaks after its first token (a dropped connection, an in-band error event, silence past
// idleTimeoutMs) is continued on another replica and spliced into the client's stream, token-exact
// against an uninterrupted run, with the uninterrupted run's usage; a stream that cannot be
// continued (response_format, logprobs) ends with an SSE error that says why; maxContinuations
// bounds the tries. Router under Miniflare, three mock vLLM replicas (deterministic at
// temperature 0, tools/mock-engine/prompt.ts outputStart); the openai SDK streams. 127.0.0.1 only.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI, { APIError } from 'openai';

import type { MockFaults, MockVllm } from '../../tools/mock-engine/index.js';
import { startContinuationRig, type ContinuationRig } from '../helpers/continuation-rig.js';
import { eventually, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const IDLE_MS = 1_000;
const MAX_TOKENS = 24;
let rig: ContinuationRig;
let mocks: MockVllm[] = [];
let router: RouterHandle;

beforeAll(async () => {
  // The charged failures must not take a replica out between the cases.
  rig = await startContinuationRig(3, { overrides: { idleTimeoutMs: IDLE_MS, maxContinuations: 2 }, poolOverrides: { maxFails: 100 } });
  ({ mocks, router } = rig);
}, 60_000);

afterAll(async () => rig?.close());

interface Streamed {
  text: string;
  ids: Set<string>;
  created: Set<number>;
  models: Set<string>;
  roles: number;
  finish: (string | null)[];
  usage: OpenAI.CompletionUsage | null;
  error: APIError | null;
  replica: string | null;
  requestId: string;
}

let seq = 0;
function client(session: string, requestId: string): OpenAI {
  return new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 20_000, defaultHeaders: { 'x-session-id': session, 'x-request-id': requestId } });
}

async function chat(session: string, extra: Record<string, unknown> = {}): Promise<Streamed> {
  const requestId = `cont-${++seq}-${session}`;
  const out: Streamed = { text: '', ids: new Set(), created: new Set(), models: new Set(), roles: 0, finish: [], usage: null, error: null, replica: null, requestId };
  try {
    const { data: stream, response } = await client(session, requestId)
      .chat.completions.create({ model: 'demo-model', stream: true, stream_options: { include_usage: true }, max_tokens: MAX_TOKENS, messages: [{ role: 'user', content: `tell me about ${session}` }], ...extra } as OpenAI.ChatCompletionCreateParamsStreaming)
      .withResponse();
    out.replica = response.headers.get('x-prefix-router-replica');
    for await (const ch of stream) {
      out.ids.add(ch.id);
      out.created.add(ch.created);
      out.models.add(ch.model);
      if (ch.usage) out.usage = ch.usage;
      for (const c of ch.choices) {
        if (c.delta.role) out.roles++;
        out.text += c.delta.content ?? '';
        if (c.finish_reason) out.finish.push(c.finish_reason);
      }
    }
  } catch (e) {
    if (!(e instanceof APIError)) throw e;
    out.error = e;
  }
  return out;
}

async function completion(session: string): Promise<Streamed> {
  const requestId = `cont-${++seq}-${session}`;
  const out: Streamed = { text: '', ids: new Set(), created: new Set(), models: new Set(), roles: 0, finish: [], usage: null, error: null, replica: null, requestId };
  try {
    const stream = await client(session, requestId).completions.create({ model: 'demo-model', stream: true, stream_options: { include_usage: true }, max_tokens: MAX_TOKENS, prompt: `Once upon a time in ${session}:` });
    for await (const ch of stream) {
      out.ids.add(ch.id);
      out.created.add(ch.created);
      if (ch.usage) out.usage = ch.usage;
      for (const c of ch.choices) {
        out.text += c.text;
        if (c.finish_reason) out.finish.push(c.finish_reason);
      }
    }
  } catch (e) {
    if (!(e instanceof APIError)) throw e;
    out.error = e;
  }
  return out;
}

const trace = (requestId: string) => rig.trace(requestId);

/** The uninterrupted run (no fault anywhere), then the same request with `faults` on the replica it lands on. */
function withFaultOnHome(session: string, run: (s: string) => Promise<Streamed>, faults: Partial<MockFaults>, clear: Partial<MockFaults>): Promise<{ ref: Streamed; got: Streamed; home: MockVllm }> {
  // The session's home replica: consistent hashing sends the same session there first.
  return rig.withFaultOnHome(() => run(session), async (ref) => mocks.find((m) => m.id === (ref.replica ?? '')) ?? (await homeOf(session)), faults, clear);
}

async function homeOf(session: string): Promise<MockVllm> {
  const probe = await chat(session);
  return mocks.find((m) => m.id === probe.replica)!;
}

const CUT = 5;

describe('a plain-text stream broken after its first token is continued on another replica', () => {
  const cases: { kind: string; faults: Partial<MockFaults>; clear: Partial<MockFaults> }[] = [
    { kind: 'connection dropped', faults: { dropAfterTokens: CUT }, clear: { dropAfterTokens: null } },
    { kind: 'in-band error event', faults: { inBandErrorAfter: CUT }, clear: { inBandErrorAfter: null } },
    { kind: 'stall past idleTimeoutMs', faults: { stallAfterTokens: CUT }, clear: { stallAfterTokens: null } },
  ];
  for (const c of cases) {
    it(`chat, ${c.kind}: token-exact text, one id, one role chunk, the uninterrupted usage`, async () => {
      const { ref, got, home } = await withFaultOnHome(`chat-${c.kind.replace(/\W+/g, '-')}`, (s) => chat(s), c.faults, c.clear);
      expect(got.error).toBeNull();
      expect(got.text).toBe(ref.text);
      expect(got.text.length).toBeGreaterThan(0);
      expect(got.ids.size).toBe(1);
      expect(got.created.size).toBe(1);
      expect(got.models).toEqual(new Set(['demo-model']));
      expect(got.roles).toBe(1);
      expect(got.finish).toEqual(ref.finish);
      expect(got.usage).not.toBeNull();
      expect({ p: got.usage!.prompt_tokens, c: got.usage!.completion_tokens, t: got.usage!.total_tokens }).toEqual({ p: ref.usage!.prompt_tokens, c: ref.usage!.completion_tokens, t: ref.usage!.total_tokens });
      const t = await trace(got.requestId);
      expect(t).toMatchObject({ status: 200, continuations: 1, completionTokens: ref.usage!.completion_tokens, promptTokens: ref.usage!.prompt_tokens });
      expect(t.replica).not.toBe(home.id);
      expect(typeof t.continuationGapMs).toBe('number');
      // The continuation re-prefilled the answer so far: counted apart, not billed.
      expect(t.reprefillTokens).toBe(CUT);
      // Each replica credited the tokens it produced; the request's (billed) are the client's.
      expect(t.segments).toEqual([
        { replica: home.id, completionTokens: CUT },
        { replica: t.replica, completionTokens: ref.usage!.completion_tokens - CUT },
      ]);
      if (c.kind.startsWith('stall')) expect(t.continuationGapMs as number).toBeGreaterThanOrEqual(IDLE_MS - 50);
      // Nothing left open on the broken replica.
      await eventually(() => expect(home.stats().activeStreams).toBe(0), { timeoutMs: 10_000 });
    });
  }

  it('a stop string split by the break: the continuing engine is given it whole and stops where the uninterrupted run did', async () => {
    // The mock, unlike vLLM, does not hold back a stop string's possible start: the client has
    // "w0 w1 " when the stream breaks before token 2, and "w1 w2" completes only with the next token.
    const session = 'chat-stop-at-seam';
    const words = (await chat(session)).text.split(' ').filter(Boolean);
    const stop = `${words[1]!} ${words[2]!}`;
    const { ref, got } = await withFaultOnHome(session, (s) => chat(s, { stop: [stop] }), { dropAfterTokens: 2 }, { dropAfterTokens: null });
    expect(ref.finish).toEqual(['stop']);
    expect(ref.text).toBe(`${words[0]!} ${words[1]!} `);
    expect(got.error).toBeNull();
    expect(got.text).toBe(ref.text);
    expect(got.finish).toEqual(['stop']);
    expect({ p: got.usage!.prompt_tokens, c: got.usage!.completion_tokens }).toEqual({ p: ref.usage!.prompt_tokens, c: ref.usage!.completion_tokens });
    // One delta given back to be generated again: the prefill is the answer less it; the
    // continuing replica produced it again (counted to it), the client got it once.
    const t = await trace(got.requestId);
    expect(t).toMatchObject({ continuations: 1, reprefillTokens: 1, completionTokens: ref.usage!.completion_tokens });
    expect((t.segments as { completionTokens: number }[]).map((x) => x.completionTokens)).toEqual([2, ref.usage!.completion_tokens - 1]);
  });

  it('completions, connection dropped: token-exact text and the uninterrupted usage', async () => {
    const session = 'completion-drop';
    const ref = await completion(session);
    expect(ref.error).toBeNull();
    // Completions carry no replica header through the SDK call above: drop on every replica but one.
    const probe = await chat(session);
    const home = mocks.find((m) => m.id === probe.replica)!;
    home.setFaults({ dropAfterTokens: CUT });
    let got: Streamed;
    try {
      got = await completion(session);
    } finally {
      home.setFaults({ dropAfterTokens: null });
    }
    expect(got.error).toBeNull();
    expect(got.text).toBe(ref.text);
    expect(got.ids.size).toBe(1);
    expect(got.created.size).toBe(1);
    expect(got.finish).toEqual(ref.finish);
    expect({ p: got.usage!.prompt_tokens, c: got.usage!.completion_tokens, t: got.usage!.total_tokens }).toEqual({ p: ref.usage!.prompt_tokens, c: ref.usage!.completion_tokens, t: ref.usage!.total_tokens });
    expect(await trace(got.requestId)).toMatchObject({ status: 200, continuations: 1 });
  });
});

describe('what is not continued ends as today, with the reason in the SSE error', () => {
  for (const [why, extra, fault] of [
    ['response_format', { response_format: { type: 'json_object' } }, 'drop'],
    ['logprobs', { logprobs: true }, 'drop'],
    ['response_format', { response_format: { type: 'json_object' } }, 'in-band'],
  ] as const) {
    it(`${why}, ${fault}: an SSE error the openai SDK raises, naming ${why}`, async () => {
      const session = `not-${why}-${fault}`;
      const home = await homeOf(session);
      const before = fault === 'drop' ? home.stats().droppedConnections : home.stats().injectedInBandErrors;
      home.setFaults(fault === 'drop' ? { dropAfterTokens: CUT } : { inBandErrorAfter: CUT });
      let got: Streamed;
      try {
        got = await chat(session, extra);
      } finally {
        home.setFaults({ dropAfterTokens: null, inBandErrorAfter: null });
      }
      expect(fault === 'drop' ? home.stats().droppedConnections : home.stats().injectedInBandErrors).toBe(before + 1);
      expect(got.error).not.toBeNull();
      expect(got.error!.message).toContain(`not continued on another replica: ${why}`);
      // The engine's own message is kept in the router's event.
      if (fault === 'in-band') expect(got.error!.message).toMatch(/^Replica failed mid-response: \S/);
      expect(got.text.length).toBeGreaterThan(0);
      const t = await trace(got.requestId);
      expect(t).toMatchObject({ notContinued: why, attempts: 1 });
      expect(t.continuations).toBeUndefined();
    });
  }
});

describe('a continuation answered 500', () => {
  it('is a failed try on that replica (charged), and the next try goes to another', async () => {
    const session = 'continuation-500';
    const home = await homeOf(session);
    const others = mocks.filter((m) => m !== home);
    const before = others.map((m) => m.stats().injectedErrors);
    home.setFaults({ dropAfterTokens: CUT });
    for (const m of others) m.setFaults({ error500Rate: 1 });
    let got: Streamed;
    try {
      got = await chat(session);
    } finally {
      home.setFaults({ dropAfterTokens: null });
      for (const m of others) m.setFaults({ error500Rate: 0 });
    }
    // Both other replicas were tried once each (maxContinuations 2), not the first 500 taken as the end.
    expect(others.map((m, i) => m.stats().injectedErrors - before[i]!)).toEqual([1, 1]);
    expect(got.error).not.toBeNull();
    expect(got.error!.message).toContain('not continued on another replica: continuation_failed');
    expect(await trace(got.requestId)).toMatchObject({ notContinued: 'continuation_failed', attempts: 3 });
  });
});

describe('bounds', () => {
  it('maxContinuations: every replica breaking, the stream ends after two continuations with the reason', async () => {
    const session = 'max-continuations';
    const ref = await chat(session);
    const dropped = mocks.map((m) => m.stats().droppedConnections);
    for (const m of mocks) m.setFaults({ dropAfterTokens: 2 });
    let got: Streamed;
    try {
      got = await chat(session);
    } finally {
      for (const m of mocks) m.setFaults({ dropAfterTokens: null });
    }
    // Three segments of two tokens each: the original and two continuations, each on another replica.
    expect(mocks.map((m, i) => m.stats().droppedConnections - dropped[i]!)).toEqual([1, 1, 1]);
    expect(got.error).not.toBeNull();
    expect(got.error!.message).toContain('not continued on another replica: max_continuations');
    expect(got.text).toBe(ref.text.slice(0, 6 * 4));
    const t = await trace(got.requestId);
    expect(t).toMatchObject({ continuations: 2, notContinued: 'max_continuations', attempts: 3 });
  });

  it('/metrics counts every break of this file by outcome', async () => {
    const sample = (text: string, outcome: string) => Number(new RegExp(`^prefix_router_continuations_total\\{pool="chat",outcome="${outcome}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? 0);
    await eventually(
      async () => {
        const text = await (await router.adminFetch('/metrics')).text();
        // Chat: three cases and the stop at the seam, completions one, the maxContinuations case two.
        expect(sample(text, 'continued')).toBe(7);
        expect(sample(text, 'not_attempted_response_format')).toBe(2);
        expect(sample(text, 'not_attempted_logprobs')).toBe(1);
        expect(sample(text, 'not_attempted_max_continuations')).toBe(1);
        // The case whose continuation tries were each answered 500.
        expect(sample(text, 'failed')).toBe(1);
        // Re-prefilled answers so far: five tokens for each of the four single continuations, one at the stop seam, 2 + 4 for the two of the last case.
        const reprefill = [...text.matchAll(/^prefix_router_continuation_reprefill_tokens_total\{pool="chat",replica="[^"]+"\} (\d+)$/gm)].reduce((a, m) => a + Number(m[1]), 0);
        expect(reprefill).toBe(4 * CUT + 1 + 6);
        // Each replica's completion tokens are those it produced: over this file, the trace's
        // segments (or the request's own count when it had one segment) add up to /metrics'.
        const produced = new Map<string, number>(mocks.map((m) => [m.id, 0]));
        for (const t of router.traceLines()) {
          const segs = Array.isArray(t.segments) ? (t.segments as { replica: string; completionTokens: number }[]) : [{ replica: String(t.replica), completionTokens: Number(t.completionTokens ?? 0) }];
          for (const g of segs) if (g.completionTokens > 0) produced.set(g.replica, (produced.get(g.replica) ?? 0) + g.completionTokens);
        }
        const perReplica = new Map<string, number>(mocks.map((m) => [m.id, 0]));
        for (const m of text.matchAll(/^prefix_router_completion_tokens_total\{pool="chat",replica="([^"]+)"\} (\d+)$/gm)) perReplica.set(m[1]!, Number(m[2]));
        expect(perReplica).toEqual(produced);
      },
      { timeoutMs: 10_000 },
    );
  });
});
