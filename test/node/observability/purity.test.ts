import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

// The engine profiles, the scrape parser and the alert logic run in the Durable Object and in
// plain Node: src/engines/ may import only its own modules and src/core (type imports included),
// alerts.ts nothing, and none may reach for I/O, the clock or randomness.
const root = join(import.meta.dirname, '../../..');
const engines = readdirSync(join(root, 'src/engines'))
  .filter((f) => f.endsWith('.ts'))
  .map((f) => `src/engines/${f}`);
const modules = [...engines, 'src/coordinator/alerts.ts'];

describe('engine, scrape and alert modules are pure', () => {
  it('finds the engine modules (the check is not vacuous)', () => {
    expect(engines).toEqual(expect.arrayContaining(['src/engines/prom-text.ts', 'src/engines/vllm.ts', 'src/engines/sglang.ts', 'src/engines/llama-cpp.ts', 'src/engines/index.ts']));
  });

  for (const m of modules) {
    it(m, () => {
      const src = readFileSync(join(root, m), 'utf8');
      const imports = [...src.matchAll(/from\s+['"]([^'"]+)['"]/g)].map((x) => x[1]!);
      const allowed = m.startsWith('src/engines/') ? /^(\.\/[a-z-]+\.js|\.\.\/core\/[a-z/-]+\.js)$/ : /^$/;
      for (const spec of imports) expect(spec, `${m} imports ${spec}`).toMatch(allowed);
      expect(src).not.toMatch(/\bfetch\(|Date\.now\(|new Date\(|Math\.random\(|performance\.now\(|setTimeout\(|console\./);
      expect(src.split('\n')[0]).toMatch(/^\/\/ /); // opens with what it owns
      expect(src.slice(0, 400)).toMatch(/no I\/O/i);
    });
  }
});
