import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

// The core must not import from Workers, Hono, or anything outside src/core.
describe('src/core purity', () => {
  const dir = join(import.meta.dirname, '../../../src/core');
  const files = readdirSync(dir, { recursive: true }).map(String).filter((f) => f.endsWith('.ts'));
  it('has modules', () => expect(files.length).toBeGreaterThan(0));
  for (const f of files) {
    it(`${f} imports only core modules`, () => {
      const src = readFileSync(join(dir, f), 'utf8');
      const imports = [...src.matchAll(/from\s+['"]([^'"]+)['"]/g)].map((m) => m[1]!);
      for (const spec of imports) {
        const target = resolve(dir, dirname(f), spec);
        expect(spec.startsWith('.') && target.startsWith(dir + '/'), `${f} imports ${spec}`).toBe(true);
      }
      expect(src).not.toMatch(/\bfetch\(|Date\.now\(|Math\.random\(/);
    });
  }
  it('importing cloudflare:workers fails in this project', async () => {
    await expect(import(/* @vite-ignore */ 'cloudflare:' + 'workers')).rejects.toThrow();
  });
});
