// Parser for the Prometheus text exposition format 0.0.4, used on each replica's `/metrics` body
// whatever its engine, and the queries the engine profiles read it with. Pure: no I/O, no clock;
// never throws on bad input, input and output are capped.
//
// Format reference: prometheus/docs content/docs/instrumenting/exposition_formats.md
// ("Text format details"): line-oriented, `\n` separated (we also accept `\r\n`), tokens
// separated by blanks or tabs, `# HELP name doc` (doc escapes `\\` and `\n`), `# TYPE name
// counter|gauge|histogram|summary|untyped`, other `#` lines are comments, samples are
//   metric_name [ "{" label_name "=" `"` label_value `"` { "," ... } [ "," ] "}" ] value [ timestamp ]
// with label values escaping `\\`, `\"` and `\n`, values parsed like Go's strconv.ParseFloat
// (so `NaN`, `+Inf`, `-Inf`), timestamps int64 milliseconds. Histograms and summaries spread
// one family over `x_bucket{le=…}`, `x_sum`, `x_count` (and summaries `x{quantile=…}`).
// Python's prometheus_client declares a counter family by its sample name (`# TYPE x_total
// counter`) while OpenMetrics-style exporters declare `x` and emit `x_total`; both attach here.

export type MetricType = 'counter' | 'gauge' | 'histogram' | 'summary' | 'untyped';

export type Labels = Readonly<Record<string, string>>;

export interface PromSample {
  /** The sample's own name, e.g. `vllm:time_to_first_token_seconds_bucket`. */
  readonly name: string;
  /** Label name → unescaped value. A null-prototype object. */
  readonly labels: Labels;
  readonly value: number;
  /** Milliseconds since the epoch, when the exposition carried one. */
  readonly timestamp?: number;
}

export interface PromFamily {
  readonly name: string;
  readonly type: MetricType;
  readonly help?: string;
  readonly samples: readonly PromSample[];
}

interface MutableFamily {
  readonly name: string;
  type: MetricType;
  help?: string;
  readonly samples: PromSample[];
}

export interface PromParseError {
  /** 1-based line number. */
  readonly line: number;
  readonly reason: string;
}

export interface PromParse {
  /** Family name → family, in order of first appearance. */
  readonly families: ReadonlyMap<string, PromFamily>;
  /** Sample name → samples with that exact name (across families). */
  readonly byName: ReadonlyMap<string, readonly PromSample[]>;
  readonly sampleCount: number;
  /** Malformed lines skipped (comments and blank lines are not counted). */
  readonly skipped: number;
  /** The first few malformed lines, for a diagnostic; at most `MAX_ERRORS_KEPT`. */
  readonly errors: readonly PromParseError[];
  /** True when the input or the sample count hit a cap and the rest was not parsed. */
  readonly truncated: boolean;
}

export interface PromParseOptions {
  /** Characters of input looked at; the rest is dropped at a line boundary. Default 4 Mi. */
  readonly maxInputChars?: number;
  /** Samples kept; parsing stops after this many. Default 100 000. */
  readonly maxSamples?: number;
  /** Longer lines are skipped as malformed. Default 64 Ki characters. */
  readonly maxLineChars?: number;
}

// A vLLM server with 8 data-parallel engines exposes on the order of 5 000 samples (~1 MB);
// the defaults leave room for that and a few unrelated exporters without letting a broken
// origin make the coordinator allocate without bound.
export const DEFAULT_MAX_INPUT_CHARS = 4 * 1024 * 1024;
export const DEFAULT_MAX_SAMPLES = 100_000;
export const DEFAULT_MAX_LINE_CHARS = 64 * 1024;
export const MAX_ERRORS_KEPT = 20;

const METRIC_TYPES: ReadonlySet<string> = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);
const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const DECIMAL_FLOAT = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
const INF = /^[+-]?inf(?:inity)?$/i;
const INT64 = /^[+-]?\d{1,19}$/;

// Which sample-name suffixes may belong to a family of which type, most specific first.
const SUFFIX_OWNERS: readonly (readonly [string, readonly MetricType[]])[] = [
  ['_bucket', ['histogram']],
  ['_count', ['histogram', 'summary']],
  ['_sum', ['histogram', 'summary']],
  ['_total', ['counter']],
  ['_created', ['counter', 'histogram', 'summary']],
];

/** Parses a Prometheus 0.0.4 text exposition. Never throws; see `skipped` and `errors`. */
export function parsePromText(input: string, options: PromParseOptions = {}): PromParse {
  const maxInput = positiveOr(options.maxInputChars, DEFAULT_MAX_INPUT_CHARS);
  const maxSamples = positiveOr(options.maxSamples, DEFAULT_MAX_SAMPLES);
  const maxLine = positiveOr(options.maxLineChars, DEFAULT_MAX_LINE_CHARS);

  const families = new Map<string, MutableFamily>();
  const typed = new Set<string>(); // families whose TYPE line has been seen
  const byName = new Map<string, PromSample[]>();
  const errors: PromParseError[] = [];
  let skipped = 0;
  let sampleCount = 0;
  let truncated = false;

  let text = typeof input === 'string' ? input : '';
  if (text.length > maxInput) {
    truncated = true;
    const cut = text.lastIndexOf('\n', maxInput);
    text = cut < 0 ? '' : text.slice(0, cut);
  }

  const fail = (line: number, reason: string): void => {
    skipped++;
    if (errors.length < MAX_ERRORS_KEPT) errors.push({ line, reason });
  };

  let lineNo = 0;
  let pos = 0;
  while (pos <= text.length) {
    let end = text.indexOf('\n', pos);
    if (end < 0) end = text.length;
    lineNo++;
    const start = pos;
    pos = end + 1;
    if (end - start > maxLine) {
      fail(lineNo, 'line too long');
      continue;
    }
    const line = text.slice(start, end).replace(/^[ \t]+|[ \t\r]+$/g, '');
    if (line === '') continue;

    if (line[0] === '#') {
      const reason = parseComment(line, families, typed);
      if (reason !== null) fail(lineNo, reason);
      continue;
    }

    const parsed = parseSampleLine(line);
    if (typeof parsed === 'string') {
      fail(lineNo, parsed);
      continue;
    }
    if (sampleCount >= maxSamples) {
      truncated = true;
      break;
    }
    const family = familyFor(parsed.name, families);
    family.samples.push(parsed);
    let list = byName.get(parsed.name);
    if (list === undefined) byName.set(parsed.name, (list = []));
    list.push(parsed);
    sampleCount++;
  }

  return { families, byName, sampleCount, skipped, errors, truncated };
}

function positiveOr(v: number | undefined, dflt: number): number {
  return v !== undefined && Number.isFinite(v) && v > 0 ? Math.floor(v) : dflt;
}

function getOrCreateFamily(name: string, families: Map<string, MutableFamily>): MutableFamily {
  let f = families.get(name);
  if (f === undefined) {
    f = { name, type: 'untyped', samples: [] };
    families.set(name, f);
  }
  return f;
}

/** Returns null when the line was a valid HELP/TYPE or a plain comment, else a reason. */
function parseComment(line: string, families: Map<string, MutableFamily>, typed: Set<string>): string | null {
  const m = /^#[ \t]*(HELP|TYPE)(?:[ \t]+|$)(.*)$/.exec(line);
  if (m === null) return null; // an ordinary comment
  const keyword = m[1]!;
  const rest = m[2]!;
  const nm = /^([^ \t]+)(?:[ \t]+(.*))?$/.exec(rest);
  if (nm === null) return `${keyword} without a metric name`;
  const name = nm[1]!;
  const tail = nm[2] ?? '';
  if (!METRIC_NAME.test(name)) return `${keyword} with an invalid metric name`;
  if (keyword === 'HELP') {
    const family = getOrCreateFamily(name, families);
    if (family.help !== undefined) return 'duplicate HELP';
    family.help = unescapeHelp(tail);
    return null;
  }
  const type = tail.trim().toLowerCase();
  if (!METRIC_TYPES.has(type)) return `unknown TYPE ${JSON.stringify(tail.slice(0, 32))}`;
  if (typed.has(name)) return 'duplicate TYPE';
  const family = getOrCreateFamily(name, families);
  typed.add(name);
  family.type = type as MetricType;
  return null;
}

function unescapeHelp(s: string): string {
  // HELP escapes only `\\` and `\n`; any other backslash stays as written.
  return s.replace(/\\(\\|n)/g, (_, c: string) => (c === 'n' ? '\n' : '\\'));
}

/** The family a sample belongs to: its own name, a compatible base name, or a new untyped one. */
function familyFor(sampleName: string, families: Map<string, MutableFamily>): MutableFamily {
  const own = families.get(sampleName);
  if (own !== undefined) return own;
  for (const [suffix, owners] of SUFFIX_OWNERS) {
    if (!sampleName.endsWith(suffix)) continue;
    const base = families.get(sampleName.slice(0, -suffix.length));
    if (base !== undefined && owners.includes(base.type)) return base;
  }
  return getOrCreateFamily(sampleName, families);
}

const NAME_AT = /[a-zA-Z_:][a-zA-Z0-9_:]*/y;
const LABEL_AT = /[a-zA-Z_][a-zA-Z0-9_]*/y;

/** Parses one sample line (already trimmed); a string return is the reason it is malformed. */
function parseSampleLine(line: string): PromSample | string {
  const n = line.length;
  NAME_AT.lastIndex = 0;
  const nameMatch = NAME_AT.exec(line);
  if (nameMatch === null) return 'invalid metric name';
  const name = nameMatch[0];
  let i = name.length;
  if (i < n && line[i] !== ' ' && line[i] !== '\t' && line[i] !== '{') return 'invalid metric name';
  const labels: Record<string, string> = Object.create(null) as Record<string, string>;
  i = skipBlanks(line, i);

  if (line[i] === '{') {
    i++;
    for (;;) {
      i = skipBlanks(line, i);
      if (i >= n) return 'unterminated label set';
      if (line[i] === '}') {
        i++;
        break;
      }
      LABEL_AT.lastIndex = i;
      const labelMatch = LABEL_AT.exec(line);
      if (labelMatch === null) return 'invalid label name';
      const labelName = labelMatch[0];
      i = skipBlanks(line, i + labelName.length);
      if (line[i] !== '=') return `expected '=' after label ${labelName}`;
      i = skipBlanks(line, i + 1);
      if (line[i] !== '"') return `expected '"' to open the value of label ${labelName}`;
      i++;
      const quote = line.indexOf('"', i);
      if (quote < 0) return `unterminated value of label ${labelName}`;
      let value: string;
      if (line.lastIndexOf('\\', quote) < i) {
        // Fast path: no escapes before the next quote.
        value = line.slice(i, quote);
        i = quote + 1;
      } else {
        value = '';
        let closed = false;
        while (i < n) {
          const c = line[i]!;
          if (c === '"') {
            closed = true;
            i++;
            break;
          }
          if (c === '\\') {
            const e = line[i + 1];
            if (e === '\\') value += '\\';
            else if (e === '"') value += '"';
            else if (e === 'n') value += '\n';
            else return `invalid escape in the value of label ${labelName}`;
            i += 2;
            continue;
          }
          value += c;
          i++;
        }
        if (!closed) return `unterminated value of label ${labelName}`;
      }
      if (Object.prototype.hasOwnProperty.call(labels, labelName)) return `duplicate label ${labelName}`;
      labels[labelName] = value;
      i = skipBlanks(line, i);
      if (line[i] === ',') {
        i++;
        continue;
      }
      if (line[i] === '}') {
        i++;
        break;
      }
      return 'expected \',\' or \'}\' after a label';
    }
  }

  const rest = line.slice(i).trim();
  if (rest === '') return 'missing value';
  const tokens = rest.split(/[ \t]+/);
  if (tokens.length > 2) return 'trailing tokens after timestamp';
  const value = parseFloatGo(tokens[0]!);
  if (value === undefined) return 'invalid value';
  if (tokens.length === 2) {
    const ts = tokens[1]!;
    if (!INT64.test(ts)) return 'invalid timestamp';
    return { name, labels, value, timestamp: Number(ts) };
  }
  return { name, labels, value };
}

function skipBlanks(s: string, i: number): number {
  while (i < s.length && (s[i] === ' ' || s[i] === '\t')) i++;
  return i;
}

/** Go's strconv.ParseFloat for the decimal forms exporters write: also `NaN`, `±Inf`, `±Infinity`. */
export function parseFloatGo(token: string): number | undefined {
  if (DECIMAL_FLOAT.test(token)) return Number(token);
  if (INF.test(token)) return token[0] === '-' ? -Infinity : Infinity;
  if (/^nan$/i.test(token)) return NaN;
  return undefined;
}

// ---- Queries ----------------------------------------------------------------------------

/** Label equality (every listed label must match) or a predicate over the labels. */
export type LabelFilter = Readonly<Record<string, string>> | ((labels: Labels) => boolean);

function matches(labels: Labels, filter: LabelFilter | undefined): boolean {
  if (filter === undefined) return true;
  if (typeof filter === 'function') return filter(labels);
  for (const k of Object.keys(filter)) if (labels[k] !== filter[k]) return false;
  return true;
}

export function getFamily(parsed: PromParse, name: string): PromFamily | undefined {
  return parsed.families.get(name);
}

/** Samples with exactly this sample name that pass the filter. */
export function findSamples(parsed: PromParse, name: string, filter?: LabelFilter): PromSample[] {
  const list = parsed.byName.get(name);
  if (list === undefined) return [];
  return filter === undefined ? list.slice() : list.filter((s) => matches(s.labels, filter));
}

/**
 * Sum of the values of the samples with this exact name that pass the filter; `undefined`
 * when none exist. NaN samples are left out (a NaN gauge carries no value); if every match
 * is NaN the result is NaN. ±Inf is summed as is.
 */
export function sumSamples(parsed: PromParse, name: string, filter?: LabelFilter): number | undefined {
  const t = nonNaNTotal(parsed, name, filter);
  return t === undefined ? undefined : t.seen === 0 ? NaN : t.sum;
}

/** Mean over matching non-NaN samples; `undefined` when none exist (NaN if all are NaN). */
export function meanSamples(parsed: PromParse, name: string, filter?: LabelFilter): number | undefined {
  const t = nonNaNTotal(parsed, name, filter);
  return t === undefined ? undefined : t.seen === 0 ? NaN : t.sum / t.seen;
}

/** Sum and count of the matching samples' non-NaN values; `undefined` when nothing matches. */
function nonNaNTotal(parsed: PromParse, name: string, filter?: LabelFilter): { sum: number; seen: number } | undefined {
  const list = findSamples(parsed, name, filter);
  if (list.length === 0) return undefined;
  let sum = 0;
  let seen = 0;
  for (const s of list) {
    if (Number.isNaN(s.value)) continue;
    sum += s.value;
    seen++;
  }
  return { sum, seen };
}

/**
 * A counter's summed value whether it is exposed as `base_total` (prometheus_client,
 * OpenMetrics) or as bare `base` (older client libraries). `base_total` wins when both exist.
 * Pass the base name without `_total`.
 */
export function sumCounter(parsed: PromParse, base: string, filter?: LabelFilter): number | undefined {
  const stem = base.endsWith('_total') ? base.slice(0, -'_total'.length) : base;
  return sumSamples(parsed, `${stem}_total`, filter) ?? sumSamples(parsed, stem, filter);
}

/** The HELP text of the family that owns the counter `base` (as `base_total` or `base`). */
export function counterHelp(parsed: PromParse, base: string): string | undefined {
  const stem = base.endsWith('_total') ? base.slice(0, -'_total'.length) : base;
  return parsed.families.get(`${stem}_total`)?.help ?? parsed.families.get(stem)?.help;
}

/** A counter family declared by HELP/TYPE (as `x_total` or OpenMetrics-style `x`) or present in samples. */
export function counterDeclared(parsed: PromParse, base: string): boolean {
  const stem = base.endsWith('_total') ? base.slice(0, -'_total'.length) : base;
  return parsed.families.has(`${stem}_total`) || parsed.families.has(stem) || parsed.byName.has(`${stem}_total`);
}

/** The value when it is a finite number (not NaN, not ±Inf), else undefined. */
export function finiteValue(v: number | undefined): number | undefined {
  return v !== undefined && Number.isFinite(v) ? v : undefined;
}

/** A label value that is a positive decimal integer, else undefined (e.g. vLLM's "None" before profiling). */
export function positiveIntLabel(s: string | undefined): number | undefined {
  if (s === undefined || !/^\d{1,15}$/.test(s)) return undefined;
  const n = Number(s);
  return n > 0 ? n : undefined;
}
