// Mock tokenizer and chat template: renders a request's prompt to text, counts 4-character
// tokens, cuts 16-token blocks and generates deterministic output tokens. Pure, no I/O.

import { hashString } from '../../src/core/hash.js';

/** Characters per mock token (a rough average for English BPE vocabularies). */
export const CHARS_PER_TOKEN = 4;
/** vLLM's default KV block size in tokens. */
export const BLOCK_TOKENS = 16;
export const BLOCK_CHARS = CHARS_PER_TOKEN * BLOCK_TOKENS;

/** Text of a message's `content`: a string, or the concatenated `text` of its parts. */
export function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    let s = '';
    for (const part of content) {
      if (part && typeof part === 'object' && typeof (part as { text?: unknown }).text === 'string') {
        s += (part as { text: string }).text;
      }
    }
    return s;
  }
  return '';
}

/**
 * A chat template in the spirit of vLLM's: tool schemas first, then `<|role|>\n content \n` per
 * message, then the generation prompt `<|assistant|>\n`. The generation prompt matters: the prompt
 * plus the generated text plus `\n` is exactly how the next turn renders that assistant message, so
 * the next turn hits the blocks cached during decode, as with a real model.
 */
export function renderChatPrompt(body: { messages: unknown[]; tools?: unknown }, continueFinal = false): string {
  let s = '';
  if (Array.isArray(body.tools) && body.tools.length > 0) s += `<|tools|>\n${JSON.stringify(body.tools)}\n`;
  const last = body.messages.length - 1;
  for (const [at, m] of body.messages.entries()) {
    const msg = (m ?? {}) as { role?: unknown; content?: unknown; tool_calls?: unknown };
    s += `<|${String(msg.role)}|>\n${contentText(msg.content)}`;
    if (Array.isArray(msg.tool_calls) && msg.tool_calls.length > 0) s += JSON.stringify(msg.tool_calls);
    // vLLM's continue_final_message: the final message left open (no end of turn), no generation prompt.
    if (continueFinal && at === last) return s;
    s += '\n';
  }
  return s + '<|assistant|>\n';
}

/**
 * The completions `prompt`: a string, a one-element string array, or token ids (each id rendered
 * as one 4-character token). Returns null for shapes the mock does not serve (several prompts).
 */
export function renderCompletionPrompt(prompt: unknown): string | null {
  if (typeof prompt === 'string') return prompt;
  if (Array.isArray(prompt)) {
    if (prompt.length === 1 && typeof prompt[0] === 'string') return prompt[0];
    if (prompt.length > 0 && prompt.every((t) => Number.isInteger(t))) {
      return prompt.map((t) => String(t).padStart(CHARS_PER_TOKEN, '0').slice(-CHARS_PER_TOKEN)).join('');
    }
  }
  return null;
}

/** Token count of a text: every started 4-character piece is a token. */
export function countTokens(text: string): number {
  return Math.ceil(text.length / CHARS_PER_TOKEN);
}

/** The text of each full 16-token block, in order (the partial tail is never cached, as in vLLM). */
export function fullBlocks(text: string): string[] {
  const n = Math.floor(text.length / BLOCK_CHARS);
  const out = new Array<string>(n);
  for (let i = 0; i < n; i++) out[i] = text.slice(i * BLOCK_CHARS, (i + 1) * BLOCK_CHARS);
  return out;
}

// Three-letter words plus a space: every output token is exactly one 4-character mock token.
const WORDS = [
  'the', 'fox', 'red', 'sun', 'sky', 'sea', 'owl', 'map', 'pen', 'cup', 'ice', 'oak', 'elm', 'ray',
  'jam', 'kit', 'log', 'net', 'orb', 'pod', 'rug', 'saw', 'tea', 'urn', 'van', 'web', 'yak', 'zip',
];

/** Output token `i` for a prompt: deterministic, so tests and replays see the same text. */
export function outputToken(promptSeed: number, i: number): string {
  return `${WORDS[(promptSeed + i * 7) % WORDS.length]!} `;
}

/** Seed of a prompt's output sequence. */
export function promptSeed(prompt: string): number {
  return hashString(prompt) % 1_000_003;
}

const WORD_TOKENS = new Set(WORDS.map((w) => `${w} `));

/**
 * Where the mock's greedy answer to `prompt` starts: the seed of its output sequence and the index
 * of its first token. A real engine decoding at temperature 0 from P + S[:k], where S is its answer
 * to P, produces S[k:] (each token is the argmax given the prefix, and the prefix is the same), so
 * a prompt that ends in the first k tokens of the answer to what precedes them is continued from
 * token k of that answer: the longest such k wins (a broken stream continued elsewhere through
 * `continue_final_message` or a completions prompt plus the text so far). Any other prompt starts
 * its own sequence at 0. The mock's token i depends only on seed(P) and i, so this recognition is
 * how it models the prefix property; a prompt that ends in such tokens by chance is continued the
 * same way, as a real greedy engine would.
 */
export function outputStart(prompt: string): { seed: number; index: number } {
  let m = 0;
  while (prompt.length >= CHARS_PER_TOKEN * (m + 1) && WORD_TOKENS.has(prompt.slice(prompt.length - CHARS_PER_TOKEN * (m + 1), prompt.length - CHARS_PER_TOKEN * m))) m++;
  for (let k = m; k >= 1; k--) {
    const headLen = prompt.length - CHARS_PER_TOKEN * k;
    const seed = promptSeed(prompt.slice(0, headLen));
    let ok = true;
    for (let i = 0; i < k && ok; i++) ok = prompt.slice(headLen + CHARS_PER_TOKEN * i, headLen + CHARS_PER_TOKEN * (i + 1)) === outputToken(seed, i);
    if (ok) return { seed, index: k };
  }
  return { seed: promptSeed(prompt), index: 0 };
}
