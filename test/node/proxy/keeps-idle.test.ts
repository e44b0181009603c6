// keepsIdle (proxy/sse-tap.ts, used by stream-step.ts): a read of nothing but SSE comment lines (vLLM's
// `: keep-alive`, vllm/entrypoints/serve/utils/sse_keep_alive.py) does not reset the idle clock;
// anything else does, a comment split across reads included.

import { describe, expect, it } from 'vitest';

import { keepsIdle } from '../../../src/proxy/sse-tap.js';

const bytes = (s: string) => new TextEncoder().encode(s);

describe('keepsIdle', () => {
  it('is true for whole comment lines and blank lines only', () => {
    expect(keepsIdle(bytes(': keep-alive\n\n'))).toBe(true);
    expect(keepsIdle(bytes(': keep-alive\n\n: keep-alive\n\n: keep-alive\n\n'))).toBe(true);
    expect(keepsIdle(bytes(':\r\n\r\n'))).toBe(true);
  });
  it('is false for anything that carries or may carry an event', () => {
    expect(keepsIdle(bytes('data: {"choices":[]}\n\n'))).toBe(false);
    expect(keepsIdle(bytes(': keep-alive\n\ndata: {"choices":[]}\n\n'))).toBe(false);
    expect(keepsIdle(bytes('event: ping\ndata: {"type":"ping"}\n\n'))).toBe(false);
    // A comment cut by the read: it may end in more bytes; counted as progress, never cut for.
    expect(keepsIdle(bytes(': keep-al'))).toBe(false);
    expect(keepsIdle(new Uint8Array(0))).toBe(false);
  });
});
