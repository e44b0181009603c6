// Review of #17: dataParallelPinning = true where nothing can pin (only prefix-aware pools pin
// engines, coordinator/dp-engines.ts) is a clear configuration error, not silently ignored.
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config.js';

const pool = (over: Record<string, unknown> = {}) => ({ name: 'chat', models: ['m'], replicas: [{ id: 'r1', url: 'https://a.example.com', auth: 'bearer:KEY' }], ...over });

function errorOf(raw: unknown): string {
  try {
    parseConfig(raw);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

describe('dataParallelPinning on a pool that cannot pin', () => {
  it('is refused as true on a strategy without prefix matching, allowed as false or unset', () => {
    expect(errorOf({ pools: [pool({ strategy: 'bounded-hash:1.25', dataParallelPinning: true })] })).toMatch(/ROUTER_CONFIG\.pools\.0\.dataParallelPinning: .*prefix-aware/);
    expect(parseConfig({ pools: [pool({ strategy: 'bounded-hash:1.25', dataParallelPinning: false })] }).pools[0]!.dataParallelPinning).toBe(false);
    expect(parseConfig({ pools: [pool({ strategy: 'least-load' })] }).pools[0]!.dataParallelPinning).toBeUndefined();
    expect(parseConfig({ pools: [pool({ strategy: 'prefix-aware', dataParallelPinning: true })] }).pools[0]!.dataParallelPinning).toBe(true);
  });
});
