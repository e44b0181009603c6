import { cloudflareTest } from '@cloudflare/vitest-pool-workers';
import { defineConfig } from 'vitest/config';

// Three projects: `core` runs the pure routing core in plain Node (an import of
// `cloudflare:*` fails there, which is how purity is enforced), `workers` runs the
// Worker and the Durable Object inside workerd, and `e2e` drives real processes
// (router under Miniflare, mock vLLM replicas) over loopback.
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'core',
          environment: 'node',
          include: ['test/core/**/*.test.ts', 'test/scripts/**/*.test.ts', 'test/**/*.node.test.ts'],
        },
      },
      {
        plugins: [cloudflareTest({ main: './src/index.ts', wrangler: { configPath: './wrangler.toml' } })],
        test: {
          name: 'workers',
          include: ['test/workers/**/*.test.ts'],
        },
      },
      {
        test: {
          name: 'e2e',
          environment: 'node',
          include: ['test/e2e/**/*.test.ts', 'test/security/**/*.test.ts'],
          testTimeout: 60_000,
          hookTimeout: 60_000,
          fileParallelism: false,
        },
      },
    ],
  },
});
