import { describe, expect, it } from 'vitest';

import { clientBucket } from '../../../src/http/operator-auth-budget.js';

describe('clientBucket: where an operator credential failure is counted', () => {
  it('counts an IPv4 address alone', () => {
    expect(clientBucket('203.0.113.7')).toBe('203.0.113.7');
    expect(clientBucket('203.0.113.8')).not.toBe(clientBucket('203.0.113.7'));
  });

  it('counts every address of one IPv6 /64 together, and other /64s apart', () => {
    const a = clientBucket('2001:db8:1:2:aaaa:bbbb:cccc:dddd');
    expect(a).toBe('2001:db8:1:2::/64');
    expect(clientBucket('2001:0db8:0001:0002:0000:0000:0000:0001')).toBe(a);
    expect(clientBucket('2001:DB8:1:2::ffff')).toBe(a);
    expect(clientBucket('2001:db8:1:2::')).toBe(a);
    expect(clientBucket('2001:db8:1:3::1')).not.toBe(a);
    expect(clientBucket('::1')).toBe('0:0:0:0::/64');
    expect(clientBucket('fe80::1%eth0')).toBe('fe80:0:0:0::/64');
  });

  it('counts an IPv4-mapped IPv6 address as its IPv4 address', () => {
    expect(clientBucket('::ffff:203.0.113.7')).toBe('203.0.113.7');
    expect(clientBucket('::ffff:cb00:7107')).toBe('203.0.113.7');
  });

  it('keeps what does not parse as itself, and a missing header as unknown', () => {
    expect(clientBucket(undefined)).toBe('unknown');
    expect(clientBucket('')).toBe('unknown');
    expect(clientBucket('1:2:3:4:5:6:7:8:9')).toBe('1:2:3:4:5:6:7:8:9');
    expect(clientBucket('2001:db8::1::2')).toBe('2001:db8::1::2');
    expect(clientBucket('gggg::1')).toBe('gggg::1');
    expect(clientBucket('::ffff:300.1.1.1')).toBe('::ffff:300.1.1.1');
  });
});
