import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  counterHelp,
  findSamples,
  getFamily,
  meanSamples,
  parseFloatGo,
  parsePromText,
  sumCounter,
  sumSamples,
} from '../../../src/engines/prom-text.js';

const fixture = (name: string): string => readFileSync(join(import.meta.dirname, '../../fixtures/vllm-metrics', name), 'utf8');

describe('parsePromText: the spec examples', () => {
  // The example block of prometheus/docs exposition_formats.md ("Text format details").
  const spec = [
    '# HELP http_requests_total The total number of HTTP requests.',
    '# TYPE http_requests_total counter',
    'http_requests_total{method="post",code="200"} 1027 1395066363000',
    'http_requests_total{method="post",code="400"}    3 1395066363000',
    '',
    '# Escaping in label values:',
    'msdos_file_access_time_seconds{path="C:\\\\DIR\\\\FILE.TXT",error="Cannot find file:\\n\\"FILE.TXT\\""} 1.458255915e9',
    '',
    '# Minimalistic line:',
    'metric_without_timestamp_and_labels 12.47',
    '',
    '# A weird metric from before the epoch:',
    'something_weird{problem="division by zero"} +Inf -3982045',
    '',
    '# HELP http_request_duration_seconds A histogram of the request duration.',
    '# TYPE http_request_duration_seconds histogram',
    'http_request_duration_seconds_bucket{le="0.05"} 24054',
    'http_request_duration_seconds_bucket{le="0.1"} 33444',
    'http_request_duration_seconds_bucket{le="+Inf"} 144320',
    'http_request_duration_seconds_sum 53423',
    'http_request_duration_seconds_count 144320',
    '',
    '# HELP telemetry_requests_metrics_latency_microseconds A summary of the response latency.',
    '# TYPE telemetry_requests_metrics_latency_microseconds summary',
    'telemetry_requests_metrics_latency_microseconds{quantile="0.01"} 3102',
    'telemetry_requests_metrics_latency_microseconds{quantile="0.99"} 76656',
    'telemetry_requests_metrics_latency_microseconds_sum 1.7560473e+07',
    'telemetry_requests_metrics_latency_microseconds_count 2693',
    '',
  ].join('\n');
  const p = parsePromText(spec);

  it('parses every line, skips none', () => {
    expect(p.skipped).toBe(0);
    expect(p.errors).toEqual([]);
    expect(p.truncated).toBe(false);
    expect(p.sampleCount).toBe(14);
  });

  it('keeps several label sets of one metric, with timestamps', () => {
    const f = getFamily(p, 'http_requests_total')!;
    expect(f.type).toBe('counter');
    expect(f.help).toBe('The total number of HTTP requests.');
    expect(f.samples).toHaveLength(2);
    expect({ ...f.samples[0]!.labels }).toEqual({ method: 'post', code: '200' });
    expect(f.samples[0]!.value).toBe(1027);
    expect(f.samples[0]!.timestamp).toBe(1395066363000);
    expect(f.samples[1]!.value).toBe(3);
  });

  it('unescapes backslash, double quote and line feed in label values', () => {
    const [s] = findSamples(p, 'msdos_file_access_time_seconds');
    expect(s!.labels['path']).toBe('C:\\DIR\\FILE.TXT');
    expect(s!.labels['error']).toBe('Cannot find file:\n"FILE.TXT"');
    expect(s!.value).toBe(1.458255915e9);
    expect(s!.timestamp).toBeUndefined();
  });

  it('reads +Inf with a negative timestamp', () => {
    const [s] = findSamples(p, 'something_weird');
    expect(s!.value).toBe(Infinity);
    expect(s!.timestamp).toBe(-3982045);
  });

  it('groups _bucket, _sum and _count under the histogram family, and summary quantiles', () => {
    const h = getFamily(p, 'http_request_duration_seconds')!;
    expect(h.type).toBe('histogram');
    expect(h.samples.map((s) => s.name)).toEqual([
      'http_request_duration_seconds_bucket',
      'http_request_duration_seconds_bucket',
      'http_request_duration_seconds_bucket',
      'http_request_duration_seconds_sum',
      'http_request_duration_seconds_count',
    ]);
    expect(findSamples(p, 'http_request_duration_seconds_bucket', { le: '+Inf' })[0]!.value).toBe(144320);
    const s = getFamily(p, 'telemetry_requests_metrics_latency_microseconds')!;
    expect(s.type).toBe('summary');
    expect(s.samples).toHaveLength(4);
    expect(sumSamples(p, 'telemetry_requests_metrics_latency_microseconds_sum')).toBe(1.7560473e7);
    expect(getFamily(p, 'http_request_duration_seconds_bucket')).toBeUndefined();
  });

  it('gives an untyped family to samples with no TYPE line', () => {
    expect(getFamily(p, 'metric_without_timestamp_and_labels')!.type).toBe('untyped');
  });
});

describe('parsePromText: counters with and without _total', () => {
  it('attaches x_total to a family declared as x (OpenMetrics style) and as x_total (prometheus_client)', () => {
    const p = parsePromText(
      [
        '# TYPE a counter',
        'a_total{k="1"} 5',
        'a_created{k="1"} 1.7e9',
        '# TYPE b_total counter',
        '# HELP b_total B help',
        'b_total 7',
        '# TYPE b_created gauge',
        'b_created 1.7e9',
        '# TYPE c counter',
        'c 9',
      ].join('\n'),
    );
    expect(p.skipped).toBe(0);
    expect(getFamily(p, 'a')!.samples.map((s) => s.name)).toEqual(['a_total', 'a_created']);
    expect(sumCounter(p, 'a')).toBe(5);
    expect(sumCounter(p, 'b')).toBe(7);
    expect(sumCounter(p, 'b_total')).toBe(7);
    expect(counterHelp(p, 'b')).toBe('B help');
    expect(sumCounter(p, 'c')).toBe(9);
    expect(sumCounter(p, 'missing')).toBeUndefined();
  });

  it('does not attach a suffix to a family of the wrong type', () => {
    const p = parsePromText('# TYPE g gauge\ng 1\ng_count 2\ng_total 3\n');
    expect(getFamily(p, 'g')!.samples).toHaveLength(1);
    expect(getFamily(p, 'g_count')!.type).toBe('untyped');
    expect(getFamily(p, 'g_total')!.type).toBe('untyped');
  });
});

describe('parsePromText: the nasty fixture', () => {
  const p = parsePromText(fixture('nasty.txt'));

  it('skips and counts exactly the malformed lines, never throws', () => {
    expect(p.skipped).toBe(10);
    expect(p.errors.map((e) => e.line)).toEqual([19, 20, 21, 22, 23, 24, 25, 26, 27, 28]);
    expect(p.truncated).toBe(false);
  });

  it('unescapes HELP text (only \\\\ and \\n)', () => {
    expect(getFamily(p, 'nasty_gauge')!.help).toBe('A gauge with a \\ backslash and a \n newline in its help');
    expect(getFamily(p, 'nasty_gauge')!.type).toBe('gauge'); // the later duplicate TYPE is ignored
  });

  it('reads NaN, ±Inf, timestamps, blanks, tabs, a trailing comma and CRLF', () => {
    const by = (path: string) => findSamples(p, 'nasty_gauge', { path })[0]!;
    expect(by('C:\\DIR\\FILE.TXT').labels['error']).toBe('Cannot find file:\n"FILE.TXT"');
    expect(by('/tmp').value).toBeNaN();
    expect(by('/inf').value).toBe(Infinity);
    expect(by('/inf').timestamp).toBe(1395066363000);
    expect(by('/neg-inf').value).toBe(-Infinity);
    expect(by('/neg-inf').timestamp).toBe(-3982045);
    expect(by('spaces').value).toBe(42);
    expect(by('spaces').labels['trailing']).toBe('comma');
    expect(by('crlf').value).toBe(7);
    expect(getFamily(p, 'nasty_histogram')!.samples).toHaveLength(4);
    expect(sumSamples(p, 'nasty_histogram_sum')).toBe(0.15);
    expect(findSamples(p, 'metric_with_timestamp')[0]!.timestamp).toBe(1_700_000_000_000);
    expect(sumSamples(p, 'no_trailing_newline_at_end')).toBe(-0.0005);
  });

  it('keeps escaped label values intact for filtering and sums, leaving NaN out', () => {
    const model = 'with "quotes" and \\ and \n';
    expect(sumSamples(p, 'vllm:num_requests_waiting', { model_name: model })).toBe(4);
    expect(sumSamples(p, 'vllm:num_requests_waiting')).toBe(14);
    expect(meanSamples(p, 'vllm:num_requests_waiting', (l) => l['engine'] === '0')).toBe(7);
    expect(sumSamples(p, 'vllm:num_requests_waiting', { model_name: model, engine: '1' })).toBeNaN();
    expect(sumSamples(p, 'vllm:num_requests_waiting', { model_name: 'nope' })).toBeUndefined();
  });

  it('attaches a _total sample to its counter family', () => {
    expect(sumCounter(p, 'nasty_counter')).toBe(6);
  });
});

describe('parsePromText: hostile input', () => {
  it('never throws on garbage', () => {
    const junk = ['{', '}', '"', '\\', 'a{', 'a{b', 'a{b=', 'a{b="', 'a{b="\\', 'a{b="c"', 'a{b="c"}', 'a{b="c"}x', '# TYPE', '# HELP', '# TYPE a', '\u0000\u0001', 'a 1 x', 'a 1 1.5', '__proto__ 1', 'a{__proto__="x"} 1', 'a{constructor="x"} 2'];
    for (const j of junk) expect(() => parsePromText(j)).not.toThrow();
    const p = parsePromText(junk.join('\n'));
    expect(p.sampleCount).toBe(3); // `__proto__ 1` and the two label sets named after Object members
    expect(findSamples(p, 'a', { __proto__: 'x' } as Record<string, string>)).toBeDefined();
    expect(findSamples(p, 'a')[0]!.labels['__proto__']).toBe('x');
    expect(Object.getPrototypeOf({})).toBe(Object.prototype); // nothing polluted
    expect(({} as Record<string, unknown>)['x']).toBeUndefined();
  });

  it('caps the sample count', () => {
    const text = Array.from({ length: 1000 }, (_, i) => `m{i="${i}"} ${i}`).join('\n');
    const p = parsePromText(text, { maxSamples: 100 });
    expect(p.sampleCount).toBe(100);
    expect(p.truncated).toBe(true);
  });

  it('caps the input size at a line boundary', () => {
    const text = Array.from({ length: 1000 }, (_, i) => `m{i="${i}"} ${i}`).join('\n');
    const p = parsePromText(text, { maxInputChars: 200 });
    expect(p.truncated).toBe(true);
    expect(p.skipped).toBe(0);
    expect(p.sampleCount).toBeGreaterThan(5);
    expect(p.sampleCount).toBeLessThan(20);
  });

  it('skips over-long lines', () => {
    const p = parsePromText(`m{v="${'x'.repeat(100)}"} 1\nok 2\n`, { maxLineChars: 50 });
    expect(p.skipped).toBe(1);
    expect(sumSamples(p, 'ok')).toBe(2);
  });

  it('keeps at most MAX_ERRORS_KEPT errors but counts them all', () => {
    const p = parsePromText('bad line here\n'.repeat(500));
    expect(p.skipped).toBe(500);
    expect(p.errors.length).toBe(20);
  });

  it('handles an empty body and a non-string', () => {
    expect(parsePromText('').sampleCount).toBe(0);
    expect(parsePromText(undefined as unknown as string).sampleCount).toBe(0);
  });
});

describe('parseFloatGo', () => {
  it.each([
    ['1', 1],
    ['-1.5e3', -1500],
    ['.5', 0.5],
    ['5.', 5],
    ['+Inf', Infinity],
    ['-Inf', -Infinity],
    ['inf', Infinity],
    ['+Infinity', Infinity],
    ['1E-2', 0.01],
  ])('%s → %s', (s, v) => expect(parseFloatGo(s)).toBe(v));
  it('NaN', () => expect(parseFloatGo('NaN')).toBeNaN());
  it.each(['', '1.2.3', 'abc', '0x10', '1e', '--1', 'Infx'])('rejects %j', (s) => expect(parseFloatGo(s)).toBeUndefined());
});
