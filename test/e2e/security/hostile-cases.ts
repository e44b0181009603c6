// The hostile-input table: every request here must get a 4xx and reach no replica (admin cases
// also change no pool). Shared by hostile-inputs.test.ts (which runs and counts them) and
// secrets.test.ts (which replays them all and scans the answers and logs for secrets).

import { createHash } from 'node:crypto';

import type { RawRequest, RawResponse } from '../../helpers/security-rig.js';
import { MODEL, OTHER_MODEL, POOL } from '../../helpers/security-rig.js';

export interface CaseContext {
  acmeKey: string;
  globexKey: string;
  adminToken: string;
  originKey: string;
  bodyTimeoutMs: number;
  /** The router's own port on 127.0.0.1: a replica there would be the router itself. */
  routerPort?: number;
}

export interface HostileCase {
  category: string;
  name: string;
  request: RawRequest;
  /** Allowed statuses (all 4xx). */
  expect: number[];
  /** Also check that no pool's replica set changed. */
  admin?: boolean;
  /** The answer's body must contain this (to prove which check refused it). */
  bodyIncludes?: string;
  /** A slow-body case: the answer must come between these many milliseconds after the start (the upper one is the socket's wait). */
  withinMs?: [number, number];
}

const enc = (s: string) => Buffer.from(s, 'utf8');
const json = 'application/json';
const MiB = 1024 * 1024;

export function hostileCases(x: CaseContext): HostileCase[] {
  const out: HostileCase[] = [];
  const add = (category: string, name: string, request: RawRequest, expect: number | number[], more: Partial<HostileCase> = {}) =>
    out.push({ category, name, request, expect: Array.isArray(expect) ? expect : [expect], ...more });

  const tenant = (key = x.acmeKey): [string, string][] => [
    ['Authorization', `Bearer ${key}`],
    ['Content-Type', json],
  ];
  const chat = (body: string | Uint8Array, headers: [string, string][] = [], key?: string): RawRequest => ({ headers: [...tenant(key), ...headers], body });
  const okChat = (extra = '') => `{"model":"${MODEL}","max_tokens":2${extra},"messages":[{"role":"user","content":"hi"}]}`;
  const withContent = (bytes: Uint8Array) => Buffer.concat([enc(`{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":"a`), bytes, enc('z"}]}')]);
  const admin = (method: string, path: string, body?: string, headers: [string, string][] = []): RawRequest => ({
    method,
    path,
    headers: [['Authorization', `Bearer ${x.adminToken}`], ...(body === undefined ? [] : ([['Content-Type', json]] as [string, string][])), ...headers],
    body,
  });
  const goodReplica = '{"url":"https://replica.example.com","auth":"none"}';

  // ---- malformed JSON ----------------------------------------------------------------------------
  const C1 = 'malformed JSON';
  add(C1, 'truncated object', chat(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi"`), 400);
  add(C1, 'truncated inside a string', chat(`{"model":"${MODEL}","messages":[{"role":"user","content":"h`), 400);
  add(C1, 'trailing garbage', chat(okChat() + 'xyz'), 400);
  add(C1, 'two objects back to back', chat(okChat() + okChat()), 400);
  add(C1, 'BOM then garbage', chat(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), enc('garbage')])), 400);
  add(C1, 'NaN literal', chat(okChat(',"temperature":NaN')), 400);
  add(C1, 'Infinity literal', chat(okChat(',"temperature":Infinity')), 400);
  add(C1, '-Infinity literal', chat(okChat(',"temperature":-Infinity')), 400);
  add(C1, 'single quotes', chat(`{'model':'${MODEL}','messages':[]}`), 400);
  add(C1, 'trailing comma', chat(okChat(',')), 400);
  add(C1, 'comment', chat(`{/* x */"model":"${MODEL}","messages":[{"role":"user","content":"hi"}]}`), 400);
  add(C1, 'unquoted key', chat(`{model:"${MODEL}","messages":[{"role":"user","content":"hi"}]}`), 400);
  add(C1, 'raw newline inside a string', chat(`{"model":"${MODEL}","messages":[{"role":"user","content":"a\nb"}]}`), 400);
  add(C1, 'hex number', chat(okChat(',"seed":0x10')), 400);
  add(C1, 'empty body', chat(''), 400);
  add(C1, 'whitespace only', chat(' \r\n\t '), 400);
  // Duplicate keys are valid JSON; the last one wins and is all the origin ever sees (the router
  // re-serialises what it validated), so the check below is on the value that counts.
  add(C1, 'duplicate "model": the last one names a pool the tenant may not use', chat(`{"model":"${MODEL}","model":"${OTHER_MODEL}","messages":[{"role":"user","content":"hi"}]}`, [], x.globexKey), 404);
  add(C1, '__proto__ smuggling the model', chat(`{"__proto__":{"model":"${MODEL}"},"messages":[{"role":"user","content":"hi"}]}`), 400);
  add(C1, 'UTF-16LE with a BOM', chat(Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(okChat(), 'utf16le')])), 400);
  add(C1, 'gzip bytes with Content-Encoding: gzip', chat(Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xab, 0xae, 0x05, 0x00]), [['Content-Encoding', 'gzip']]), 400);

  // ---- nesting ---------------------------------------------------------------------------------
  const C2 = 'deep nesting';
  // Innermost value `1`, so each body is valid JSON apart from its depth; the answer must say so.
  const nest = (open: string, close: string, n: number) => chat(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"x":${open.repeat(n)}1${close.repeat(n)}}`);
  const depth = { bodyIncludes: 'nesting' };
  add(C2, 'arrays 65 levels', nest('[', ']', 64), 400, depth);
  add(C2, 'objects 65 levels', nest('{"a":', '}', 64), 400, depth);
  add(C2, 'mixed arrays/objects 66 levels', nest('[{"a":', '}]', 33), 400, depth);
  add(C2, 'arrays 100k levels', nest('[', ']', 100_000), 400, depth);
  add(C2, 'objects 100k levels', nest('{"a":', '}', 100_000), 400, depth);
  add(C2, 'unbalanced 100k opening brackets', chat('['.repeat(100_000)), 400, depth);

  // ---- numbers and sizes ---------------------------------------------------------------------------
  const C3 = 'huge numbers and strings';
  const range = { bodyIncludes: 'out of range' };
  add(C3, 'max_tokens 1e400', chat(okChat().replace('"max_tokens":2', '"max_tokens":1e400')), 400, range);
  add(C3, 'max_tokens -1e400', chat(okChat().replace('"max_tokens":2', '"max_tokens":-1e400')), 400, range);
  add(C3, 'max_tokens 2^64', chat(okChat().replace('"max_tokens":2', `"max_tokens":${2n ** 64n}`)), 400);
  add(C3, 'max_tokens with 400 digits', chat(okChat().replace('"max_tokens":2', `"max_tokens":1${'0'.repeat(400)}`)), 400);
  add(C3, 'temperature 1e400 (an unknown field would be forwarded as null)', chat(okChat(',"temperature":1e400')), 400, range);
  add(C3, '1e400 deep in a message field', chat(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi","weight":[1,2,1e400]}]}`), 400, range);
  add(C3, 'prompt token id 2^64', { ...chat(`{"model":"${MODEL}","prompt":[1,2,${2n ** 64n}]}`), path: '/v1/completions' }, 400);
  const big = 'x'.repeat(3 * MiB);
  add(C3, '3 MiB content (Content-Length)', chat(`{"model":"${MODEL}","messages":[{"role":"user","content":"${big}"}]}`), 413);
  add(C3, '3 MiB prompt, chunked (no Content-Length)', {
    path: '/v1/completions',
    headers: [...tenant(), ['Transfer-Encoding', 'chunked']],
    body: Buffer.concat([enc(((3 * MiB + 40).toString(16)) + '\r\n'), enc(`{"model":"${MODEL}","prompt":"${big}"}`.padEnd(3 * MiB + 40, ' ')), enc('\r\n0\r\n\r\n')]),
  }, 413);
  add(C3, 'Content-Length of 10^20', { headers: [...tenant(), ['Content-Length', '99999999999999999999']], body: okChat() }, 413);

  // ---- invalid UTF-8 -------------------------------------------------------------------------------
  const C4 = 'invalid UTF-8';
  const utf8 = (name: string, bytes: number[]) => add(C4, name, chat(withContent(Buffer.from(bytes))), 400);
  utf8('overlong "/" (C0 AF)', [0xc0, 0xaf]);
  utf8('overlong NUL (C0 80)', [0xc0, 0x80]);
  utf8('overlong 3-byte "/" (E0 80 AF)', [0xe0, 0x80, 0xaf]);
  utf8('overlong 4-byte (F0 80 80 AF)', [0xf0, 0x80, 0x80, 0xaf]);
  utf8('lone continuation byte (80)', [0x80]);
  utf8('two continuation bytes (BF BF)', [0xbf, 0xbf]);
  utf8('UTF-8-encoded high surrogate (ED A0 80)', [0xed, 0xa0, 0x80]);
  utf8('CESU-8 surrogate pair (ED A0 BD ED B2 A9)', [0xed, 0xa0, 0xbd, 0xed, 0xb2, 0xa9]);
  utf8('truncated 3-byte sequence (E2 82)', [0xe2, 0x82]);
  utf8('above U+10FFFF (F4 90 80 80)', [0xf4, 0x90, 0x80, 0x80]);
  utf8('5-byte form (F8 88 80 80 80)', [0xf8, 0x88, 0x80, 0x80, 0x80]);
  utf8('FE and FF bytes', [0xfe, 0xff]);

  // ---- header injection and malformed headers (the runtime's parser) --------------------------------
  const C5 = 'header injection';
  add(C5, 'NUL in a header value', chat(okChat(), [['X-Session-Id', 'abc\0X-Evil: 1']]), 400);
  add(C5, 'CR before CRLF in a value', chat(okChat(), [['X-Session-Id', 'abc\r']]), 400);
  // DEL and C0 bytes pass workerd's parser: the router refuses them in x-session-id itself (its
  // value goes upstream only as an HMAC, so no origin parser sees them any more).
  add(C5, 'DEL in a header value', chat(okChat(), [['X-Session-Id', 'abc\x7fdef']]), 400);
  add(C5, 'control byte 0x01 in a header value', chat(okChat(), [['X-Session-Id', 'abc\x01def']]), 400);
  add(C5, 'LF inside a header name', chat(okChat(), [['X-Ses\nsion-Id', 'abc']]), 400);
  add(C5, 'header line without a colon', chat(okChat(), [['X-Weird\r\nBroken', 'x']]), 400);
  add(C5, 'CR/LF in the request target', { ...chat(okChat()), path: '/v1/chat/completions\r\nX-Evil: 1' }, 400);
  add(C5, 'Content-Length and Transfer-Encoding together (smuggling)', { headers: [...tenant(), ['Transfer-Encoding', 'chunked'], ['Content-Length', '5']], body: '0\r\n\r\n' + okChat() }, 400);
  add(C5, 'two Authorization headers (two tenants)', { headers: [['Authorization', `Bearer ${x.globexKey}`], ['Authorization', `Bearer ${x.acmeKey}`], ['Content-Type', json]], body: okChat() }, 401);

  // ---- oversized headers -----------------------------------------------------------------------------
  const C6 = 'oversized headers';
  add(C6, 'one 64 KiB header', chat(okChat(), [['X-Big', 'a'.repeat(64 * 1024)]]), [400, 413, 431]);
  add(C6, 'one 200 KiB header', chat(okChat(), [['X-Big', 'a'.repeat(200 * 1024)]]), [400, 413, 431]);
  add(C6, '64 KiB x-session-id (a forwarded header)', chat(okChat(), [['X-Session-Id', 's'.repeat(64 * 1024)]]), [400, 413, 431]);
  add(C6, '1000 headers of 100 bytes', chat(okChat(), Array.from({ length: 1000 }, (_, i): [string, string] => [`X-H${i}`, 'v'.repeat(100)])), [400, 413, 431]);
  add(C6, '40 KiB cookie', chat(okChat(), [['Cookie', `a=${'c'.repeat(40 * 1024)}`]]), [400, 413, 431]);

  // ---- slow and never-ending bodies ---------------------------------------------------------------------
  const C7 = 'slow bodies';
  const t = x.bodyTimeoutMs;
  // Not before the timeout; after it, only as soon as a loaded machine manages: the socket waits
  // t + 8 s, still short of the trickles' 10 s (40 × 250 ms), so a timer that each byte restarted
  // would not have answered by then, and a slow answer is no failure.
  const within: [number, number] = [t - 100, t + 8_000];
  const slow = (r: RawRequest): RawRequest => ({ ...r, timeoutMs: t + 8_000 });
  add(C7, 'Content-Length 100, 8 bytes, then nothing', slow({ headers: [...tenant(), ['Content-Length', '100']], body: '{"model"' }), 408, { withinMs: within });
  add(C7, 'Content-Length 100, headers only', slow({ headers: [...tenant(), ['Content-Length', '100']] }), 408, { withinMs: within });
  add(C7, 'chunked, one chunk, never ends', slow({ headers: [...tenant(), ['Transfer-Encoding', 'chunked']], body: '8\r\n{"model"\r\n' }), 408, { withinMs: within });
  add(C7, 'chunked, one byte every 250 ms forever', slow({ headers: [...tenant(), ['Transfer-Encoding', 'chunked']], body: '1\r\n{\r\n', trickle: Array.from({ length: 40 }, () => ({ delayMs: 250, data: '1\r\n \r\n' })) }), 408, { withinMs: within });
  add(C7, 'Content-Length 100000, one byte every 250 ms', slow({ headers: [...tenant(), ['Content-Length', '100000']], body: '{', trickle: Array.from({ length: 40 }, () => ({ delayMs: 250, data: ' ' })) }), 408, { withinMs: within });
  add(C7, 'admin PUT with a stalled body', slow({ ...admin('PUT', `/admin/pools/${POOL}/replicas/slow1`), headers: [['Authorization', `Bearer ${x.adminToken}`], ['Content-Type', json], ['Content-Length', '200']], body: '{"url":' }), 408, { withinMs: within, admin: true });
  add(C7, 'dashboard login with a stalled body', slow({ path: '/dashboard/login', headers: [['Content-Type', 'application/x-www-form-urlencoded'], ['Content-Length', '200']], body: 'token=' }), 408, { withinMs: within });

  // ---- path tricks in admin ids ---------------------------------------------------------------------
  const C8 = 'admin id tricks';
  const putReplica = (id: string, pool = POOL) => admin('PUT', `/admin/pools/${pool}/replicas/${id}`, goodReplica);
  const ids: [string, string][] = [
    ['..', '..'],
    ['%2e%2e', '%2e%2e'],
    ['%2E%2E/x (dot segments then a name)', '%2E%2E/x'],
    ['. (single dot)', '.'],
    ['a%2Fb (encoded slash)', 'a%2Fb'],
    ['..%2F..%2Fbatch', '..%2F..%2Fbatch'],
    ['..\\evil (backslash)', '..\\evil'],
    ['%5C..%5Cevil (encoded backslash)', '%5C..%5Cevil'],
    ['r1%00 (NUL)', 'r1%00'],
    ['%00 alone', '%00'],
    ['raw UTF-8 é', Buffer.from('ré', 'utf8').toString('latin1')],
    ['percent-encoded é', 'r%C3%A9'],
    ['fullwidth letters', '%EF%BD%92%EF%BC%91'],
    ['300 characters', 'r'.repeat(300)],
    ['; parameter', 'r1;jsessionid=x'],
    ['%3B parameter', 'r1%3Bx'],
    ['double-encoded dots %252e%252e', '%252e%252e'],
    ['leading dot', '.hidden'],
    ['trailing %20', 'r1%20'],
    ['%0d%0a in the id', 'r1%0d%0aX-Evil:1'],
  ];
  for (const [name, id] of ids) add(C8, `replica id: ${name}`, putReplica(id), [400, 404], { admin: true });
  add(C8, 'pool id ..%2Fbatch', putReplica('r9', '..%2Fbatch'), [400, 404], { admin: true });
  add(C8, 'pool id of 300 characters', putReplica('r9', 'p'.repeat(300)), [400, 404], { admin: true });
  add(C8, 'DELETE replica %2e%2e (would be the pool itself)', admin('DELETE', `/admin/pools/${POOL}/replicas/%2e%2e`), [400, 404, 405], { admin: true });
  add(C8, 'DELETE replica r1%00', admin('DELETE', `/admin/pools/${POOL}/replicas/r1%00`), [400, 404], { admin: true });
  add(C8, 'PATCH replica r1;x', admin('PATCH', `/admin/pools/${POOL}/replicas/r1;x`, '{"draining":true}'), [400, 404], { admin: true });
  add(C8, 'tenant id ..%2Fkeys', admin('PUT', '/admin/tenants/..%2Fkeys', '{"pools":["*"]}'), [400, 404], { admin: true });

  // ---- replica URLs ------------------------------------------------------------------------------
  const C9 = 'replica URL';
  const urls: string[] = [
    'http://169.254.169.254/',
    'https://169.254.169.254/',
    'https://169.254.169.254./',
    'https://[fe80::1]/',
    'https://[fe90::1]/',
    'https://metadata.google.internal/',
    'https://metadata.google.internal./',
    'https://metadata/',
    'https://169.254.170.2/',
    'https://[fd00:ec2::254]/',
    'https://10.0.0.1/',
    'https://172.16.0.1/',
    'https://172.31.255.254/',
    'https://192.168.1.1/',
    'https://100.64.0.1/',
    'https://100.100.100.200/',
    'https://0.0.0.0/',
    'https://[::]/',
    'https://224.0.0.1/',
    'https://[::ffff:10.0.0.1]/',
    'https://[::ffff:169.254.169.254]/',
    'https://[::a9fe:a9fe]/',
    'https://[64:ff9b::a9fe:a9fe]/',
    'http://2130706433/',
    'http://0x7f.1/',
    'http://0177.0.0.1/',
    'http://127.1/',
    'http://127.0.0.1.nip.io/',
    'https://127.0.0.1.nip.io.local/',
    'https://0xA9FEA9FE/',
    'https://0251.0376.0251.0376/',
    'https://169.254.43518/',
    'https://\uff11\uff16\uff19.\uff12\uff15\uff14.\uff11\uff16\uff19.\uff12\uff15\uff14/',
    'http://example.com/',
    'ftp://example.com/',
    'file:///etc/passwd',
    'javascript:alert(1)',
    'data:text/plain,hi',
    'ws://example.com/',
    'https://user:pass@replica.example.com/',
    'https://user@replica.example.com/',
    'https://@replica.example.com/',
    'https://replica.example.com@10.0.0.1/',
    'https://replica.example.com/?token=x',
    'https://replica.example.com/#x',
    '//replica.example.com/',
    'not a url',
  ];
  for (const u of urls) add(C9, `url ${JSON.stringify(u)}`, admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: u, auth: 'none' })), 400, { admin: true });
  add(C9, 'auth naming the admin token (it would be sent to the replica)', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: 'https://replica.example.com', auth: 'bearer:ADMIN_TOKEN' })), 400, { admin: true });
  add(C9, 'auth naming TENANT_KEYS', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: 'https://replica.example.com', auth: 'headers:TENANT_KEYS' })), 400, { admin: true });
  add(C9, 'auth naming an unknown secret', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: 'https://replica.example.com', auth: 'bearer:NO_SUCH_SECRET' })), 400, { admin: true });
  add(C9, 'auth with a line break', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: 'https://replica.example.com', auth: 'bearer:ORIGIN_API_KEY\nX-Evil' })), 400, { admin: true });

  // ---- issue #15: replica URLs, auth references, engine bounds --------------------------------------------
  const C15 = 'tenant isolation and origin hardening';
  const newUrls: [string, string][] = [
    ['benchmarking range 198.18.0.0/15', 'https://198.18.0.1/'],
    ['benchmarking range, upper half', 'https://198.19.255.254/'],
    ['documentation range 192.0.2.0/24', 'https://192.0.2.10/'],
    ['6to4 form of the metadata address', 'https://[2002:a9fe:a9fe::1]/'],
    ['6to4 form of 10.0.0.1', 'https://[2002:a00:1::]/'],
    ['6to4 form of loopback', 'https://[2002:7f00:1::]/'],
    ['NAT64 form of 10.0.0.1', 'https://[64:ff9b::10.0.0.1]/'],
    ['IPv4-mapped benchmarking address', 'https://[::ffff:198.18.0.1]/'],
    ['IPv6 documentation range', 'https://[2001:db8::1]/'],
    ['Teredo', 'https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/'],
    ['backslash before @ (parsers disagree on the host)', 'https://replica.example.com\\@169.254.169.254/'],
    ['backslash in the path', 'https://replica.example.com/v1\\..\\admin'],
    ['userinfo after a path-like prefix', 'https://replica.example.com%2F@10.0.0.1/'],
  ];
  if (x.routerPort) newUrls.push(['the router itself', `http://127.0.0.1:${x.routerPort}/`]);
  for (const [name, u] of newUrls) add(C15, `replica url: ${name}`, admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: u, auth: 'none' })), 400, { admin: true });
  const goodUrl = 'https://replica.example.com';
  add(C15, 'auth reference of the wrong kind for the pool (headers: instead of bearer:)', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: goodUrl, auth: 'headers:ORIGIN_API_KEY' })), 400, { admin: true, bodyIncludes: 'bearer:ORIGIN_API_KEY' });
  add(C15, 'auth reference to a secret declared for no pool', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: goodUrl, auth: 'bearer:SPARE_ORIGIN_KEY' })), 400, { admin: true, bodyIncludes: 'authRefs' });
  add(C15, 'auth reference to CACHE_SALT_KEY', admin('PUT', `/admin/pools/${POOL}/replicas/evil`, JSON.stringify({ url: goodUrl, auth: 'bearer:CACHE_SALT_KEY' })), 400, { admin: true });
  add(C15, 'auth reference of another pool on an existing replica (PUT r1)', admin('PUT', `/admin/pools/${POOL}/replicas/r1`, JSON.stringify({ url: goodUrl, auth: 'bearer:SPARE_ORIGIN_KEY' })), 400, { admin: true });
  const bound = (field: string, value: number) => chat(`{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"${field}":${value}}`.replace(`"max_tokens":2,`, field.startsWith('max_') ? '' : '"max_tokens":2,'));
  add(C15, 'n above the pool\'s maxN (8)', bound('n', 9), 400, { bodyIncludes: "Invalid 'n'" });
  add(C15, 'n of a million', bound('n', 1_000_000), 400, { bodyIncludes: "Invalid 'n'" });
  add(C15, 'best_of above maxBestOf (8)', bound('best_of', 64), 400, { bodyIncludes: "Invalid 'best_of'" });
  add(C15, 'max_tokens above maxOutputTokens (32768)', bound('max_tokens', 1_000_000), 400, { bodyIncludes: "Invalid 'max_tokens'" });
  add(C15, 'max_completion_tokens above maxOutputTokens', bound('max_completion_tokens', 40_000), 400, { bodyIncludes: "Invalid 'max_completion_tokens'" });
  add(C15, 'min_tokens above maxOutputTokens', bound('min_tokens', 40_000), 400, { bodyIncludes: "Invalid 'min_tokens'" });
  add(C15, 'a completion asking for n above maxN', { ...chat(`{"model":"${MODEL}","max_tokens":2,"prompt":"hi","n":50}`), path: '/v1/completions' }, 400, { bodyIncludes: "Invalid 'n'" });

  // ---- credentials in the wrong place ----------------------------------------------------------------
  const C10 = 'admin token';
  const q = encodeURIComponent(x.adminToken);
  add(C10, 'GET /admin/pools?token= with a valid header', admin('GET', `/admin/pools?token=${q}`), 400);
  add(C10, '?access_token=', admin('GET', `/admin/pools?access_token=${q}`), 400);
  add(C10, '?TOKEN= (upper case)', admin('GET', `/admin/pools?TOKEN=${q}`), 400);
  add(C10, '?x=<admin token> (any parameter)', admin('GET', `/admin/pools?x=${q}`), 400);
  add(C10, 'PUT a replica with ?token=', admin('PUT', `/admin/pools/${POOL}/replicas/evil?token=${q}`, goodReplica), 400, { admin: true });
  add(C10, '/metrics?token=', admin('GET', `/metrics?token=${q}`), 400);
  add(C10, '/dashboard?token=', { method: 'GET', path: `/dashboard?token=${q}` }, 400);
  add(C10, 'tenant key on the admin API', { method: 'GET', path: '/admin/pools', headers: [['Authorization', `Bearer ${x.acmeKey}`]] }, 401);
  add(C10, 'origin key on the admin API', { method: 'GET', path: '/admin/pools', headers: [['Authorization', `Bearer ${x.originKey}`]] }, 401);
  add(C10, 'admin token with Basic', { method: 'GET', path: '/admin/pools', headers: [['Authorization', `Basic ${Buffer.from(`admin:${x.adminToken}`).toString('base64')}`]] }, 401);
  add(C10, 'admin token plus one character', { method: 'GET', path: '/admin/pools', headers: [['Authorization', `Bearer ${x.adminToken}x`]] }, 401);
  add(C10, 'first half of the admin token', { method: 'GET', path: '/admin/pools', headers: [['Authorization', `Bearer ${x.adminToken.slice(0, x.adminToken.length >> 1)}`]] }, 401);
  add(C10, 'admin token as x-admin-token', { method: 'GET', path: '/admin/pools', headers: [['X-Admin-Token', x.adminToken]] }, 401);

  // ---- tenant keys ------------------------------------------------------------------------------------
  const C11 = 'tenant auth';
  add(C11, 'no Authorization', { headers: [['Content-Type', json]], body: okChat() }, 401);
  add(C11, 'empty bearer', chat(okChat(), [], ''), 401);
  add(C11, 'admin token as a tenant key', chat(okChat(), [], x.adminToken), 401);
  add(C11, 'origin key as a tenant key', chat(okChat(), [], x.originKey), 401);
  add(C11, 'SHA-256 of a tenant key (what TENANT_KEYS stores)', chat(okChat(), [], createHash('sha256').update(x.acmeKey).digest('hex')), 401);
  add(C11, 'a tenant key with its last character changed', chat(okChat(), [], x.acmeKey.slice(0, -1) + (x.acmeKey.endsWith('A') ? 'B' : 'A')), 401);
  add(C11, '600-character key', chat(okChat(), [], 'k'.repeat(600)), 401);
  add(C11, 'non-ASCII key', chat(okChat(), [], Buffer.from('clé-ünïcode', 'utf8').toString('latin1')), 401);
  add(C11, 'x-api-key instead of Authorization', { headers: [['X-Api-Key', x.acmeKey], ['Content-Type', json]], body: okChat() }, 401);
  add(C11, 'api-key (Azure style) instead of Authorization', { headers: [['Api-Key', x.acmeKey], ['Content-Type', json]], body: okChat() }, 401);
  add(C11, 'key in the query string', { path: `/v1/chat/completions?api_key=${encodeURIComponent(x.acmeKey)}`, headers: [['Content-Type', json]], body: okChat() }, 401);
  add(C11, 'key in a cookie', { headers: [['Cookie', `api_key=${x.acmeKey}`], ['Content-Type', json]], body: okChat() }, 401);

  // ---- content type, methods, paths ----------------------------------------------------------------------
  const C12 = 'methods and paths';
  add(C12, 'text/plain', { headers: [['Authorization', `Bearer ${x.acmeKey}`], ['Content-Type', 'text/plain']], body: okChat() }, 415);
  add(C12, 'no Content-Type', { headers: [['Authorization', `Bearer ${x.acmeKey}`]], body: okChat() }, 415);
  add(C12, 'application/jsonx', { headers: [['Authorization', `Bearer ${x.acmeKey}`], ['Content-Type', 'application/jsonx']], body: okChat() }, 415);
  for (const m of ['GET', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'TRACE']) add(C12, `${m} /v1/chat/completions`, { ...chat(okChat()), method: m }, 405);
  add(C12, 'HEAD /v1/chat/completions', { method: 'HEAD', headers: tenant() }, [404, 405]);
  add(C12, 'GET /v1/completions', { ...chat(okChat()), method: 'GET', path: '/v1/completions' }, 405);
  for (const p of ['/v1/embeddingz', '/v2/chat/completions', '/v1/chat/completions/', '/V1/CHAT/COMPLETIONS', '/v1/chat/completions%00', '/v1/chat%2Fcompletions', '//v1/chat/completions', '/v1/chat/completions/../../admin/pools', '/admin/../v1/../admin/pools/chat', '/.env', '/wp-login.php']) {
    add(C12, `POST ${p}`, { ...chat(okChat()), path: p }, [401, 404, 405]);
  }
  add(C12, 'DELETE /admin/pools/chat (no such route)', admin('DELETE', `/admin/pools/${POOL}`), [404, 405], { admin: true });
  add(C12, 'POST /admin/pools (no such route)', admin('POST', '/admin/pools', '{"name":"x","models":["m"]}'), [404, 405], { admin: true });

  // ---- the Responses API: OpenAI errors, never a replica ---------------------------------------------
  const C13 = 'Responses API';
  const resp = (body: string | Uint8Array, more: Partial<RawRequest> = {}, key?: string): RawRequest => ({ path: '/v1/responses', ...chat(body, [], key), ...more });
  const okResp = (extra = '') => `{"model":"${MODEL}","input":"hi"${extra}}`;
  add(C13, 'no input', resp(`{"model":"${MODEL}"}`), 400, { bodyIncludes: 'input' });
  add(C13, 'no model', resp('{"input":"hi"}'), 400);
  add(C13, 'input a number', resp(`{"model":"${MODEL}","input":5}`), 400);
  add(C13, 'input an empty list', resp(`{"model":"${MODEL}","input":[]}`), 400);
  add(C13, 'input item not an object', resp(`{"model":"${MODEL}","input":["hi"]}`), 400);
  add(C13, 'instructions an object', resp(okResp(',"instructions":{"a":1}')), 400);
  add(C13, 'tools not a list', resp(okResp(',"tools":{}')), 400);
  add(C13, 'stream a string', resp(okResp(',"stream":"yes"')), 400);
  add(C13, 'max_output_tokens 0', resp(okResp(',"max_output_tokens":0')), 400);
  add(C13, 'max_output_tokens 1e30', resp(okResp(',"max_output_tokens":1e30')), 400);
  add(C13, 'background without store', resp(okResp(',"background":true,"store":false')), 400, { bodyIncludes: 'background' });
  add(C13, 'previous_response_id with a path in it', resp(okResp(',"previous_response_id":"../admin"')), 400);
  add(C13, 'previous_response_id of 2000 characters', resp(okResp(`,"previous_response_id":"resp_${'a'.repeat(2000)}"`)), 400);
  add(C13, 'previous_response_id unknown to the router', resp(okResp(`,"previous_response_id":"resp_${'0'.repeat(32)}"`)), 404, { bodyIncludes: 'response_not_found' });
  add(C13, 'previous_response_id another tenant could have', resp(okResp(',"previous_response_id":"resp_someone_elses"'), {}, x.globexKey), 404);
  add(C13, 'malformed JSON', resp(`{"model":"${MODEL}","input":"hi"`), 400);
  add(C13, 'deep nesting in input', resp(`{"model":"${MODEL}","input":[{"role":"user","content":${'['.repeat(100)}${']'.repeat(100)}}]}`), 400);
  add(C13, 'unknown model', resp(`{"model":"no-such-model","input":"hi"}`), 404);
  add(C13, 'no API key', { path: '/v1/responses', headers: [['Content-Type', json]], body: okResp() }, 401);
  add(C13, 'x-api-key is no credential on OpenAI paths', { path: '/v1/responses', headers: [['X-Api-Key', x.acmeKey], ['Content-Type', json]], body: okResp() }, 401);
  add(C13, 'GET /v1/responses', { method: 'GET', path: '/v1/responses', headers: tenant() }, 405);
  add(C13, 'GET an unknown id', { method: 'GET', path: `/v1/responses/resp_${'1'.repeat(32)}`, headers: tenant() }, 404);
  add(C13, 'GET an id with dots', { method: 'GET', path: '/v1/responses/resp..x', headers: tenant() }, 400);
  add(C13, 'GET an id of 300 characters', { method: 'GET', path: `/v1/responses/${'r'.repeat(300)}`, headers: tenant() }, 400);
  add(C13, 'GET with stream=maybe', { method: 'GET', path: `/v1/responses/resp_${'1'.repeat(32)}?stream=maybe`, headers: tenant() }, 400);
  add(C13, 'GET with starting_after=-1', { method: 'GET', path: `/v1/responses/resp_${'1'.repeat(32)}?starting_after=-1`, headers: tenant() }, 400);
  add(C13, 'cancel an unknown id', { method: 'POST', path: `/v1/responses/resp_${'2'.repeat(32)}/cancel`, headers: tenant() }, 404);
  add(C13, 'PUT on an id', { method: 'PUT', path: `/v1/responses/resp_${'2'.repeat(32)}`, headers: tenant() }, 405);
  add(C13, 'GET on cancel', { method: 'GET', path: `/v1/responses/resp_${'2'.repeat(32)}/cancel`, headers: tenant() }, 405);
  add(C13, 'x-pool the tenant may not choose', { method: 'GET', path: `/v1/responses/resp_${'3'.repeat(32)}`, headers: [...tenant(x.globexKey), ['x-pool', POOL]] }, 403);

  // ---- the Anthropic Messages API: Anthropic errors, never a replica -----------------------------------
  const C14 = 'Anthropic Messages API';
  const anth = (body: string | Uint8Array, more: Partial<RawRequest> = {}, headers: [string, string][] = [['X-Api-Key', x.acmeKey], ['Content-Type', json]]): RawRequest => ({ path: '/v1/messages', headers, body, ...more });
  const okMsg = (extra = '') => `{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":"hi"}]${extra}}`;
  add(C14, 'no max_tokens', anth(`{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}]}`), 400, { bodyIncludes: 'max_tokens' });
  add(C14, 'max_tokens 0', anth(`{"model":"${MODEL}","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`), 400);
  add(C14, 'no messages', anth(`{"model":"${MODEL}","max_tokens":2}`), 400);
  add(C14, 'empty messages', anth(`{"model":"${MODEL}","max_tokens":2,"messages":[]}`), 400);
  add(C14, 'message without a role', anth(`{"model":"${MODEL}","max_tokens":2,"messages":[{"content":"hi"}]}`), 400);
  add(C14, 'content a number', anth(`{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":7}]}`), 400);
  add(C14, 'content block without a type', anth(`{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":[{"text":"hi"}]}]}`), 400);
  add(C14, 'system a number', anth(okMsg(',"system":3')), 400);
  add(C14, 'tool without a name', anth(okMsg(',"tools":[{"input_schema":{}}]')), 400);
  add(C14, 'metadata.user_id a number', anth(okMsg(',"metadata":{"user_id":5}')), 400);
  add(C14, 'stream a string', anth(okMsg(',"stream":"yes"')), 400);
  add(C14, 'malformed JSON', anth(`{"model":"${MODEL}","max_tokens":2,"messages":[`), 400);
  add(C14, 'not UTF-8', anth(Buffer.concat([enc(`{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":"`), Buffer.from([0xc3, 0x28]), enc('"}]}')])), 400);
  add(C14, 'unknown model', anth(`{"model":"no-such-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`), 404, { bodyIncludes: 'not_found_error' });
  add(C14, 'no API key', anth(okMsg(), {}, [['Content-Type', json]]), 401, { bodyIncludes: 'authentication_error' });
  add(C14, 'a wrong x-api-key', anth(okMsg(), {}, [['X-Api-Key', 'sk-wrong'], ['Content-Type', json]]), 401, { bodyIncludes: 'authentication_error' });
  add(C14, 'x-api-key with a space', anth(okMsg(), {}, [['X-Api-Key', 'sk wrong'], ['Content-Type', json]]), 401);
  add(C14, 'text/plain', anth(okMsg(), {}, [['X-Api-Key', x.acmeKey], ['Content-Type', 'text/plain']]), 415);
  add(C14, 'GET /v1/messages', anth(okMsg(), { method: 'GET' }), 405);
  add(C14, 'count_tokens without messages', anth(`{"model":"${MODEL}"}`, { path: '/v1/messages/count_tokens' }), 400);
  add(C14, 'count_tokens unknown model', anth(`{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`, { path: '/v1/messages/count_tokens' }), 404);
  add(C14, 'body over the size limit', anth(okMsg(`,"pad":"${'x'.repeat(3 * MiB)}"`)), 413, { bodyIncludes: 'request_too_large' });
  add(C14, 'unknown path under /v1/messages', anth(okMsg(), { path: '/v1/messages/batches' }), 404, { bodyIncludes: 'not_found_error' });
  // ---- keyless APIs and prompt_cache_key ------------------------------------------------------
  const CK = 'keyless APIs';
  const keyless = (path: string, body: string, headers: [string, string][] = tenant()): RawRequest => ({ path, headers, body });
  add(CK, 'embeddings without input', keyless('/v1/embeddings', `{"model":"${MODEL}"}`), 400);
  add(CK, 'embeddings input an object', keyless('/v1/embeddings', `{"model":"${MODEL}","input":{"a":1}}`), 400);
  add(CK, 'embeddings 3000 inputs', keyless('/v1/embeddings', JSON.stringify({ model: MODEL, input: Array.from({ length: 3000 }, () => 'a') })), 400);
  add(CK, 'embeddings stream true', keyless('/v1/embeddings', `{"model":"${MODEL}","input":"x","stream":true}`), 400);
  add(CK, 'embeddings for a model no pool serves', keyless('/v1/embeddings', '{"model":"no-such-model","input":"x"}'), 404);
  add(CK, 'rerank documents a string', keyless('/v1/rerank', `{"model":"${MODEL}","query":"q","documents":"d"}`), 400);
  add(CK, 'rerank alias without query', keyless('/v2/rerank', `{"model":"${MODEL}","documents":["d"]}`), 400);
  add(CK, 'score without a pair', keyless('/v1/score', `{"model":"${MODEL}","text_1":"a"}`), 400);
  add(CK, 'tokenize prompt a number', keyless('/tokenize', `{"model":"${MODEL}","prompt":5}`), 400);
  add(CK, 'detokenize negative token', keyless('/detokenize', `{"model":"${MODEL}","tokens":[-1]}`), 400);
  add(CK, 'tokenize without a key', keyless('/tokenize', `{"model":"${MODEL}","prompt":"x"}`, [['Content-Type', json]]), 401);
  add(CK, 'detokenize with a wrong key', keyless('/detokenize', `{"model":"${MODEL}","tokens":[1]}`, tenant('sk-not-a-key')), 401);
  add(CK, 'rerank with a wrong key', keyless('/rerank', `{"model":"${MODEL}","query":"q","documents":["d"]}`, tenant('sk-not-a-key')), 401);
  add(CK, 'GET /tokenize', { method: 'GET', path: '/tokenize', headers: tenant() }, 405);
  add(CK, 'prompt_cache_key a number', chat(okChat(',"prompt_cache_key":42')), 400, { bodyIncludes: 'prompt_cache_key' });
  add(CK, 'prompt_cache_key of 300 characters', chat(okChat(`,"prompt_cache_key":"${'k'.repeat(300)}"`)), 400, { bodyIncludes: 'prompt_cache_key' });
  add(CK, 'GET /v1/models/{id} of a model no pool serves', { method: 'GET', path: '/v1/models/no-such-model', headers: tenant() }, 404);

  // ---- bounded fields by the type the engine coerces them to (issue #30) -----------------------------
  // vLLM parses its request models in pydantic's lax mode ("9" runs as 9): a bound is only a bound
  // when a string, boolean or array in its place is refused.
  const CB = 'bounded fields sent as other types';
  add(CB, 'n as a string', chat(okChat(',"n":"9"')), 400, { bodyIncludes: "Invalid type for 'n'" });
  add(CB, 'best_of as a string', chat(okChat(',"best_of":"64"')), 400, { bodyIncludes: "Invalid type for 'best_of'" });
  add(CB, 'max_completion_tokens as a string', chat(okChat(',"max_completion_tokens":"1000000"')), 400, { bodyIncludes: "Invalid type for 'max_completion_tokens'" });
  add(CB, 'min_tokens as a string', chat(okChat(',"min_tokens":"40000"')), 400, { bodyIncludes: "Invalid type for 'min_tokens'" });
  add(CB, 'n as true', chat(okChat(',"n":true')), 400, { bodyIncludes: "Invalid type for 'n'" });
  add(CB, 'Responses max_output_tokens as a string', { path: '/v1/responses', headers: tenant(), body: `{"model":"${MODEL}","input":"hi","max_output_tokens":"1000000"}` }, 400, { bodyIncludes: "Invalid type for 'max_output_tokens'" });
  add(CB, 'Messages max_tokens as a string', anth(`{"model":"${MODEL}","max_tokens":"100000","messages":[{"role":"user","content":"hi"}]}`), 400, { bodyIncludes: 'invalid_request_error' });

  return out;
}

/** What is wrong with one answer (empty when it is right). */
export function judge(c: HostileCase, res: RawResponse): string[] {
  const p: string[] = [];
  const label = `${c.category} / ${c.name}`;
  if (!c.expect.includes(res.status)) p.push(`${label}: status ${res.status}, expected ${c.expect.join('|')}: ${res.raw.slice(0, 200).replace(/\r\n/g, ' | ')}`);
  if (res.status >= 500) p.push(`${label}: a 5xx`);
  if (c.bodyIncludes && !res.body.includes(c.bodyIncludes)) p.push(`${label}: body lacks "${c.bodyIncludes}": ${res.body.slice(0, 160)}`);
  // The router's own answers are OpenAI-shaped, Anthropic-shaped on /v1/messages; the runtime's
  // parser errors are plain text.
  if ((res.headers['content-type'] ?? '').startsWith('application/json') && c.request.method !== 'HEAD') {
    try {
      const parsed = JSON.parse(res.body) as { type?: unknown; error?: { message?: unknown; type?: unknown; code?: unknown } };
      const e = parsed.error;
      if (/^\/v1\/messages(\/|$|\?)/.test(c.request.path ?? '')) {
        if (parsed.type !== 'error' || !e || typeof e.message !== 'string' || typeof e.type !== 'string' || 'code' in e) p.push(`${label}: not the Anthropic error shape`);
      } else if (!e || typeof e.message !== 'string' || typeof e.type !== 'string' || typeof e.code !== 'string') p.push(`${label}: not the OpenAI error shape`);
    } catch {
      p.push(`${label}: JSON content type, unparsable body`);
    }
  }
  if (c.withinMs && (res.elapsedMs < c.withinMs[0] || res.elapsedMs > c.withinMs[1])) p.push(`${label}: answered after ${res.elapsedMs} ms, expected ${c.withinMs[0]}-${c.withinMs[1]}`);
  return p;
}

