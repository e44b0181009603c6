// End to end: the demo configuration `npm start` runs (wrangler.toml's ROUTER_CONFIG, read through
// wrangler's unstable_getMiniflareWorkerOptions as scripts/dev.ts reads it) routes an OpenAI
// client's `prompt_cache_key` as the README's default key list promises, on Chat Completions and
// on the Responses API (the Codex CLI sends its conversation id there). The router runs under
// Miniflare with four mock vLLM replicas on free loopback ports in place of 127.0.0.1:9001-9004.
// Requests go one at a time, so the bound never spills: a request lands on its key's home, and
// conversations keyed by the tenant alone would all land on one replica. Only 127.0.0.1.

import { join } from 'node:path';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { unstable_getMiniflareWorkerOptions } from 'wrangler';

import type { MockVllm } from '../../tools/mock-engine/index.js';
import { parseConfig } from '../../src/config.js';
import { eventually, startMocks, startRouter, TEST_KEY, type RouterHandle } from '../helpers/router.js';

const ROOT = join(import.meta.dirname, '../..');
const MODEL = 'demo-model';
const CONVERSATIONS = 8;

let mocks: MockVllm[] = [];
let router: RouterHandle;
let client: OpenAI;

/** wrangler.toml's ROUTER_CONFIG as `npm start` gets it, the demo replicas moved onto the mocks. */
function demoConfig(replicas: readonly MockVllm[]): Record<string, unknown> {
  process.env.WRANGLER_SEND_METRICS = 'false';
  process.env.CLOUDFLARE_CF_FETCH_ENABLED = 'false';
  const { workerOptions } = unstable_getMiniflareWorkerOptions(join(ROOT, 'wrangler.toml'));
  const config = (workerOptions.bindings as Record<string, unknown>).ROUTER_CONFIG;
  const text = JSON.stringify(config).replace(/http:\/\/127\.0\.0\.1:900([1-4])\b/g, (_, n: string) => replicas[Number(n) - 1]!.url);
  expect(text).not.toMatch(/127\.0\.0\.1:900[1-4]\b/);
  return JSON.parse(text) as Record<string, unknown>;
}

beforeAll(async () => {
  mocks = await startMocks(4);
  router = await startRouter({ config: demoConfig(mocks) as never });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, timeout: 15_000 });
}, 60_000);

afterAll(async () => {
  await router?.close();
  await Promise.all(mocks.map((m) => m.close()));
});

/** Two turns of each of 8 conversations, one request at a time; the replica of each turn. */
async function placeConversations(send: (conversation: number, turn: number) => Promise<Response>): Promise<string[][]> {
  const placed: string[][] = Array.from({ length: CONVERSATIONS }, () => []);
  for (let turn = 0; turn < 2; turn++) {
    for (let i = 0; i < CONVERSATIONS; i++) {
      const res = await send(i, turn);
      const replica = res.headers.get('x-prefix-router-replica');
      expect(replica, `conversation ${i} turn ${turn}`).toMatch(/^r[1-4]$/);
      placed[i]!.push(replica!);
    }
  }
  return placed;
}

function expectKeyedByConversation(placed: string[][], api: string): void {
  // Each conversation stays on one replica, and the 8 conversations do not all share it.
  for (const [i, turns] of placed.entries()) expect(turns[1], `${api} conversation ${i}: turn 2 on turn 1's replica`).toBe(turns[0]);
  expect(new Set(placed.map((turns) => turns[0])).size, `${api}: replicas of 8 conversations ${JSON.stringify(placed)}`).toBeGreaterThan(1);
}

describe("npm start's demo configuration routes OpenAI's prompt_cache_key (the default key list)", () => {
  it('every keyed demo pool, the default one (chat) first, has body:prompt_cache_key in its key list', () => {
    const config = parseConfig(demoConfig(mocks));
    // A request naming the model without x-pool goes to the first pool serving it.
    expect(config.poolByModel.get(MODEL)?.name).toBe('chat');
    const keyed = config.pools.filter((p) => p.keys.some((k) => k !== 'none'));
    expect(keyed.map((p) => p.name)).toContain('chat');
    for (const p of keyed) expect(p.keys, `pool ${p.name}`).toContain('body:prompt_cache_key');
  });

  it('Chat Completions: 8 conversations with 8 prompt_cache_key values spread over the replicas', async () => {
    const placed = await placeConversations(async (i, turn) => {
      const { response } = await client.chat.completions
        .create({ model: MODEL, max_tokens: 4, prompt_cache_key: `chat-conversation-${i}`, messages: [{ role: 'user', content: `conversation ${i}, turn ${turn}` }] })
        .withResponse();
      return response;
    });
    expectKeyedByConversation(placed, 'chat completions');
  });

  it('Responses API: 8 conversations with 8 prompt_cache_key values spread over the replicas', async () => {
    const placed = await placeConversations(async (i, turn) => {
      const { response } = await client.responses
        .create({ model: MODEL, max_output_tokens: 4, prompt_cache_key: `codex-conversation-${i}`, input: `conversation ${i}, turn ${turn}` })
        .withResponse();
      return response;
    });
    expectKeyedByConversation(placed, 'responses');
  });

  it('the trace log names the body key as the routing key of every one of those requests', async () => {
    await eventually(() => {
      const lines = router.traceLines().filter((l) => l.pool === 'chat');
      expect(lines).toHaveLength(4 * CONVERSATIONS);
      for (const l of lines) expect(l, JSON.stringify(l)).toMatchObject({ status: 200, keyKind: 'body' });
    });
  });
});
