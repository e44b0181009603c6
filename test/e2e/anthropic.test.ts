// End to end: the Anthropic Messages API through the router under Miniflare to mock vLLM
// replicas, driven by the official @anthropic-ai/sdk (x-api-key auth): messages.create streaming
// and not, countTokens, Anthropic-shaped errors, Claude Code's session header and
// metadata.user_id as routing keys, usage with cache_read_input_tokens read by the tap.
// Only 127.0.0.1; every wait bounded.

import Anthropic from '@anthropic-ai/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { eventually, routerConfig, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const MODEL = 'demo-model';
const SYSTEM = `You are Claude Code. ${'Follow the repository conventions. '.repeat(30)}`;

let mocks: MockVllm[] = [];
let router: RouterHandle;
let client: Anthropic;

interface ReplicaSnap {
  id: string;
  inFlight: number;
  stats: { requests: number; cachedTokens: number; promptTokens: number; ttft: { count: number } };
}

async function replicas(): Promise<ReplicaSnap[]> {
  const res = await router.adminFetch('/admin/pools/chat');
  return ((await res.json()) as { replicas: ReplicaSnap[] }).replicas;
}

beforeAll(async () => {
  mocks = await startMocks(3, { decodeMsPerToken: 2, maxRunning: 64 });
  // The default key list: a session header first (Claude Code's header or metadata.user_id stand in for it).
  // The chat pool opts in to Messages on vLLM, whose /v1/messages ignores cache_salt; the
  // `partitioned` pool keeps the default and must refuse Messages (tenant isolation).
  router = await startRouter({
    config: routerConfig({
      replicas: mocks,
      strategy: 'bounded-hash:1.25',
      keys: ['header:x-session-id', 'prefix:4096'],
      poolOverrides: { messagesSharedCache: true },
      extraPools: [{ name: 'partitioned', models: [MODEL], replicas: mocks.map((m) => ({ id: m.id, url: m.url, auth: 'bearer:ORIGIN_API_KEY' })) }],
    }),
  });
  client = new Anthropic({ baseURL: router.url, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.all(mocks.map((m) => m.close()));
});

describe('Anthropic Messages API through the router (@anthropic-ai/sdk)', () => {
  it('non-streaming create with x-api-key; a session stays on its replica and hits its prefix cache', async () => {
    const session = 'claude-code-session-7f3e9c2a';
    const history: Anthropic.MessageParam[] = [];
    let home = '';
    for (let turn = 0; turn < 3; turn++) {
      history.push({ role: 'user', content: `step ${turn}: edit the file` });
      const { data, response } = await client.messages
        .create({ model: MODEL, max_tokens: 8, system: SYSTEM, messages: history }, { headers: { 'x-claude-code-session-id': session } })
        .withResponse();
      expect(data.type).toBe('message');
      expect(data.role).toBe('assistant');
      expect(data.content[0]!.type).toBe('text');
      const text = (data.content[0] as Anthropic.TextBlock).text;
      history.push({ role: 'assistant', content: text });
      // The next turn is picked with this one's lease released (a held one counts against the load bound).
      await eventually(async () => expect(((await router.adminFetch('/admin/pools/chat').then((r) => r.json())) as { leases: number }).leases).toBe(0), { timeoutMs: 15_000 });
      const replica = response.headers.get('x-prefix-router-replica')!;
      if (turn === 0) home = replica;
      else {
        expect(replica).toBe(home);
        expect(data.usage.cache_read_input_tokens).toBeGreaterThan(0);
      }
    }
    await eventually(async () => {
      const r = (await replicas()).find((x) => x.id === home)!;
      expect(r.inFlight).toBe(0);
      expect(r.stats.cachedTokens).toBeGreaterThan(0); // the tap read cache_read_input_tokens
    }, { timeoutMs: 15_000 });
  });

  it('metadata.user_id keys a conversation when no session header is sent', async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) {
      const { response } = await client.messages
        .create({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: `question ${i}` }], metadata: { user_id: 'user_abc_account_1_session_42' } })
        .withResponse();
      seen.add(response.headers.get('x-prefix-router-replica')!);
    }
    expect(seen.size).toBe(1);
  });

  it('streaming create: Anthropic SSE events, TTFT and usage measured', async () => {
    const before = (await replicas()).reduce((s, r) => s + r.stats.ttft.count, 0);
    const stream = await client.messages.create({ model: MODEL, max_tokens: 6, system: SYSTEM, messages: [{ role: 'user', content: 'stream please' }], stream: true });
    const types: string[] = [];
    let text = '';
    let outputTokens = 0;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
      if (ev.type === 'message_delta') outputTokens = ev.usage.output_tokens;
    }
    expect(types[0]).toBe('message_start');
    expect(types).toContain('content_block_delta');
    expect(types.at(-1)).toBe('message_stop');
    expect(text.length).toBeGreaterThan(0);
    expect(outputTokens).toBe(6);
    // The helper that accumulates a final message works over the same stream.
    const final = await client.messages.stream({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'again' }] }).finalMessage();
    expect(final.usage.output_tokens).toBe(4);
    await eventually(async () => {
      const after = (await replicas()).reduce((s, r) => s + r.stats.ttft.count, 0);
      expect(after).toBeGreaterThanOrEqual(before + 2);
    }, { timeoutMs: 15_000 });
  });

  it('countTokens', async () => {
    const counted = await client.messages.countTokens({ model: MODEL, system: SYSTEM, messages: [{ role: 'user', content: 'how many?' }] });
    expect(counted.input_tokens).toBeGreaterThan(100);
  });

  it('a pool that partitions the prefix cache per tenant refuses Messages (vLLM ignores cache_salt there) and reaches no replica; count_tokens stays open', async () => {
    const PARTITIONED = { 'x-pool': 'partitioned' };
    const before = (await router.adminFetch('/admin/pools/partitioned').then((r) => r.json())) as { replicas: ReplicaSnap[] };
    const refused = await client.messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }, { headers: PARTITIONED }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Anthropic.PermissionDeniedError);
    expect((refused as InstanceType<typeof Anthropic.PermissionDeniedError>).error).toMatchObject({ type: 'error', error: { type: 'permission_error' } });
    expect(JSON.stringify((refused as InstanceType<typeof Anthropic.PermissionDeniedError>).error)).toContain('messagesSharedCache');
    const streamed = await (async () => {
      const stream = client.messages.stream({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }, { headers: PARTITIONED });
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e);
    expect(streamed).toBeInstanceOf(Anthropic.PermissionDeniedError);
    const counted = await client.messages.countTokens({ model: MODEL, messages: [{ role: 'user', content: 'how many?' }] }, { headers: PARTITIONED });
    expect(counted.input_tokens).toBeGreaterThan(0);
    const requests = (snap: { replicas: ReplicaSnap[] }) => snap.replicas.reduce((n, r) => n + ((r as unknown as { stats: { requests: number } }).stats.requests), 0);
    // Only the count_tokens request reached a replica.
    await eventually(async () => {
      const now = (await router.adminFetch('/admin/pools/partitioned').then((r) => r.json())) as { replicas: ReplicaSnap[] };
      expect(requests(now) - requests(before)).toBe(1);
    }, { timeoutMs: 15_000 });
  });

  it('errors come back in Anthropic shape with the right status and type', async () => {
    const bad = await client.messages.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }] } as unknown as Anthropic.MessageCreateParamsNonStreaming).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(Anthropic.BadRequestError);
    expect((bad as InstanceType<typeof Anthropic.BadRequestError>).error).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } });

    const unknownModel = await client.messages.create({ model: 'no-such-model', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(unknownModel).toBeInstanceOf(Anthropic.NotFoundError);
    expect((unknownModel as InstanceType<typeof Anthropic.NotFoundError>).error).toMatchObject({ type: 'error', error: { type: 'not_found_error' } });

    const wrongKey = new Anthropic({ baseURL: router.url, apiKey: 'sk-not-a-tenant', maxRetries: 0 });
    const auth = await wrongKey.messages.create({ model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(auth).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((auth as InstanceType<typeof Anthropic.AuthenticationError>).error).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
  });
});
