// MurmurHash3 x86_32 over UTF-8 bytes. Pure: no I/O, no globals beyond TextEncoder.
//
// Why MurmurHash3 and not xxHash32: both mix well and pass SMHasher; Murmur3 x86_32 is
// a few lines with `Math.imul`, has widely published test vectors (Appleby's SMHasher,
// Guava, Python's mmh3), and keys here are short (session ids, 32-byte ring labels) where
// xxHash32's 16-byte stripes buy nothing. For long prompt prefixes it runs at roughly
// 1 GB/s in V8, which is well below the cost of parsing the JSON that carried the prompt.

const C1 = 0xcc9e2d51;
const C2 = 0x1b873593;

/**
 * One MurmurHash3 x86_32 body round: mix the 32-bit word `k` into the state `h`. Exported for
 * hashes over words rather than bytes (the simulator's chained block ids).
 */
export function murmur3Round(h: number, k: number): number {
  k = Math.imul(k, C1);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, C2);
  h ^= k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

/** MurmurHash3's finalizer (fmix32): avalanches the state; returns an unsigned 32-bit integer. */
export function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** MurmurHash3 x86_32 of `bytes[start, end)` with `seed`; returns an unsigned 32-bit integer. */
export function murmur3(bytes: Uint8Array, seed = 0, start = 0, end = bytes.length): number {
  let h = seed >>> 0;
  const len = end - start;
  const blockEnd = start + (len & ~3);
  let i = start;
  for (; i < blockEnd; i += 4) {
    // murmur3Round written out: calling it here costs ~7% on 4 KB prompt prefixes (Node 20).
    let k = bytes[i]! | (bytes[i + 1]! << 8) | (bytes[i + 2]! << 16) | (bytes[i + 3]! << 24);
    k = Math.imul(k, C1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, C2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  let k = 0;
  switch (len & 3) {
    case 3:
      k ^= bytes[i + 2]! << 16;
    // falls through
    case 2:
      k ^= bytes[i + 1]! << 8;
    // falls through
    case 1:
      k ^= bytes[i]!;
      k = Math.imul(k, C1);
      k = (k << 15) | (k >>> 17);
      k = Math.imul(k, C2);
      h ^= k;
  }
  return fmix32(h ^ len);
}

const encoder = new TextEncoder();
let scratch = new Uint8Array(256);

/**
 * MurmurHash3 of an ASCII string read straight from its char codes (for ASCII, the UTF-8 bytes
 * are the code units), or -1 when a code unit is ≥ 0x80. Skips TextEncoder, whose call costs
 * more than hashing a 32-character session id (scripts/bench-core.ts).
 */
function hashAscii(s: string, seed: number): number {
  let h = seed >>> 0;
  const len = s.length;
  const blockEnd = len & ~3;
  let i = 0;
  for (; i < blockEnd; i += 4) {
    const c0 = s.charCodeAt(i);
    const c1 = s.charCodeAt(i + 1);
    const c2 = s.charCodeAt(i + 2);
    const c3 = s.charCodeAt(i + 3);
    if ((c0 | c1 | c2 | c3) >= 0x80) return -1;
    let k = c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
    k = Math.imul(k, C1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, C2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  let k = 0;
  switch (len & 3) {
    case 3: {
      const c = s.charCodeAt(i + 2);
      if (c >= 0x80) return -1;
      k ^= c << 16;
    }
    // falls through
    case 2: {
      const c = s.charCodeAt(i + 1);
      if (c >= 0x80) return -1;
      k ^= c << 8;
    }
    // falls through
    case 1: {
      const c = s.charCodeAt(i);
      if (c >= 0x80) return -1;
      k ^= c;
      k = Math.imul(k, C1);
      k = (k << 15) | (k >>> 17);
      k = Math.imul(k, C2);
      h ^= k;
    }
  }
  return fmix32(h ^ len);
}

/** UTF-8 encode `s` (lone surrogates become U+FFFD, as TextEncoder does) and hash it. */
export function hashString(s: string, seed = 0): number {
  if (s.length <= 1024) {
    const h = hashAscii(s, seed);
    if (h >= 0) return h;
  }
  // Worst case 3 bytes per UTF-16 code unit; reuse one buffer to keep the hot path allocation-free.
  if (s.length * 3 > scratch.length) scratch = new Uint8Array(Math.max(s.length * 3, scratch.length * 2));
  const { written } = encoder.encodeInto(s, scratch);
  return murmur3(scratch, seed, 0, written);
}

/** UTF-8 bytes of `s`. */
export function utf8(s: string): Uint8Array {
  return encoder.encode(s);
}

/** Lower-case 8-digit hex of a 32-bit hash, for logs and labels. */
export function hex32(h: number): string {
  return (h >>> 0).toString(16).padStart(8, '0');
}
