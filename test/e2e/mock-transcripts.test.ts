// The mock still produces the golden engine transcripts under test/fixtures/engines/ (timestamps
// and measured durations normalised; tools/mock-engine/transcripts.ts writes them). A change to
// an engine profile's wire behaviour shows up here as a diff of the checked-in bytes; regenerate
// with `npx tsx tools/mock-engine/transcripts.ts` once the change is meant.

import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { PROFILES } from '../../tools/mock-engine/profiles.js';
import { FIXTURE_DIR, recordTranscripts } from '../../tools/mock-engine/transcripts.js';

describe('golden engine transcripts', () => {
  it('has one folder per profile and nothing else', async () => {
    expect((await readdir(FIXTURE_DIR, { withFileTypes: true })).filter((d) => d.isDirectory()).map((d) => d.name).sort()).toEqual([...PROFILES].sort());
  });

  for (const profile of PROFILES) {
    it(`${profile}: the mock's bytes match the checked-in transcripts`, async () => {
      const { files } = await recordTranscripts(profile);
      const dir = join(FIXTURE_DIR, profile);
      expect((await readdir(dir)).sort()).toEqual(Object.keys(files).sort());
      for (const [name, text] of Object.entries(files)) {
        expect(text, `${profile}/${name}`).toBe(await readFile(join(dir, name), 'utf8'));
      }
    });
  }
});
