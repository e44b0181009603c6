import { cloudflareTest } from '@cloudflare/vitest-pool-workers';
import { defineConfig } from 'vitest/config';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import * as workersTestEnv from './test/fixtures/workers/test-env.js';

// One project per runtime, one test/ folder each: `core` (test/node) runs the pure routing core
// in plain Node (an import of `cloudflare:*` fails there, which is how purity is enforced),
// `workers` (test/workers) runs the Worker and the Durable Object inside workerd, `e2e`
// (test/e2e) drives real processes (router under Miniflare, mock vLLM replicas) over loopback,
// and `faults` (test/faults) is the fault run.
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'core',
          environment: 'node',
          include: ['test/node/**/*.test.ts'],
          // Pure CPU work, some of it seconds long (generated traces, simulations) once the whole
          // suite shares a 2-core CI machine: the timeout is there to catch a hang, not to time it.
          testTimeout: 30_000,
        },
      },
      {
        plugins: [
          cloudflareTest({
            // The test entry: src/index.ts plus the fault hooks some tests inject (test-fault, the
            // coordinator's testFault), which the production bundle does not contain.
            main: './test/fixtures/router-entry/index.ts',
            wrangler: { configPath: './wrangler.toml' },
            // Test bindings and a fake vLLM origin (test/fixtures/workers): every outbound fetch of
            // the runner (proxy, health checks, the tests' own) goes to the "origin" worker.
            miniflare: {
              bindings: {
                ROUTER_CONFIG: workersTestEnv.ROUTER_CONFIG,
                ADMIN_TOKEN: workersTestEnv.ADMIN_TOKEN,
                ORIGIN_KEY: workersTestEnv.ORIGIN_KEY,
                CACHE_SALT_KEY: workersTestEnv.CACHE_SALT_KEY,
                TENANT_KEYS: JSON.stringify({
                  tenants: Object.fromEntries(
                    Object.entries(workersTestEnv.TENANTS).map(([id, t]) => [id, { pools: [...t.pools], allowPoolHeader: t.allowPoolHeader }]),
                  ),
                  keys: Object.fromEntries(
                    Object.entries(workersTestEnv.TENANTS).map(([id, t]) => [createHash('sha256').update(t.key).digest('hex'), { tenant: id, keyId: t.keyId }]),
                  ),
                }),
              },
              outboundService: 'origin',
              workers: [
                {
                  name: 'origin',
                  modules: true,
                  scriptPath: fileURLToPath(new URL('./test/fixtures/workers/fake-origin.js', import.meta.url)),
                  compatibilityDate: '2026-04-20',
                  // request.signal: the fake origin marks a stream whose caller went away (aborted).
                  compatibilityFlags: ['enable_request_signal'],
                },
              ],
            },
          }),
        ],
        test: {
          name: 'workers',
          include: ['test/workers/**/*.test.ts'],
          // Waits inside these tests are bounded at 15 s (test/helpers/workers.ts until): the test's
          // own bound must be above them, so a slow machine fails with the named wait, not vitest's.
          testTimeout: 30_000,
        },
      },
      {
        test: {
          name: 'e2e',
          environment: 'node',
          include: ['test/e2e/**/*.test.ts'],
          testTimeout: 60_000,
          hookTimeout: 60_000,
          fileParallelism: false,
        },
      },
      {
        // Router under Miniflare (as `npm start`) + four mock replicas with injected faults (test/faults).
        // `npm run test:faults` runs the full size; plain `npm test` a smaller run (FAULTS_REQUESTS).
        test: {
          name: 'faults',
          environment: 'node',
          include: ['test/faults/**/*.test.ts'],
          testTimeout: 600_000,
          hookTimeout: 120_000,
          fileParallelism: false,
        },
      },
    ],
  },
});
