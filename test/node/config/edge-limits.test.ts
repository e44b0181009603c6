// Issue #27: configuration the edge cannot run, refused before a deploy with the remedy in the
// message. Origins (IP literals, ports outside Cloudflare's HTTPS list, plain http), the body cap
// (isolate memory) and health concurrency (six connections per invocation). Each limit's source is
// cited where src/config.ts enforces it. Plain Node: no runtime, no network.

import { describe, expect, it } from 'vitest';
import { CLOUDFLARE_HTTPS_PORTS, ConfigError, DEFAULTS, MAX_BODY_BYTES_CAP, parseConfig, replicaSchema, replicaUrlProblem } from '../../../src/config.js';
import { isReplicaFailure } from '../../../src/coordinator/stats.js';
import { PROXY_READ_TIMEOUT_MS } from '../../../scripts/lib/deploy-check.js';

const pool = (over: Record<string, unknown> = {}) => ({ name: 'chat', models: ['m'], replicas: [{ id: 'r1', url: 'https://vllm-1.example.com', auth: 'none' }], ...over });
const withUrl = (url: string) => ({ pools: [pool({ replicas: [{ id: 'r1', url, auth: 'none' }] })] });

function errorOf(raw: unknown, target?: 'edge' | 'local'): string {
  try {
    parseConfig(raw, target ? { target } : {});
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

describe('origins the edge can reach (#27 item 1)', () => {
  it('https to a hostname passes on 443 and on each of Cloudflare\'s other HTTPS ports, for both targets', () => {
    expect([...CLOUDFLARE_HTTPS_PORTS]).toEqual([443, 2053, 2083, 2087, 2096, 8443]);
    for (const port of CLOUDFLARE_HTTPS_PORTS) {
      const url = `https://vllm-1.example.com:${port}/v1-gw`;
      expect(replicaUrlProblem(url, 'edge'), url).toBeNull();
      expect(replicaUrlProblem(url, 'local'), url).toBeNull();
    }
    expect(parseConfig(withUrl('https://vllm-1.example.com'), { target: 'edge' }).pools[0]!.replicas[0]!.url).toBe('https://vllm-1.example.com');
  });

  it('refuses any other port on a hostname (vLLM\'s :8000 included) and says to serve it on 443 through a Tunnel', () => {
    for (const port of [8000, 8080, 80, 3000, 30000, 2052]) {
      const p = replicaUrlProblem(`https://vllm-1.example.com:${port}`);
      expect(p, String(port)).toContain(`uses port ${port}`);
      expect(p).toContain('silently goes to 443');
      expect(p).toContain(`http://localhost:${port}`);
    }
    expect(errorOf(withUrl('https://vllm-1.example.com:8000'))).toMatch(/ROUTER_CONFIG\.pools\.0\.replicas\.0\.url: uses port 8000/);
  });

  it('refuses IP literals, v4 and v6, public ones included, naming the DNS-record remedy', () => {
    for (const url of ['https://8.8.8.8', 'https://203.1.113.9:443', 'https://[2606:4700:4700::1111]', 'https://[2a00:1450:4001::8a]:8443']) {
      expect(replicaUrlProblem(url), url).toMatch(/^is an IP address \(.+\): Workers subrequests can only go to hostnames.*DNS record/);
    }
  });

  it('refuses plain http to anything but loopback, with the Tunnel remedy', () => {
    for (const url of ['http://vllm-1.example.com', 'http://vllm-1.example.com:8000', 'http://8.8.8.8']) {
      expect(replicaUrlProblem(url), url).toMatch(/must use https .*loopback.*Tunnel/);
    }
  });

  it('loopback (127.0.0.0/8, ::1, localhost) on any port over http or https: accepted for a local run, refused for the edge', () => {
    for (const url of ['http://127.0.0.1:9001', 'http://127.8.9.10:1', 'http://[::1]:8000', 'http://localhost:8000', 'https://localhost:9443', 'http://LOCALHOST.:8000']) {
      expect(replicaUrlProblem(url), url).toBeNull();
      expect(replicaUrlProblem(url, 'local'), url).toBeNull();
      expect(replicaUrlProblem(url, 'edge'), url).toMatch(/is a loopback address .*the edge cannot/);
    }
    // Written another way, loopback is refused for either target, as before.
    expect(replicaUrlProblem('http://2130706433:9001')).toMatch(/four decimal numbers/);
  });

  it('the edge target names every loopback replica; the local target accepts the same config', () => {
    const raw = { pools: [pool({ replicas: [{ id: 'a', url: 'http://127.0.0.1:9001' }, { id: 'b', url: 'https://ok.example.com' }, { id: 'c', url: 'http://localhost:9003' }] })] };
    expect(parseConfig(raw).pools[0]!.replicas).toHaveLength(3);
    const msg = errorOf(raw, 'edge');
    expect(msg).toContain('ROUTER_CONFIG.pools.0.replicas.0.url: is a loopback address');
    expect(msg).toContain('ROUTER_CONFIG.pools.0.replicas.2.url: is a loopback address');
    expect(msg).not.toContain('replicas.1.url');
  });

  it('admin-added replicas go through the same rules (the coordinator parses them with replicaSchema)', () => {
    const bad = (url: string) => replicaSchema.safeParse({ id: 'x', url }).success;
    expect(bad('https://vllm-9.example.com:8000')).toBe(false);
    expect(bad('https://8.8.4.4')).toBe(false);
    expect(bad('http://vllm-9.example.com')).toBe(false);
    expect(bad('https://vllm-9.example.com')).toBe(true);
    expect(bad('http://127.0.0.1:9009')).toBe(true);
  });
});

describe('isolate memory and connections (#27 items 4 and 8)', () => {
  it('maxBodyBytes is capped at 8 MiB and the error says why', () => {
    expect(MAX_BODY_BYTES_CAP).toBe(8 * 1024 * 1024);
    expect(parseConfig({ pools: [pool()], maxBodyBytes: MAX_BODY_BYTES_CAP }).maxBodyBytes).toBe(MAX_BODY_BYTES_CAP);
    expect(errorOf({ pools: [pool()], maxBodyBytes: MAX_BODY_BYTES_CAP + 1 })).toMatch(/ROUTER_CONFIG\.maxBodyBytes: at most 8388608 \(8 MiB\).*128 MB/);
    expect(errorOf({ pools: [pool()], maxBodyBytes: 100 * 1024 * 1024 })).toMatch(/maxBodyBytes/);
  });

  it('healthConcurrency is at most 6, the connections one invocation opens at once', () => {
    expect(parseConfig({ pools: [pool({ healthConcurrency: 6 })] }).pools[0]!.healthConcurrency).toBe(6);
    expect(parseConfig({ pools: [pool()] }).pools[0]!.healthConcurrency).toBe(4);
    expect(errorOf({ pools: [pool({ healthConcurrency: 7 })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.healthConcurrency: at most 6: .*six connections/);
    expect(errorOf({ pools: [pool({ healthConcurrency: 32 })] })).toMatch(/healthConcurrency/);
  });
});

describe('timeouts and failure accounting behind Cloudflare\'s proxy (#27 item 2)', () => {
  it('a non-streaming request\'s default limit is under the 120 s after which a proxied origin gets a 524', () => {
    expect(PROXY_READ_TIMEOUT_MS).toBe(120_000);
    expect(DEFAULTS.nonStreamTimeoutMs).toBeLessThan(PROXY_READ_TIMEOUT_MS);
    expect(parseConfig(withUrl('https://vllm-1.example.com'), { target: 'edge' }).nonStreamTimeoutMs).toBe(DEFAULTS.nonStreamTimeoutMs);
  });

  it('a 524 is not a replica failure; the other 5xx (522, 523 included) and timeouts are', () => {
    expect(isReplicaFailure({ status: 524, error: 'upstream_5xx' })).toBe(false);
    expect(isReplicaFailure({ status: 524 })).toBe(false);
    for (const status of [500, 502, 503, 504, 520, 521, 522, 523, 525, 526, 530]) expect(isReplicaFailure({ status, error: 'upstream_5xx' }), String(status)).toBe(true);
    expect(isReplicaFailure({ status: 0, error: 'timeout' })).toBe(true);
    expect(isReplicaFailure({ status: 0, error: 'max_duration' })).toBe(false);
  });
});
