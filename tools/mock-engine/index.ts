// The mock engine (tools/mock-engine/README.md): the CLI (`npm run mock-engine -- --port 9001 --id r1`) and the in-process API
// (`startMockVllm`) for tests, benchmarks and the local demo. Listens on 127.0.0.1 only.

import { pathToFileURL } from 'node:url';

import { parseCliArgs, USAGE } from './cli-args.js';
import { startMockVllm } from './server.js';

export { startMockVllm, mergeFaults } from './server.js';
export { DEFAULT_FAULTS } from './types.js';
export { PROFILES, resolveProfile, type MockProfile, type ProfileBehaviour } from './profiles.js';
export type { MetricsFlavor, MockFaults, MockStats, MockVllm, MockVllmOptions, ReceivedRequest } from './types.js';
export { renderChatPrompt, renderCompletionPrompt, countTokens, BLOCK_TOKENS, CHARS_PER_TOKEN } from './prompt.js';

async function main(argv: string[]): Promise<void> {
  let parsed;
  try {
    parsed = parseCliArgs(argv);
  } catch (err) {
    console.error(`mock-vllm: ${(err as Error).message}\n\n${USAGE}`);
    process.exit(2);
  }
  if (parsed.help) {
    console.log(USAGE);
    return;
  }
  const mock = await startMockVllm(parsed.options);
  console.log(`mock-vllm ${mock.id} listening on ${mock.url}`);
  const stop = (signal: string): void => {
    console.log(`mock-vllm ${mock.id}: ${signal}, shutting down`);
    mock.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
}

const entry = process.argv[1];
if (entry && import.meta.url === pathToFileURL(entry).href) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    console.error(`mock-vllm: ${(err as Error).message ?? String(err)}`);
    process.exit(1);
  });
}
