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

/** A chat completion stream read as it arrives: its content deltas, `[DONE]`, and when the first content and the end came. */
export interface ReadChat {
  text: string;
  tokens: number;
  done: boolean;
  firstTokenAt: number | null;
  endedAt: number;
}

/** Read a Chat Completions SSE body to its end, as a client sees it; `onFirstToken` fires at its first content delta. */
export async function readChatStream(body: ReadableStream<Uint8Array>, onFirstToken?: () => void): Promise<ReadChat> {
  const out: ReadChat = { text: '', tokens: 0, done: false, firstTokenAt: null, endedAt: 0 };
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const r = await reader.read();
    if (r.done) break;
    buf += decoder.decode(r.value, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const data = buf.slice(0, i).replace(/^data: /, '');
      buf = buf.slice(i + 2);
      if (data === '[DONE]') out.done = true;
      else if (data.startsWith('{')) {
        const content = (JSON.parse(data) as { choices?: { delta?: { content?: string } }[] }).choices?.[0]?.delta?.content;
        if (!content) continue;
        out.tokens++;
        out.text += content;
        if (out.firstTokenAt === null) {
          out.firstTokenAt = Date.now();
          onFirstToken?.();
        }
      }
    }
  }
  out.endedAt = Date.now();
  return out;
}
