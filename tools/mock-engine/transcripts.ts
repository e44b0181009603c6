// Golden engine transcripts: records what the mock sends for each engine profile (a streamed chat
// completion with usage, a non-streamed one, in-band error streams, /metrics; on a data-parallel
// server a stale rank on the Messages API, streamed and not) and writes them
// under test/fixtures/engines/<profile>/ with the unstable parts (timestamps, timings) normalised.
// I/O: starts mock replicas on 127.0.0.1 and, run as a script, writes the fixture files.
//
//   npx tsx tools/mock-engine/transcripts.ts            # rewrite test/fixtures/engines/
//
// test/e2e/mock-transcripts.test.ts checks the mock still produces them; the router's parsers are
// tested on them in test/node/engines/transcripts.test.ts.

import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

import { PROFILES, type MockProfile } from './profiles.js';
import { startMockVllm } from './server.js';

/** Each engine's replica in the transcripts: small, and data-parallel for vLLM (its DP labels are the point). */
export const TRANSCRIPT_CACHE_BLOCKS = 64;
export function dataParallelSizeOf(profile: MockProfile): number {
  return profile === 'vllm' || profile === 'vllm-cache-report' || profile === 'legacy' ? 2 : 1;
}

/** The chat request every transcript sends: 56 prompt tokens (3 full blocks), 6 output tokens. */
export const TRANSCRIPT_REQUEST = {
  model: 'demo-model',
  messages: [{ role: 'user', content: 'The quick brown fox jumps over the lazy dog near the riverbank at dawn. '.repeat(3).slice(0, 200) }],
  max_tokens: 6,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
} as const;

/** The Messages API request of the data-parallel transcripts. */
export const MESSAGES_REQUEST = { model: 'demo-model', max_tokens: 6, messages: [{ role: 'user', content: 'hello' }] } as const;

export interface Transcript {
  /** What a file holds, by its name in the profile's folder. */
  files: Record<string, string>;
}

interface Meta {
  profile: MockProfile;
  options: { dataParallelSize: number; cacheBlocks: number };
  request: string;
  transcripts: Record<string, { status: number; contentType: string | null; request: string; faults?: Record<string, number> }>;
}

/** Timestamps and measured durations out; everything else is the mock's exact bytes. */
export function normaliseBody(text: string): string {
  return text
    .replace(/"(created|created_at)":\d+/g, '"$1":0')
    .replace(/"(prompt_ms|prompt_per_token_ms|prompt_per_second|predicted_ms|predicted_per_token_ms|predicted_per_second)":[-+0-9.eE]+/g, '"$1":0');
}

/** `_created` samples and the TTFT histogram (timing dependent) set to 0. */
export function normaliseMetrics(text: string): string {
  return text
    .split('\n')
    .map((l) => (!l.startsWith('#') && /^(\S+_created|vllm:time_to_first_token_seconds_(bucket|sum))[{ ]/.test(l) ? l.replace(/ [^ ]+$/, ' 0') : l))
    .join('\n');
}

/** Record one profile's transcripts from a fresh mock (pinned to data-parallel rank 0, so the warm request hits). */
export async function recordTranscripts(profile: MockProfile): Promise<Transcript> {
  const dp = dataParallelSizeOf(profile);
  const mock = await startMockVllm({ profile, port: 0, id: `golden-${profile}`, cacheBlocks: TRANSCRIPT_CACHE_BLOCKS, dataParallelSize: dp, decodeMsPerToken: 0 });
  const files: Record<string, string> = {};
  const meta: Meta = { profile, options: { dataParallelSize: dp, cacheBlocks: TRANSCRIPT_CACHE_BLOCKS }, request: 'request.json', transcripts: {} };
  const headers = { 'content-type': 'application/json', 'x-request-id': 'golden', ...(dp > 1 ? { 'x-data-parallel-rank': '0' } : {}) };
  const send = async (name: string, body: Record<string, unknown>, faults?: Record<string, number>): Promise<void> => {
    mock.setFaults({ inBandErrorAfter: null, ...(faults ?? {}) });
    const res = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
    files[name] = normaliseBody(await res.text());
    meta.transcripts[name] = { status: res.status, contentType: res.headers.get('content-type'), request: body.stream ? 'request.json' : 'request.json without stream and stream_options', ...(faults ? { faults } : {}) };
  };
  try {
    const { stream: _s, stream_options: _o, ...plain } = TRANSCRIPT_REQUEST;
    // Cold: nothing cached yet. Then warm: 48 of the 56 prompt tokens come from the prefix cache.
    await send('chat.json', plain);
    await send('chat-stream.sse', { ...TRANSCRIPT_REQUEST });
    // The engine fails before its first token, and after two.
    await send(profile === 'llama.cpp' ? 'chat-error-first.json' : 'chat-error-first.sse', { ...TRANSCRIPT_REQUEST }, { inBandErrorAfter: 0 });
    await send('chat-error.sse', { ...TRANSCRIPT_REQUEST }, { inBandErrorAfter: 2 });
    if (dp > 1) {
      // A stale data-parallel rank on the Messages API (rank 2 of engines [0, 2)), streamed and not.
      for (const stream of [true, false]) {
        const name = stream ? 'messages-rank-error.sse' : 'messages-rank-error.json';
        const res = await fetch(`${mock.url}/v1/messages`, { method: 'POST', headers: { ...headers, 'x-data-parallel-rank': '2' }, body: JSON.stringify({ ...MESSAGES_REQUEST, stream }) });
        files[name] = normaliseBody(await res.text());
        meta.transcripts[name] = { status: res.status, contentType: res.headers.get('content-type'), request: `${JSON.stringify({ ...MESSAGES_REQUEST, stream })} with X-data-parallel-rank: 2` };
      }
    }
    files['metrics.txt'] = normaliseMetrics(await (await fetch(`${mock.url}/metrics`)).text());
  } finally {
    await mock.close();
  }
  files['request.json'] = `${JSON.stringify(TRANSCRIPT_REQUEST, null, 2)}\n`;
  files['meta.json'] = `${JSON.stringify(meta, null, 2)}\n`;
  return { files };
}

export const FIXTURE_DIR = join('test', 'fixtures', 'engines');

async function main(): Promise<void> {
  for (const profile of PROFILES) {
    const { files } = await recordTranscripts(profile);
    const dir = join(FIXTURE_DIR, profile);
    await mkdir(dir, { recursive: true });
    for (const [name, text] of Object.entries(files)) await writeFile(join(dir, name), text);
    console.log(`${dir}: ${Object.keys(files).join(', ')}`);
  }
}

const entry = process.argv[1];
if (entry && import.meta.url === pathToFileURL(entry).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
