// MurmurHash3 x86_32: published vectors, plus a cross-check against an independent port of
// Appleby's reference C (smhasher/src/MurmurHash3.cpp, MurmurHash3_x86_32) over a Buffer.
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../../../src/core/random.js';
import { fmix32, hashString, hex32, murmur3, murmur3Round, utf8 } from '../../../src/core/hash.js';

/** Straight port of MurmurHash3_x86_32 from Appleby's C, deliberately written differently from src/core. */
function referenceMurmur3(data: Buffer, seed: number): number {
  const rotl32 = (x: number, r: number) => ((x << r) | (x >>> (32 - r))) >>> 0;
  const mul32 = (a: number, b: number) => Number((BigInt(a >>> 0) * BigInt(b >>> 0)) & 0xffffffffn);
  const fmix32 = (h: number) => {
    h = (h ^ (h >>> 16)) >>> 0;
    h = mul32(h, 0x85ebca6b);
    h = (h ^ (h >>> 13)) >>> 0;
    h = mul32(h, 0xc2b2ae35);
    h = (h ^ (h >>> 16)) >>> 0;
    return h;
  };
  const len = data.length;
  const nblocks = Math.floor(len / 4);
  let h1 = seed >>> 0;
  const c1 = 0xcc9e2d51;
  const c2 = 0x1b873593;
  for (let i = 0; i < nblocks; i++) {
    let k1 = data.readUInt32LE(i * 4);
    k1 = mul32(k1, c1);
    k1 = rotl32(k1, 15);
    k1 = mul32(k1, c2);
    h1 = (h1 ^ k1) >>> 0;
    h1 = rotl32(h1, 13);
    h1 = (mul32(h1, 5) + 0xe6546b64) >>> 0;
  }
  const tail = nblocks * 4;
  let k1 = 0;
  const rem = len & 3;
  if (rem >= 3) k1 = (k1 ^ (data[tail + 2]! << 16)) >>> 0;
  if (rem >= 2) k1 = (k1 ^ (data[tail + 1]! << 8)) >>> 0;
  if (rem >= 1) {
    k1 = (k1 ^ data[tail]!) >>> 0;
    k1 = mul32(k1, c1);
    k1 = rotl32(k1, 15);
    k1 = mul32(k1, c2);
    h1 = (h1 ^ k1) >>> 0;
  }
  h1 = (h1 ^ len) >>> 0;
  return fmix32(h1);
}

// Byte vectors from the SMHasher verification set as tabulated by Ian Boyd
// (stackoverflow.com/a/31929528), and string vectors from the same answer; the same values
// appear in Guava's Murmur3_32HashFunctionTest and Python mmh3's tests.
const BYTE_VECTORS: [number[], number, number][] = [
  [[], 0, 0],
  [[], 1, 0x514e28b7],
  [[], 0xffffffff, 0x81f16f39],
  [[0xff, 0xff, 0xff, 0xff], 0, 0x76293b50],
  [[0x21, 0x43, 0x65, 0x87], 0, 0xf55b516b],
  [[0x21, 0x43, 0x65, 0x87], 0x5082edee, 0x2362f9de],
  [[0x21, 0x43, 0x65], 0, 0x7e4a8634],
  [[0x21, 0x43], 0, 0xa0f7b07a],
  [[0x21], 0, 0x72661cf4],
  [[0, 0, 0, 0], 0, 0x2362f9de],
  [[0, 0, 0], 0, 0x85f0b427],
  [[0, 0], 0, 0x30f4c306],
  [[0], 0, 0x514e28b7],
];

const STRING_VECTORS: [string, number, number][] = [
  ['', 0, 0],
  ['', 1, 0x514e28b7],
  ['', 0xffffffff, 0x81f16f39],
  ['\0\0\0\0', 0, 0x2362f9de],
  ['aaaa', 0x9747b28c, 0x5a97808a],
  ['aaa', 0x9747b28c, 0x283e0130],
  ['aa', 0x9747b28c, 0x5d211726],
  ['a', 0x9747b28c, 0x7fa09ea6],
  ['abcd', 0x9747b28c, 0xf0478627],
  ['abc', 0x9747b28c, 0xc84a62dd],
  ['ab', 0x9747b28c, 0x74875592],
  ['Hello, world!', 0x9747b28c, 0x24884cba],
  ['ππππππππ', 0x9747b28c, 0xd58063c1],
  ['The quick brown fox jumps over the lazy dog', 0x9747b28c, 0x2fa826cd],
];

describe('murmur3 (x86_32)', () => {
  it.each(BYTE_VECTORS.map(([b, s, e]) => [Buffer.from(b).toString('hex') || '(empty)', s, e, b] as const))(
    'bytes %s seed %i',
    (_label, seed, expected, bytes) => {
      expect(hex32(murmur3(Uint8Array.from(bytes), seed))).toBe(hex32(expected));
      expect(hex32(referenceMurmur3(Buffer.from(bytes), seed))).toBe(hex32(expected));
    },
  );

  it.each(STRING_VECTORS)('string %j seed %i', (s, seed, expected) => {
    expect(hex32(hashString(s, seed))).toBe(hex32(expected));
    expect(hex32(murmur3(utf8(s), seed))).toBe(hex32(expected));
    expect(hex32(referenceMurmur3(Buffer.from(s, 'utf8'), seed))).toBe(hex32(expected));
  });

  it('agrees with the reference port on random bytes of every length 0..64 and random seeds', () => {
    const rnd = seededRandom(0xc0ffee);
    let checked = 0;
    for (let len = 0; len <= 64; len++) {
      for (let n = 0; n < 60; n++) {
        const buf = Buffer.alloc(len);
        for (let i = 0; i < len; i++) buf[i] = Math.floor(rnd() * 256);
        const seed = n === 0 ? 0 : Math.floor(rnd() * 2 ** 32);
        const got = murmur3(new Uint8Array(buf.buffer, buf.byteOffset, buf.length), seed);
        if (got !== referenceMurmur3(buf, seed)) throw new Error(`mismatch at len ${len} seed ${seed} bytes ${buf.toString('hex')}`);
        checked++;
      }
    }
    expect(checked).toBe(65 * 60);
  });

  it('hashes a sub-range [start, end) exactly like a copy of those bytes', () => {
    const rnd = seededRandom(7);
    const big = new Uint8Array(200);
    for (let i = 0; i < big.length; i++) big[i] = Math.floor(rnd() * 256);
    for (let n = 0; n < 500; n++) {
      const start = Math.floor(rnd() * 100);
      const end = start + Math.floor(rnd() * 100);
      const seed = Math.floor(rnd() * 2 ** 32);
      expect(murmur3(big, seed, start, end)).toBe(referenceMurmur3(Buffer.from(big.subarray(start, end)), seed));
    }
  });

  it('murmur3Round and fmix32 (the word-level pieces the simulator uses) compose to murmur3', () => {
    const rnd = seededRandom(99);
    for (let n = 0; n < 500; n++) {
      const words = Array.from({ length: 1 + Math.floor(rnd() * 4) }, () => Math.floor(rnd() * 2 ** 32));
      const seed = Math.floor(rnd() * 2 ** 32);
      const buf = Buffer.alloc(words.length * 4);
      words.forEach((w, i) => buf.writeUInt32LE(w, i * 4));
      const h = words.reduce((acc, w) => murmur3Round(acc, w), seed);
      expect(fmix32(h ^ buf.length)).toBe(referenceMurmur3(buf, seed));
    }
  });

  it('returns unsigned 32-bit integers', () => {
    for (let i = 0; i < 1000; i++) {
      const h = hashString(`k${i}`);
      expect(Number.isInteger(h) && h >= 0 && h <= 0xffffffff).toBe(true);
    }
  });
});

describe('hashString', () => {
  it('hashes the UTF-8 bytes of random strings (BMP, astral, ASCII) like the reference', () => {
    const rnd = seededRandom(42);
    const pools = [
      () => String.fromCharCode(0x20 + Math.floor(rnd() * 95)),
      () => String.fromCharCode(0xa0 + Math.floor(rnd() * 0x700)),
      () => String.fromCharCode(0x3000 + Math.floor(rnd() * 0x5000)),
      () => String.fromCodePoint(0x1f300 + Math.floor(rnd() * 0x300)),
    ];
    for (let n = 0; n < 3000; n++) {
      const len = Math.floor(rnd() * 65);
      let s = '';
      for (let i = 0; i < len; i++) s += pools[Math.floor(rnd() * pools.length)]!();
      const seed = Math.floor(rnd() * 2 ** 32);
      const want = referenceMurmur3(Buffer.from(s, 'utf8'), seed);
      if (hashString(s, seed) !== want) throw new Error(`mismatch for ${JSON.stringify(s)} seed ${seed}`);
    }
  });

  it('encodes lone surrogates as U+FFFD', () => {
    const replacement = referenceMurmur3(Buffer.from([0x61, 0xef, 0xbf, 0xbd, 0x62]), 0);
    expect(hashString('a\ud800b')).toBe(replacement);
    expect(hashString('a\udc00b')).toBe(replacement);
    expect(hashString('a\ufffdb')).toBe(replacement);
    // A well-formed pair is one 4-byte code point, not two replacements.
    expect(hashString('a\ud83d\ude00b')).toBe(referenceMurmur3(Buffer.from('a😀b', 'utf8'), 0));
    expect(hashString('a\ud83d\ude00b')).not.toBe(hashString('a\ufffd\ufffdb'));
  });

  it('is unaffected by a previous longer input (scratch buffer reuse) and handles very long strings', () => {
    const long = 'x'.repeat(10_000) + 'π'.repeat(5_000);
    expect(hashString(long)).toBe(referenceMurmur3(Buffer.from(long, 'utf8'), 0));
    expect(hashString('abc', 0x9747b28c)).toBe(0xc84a62dd);
    expect(hashString('ππππππππ', 0x9747b28c)).toBe(0xd58063c1);
  });

  it('hex32 pads to 8 lower-case digits', () => {
    expect(hex32(0)).toBe('00000000');
    expect(hex32(0xabc)).toBe('00000abc');
    expect(hex32(-1)).toBe('ffffffff');
  });
});
