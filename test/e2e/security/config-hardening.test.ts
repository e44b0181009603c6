// Abuse suite, configuration and pure pieces of issue #15: what a pool may declare (forwarded
// headers, engine control fields, auth references), replica URLs (path kept, normalised, the
// extended blocked ranges), tenant namespaces of routing keys and prompt blocks, request bounds.
// Plain Node: no runtime, no network.

import { describe, expect, it } from 'vitest';

import { ConfigError, parseConfig, replicaEndpoint, replicaUrlProblem, type RouterConfigInput } from '../../../src/config.js';
import { blockHashes, namespaceSeed, parseKeySource, resolveRoutingKey } from '../../../src/core/index.js';
import { exceededBound, sequencesOf } from '../../../src/engines/request-fields.js';
import { forwardHeaderProblem } from '../../../src/origin/forward-headers.js';

const replica = { id: 'r1', url: 'https://vllm-1.example.com', auth: 'bearer:VLLM_KEY' };
const config = (pool: Record<string, unknown> = {}): RouterConfigInput => ({ pools: [{ name: 'chat', models: ['m'], replicas: [replica], ...pool }] }) as RouterConfigInput;

describe('forwardHeaders (item 11)', () => {
  it('an application header may be added; credentials, client addresses, framing and origin-auth names never', () => {
    expect(parseConfig(config({ forwardHeaders: ['X-Work-Hint', 'x-gateway-route'] })).pools[0]!.forwardHeaders).toEqual(['x-work-hint', 'x-gateway-route']);
    for (const bad of ['authorization', 'Authorization', 'proxy-authorization', 'cookie', 'set-cookie', 'cf-connecting-ip', 'CF-Access-Client-Secret', 'x-forwarded-for', 'X-Forwarded-Host', 'forwarded', 'x-real-ip', 'x-api-key', 'api-key', 'host', 'content-length', 'transfer-encoding', 'connection', 'x-request-id', 'bad header', '']) {
      expect(forwardHeaderProblem(bad), bad).not.toBeNull();
      expect(() => parseConfig(config({ forwardHeaders: [bad] })), bad).toThrow(ConfigError);
    }
    expect(() => parseConfig(config({ forwardHeaders: ['cookie'] }))).toThrow(/forwardHeaders/);
  });
});

describe('allowEngineFields and bounds (item 3)', () => {
  it('only known control fields may be allowed, never cache_salt or request_id', () => {
    expect(parseConfig(config({ allowEngineFields: ['priority'] })).pools[0]!.allowEngineFields).toEqual(['priority']);
    expect(() => parseConfig(config({ allowEngineFields: ['cache_salt'] }))).toThrow(/always set by the router/);
    expect(() => parseConfig(config({ allowEngineFields: ['request_id'] }))).toThrow(/always set by the router/);
    expect(() => parseConfig(config({ allowEngineFields: ['temperature'] }))).toThrow(/not an engine control field/);
  });

  it('defaults bound n, best_of and output tokens; the error names the field', () => {
    const p = parseConfig(config()).pools[0]!;
    expect([p.maxN, p.maxBestOf, p.maxOutputTokens]).toEqual([8, 8, 32_768]);
    expect(exceededBound({ n: 8, max_tokens: 32_768 }, p)).toBeNull();
    expect(exceededBound({ n: 9 }, p)).toMatchObject({ param: 'n' });
    expect(exceededBound({ best_of: 9 }, p)).toMatchObject({ param: 'best_of' });
    expect(exceededBound({ max_completion_tokens: 40_000 }, p)?.message).toBe("Invalid 'max_completion_tokens': integer above maximum value. Expected a value <= 32768, but got 40000 instead.");
    expect(exceededBound({ max_output_tokens: 40_000 }, p)).toMatchObject({ param: 'max_output_tokens' });
  });

  it('sequences: n, or best_of when larger', () => {
    expect(sequencesOf({})).toBe(1);
    expect(sequencesOf({ n: 3 })).toBe(3);
    expect(sequencesOf({ n: 2, best_of: 5 })).toBe(5);
    expect(sequencesOf({ n: 'x' })).toBe(1);
  });
});

describe('authRefs (item 6)', () => {
  it('defaults to the configured replicas\' references plus none; a configured replica outside a declared list is a config error', () => {
    expect([...parseConfig(config()).pools[0]!.allowedAuthRefs].sort()).toEqual(['bearer:VLLM_KEY', 'none']);
    expect([...parseConfig(config({ authRefs: ['bearer:VLLM_KEY', 'headers:ACCESS_EU'] })).pools[0]!.allowedAuthRefs].sort()).toEqual(['bearer:VLLM_KEY', 'headers:ACCESS_EU', 'none']);
    expect(() => parseConfig(config({ authRefs: ['headers:ACCESS_EU'] }))).toThrow(/not in the pool's authRefs/);
    expect(() => parseConfig(config({ authRefs: ['bearer:CACHE_SALT_KEY'] }))).toThrow(/router's own secrets/);
  });
});

describe('replica URLs (item 7)', () => {
  it('the path is kept and joined; the stored URL is normalised', () => {
    const p = parseConfig(config({ replicas: [{ ...replica, url: 'HTTPS://GW.example.com:443/vllm-1/' }] })).pools[0]!;
    expect(p.replicas[0]!.url).toBe('https://gw.example.com/vllm-1');
    expect(replicaEndpoint(p.replicas[0]!.url, '/v1/chat/completions')).toBe('https://gw.example.com/vllm-1/v1/chat/completions');
    expect(replicaEndpoint('https://gw.example.com', '/health')).toBe('https://gw.example.com/health');
    expect(replicaEndpoint('https://gw.example.com/a/', '/metrics')).toBe('https://gw.example.com/a/metrics');
  });

  it('refuses userinfo, backslashes and the extended blocked ranges; public hostnames and loopback pass', () => {
    for (const bad of [
      'https://user@gw.example.com/',
      'https://gw.example.com\\@10.0.0.1/',
      'https://gw.example.com/a\\b',
      'https://198.18.0.1/',
      'https://198.19.1.1/',
      'https://203.0.113.9/',
      'https://[2002:a9fe:a9fe::]/',
      'https://[2002:a00:1::1]/',
      'https://[64:ff9b::a9fe:a9fe]/',
      'https://[::ffff:a9fe:a9fe]/',
      'https://[2001:db8::5]/',
      'https://[2001::1]/',
      'https://foo.localhost/',
    ]) expect(replicaUrlProblem(bad), bad).not.toBeNull();
    for (const good of ['https://gw.example.com/vllm-1', 'https://gw.example.com:8443/vllm-1', 'http://127.0.0.1:9001']) expect(replicaUrlProblem(good), good).toBeNull();
  });

  // #27 item 1: public addresses used to pass; the edge cannot fetch an IP address at all
  // (cloudflare-docs workers/platform/known-issues, "Fetch to IP addresses"), so they are refused
  // with the remedy, for configured and admin-added replicas alike (one schema).
  it('refuses public IP addresses, naming the remedy (a DNS name); loopback only for a local run', () => {
    for (const ip of ['https://198.20.0.1/', 'https://[2002:808:808::]/', 'https://[2606:4700::1111]/', 'https://1.1.1.1']) {
      expect(replicaUrlProblem(ip), ip).toMatch(/is an IP address .*hostnames, not IP addresses.*DNS record/);
      expect(() => parseConfig(config({ replicas: [{ ...replica, url: ip }] })), ip).toThrow(/replicas\.0\.url: is an IP address/);
    }
    expect(replicaUrlProblem('http://127.0.0.1:9001', 'edge')).toMatch(/loopback/);
    expect(() => parseConfig(config({ replicas: [{ ...replica, url: 'http://127.0.0.1:9001' }] }), { target: 'edge' })).toThrow(/for the edge:[\s\S]*replicas\.0\.url: is a loopback address/);
  });
});

describe('tenant namespaces (item 2)', () => {
  const sources = ['header:x-session-id', 'prefix:4096'].map(parseKeySource);
  const body = { messages: [{ role: 'user', content: 'x'.repeat(2000) }] };
  it('the same session id of two tenants is two keys; without a namespace the key is as before', () => {
    const key = (ns?: string) => resolveRoutingKey(sources.slice(0, 1), { header: () => 'sess-1', tenant: ns, body, namespace: ns }).hash;
    expect(key('acme')).not.toBe(key('globex'));
    expect(key('acme')).toBe(key('acme'));
    expect(resolveRoutingKey(sources.slice(0, 1), { header: () => 'sess-1', body }).hash).toBe(key(undefined));
  });

  it('prefix keys and prompt blocks are seeded by the prefix namespace', () => {
    const pkey = (ns?: string) => resolveRoutingKey(sources.slice(1), { header: () => undefined, body, prefixNamespace: ns }).hash;
    expect(pkey('tenant\u0000acme')).not.toBe(pkey('tenant\u0000globex'));
    const text = 'y'.repeat(4096);
    const a = blockHashes(text, { seed: namespaceSeed('tenant\u0000acme') });
    const b = blockHashes(text, { seed: namespaceSeed('tenant\u0000globex') });
    expect(a.length).toBe(16);
    expect([...a].some((h) => [...b].includes(h))).toBe(false);
    expect([...blockHashes(text, { seed: namespaceSeed('tenant\u0000acme') })]).toEqual([...a]);
    expect([...blockHashes(text)]).not.toEqual([...a]);
  });
});
