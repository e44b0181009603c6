// Stop strings across the seam of a continued stream (issue #28), pure: how many trailing deltas
// a continuation gives back so that the continuing engine sees a stop string whole, and the
// swallowing of the text it writes again.

import { describe, expect, it } from 'vitest';

import { seamHoldback, stopList, Swallow } from '../../../src/proxy/continuation.js';

describe('seamHoldback', () => {
  it('gives back the fewest trailing deltas covering the longest proper prefix of a stop string the text ends in', () => {
    expect(seamHoldback(['Hello ', 'wor', 'ld. ', 'EN'], ['END'])).toBe(1);
    expect(seamHoldback(['Hello ', 'wor', 'ld. E', 'N'], ['END'])).toBe(2);
    expect(seamHoldback(['Hello ', 'world'], ['END', 'ld!'])).toBe(1);
    // A whole stop string at the end is no prefix of it (the engine already stopped or never saw it).
    expect(seamHoldback(['a', 'END'], ['END'])).toBe(0);
    expect(seamHoldback(['Hello ', 'world'], ['END'])).toBe(0);
    expect(seamHoldback(['x'], [])).toBe(0);
    // The longest prefix over all stop strings; never more deltas than there are.
    expect(seamHoldback(['ab', 'c'], ['bcd', 'abcde'])).toBe(2);
    expect(seamHoldback(['S'], ['STOP'])).toBe(1);
  });

  it("stopList reads OpenAI's `stop` and Anthropic's `stop_sequences`: a string or a list, empty strings dropped", () => {
    expect(stopList('END')).toEqual(['END']);
    expect(stopList(['a', '', 3, 'b'])).toEqual(['a', 'b']);
    expect(stopList(undefined)).toEqual([]);
    expect(stopList('')).toEqual([]);
  });
});

describe('Swallow', () => {
  it('drops the regenerated text across deltas, passes the rest', () => {
    const s = new Swallow('wor ld');
    expect(s.take('wo')).toBe('');
    expect(s.take('r l')).toBe('');
    expect(s.take('d and more')).toBe(' and more');
    expect(s.take('next')).toBe('next');
  });

  it('what differs from the text given back is new text, passed on from there', () => {
    const s = new Swallow('abc');
    expect(s.take('abX')).toBe('X');
    expect(s.take('c')).toBe('c');
  });
});
