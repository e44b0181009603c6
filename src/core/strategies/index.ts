// Strategy registry: parse a spec string (`bounded-hash:1.25[:slack]`,
// `prefix-aware[:factor[:slack[:window[:windowShare]]]]`, `hash`, `least-load`, `round-robin`) into a Strategy, and
// the top-level pick that applies the keyless fallback. Pure.

import type { PickResult } from '../types.js';
import { createBoundedHash } from './bounded-hash.js';
import { hashStrategy } from './hash.js';
import { leastLoad } from './least-load.js';
import { createPrefixAware } from './prefix-aware.js';
import { roundRobin } from './round-robin.js';
import { pickPinned } from './pin.js';
import type { PickContext, Strategy } from './strategy.js';

export type { PickContext, Strategy } from './strategy.js';
export { balanceFactorPercent, createBoundedHash, DEFAULT_BALANCE_FACTOR, pickBoundedHash } from './bounded-hash.js';
export { isUsable, leastLoadedIndex } from './strategy.js';
export { pickPinned } from './pin.js';
export type { PrefixMatch } from './strategy.js';
export { boundFromTotals, capOf, computeLoadBound, isUnderBound, RunningTotals, weightSums, type LoadBound, type PoolTotals, type WeightSums } from './load-bound.js';
export {
  createPrefixAware,
  DEFAULT_MIN_MATCH_BLOCKS,
  DEFAULT_MIN_MATCH_SHARE,
  DEFAULT_FOLLOW_SPREAD,
  DEFAULT_FOLLOW_SPREAD_SHARE,
  DEFAULT_SEED_BELOW,
  DEFAULT_PREFIX_AWARE_SLACK,
  pickPrefixAware,
  type PrefixAwareOptions,
} from './prefix-aware.js';

export const STRATEGY_NAMES = ['bounded-hash', 'prefix-aware', 'hash', 'least-load', 'round-robin'] as const;
export type StrategyName = (typeof STRATEGY_NAMES)[number];

type Factory = (args: readonly string[]) => Strategy;

/** `[factor[:slack]]` of the bounded strategies; undefined where absent. */
function parseBoundArgs(name: string, args: readonly string[]): { factor: number | undefined; slack: number | undefined } {
  if (args.length > 2) throw new RangeError(`${name}: expected at most <factor>:<slack>`);
  const factor = args[0] === undefined || args[0] === '' ? undefined : args[0] === 'inf' ? Infinity : Number(args[0]);
  const slack = args[1] === undefined ? undefined : Number(args[1]);
  if (factor !== undefined && Number.isNaN(factor)) throw new RangeError(`${name}: balance factor "${args[0]}" is not a number`);
  if (slack !== undefined && Number.isNaN(slack)) throw new RangeError(`${name}: slack "${args[1]}" is not a number`);
  return { factor, slack };
}

const registry: Record<StrategyName, Factory> = {
  'bounded-hash': (args) => {
    const { factor, slack } = parseBoundArgs('bounded-hash', args);
    return createBoundedHash({ balanceFactor: factor, slack });
  },
  'prefix-aware': (args) => {
    // prefix-aware[:factor[:slack[:window[:windowShare]]]]: the last two are the no-starvation
    // window's S and ρ (prefix-aware.ts), for tuning in the simulator.
    if (args.length > 4) throw new RangeError('prefix-aware: expected at most <factor>:<slack>:<window>:<windowShare>');
    const { factor, slack } = parseBoundArgs('prefix-aware', args.slice(0, 2));
    const num = (k: number, what: string) => {
      if (args[k] === undefined || args[k] === '') return undefined;
      const v = args[k] === 'inf' ? Infinity : Number(args[k]);
      if (Number.isNaN(v)) throw new RangeError(`prefix-aware: ${what} "${args[k]}" is not a number`);
      return v;
    };
    return createPrefixAware({ balanceFactor: factor, slack, followSpread: num(2, 'window'), followSpreadShare: num(3, 'window share') });
  },
  hash: () => hashStrategy,
  'least-load': () => leastLoad,
  'round-robin': () => roundRobin,
};

/** Build a strategy from its spec string; throws a RangeError naming the problem. */
export function createStrategy(spec: string): Strategy {
  const [name, ...args] = spec.trim().split(':');
  const factory = registry[name as StrategyName];
  if (!factory) throw new RangeError(`unknown strategy "${name}" (known: ${STRATEGY_NAMES.join(', ')})`);
  if (name !== 'bounded-hash' && name !== 'prefix-aware' && args.length > 0) throw new RangeError(`strategy "${name}" takes no parameters`);
  return factory(args);
}

/**
 * The pick the router makes: a pinned request goes to its replica or fails (pin.ts); keyed
 * strategies see requests with a key, everything else goes to the pool's fallback (default
 * `least-load`).
 */
export function pickReplica(strategy: Strategy, fallback: Strategy, ctx: PickContext): PickResult {
  if (ctx.pin !== undefined) return pickPinned(ctx, ctx.pin);
  return (strategy.keyed && ctx.key === null ? fallback : strategy).pick(ctx);
}
