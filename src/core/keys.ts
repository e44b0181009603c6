// Routing keys: an ordered list of sources per pool, the first one present wins. Pure: works
// on already-parsed request data handed in by the caller.
//
//   header:<name>   a request header (default x-session-id)
//   body:<field>    a top-level string field of the request body, e.g. `body:prompt_cache_key`
//                   (OpenAI's cache-routing hint; Codex sends its conversation id there)
//   tenant          the authenticated tenant id (from the API key, never from a client header)
//   prefix:<bytes>  hash of the first N UTF-8 bytes of the canonical prompt
//   none            no key: the pool's fallback strategy picks

import { hashString, murmur3 } from './hash.js';

export type KeySource =
  | { readonly kind: 'header'; readonly name: string }
  | { readonly kind: 'body'; readonly field: string }
  | { readonly kind: 'tenant' }
  | { readonly kind: 'prefix'; readonly bytes: number }
  | { readonly kind: 'none' };

export type KeyKind = KeySource['kind'];

export const DEFAULT_SESSION_HEADER = 'x-session-id';
export const DEFAULT_PREFIX_BYTES = 4096;
/** Longest header value used as a key; longer values are truncated before hashing. */
export const MAX_HEADER_KEY_CHARS = 256;
/** Longest body field value used as a key (the HTTP layer refuses longer ones with a 400). */
export const MAX_BODY_KEY_CHARS = 256;

/** Parse `header:x-session-id`, `header`, `body:prompt_cache_key`, `tenant`, `prefix:4096`, `prefix`, `none`. */
export function parseKeySource(spec: string): KeySource {
  const [kind, arg, ...rest] = spec.trim().split(':');
  if (rest.length > 0) throw new RangeError(`key source "${spec}" has too many parts`);
  switch (kind) {
    case 'header': {
      const name = (arg ?? DEFAULT_SESSION_HEADER).toLowerCase();
      if (!/^[a-z0-9!#$%&'*+.^_`|~-]+$/.test(name)) throw new RangeError(`key source "${spec}": "${name}" is not a valid header name`);
      return { kind: 'header', name };
    }
    case 'body': {
      if (arg === undefined || !/^[a-z_][a-z0-9_]{0,63}$/.test(arg)) throw new RangeError(`key source "${spec}": expected body:<field> with a top-level field name such as prompt_cache_key`);
      return { kind: 'body', field: arg };
    }
    case 'tenant':
    case 'none':
      if (arg !== undefined) throw new RangeError(`key source "${kind}" takes no argument`);
      return { kind };
    case 'prefix': {
      const bytes = arg === undefined ? DEFAULT_PREFIX_BYTES : Number(arg);
      if (!Number.isInteger(bytes) || bytes < 1 || bytes > 1 << 20) throw new RangeError(`key source "${spec}": prefix bytes must be an integer in [1, 1048576]`);
      return { kind: 'prefix', bytes };
    }
    default:
      throw new RangeError(`unknown key source "${kind}" (known: header:<name>, body:<field>, tenant, prefix:<bytes>, none)`);
  }
}

export function formatKeySource(s: KeySource): string {
  return s.kind === 'header' ? `header:${s.name}` : s.kind === 'body' ? `body:${s.field}` : s.kind === 'prefix' ? `prefix:${s.bytes}` : s.kind;
}

export interface KeyInput {
  /** Header lookup (case-insensitive names, as the Fetch `Headers` class does). */
  readonly header: (name: string) => string | null | undefined;
  /** Authenticated tenant id, if any. */
  readonly tenant?: string | null;
  /** The parsed OpenAI request body. */
  readonly body: unknown;
  /** The canonical prompt start, when the API is not Chat Completions / Completions (http/apis/). */
  readonly prompt?: () => string;
  /**
   * Tenant namespace of client-chosen keys (`header:`): two tenants sending the same session id
   * get two keys. Absent: unnamespaced (the simulator's traces, tests of the hash itself).
   */
  readonly namespace?: string | null;
  /**
   * Namespace of `prefix:` keys: the tenant where the engine's cache is salted per tenant (the
   * same prompt of two tenants is two caches), a shared value where a pool shares prefixes.
   */
  readonly prefixNamespace?: string | null;
}

export interface RoutingKey {
  /** Which source produced the key; `none` when no source matched. */
  readonly kind: KeyKind;
  /** 32-bit hash of the key (what the ring sees), or null for `none`. */
  readonly hash: number | null;
}

const NO_KEY: RoutingKey = Object.freeze({ kind: 'none', hash: null });
/** No routing key: the pool's fallback strategy picks (keyless APIs). */
export const NO_ROUTING_KEY: RoutingKey = NO_KEY;

const prefixEncoder = new TextEncoder();
let prefixScratch = new Uint8Array(DEFAULT_PREFIX_BYTES + 4);

/**
 * MurmurHash3 of the first `limit` UTF-8 bytes of `text`, encoding only those (not the whole
 * prompt). encodeInto never splits a character, so when byte `limit` falls inside one, the
 * rest of it is encoded on its own and cut: the hash is exactly that of
 * `utf8(text).subarray(0, limit)`, so keys do not move.
 */
export function hashUtf8Prefix(text: string, limit: number, seed = 0): number {
  if (prefixScratch.length < limit + 4) prefixScratch = new Uint8Array(limit + 4);
  const { read, written } = prefixEncoder.encodeInto(text, prefixScratch.subarray(0, limit));
  let n = written;
  if (n < limit && read < text.length) {
    const code = text.codePointAt(read)!;
    const tail = prefixEncoder.encode(String.fromCodePoint(code >= 0xd800 && code <= 0xdfff ? 0xfffd : code));
    const take = Math.min(tail.length, limit - n);
    prefixScratch.set(tail.subarray(0, take), n);
    n += take;
  }
  return murmur3(prefixScratch, seed, 0, n);
}

/** Walk the sources in order; the first one present wins. */
export function resolveRoutingKey(sources: readonly KeySource[], input: KeyInput): RoutingKey {
  for (const s of sources) {
    switch (s.kind) {
      case 'header': {
        const v = input.header(s.name)?.trim();
        if (v) {
          const value = v.length > MAX_HEADER_KEY_CHARS ? v.slice(0, MAX_HEADER_KEY_CHARS) : v;
          return { kind: 'header', hash: hashString(input.namespace ? `${input.namespace}\u0000${value}` : value) };
        }
        break;
      }
      case 'body': {
        // Namespaced by tenant: two tenants sending the same prompt_cache_key never share a key.
        const b = input.body;
        const v = b !== null && typeof b === 'object' && !Array.isArray(b) && Object.hasOwn(b, s.field) ? (b as Record<string, unknown>)[s.field] : undefined;
        if (typeof v === 'string' && v.trim() !== '') {
          const value = v.length > MAX_BODY_KEY_CHARS ? v.slice(0, MAX_BODY_KEY_CHARS) : v;
          return { kind: 'body', hash: hashString(`body\u0000${s.field}\u0000${input.namespace ?? input.tenant ?? ''}\u0000${value}`) };
        }
        break;
      }
      case 'tenant':
        if (input.tenant) return { kind: 'tenant', hash: hashString(`tenant\u0000${input.tenant}`) };
        break;
      case 'prefix': {
        const text = input.prompt ? input.prompt() : canonicalPrompt(input.body, s.bytes);
        if (text) return { kind: 'prefix', hash: hashUtf8Prefix(text, s.bytes, input.prefixNamespace ? namespaceSeed(input.prefixNamespace) : 0) };
        break;
      }
      case 'none':
        return NO_KEY;
    }
  }
  return NO_KEY;
}

/** A 32-bit hash seed for a namespace (prefix keys, and block hashes via `BlockHashOptions.seed`). */
export function namespaceSeed(namespace: string): number {
  return hashString(`ns\u0000${namespace}`);
}

/** JSON with object keys sorted at every depth, so key order in the request never changes a hash. */
export function stableStringify(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return '[' + value.map(stableStringify).join(',') + ']';
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
  return '{' + keys.map((k) => JSON.stringify(k) + ':' + stableStringify(obj[k])).join(',') + '}';
}

// Separators that do not occur in ordinary text, so "ab"+"c" and "a"+"bc" differ.
const SEP_PART = '\u0001';
const SEP_FIELD = '\u0002';

/**
 * The canonical prompt start that vLLM's prefix cache effectively sees, in order: the tool
 * schemas, then each message's role and content (plus tool calls), or the `prompt` of a
 * completion. Objects are key-sorted so the same prompt always gives the same text.
 * Returns '' when the body carries no prompt. With `limitBytes`, it may stop after the message
 * that takes it past that many UTF-16 code units (≥ that many UTF-8 bytes): the result then
 * starts with the same `limitBytes` bytes as the whole canonical prompt.
 */
export function canonicalPrompt(body: unknown, limitBytes = Infinity): string {
  if (body === null || typeof body !== 'object') return '';
  const b = body as Record<string, unknown>;
  let out = '';
  if (Array.isArray(b.tools) && b.tools.length > 0) out += 'tools' + SEP_FIELD + stableStringify(b.tools) + SEP_PART;
  if (Array.isArray(b.messages)) {
    for (const m of b.messages) {
      // Every UTF-16 code unit is at least one UTF-8 byte: once `out` has `limitBytes` units,
      // later messages cannot change its first `limitBytes` bytes.
      if (out.length >= limitBytes) break;
      if (m === null || typeof m !== 'object') continue;
      const msg = m as Record<string, unknown>;
      out += String(msg.role ?? '') + SEP_FIELD;
      out += typeof msg.content === 'string' ? msg.content : msg.content == null ? '' : stableStringify(msg.content);
      if (msg.tool_calls !== undefined) out += SEP_FIELD + stableStringify(msg.tool_calls);
      out += SEP_PART;
    }
  } else if (b.prompt !== undefined) {
    out += typeof b.prompt === 'string' ? b.prompt : stableStringify(b.prompt);
  }
  return out;
}
