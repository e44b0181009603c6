// scripts/lib/progress.ts: redrawn in place on a terminal, one line per step in a log.
import { describe, expect, it } from 'vitest';

import { progress } from '../../../scripts/lib/progress.js';

function sink(columns?: number) {
  const out: string[] = [];
  return { out, stream: { write: (s: string) => out.push(s), columns } as unknown as NodeJS.WriteStream };
}

describe('progress', () => {
  it('on a terminal redraws one line and ends each step with a newline', () => {
    const { out, stream } = sink(80);
    const p = progress({ stream, tty: true, label: 'x', ttyEveryMs: 0 });
    p.update('1/3');
    p.update('2/3');
    p.step('done 3/3');
    expect(out).toEqual(['\r\x1b[Kx 1/3', '\r\x1b[Kx 2/3', '\r\x1b[Kx done 3/3\n']);
  });

  it('cuts a redrawn line to the terminal width (a wrapped line cannot be redrawn)', () => {
    const { out, stream } = sink(10);
    progress({ stream, tty: true }).update('0123456789abcdef');
    expect(out[0]).toBe('\r\x1b[K01234567…');
  });

  it('in a log prints whole lines, no carriage returns, updates at most once per interval', () => {
    const { out, stream } = sink();
    let t = 0;
    const p = progress({ stream, tty: false, logEveryMs: 1_000, now: () => t });
    p.update('a');
    t = 500;
    p.update('b'); // too soon: dropped
    t = 1_200;
    p.update('c');
    p.step('step 1');
    p.done();
    expect(out).toEqual(['a\n', 'c\n', 'step 1\n']);
    expect(out.join('')).not.toContain('\r');
  });

  it('done() clears a pending redrawn line only on a terminal', () => {
    const tty = sink(80);
    let t = 0;
    const p = progress({ stream: tty.stream, tty: true, now: () => t });
    p.update('x');
    t = 50;
    p.update('too soon'); // redraws are at most one per 100 ms
    p.done();
    p.done();
    expect(tty.out).toEqual(['\r\x1b[Kx', '\r\x1b[K']);
  });
});

describe('progress with logEveryMs: Infinity', () => {
  it('prints only steps in a log', () => {
    const out: string[] = [];
    const p = progress({ stream: { write: (s: string) => out.push(s) } as unknown as NodeJS.WriteStream, tty: false, logEveryMs: Infinity });
    p.update('a');
    p.update('b');
    p.step('run 1 done');
    expect(out).toEqual(['run 1 done\n']);
  });
});
