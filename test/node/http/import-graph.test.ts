// The module graph of src/ (DESIGN.md, "Layout"): no import cycle between rooms (a room is a folder
// under src/, or a top-level file such as config.ts or index.ts), type imports counted; no run-time
// import cycle between files (a type-only loop inside one room erases at build time); nothing outside http/ imports http/ (only the entry, index.ts); core/ imports
// only core/; and origin/ (what reaches an origin: its auth, the headers a pool may forward; used by
// the coordinator, the proxy and config.ts alike) imports none of them. Static: reads the import statements.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = resolve(import.meta.dirname, '../../../src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? sourceFiles(p) : p.endsWith('.ts') && !p.endsWith('.d.ts') ? [p] : [];
  });
}

/** The relative specifiers a module's text imports: static imports and re-exports (`typeOnly` for `import type` / `export type`) and dynamic `import()`. */
function importSpecifiers(text: string): { spec: string; typeOnly: boolean }[] {
  const specs: { spec: string; typeOnly: boolean }[] = [];
  for (const m of text.matchAll(/^\s*(?:import|export)\s+(type\s+)?(?:[^'";]*?\s+from\s+)?'(\.{1,2}\/[^']+)'/gm)) specs.push({ spec: m[2]!, typeOnly: !!m[1] });
  for (const m of text.matchAll(/\bimport\(\s*'(\.{1,2}\/[^']+)'\s*\)/g)) specs.push({ spec: m[1]!, typeOnly: false });
  return specs;
}

/** file (relative to src) → the files it imports; `import type` left out unless `withTypes`. */
function importGraph(withTypes: boolean): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const f of sourceFiles(SRC)) {
    const deps = importSpecifiers(readFileSync(f, 'utf8'))
      .filter((s) => withTypes || !s.typeOnly)
      .map((s) => relative(SRC, resolve(dirname(f), s.spec.replace(/\.js$/, '.ts'))));
    graph.set(relative(SRC, f), [...new Set(deps)]);
  }
  return graph;
}

/** The room of a file relative to src: its first path segment (`proxy/forward.ts` → `proxy`, `config.ts` → `config.ts`). */
const room = (f: string) => f.split('/')[0]!;

/** room → the other rooms its files import, with the file-level edges behind each (for the failure message). */
function roomGraph(files: Map<string, string[]>): { graph: Map<string, string[]>; why: Map<string, string[]> } {
  const graph = new Map<string, string[]>();
  const why = new Map<string, string[]>();
  for (const [f, deps] of files) {
    const from = room(f);
    if (!graph.has(from)) graph.set(from, []);
    for (const d of deps) {
      const to = room(d);
      if (to === from) continue;
      if (!graph.get(from)!.includes(to)) graph.get(from)!.push(to);
      const k = `${from} → ${to}`;
      why.set(k, [...(why.get(k) ?? []), `${f} → ${d}`]);
    }
  }
  return { graph, why };
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
  const graph = importGraph(true);
  const rooms = roomGraph(graph);

  it('reads the graph (the check is not vacuous)', () => {
    expect(graph.size).toBeGreaterThan(40);
    expect(graph.get('index.ts')).toContain('http/app.ts');
    expect(cycles(new Map([['a.ts', ['b.ts']], ['b.ts', ['a.ts']], ['c.ts', ['a.ts']]]))).toEqual([['a.ts', 'b.ts', 'a.ts']]);
    // Type-only imports, re-exports and dynamic imports are edges too.
    expect(importSpecifiers("import type { A } from './a.js';\nexport type { B } from '../b.js';\nimport {\n  c,\n  type D,\n} from './c.js';\nconst e = await import('./e.js');")).toEqual([
      { spec: './a.js', typeOnly: true },
      { spec: '../b.js', typeOnly: true },
      { spec: './c.js', typeOnly: false },
      { spec: './e.js', typeOnly: false },
    ]);
    expect(graph.get('observability/trace-log.ts')).toContain('proxy/forward.ts'); // a type-only import, counted
    // A type-only edge between two rooms closes a room cycle.
    const r = roomGraph(new Map([['x/a.ts', ['y/b.ts']], ['y/b.ts', ['z.ts']], ['z.ts', ['x/c.ts']], ['x/c.ts', []]]));
    expect(cycles(r.graph)).toEqual([['x', 'y', 'z.ts', 'x']]);
    expect([...rooms.graph.keys()]).toEqual(expect.arrayContaining(['config.ts', 'index.ts', 'coordinator', 'core', 'engines', 'http', 'observability', 'origin', 'proxy', 'quota']));
  });

  it('has no run-time import cycle between files', () => {
    expect(cycles(importGraph(false)).map((c) => c.join(' → '))).toEqual([]);
  });

  it('has no import cycle between rooms (folders of src/ and its top-level files; type imports counted)', () => {
    const found = cycles(rooms.graph).map((c) => {
      const steps = c.slice(1).map((to, i) => `${c[i]} → ${to}`);
      return `${c.join(' → ')}  [${steps.map((s) => `${s}: ${rooms.why.get(s)!.join(', ')}`).join('; ')}]`;
    });
    expect(found).toEqual([]);
  });

  it('nothing but the entry imports http/', () => {
    const bad = [...graph].flatMap(([f, deps]) => (f.startsWith('http/') || f === 'index.ts' ? [] : deps.filter((d) => d.startsWith('http/')).map((d) => `${f} → ${d}`)));
    expect(bad).toEqual([]);
  });

  it('core/ imports only core/ (type imports included)', () => {
    const bad = [...graph].flatMap(([f, deps]) => (f.startsWith('core/') ? deps.filter((d) => !d.startsWith('core/')).map((d) => `${f} → ${d}`) : []));
    expect(bad).toEqual([]);
  });

  it('origin/ is below the coordinator, the proxy and config.ts: it imports none of them, and they use it', () => {
    const origin = [...graph].filter(([f]) => f.startsWith('origin/'));
    expect(origin.length).toBeGreaterThan(0);
    const bad = origin.flatMap(([f, deps]) => deps.filter((d) => !d.startsWith('origin/')).map((d) => `${f} → ${d}`));
    expect(bad).toEqual([]);
    const users = [...graph].filter(([, deps]) => deps.includes('origin/origin-auth.ts')).map(([f]) => room(f));
    expect(new Set(users)).toEqual(new Set(['coordinator', 'proxy', 'http']));
    expect(graph.get('config.ts')).toContain('origin/forward-headers.ts');
  });
});
