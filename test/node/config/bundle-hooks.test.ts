// The production bundle holds no test-only behaviour: src/index.ts bundled as the helpers and
// `npm start` bundle it (scripts/lib/worker-bundle.ts) has none of the fault hooks' strings, and the
// test entry (test/fixtures/router-entry) that adds them has every one, so the markers are the
// right ones. `npm run deploy:check` runs the same scan over wrangler's dry-run bundle in dist/.
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { bundleWorker } from '../../../scripts/lib/worker-bundle.js';
import { TEST_ONLY_MARKERS, testOnlyMarkersIn } from '../../../scripts/lib/deploy-check.js';

const ROOT = resolve(import.meta.dirname, '../../..');

describe('test hooks are out of the production bundle', () => {
  it('src/index.ts bundles without any test-only marker; the test entry carries them', async () => {
    const production = await bundleWorker(join(ROOT, 'src/index.ts'));
    const test = await bundleWorker(join(ROOT, 'test/fixtures/router-entry/index.ts'));
    // Both are whole Workers: the production app and its Durable Object classes are in each.
    for (const code of [production, test]) {
      expect(code).toMatch(/export \{[^}]*\bPoolCoordinator,[^}]*\bdefault\b/);
      expect(code).toContain('/v1/chat/completions');
    }
    expect(testOnlyMarkersIn(production)).toEqual([]);
    // `testHooks` was the configuration switch of the hooks when they lived in src/: gone from both.
    expect(testOnlyMarkersIn(test)).toEqual(TEST_ONLY_MARKERS.filter((m) => m !== 'testHooks'));
  }, 60_000);
});
