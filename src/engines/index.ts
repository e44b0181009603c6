// The registry of engine profiles by name (engines/engine.ts says what a profile provides), and
// what the rest of the router asks of "the engine" through it: which engine a scrape came from,
// its sample and KV capacity, the keyless APIs a pool serves and their origin paths. Pure data
// and functions over it: no I/O.
//
// Read by config.ts (a pool's `engine` / `endpoints`), the coordinator's scrape, the keyless
// dialects (http/apis/keyless.ts) and the control-field fence (request-fields.ts).

import { KEYLESS_APIS, type EngineProfile, type EngineSample, type ExtractOptions, type HitRateSource, type KeylessApi } from './engine.js';
import type { KvCapacity } from './kv-capacity.js';
import { llamaCpp } from './llama-cpp.js';
import type { LabelFilter, PromParse } from './prom-text.js';
import { sglang } from './sglang.js';
import { vllm } from './vllm.js';

export { KEYLESS_APIS, type EngineProfile, type EngineSample, type ExtractOptions, type KeylessApi, type PrefixCacheUnit } from './engine.js';
export { kvCapacityFromTotals, type EngineKv, type KvCapacity } from './kv-capacity.js';

/**
 * Every engine, in the order a scrape is matched against their metric names (vLLM's first); the
 * first is the default a pool runs and what a scrape naming no engine is read as.
 */
export const ENGINE_PROFILES = [vllm, sglang, llamaCpp] as const;

type AnyProfile = (typeof ENGINE_PROFILES)[number];
export type EngineName = AnyProfile['name'];
type GenerationOf<P> = P extends EngineProfile<string, infer G> ? G : never;
/** Which metric set a sample's hit rate came from, over all engines; `none` without prefix cache metrics. */
export type SampleGeneration = GenerationOf<AnyProfile> | 'none';

/** The engine names, for the configuration's enum. */
export const ENGINES = ENGINE_PROFILES.map((p) => p.name) as unknown as readonly [EngineName, ...EngineName[]];

const BY_NAME: ReadonlyMap<string, EngineProfile> = new Map<string, EngineProfile>(ENGINE_PROFILES.map((p) => [p.name, p]));
const HIT_RATE_SOURCES: ReadonlyMap<string, HitRateSource> = new Map(ENGINE_PROFILES.flatMap((p) => Object.entries<HitRateSource>(p.hitRateSources)));

export function engineProfile(name: EngineName): EngineProfile {
  return BY_NAME.get(name)!;
}

/** Whether a generation's hit rate is a ratio of counter deltas or the engine's own gauge; null for `none` or an unknown one. */
export function hitRateSource(generation: string): HitRateSource | null {
  return HIT_RATE_SOURCES.get(generation) ?? null;
}

/** The engine whose metric names a scrape carries, in registry order; null for none. */
export function detectEngine(parsed: PromParse): EngineName | null {
  return detectProfile(parsed)?.name ?? null;
}

function detectProfile(parsed: PromParse): AnyProfile | null {
  for (const p of ENGINE_PROFILES) {
    if (p.metricNames.some((n) => parsed.families.has(n) || parsed.byName.has(n))) return p;
  }
  return null;
}

/**
 * One replica's signals from a scrape of any supported engine, told apart by metric names
 * (a pool may mix engines while it migrates). Same view for all: hit rate counters or gauge,
 * waiting, running, KV usage. Never throws.
 */
export function extractEngineSample(parsed: PromParse, at: number, options: ExtractOptions = {}): EngineSample<SampleGeneration> {
  return (detectProfile(parsed) ?? ENGINE_PROFILES[0]).extractSample(parsed, at, options);
}

/**
 * KV capacity per data-parallel engine when the scrape's engine reports it that way; null
 * otherwise (then `kvCapacityFromTotals` over the sample, kv-capacity.ts).
 */
export function kvCapacity(parsed: PromParse, filter?: LabelFilter): KvCapacity | null {
  const p: EngineProfile = detectProfile(parsed) ?? ENGINE_PROFILES[0];
  return p.kvCapacity?.(parsed, filter) ?? null;
}

/** The keyless APIs an engine serves, in KEYLESS_APIS order. */
export function engineApis(engine: EngineName): KeylessApi[] {
  const paths = engineProfile(engine).keylessPaths;
  return KEYLESS_APIS.filter((a) => paths[a] !== undefined);
}

/** The origin path for `api` on `engine`, given the path the client called. */
export function engineApiPath(engine: EngineName, api: KeylessApi, clientPath: string): string {
  return engineProfile(engine).keylessPaths[api] ?? clientPath;
}
