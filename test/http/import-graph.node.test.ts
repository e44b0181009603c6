// The module graph of src/ (DESIGN.md, "Layout"): no import cycles, nothing outside http/ imports
// http/ (only the entry, index.ts), core/ imports only core/, and origin/ (origin auth, used by
// the coordinator and the proxy alike) imports neither of them. Static: reads the import statements.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = resolve(import.meta.dirname, '../../src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? sourceFiles(p) : p.endsWith('.ts') && !p.endsWith('.d.ts') ? [p] : [];
  });
}

/** file (relative to src) → the files it imports at run time (`import type` statements left out). */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const f of sourceFiles(SRC)) {
    const text = readFileSync(f, 'utf8');
    const deps: string[] = [];
    for (const m of text.matchAll(/^\s*(?:import|export)\s+(type\s+)?(?:[^'";]*?\s+from\s+)?'(\.{1,2}\/[^']+)'/gm)) {
      if (m[1]) continue;
      deps.push(relative(SRC, resolve(dirname(f), m[2]!.replace(/\.js$/, '.ts'))));
    }
    graph.set(relative(SRC, f), deps);
  }
  return graph;
}

function cycles(graph: Map<string, string[]>): string[][] {
  const state = new Map<string, 1 | 2>();
  const stack: string[] = [];
  const found: string[][] = [];
  const visit = (n: string) => {
    state.set(n, 1);
    stack.push(n);
    for (const d of graph.get(n) ?? []) {
      if (!graph.has(d)) continue;
      if (state.get(d) === 1) found.push([...stack.slice(stack.indexOf(d)), d]);
      else if (state.get(d) === undefined) visit(d);
    }
    stack.pop();
    state.set(n, 2);
  };
  for (const n of graph.keys()) if (state.get(n) === undefined) visit(n);
  return found;
}

describe('src/ import graph', () => {
  const graph = importGraph();

  it('reads the graph (the check is not vacuous)', () => {
    expect(graph.size).toBeGreaterThan(40);
    expect(graph.get('index.ts')).toContain('http/app.ts');
    expect(cycles(new Map([['a.ts', ['b.ts']], ['b.ts', ['a.ts']], ['c.ts', ['a.ts']]]))).toEqual([['a.ts', 'b.ts', 'a.ts']]);
  });

  it('has no import cycles', () => {
    expect(cycles(graph).map((c) => c.join(' → '))).toEqual([]);
  });

  it('nothing but the entry imports http/', () => {
    const bad = [...graph].flatMap(([f, deps]) => (f.startsWith('http/') || f === 'index.ts' ? [] : deps.filter((d) => d.startsWith('http/')).map((d) => `${f} → ${d}`)));
    expect(bad).toEqual([]);
  });

  it('core/ imports only core/', () => {
    const bad = [...graph].flatMap(([f, deps]) => (f.startsWith('core/') ? deps.filter((d) => !d.startsWith('core/')).map((d) => `${f} → ${d}`) : []));
    expect(bad).toEqual([]);
  });

  it('origin/ is below the coordinator and the proxy: it imports neither, and both use it', () => {
    const origin = [...graph].filter(([f]) => f.startsWith('origin/'));
    expect(origin.length).toBeGreaterThan(0);
    const bad = origin.flatMap(([f, deps]) => deps.filter((d) => /^(coordinator|proxy|http)\//.test(d)).map((d) => `${f} → ${d}`));
    expect(bad).toEqual([]);
    const users = [...graph].filter(([, deps]) => deps.includes('origin/origin-auth.ts')).map(([f]) => f.split('/')[0]);
    expect(new Set(users)).toEqual(new Set(['coordinator', 'proxy', 'http']));
  });
});
