import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

// The scrape parsers and the alert logic run in the Durable Object and in plain Node: they
// may import only each other and must not reach for I/O, the clock or randomness.
const root = join(import.meta.dirname, '../..');
const modules = ['src/engines/prom-text.ts', 'src/engines/vllm.ts', 'src/observability/alerts.ts'];

describe('scrape and alert modules are pure', () => {
  for (const m of modules) {
    it(m, () => {
      const src = readFileSync(join(root, m), 'utf8');
      const imports = [...src.matchAll(/from\s+['"]([^'"]+)['"]/g)].map((x) => x[1]!);
      for (const spec of imports) expect(['./prom-text.js'], `${m} imports ${spec}`).toContain(spec);
      expect(src).not.toMatch(/\bfetch\(|Date\.now\(|new Date\(|Math\.random\(|performance\.now\(|setTimeout\(|console\./);
      expect(src.split('\n')[0]).toMatch(/^\/\/ /); // opens with what it owns
      expect(src.slice(0, 400)).toMatch(/no I\/O/i);
    });
  }
});
