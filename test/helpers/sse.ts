// SSE helpers for tests that read an engine's or the router's stream as text. Pure.

import { expect } from 'vitest';

/** The `data:` payloads of an SSE body, in order; every event must be a `data:` line. */
export function dataEvents(text: string): string[] {
  return text
    .split('\n\n')
    .filter((e) => e !== '')
    .map((e) => {
      expect(e.startsWith('data: ')).toBe(true);
      return e.slice('data: '.length);
    });
}
