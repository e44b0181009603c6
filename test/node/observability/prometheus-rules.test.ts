// deploy/prometheus/rules.yml and deploy/grafana/prefix-router.json: `promtool check rules` and
// `promtool test rules` pass; every dashboard query parses (promtool, as a throwaway rule file);
// every metric name the rules and the dashboard use is one /metrics exports (the golden
// exposition, the tenant and fail-open families, the families src/observability renders), with the labels
// those series carry; and the dashboard is a current-schema Grafana dashboard that imports
// (inputs, a datasource variable, no deprecated panels, a grid without overlaps).
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { renderMetrics } from '../../../src/observability/prometheus.js';
import { renderTenantMetrics } from '../../../src/observability/tenant-metrics.js';
import { emptyUsage } from '../../../src/quota/usage.js';
import { promtool, promtoolMissing } from '../../helpers/promtool.js';

const ROOT = join(import.meta.dirname, '../../..');
const RULES = join(ROOT, 'deploy/prometheus/rules.yml');
const RULE_TESTS = join(ROOT, 'deploy/prometheus/rules.test.yml');
const DASHBOARD = join(ROOT, 'deploy/grafana/prefix-router.json');
const GOLDEN = join(ROOT, 'test/fixtures/metrics/golden.prom');

const tmp = mkdtempSync(join(tmpdir(), 'prom-rules-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

// ---- what /metrics exports -----------------------------------------------------------------------

/** Series name → label names, from Prometheus text. Histograms' _bucket/_sum/_count included. */
function seriesLabels(text: string): Map<string, Set<string>> {
  const out = new Map<string, Set<string>>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? /.exec(line);
    if (!m) continue;
    const labels = out.get(m[1]!) ?? new Set<string>();
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"/g)) labels.add(l[1]!);
    out.set(m[1]!, labels);
  }
  return out;
}

function exported(): { labels: Map<string, Set<string>>; names: Set<string> } {
  const tenantText = renderTenantMetrics(
    [
      { tenant: 'acme', models: { 'demo-model': { ...emptyUsage(), requests: 3, promptTokens: 300, cachedTokens: 120, completionTokens: 30, limitedByRequests: 1, limitedByTokens: 1 } }, state: { requests: { limit: 60, remaining: 10, resetMs: 30_000 }, tokens: { limit: 10_000, remaining: 5_000, resetMs: 30_000 } }, reportedAt: 0 },
      { tenant: 'globex', models: { 'demo-model': { ...emptyUsage(), requests: 1, promptTokens: 10 } }, state: null, reportedAt: 0 },
    ],
    1_000,
    1,
  );
  // Lease protocol v2's fail-open families, rendered for one pool running open.
  const openText = renderMetrics([], [{ pool: 'chat', open: true, reason: 'coordinator_unreachable', coordinatorUp: false, fallbacks: 3 }]);
  const labels = seriesLabels(readFileSync(GOLDEN, 'utf8') + tenantText + openText);
  const names = new Set(labels.keys());
  // Families src/observability renders that the fixtures above leave empty: names only.
  const dir = join(ROOT, 'src/observability');
  for (const f of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
    const src = readFileSync(join(dir, f), 'utf8');
    for (const m of src.matchAll(/\.family\(\s*'(prefix_router_[a-z0-9_]+)'/g)) names.add(m[1]!);
    for (const m of src.matchAll(/\.histogram\(\s*'(prefix_router_[a-z0-9_]+)'/g)) for (const s of ['_bucket', '_sum', '_count']) names.add(m[1]! + s);
  }
  return { labels, names };
}

// ---- what the rules and the dashboard use ------------------------------------------------------

/** The PromQL of rules.yml: each `expr:`, one line or a `|` block. */
function ruleExprs(yaml: string): string[] {
  const out: string[] = [];
  const lines = yaml.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const m = /^(\s*)expr:\s*(.*)$/.exec(lines[i]!);
    if (!m) continue;
    if (m[2] !== '|') {
      out.push(m[2]!);
      continue;
    }
    const block: string[] = [];
    for (i++; i < lines.length && (lines[i]!.trim() === '' || lines[i]!.search(/\S/) > m[1]!.length); i++) block.push(lines[i]!);
    i--;
    out.push(block.join('\n'));
  }
  return out;
}

const recordNames = (yaml: string) => [...yaml.matchAll(/^\s*- record:\s*(\S+)\s*$/gm)].map((m) => m[1]!);

interface Dashboard {
  schemaVersion: number;
  uid: string;
  title: string;
  __inputs?: { name: string; type: string; pluginId: string }[];
  panels: Panel[];
  templating: { list: { name: string; type: string; query?: unknown; definition?: string; datasource?: unknown }[] };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { x: number; y: number; w: number; h: number };
  datasource?: { type: string; uid: string };
  targets?: { refId: string; expr: string; datasource?: { uid: string } }[];
  panels?: Panel[];
}

const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as Dashboard;
const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);

/** Dashboard queries with Grafana's variables replaced by what they expand to. */
function dashboardExprs(): { where: string; expr: string }[] {
  const out = panels.flatMap((p) => (p.targets ?? []).map((t) => ({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr })));
  for (const v of dashboard.templating.list) if (v.definition) out.push({ where: `variable $${v.name}`, expr: v.definition.replace(/^label_values\((.*),\s*\w+\)$/, '$1') });
  return out.map((e) => ({ ...e, expr: e.expr.replace(/\$__rate_interval|\$__interval/g, '5m').replace(/\$\{?(\w+)\}?/g, '.*') }));
}

/** Metric names in a PromQL expression: outside string literals, not functions or keywords. */
function metricNames(expr: string): string[] {
  const code = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  return [...code.matchAll(/(?<![\w:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?=\s*(?:\{|\[|\)|$|\s|>|<|=|!|\*|\/|\+|-|,))/g)]
    .map((m) => m[1]!)
    .filter((n) => n.startsWith('prefix_router_') || n.includes(':'));
}

function checkLabels(where: string, expr: string, labels: Map<string, Set<string>>, recorded: Map<string, Set<string>>): string[] {
  const problems: string[] = [];
  const known = (n: string) => labels.get(n) ?? recorded.get(n);
  const code = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  for (const m of code.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}/g)) {
    const have = known(m[1]!);
    if (!have) continue;
    for (const l of m[2]!.matchAll(/([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)/g)) if (!have.has(l[1]!)) problems.push(`${where}: ${m[1]} has no label ${l[1]}`);
  }
  // by (...) / on (...): each label must be on some series the expression reads (or be `le`).
  const used = metricNames(expr).map(known);
  if (used.every((s) => s !== undefined)) {
    const all = new Set(used.flatMap((s) => [...s!]));
    for (const m of code.matchAll(/\b(?:by|on|without|ignoring)\s*\(([^)]*)\)/g)) {
      for (const l of m[1]!.split(',').map((s) => s.trim()).filter(Boolean)) if (l !== 'le' && !all.has(l)) problems.push(`${where}: no series it reads has label ${l}`);
    }
  }
  return problems;
}

const skipWithoutPromtool = (ctx: { skip: () => void }, what: string, r: unknown): boolean => {
  if (r !== undefined) return false;
  promtoolMissing(what);
  ctx.skip();
  return true;
};

describe('deploy/prometheus/rules.yml', () => {
  const yaml = readFileSync(RULES, 'utf8');

  it('passes promtool check rules, and promtool catches a broken rule (the check is not vacuous)', (ctx) => {
    const r = promtool(['check', 'rules', RULES]);
    if (skipWithoutPromtool(ctx, 'promtool check rules', r)) return;
    expect(r!.output).toContain('SUCCESS');
    expect(r!.status, r!.output).toBe(0);
    const bad = join(tmp, 'bad.yml');
    writeFileSync(bad, yaml.replace('for: 10m', 'for: 10 minutes'));
    expect(promtool(['check', 'rules', bad])!.status).not.toBe(0);
  });

  it('passes its unit tests (promtool test rules), which fail when a rule changes', (ctx) => {
    const r = promtool(['test', 'rules', RULE_TESTS]);
    if (skipWithoutPromtool(ctx, 'promtool test rules', r)) return;
    expect(r!.status, r!.output).toBe(0);
    expect(r!.output).toContain('SUCCESS');
    // The same tests against a queue-imbalance rule without its hold time fail.
    writeFileSync(join(tmp, 'rules.yml'), yaml.replace(/(alert: PrefixRouterQueueImbalance[\s\S]*?)for: 10m/, '$1for: 1m'));
    writeFileSync(join(tmp, 'rules.test.yml'), readFileSync(RULE_TESTS, 'utf8'));
    const mutated = promtool(['test', 'rules', join(tmp, 'rules.test.yml')])!;
    expect(mutated.status).not.toBe(0);
    expect(mutated.output).toContain('PrefixRouterQueueImbalance');
  });

  it('has the alerts the docs describe, each with a severity, summary and description', () => {
    const alerts = [...yaml.matchAll(/^\s*- alert:\s*(\S+)/gm)].map((m) => m[1]);
    expect(alerts).toEqual(expect.arrayContaining(['PrefixRouterQueueImbalance', 'PrefixRouterHotKey', 'PrefixRouterPoolWithoutCoordinator', 'PrefixRouterTenantAtLimit']));
    for (const block of yaml.split(/^\s*- alert:/m).slice(1)) {
      expect(block).toMatch(/severity: (critical|warning|info)/);
      expect(block).toMatch(/summary: /);
      expect(block).toMatch(/description: /);
    }
    expect(yaml).toMatch(/alert: PrefixRouterQueueImbalance[\s\S]*?for: 10m/);
    const tests = readFileSync(RULE_TESTS, 'utf8');
    for (const a of alerts) expect(tests, `a promtool test for ${a}`).toContain(`alertname: ${a}`);
  });
});

describe('metric names against /metrics', () => {
  const { labels, names } = exported();
  const yaml = readFileSync(RULES, 'utf8');
  const records = new Set(recordNames(yaml));
  // A recording rule keeps the labels of its `by (...)`.
  const recorded = new Map<string, Set<string>>();
  for (const m of yaml.matchAll(/- record:\s*(\S+)\s*\n\s*expr:\s*\|?\s*\n?([\s\S]*?)(?=\n\s*- (?:record|alert):|\n\s*- name:|$)/g)) {
    const by = [...m[2]!.matchAll(/\bby\s*\(([^)]*)\)/g)].map((b) => b[1]!.split(',').map((s) => s.trim()).filter((s) => s && s !== 'le'));
    const last = by.reduce<string[] | null>((acc, b) => (acc === null ? b : acc.filter((l) => b.includes(l)) || acc), null);
    recorded.set(m[1]!, new Set(last ?? []));
  }

  it('finds the names it checks (the extraction is not vacuous)', () => {
    expect(names.has('prefix_router_ttft_seconds_bucket')).toBe(true);
    expect(names.has('prefix_router_tenant_rate_limited_total')).toBe(true);
    expect(labels.get('prefix_router_coordinator_fallbacks_total')).toEqual(new Set(['pool']));
    expect(metricNames('sum by (pool) (rate(prefix_router_spills_total{pool="a:b"}[5m])) / pool:x:y')).toEqual(['prefix_router_spills_total', 'pool:x:y']);
    expect(checkLabels('t', 'max by (pool, tenant) (prefix_router_replica_up{replica_id="x"})', labels, recorded)).toHaveLength(2);
    expect(records.size).toBeGreaterThan(5);
  });

  it('every name and label the rules use is exported', () => {
    const problems: string[] = [];
    for (const expr of ruleExprs(yaml)) {
      for (const n of metricNames(expr)) {
        if (n.includes(':') ? !records.has(n) : !names.has(n)) problems.push(`rules.yml: ${n} is ${n.includes(':') ? 'not a recording rule in rules.yml' : 'not exported by /metrics'}`);
      }
      problems.push(...checkLabels('rules.yml', expr, labels, recorded));
    }
    expect(problems).toEqual([]);
  });

  it('every name and label the Grafana dashboard uses is exported', () => {
    const problems: string[] = [];
    const exprs = dashboardExprs();
    expect(exprs.length).toBeGreaterThan(20);
    for (const { where, expr } of exprs) {
      for (const n of metricNames(expr)) if (!names.has(n) && !records.has(n)) problems.push(`${where}: ${n} is not exported by /metrics`);
      problems.push(...checkLabels(where, expr, labels, recorded));
    }
    expect(problems).toEqual([]);
  });

  it('every dashboard query parses (promtool, as a rule file)', (ctx) => {
    const file = join(tmp, 'dashboard-queries.yml');
    const rules = dashboardExprs().map(({ expr }, i) => `      - record: dashboard:query_${i}\n        expr: ${JSON.stringify(expr)}`);
    writeFileSync(file, `groups:\n  - name: dashboard\n    rules:\n${rules.join('\n')}\n`);
    const r = promtool(['check', 'rules', file]);
    if (skipWithoutPromtool(ctx, 'the dashboard query check', r)) return;
    expect(r!.status, r!.output).toBe(0);
  });
});

describe('deploy/grafana/prefix-router.json', () => {
  it('is a current-schema dashboard that imports with a Prometheus datasource', () => {
    // 42 is the last schema version of Grafana's classic dashboard model, which Grafana 11-13 import.
    expect(dashboard.schemaVersion).toBe(42);
    expect(dashboard.uid).toMatch(/^[a-zA-Z0-9_-]{1,40}$/);
    expect(dashboard.__inputs).toEqual([expect.objectContaining({ name: 'DS_PROMETHEUS', type: 'datasource', pluginId: 'prometheus' })]);
    const dsVar = dashboard.templating.list.find((v) => v.type === 'datasource');
    expect(dsVar).toMatchObject({ name: 'datasource', query: 'prometheus' });
    const vars = new Set(dashboard.templating.list.map((v) => v.name));
    const text = readFileSync(DASHBOARD, 'utf8');
    for (const m of text.matchAll(/\$\{?([a-zA-Z]\w*)\}?/g)) if (!m[1]!.startsWith('__') && m[1] !== 'DS_PROMETHEUS') expect(vars, `variable $${m[1]}`).toContain(m[1]);
  });

  it('uses current panel types, unique ids, the datasource variable, and a grid without overlaps', () => {
    const ids = panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    const cells = new Set<string>();
    for (const p of panels) {
      expect(['timeseries', 'stat', 'row', 'table', 'bargauge', 'gauge', 'heatmap']).toContain(p.type); // no graph, singlestat, table-old
      const g = p.gridPos;
      expect(g.x + g.w, p.title).toBeLessThanOrEqual(24);
      for (let x = g.x; x < g.x + g.w; x++) for (let y = g.y; y < g.y + g.h; y++) {
        expect(cells.has(`${x},${y}`), `${p.title} overlaps at ${x},${y}`).toBe(false);
        cells.add(`${x},${y}`);
      }
      if (p.type === 'row') continue;
      expect(p.datasource, p.title).toEqual({ type: 'prometheus', uid: '${datasource}' });
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
      const refs = p.targets!.map((t) => t.refId);
      expect(new Set(refs).size).toBe(refs.length);
    }
  });

  it('shows per-replica hit rate, waiting and TTFT side by side, spills, retries and per-tenant usage', () => {
    const find = (re: RegExp) => panels.find((p) => re.test(p.title) && p.type !== 'row');
    const trio = [find(/hit rate per replica/i), find(/waiting per replica/i), find(/TTFT .*per replica/i)];
    for (const p of trio) expect(p).toBeDefined();
    expect(new Set(trio.map((p) => p!.gridPos.y)).size).toBe(1);
    expect(trio.map((p) => p!.gridPos.x)).toEqual([0, trio[0]!.gridPos.w, trio[0]!.gridPos.w + trio[1]!.gridPos.w]);
    const exprOf = (p: Panel | undefined) => (p?.targets ?? []).map((t) => t.expr).join('\n');
    expect(exprOf(trio[0])).toContain('prefix_router_cached_tokens_total');
    expect(exprOf(trio[1])).toContain('prefix_router_vllm_requests_waiting');
    expect(exprOf(trio[2])).toContain('prefix_router_ttft_seconds_bucket');
    expect(exprOf(find(/^Spills/))).toContain('prefix_router_spills_total');
    expect(exprOf(find(/^Retries/))).toContain('prefix_router_retries_total');
    expect(exprOf(find(/per tenant/i))).toMatch(/prefix_router_tenant_/);
  });
});
