// Cross-region failover: a model served by pools in several regions (`region` per pool) goes to
// the nearest region first, by the request's `cf` (its continent, then great-circle distance
// from its coordinates to the region), and spills to the next nearest when that pool cannot take
// it (forward() returns `spill`: no healthy replica, or its coordinator unreachable). Pure; the
// caller passes `request.cf`.

import { REGIONS, type PoolRuntime } from '../config.js';

type Region = (typeof REGIONS)[number];

/**
 * A representative point and the continents (cf `continent` codes) of each Durable Object
 * location hint (developers.cloudflare.com/durable-objects/reference/data-location/): a major
 * Cloudflare location inside it.
 */
const REGION_POINTS: Record<Region, { lat: number; lon: number; continents: readonly string[] }> = {
  wnam: { lat: 37.77, lon: -122.42, continents: ['NA'] }, // San Francisco
  enam: { lat: 38.9, lon: -77.04, continents: ['NA'] }, // Ashburn / Washington
  sam: { lat: -23.55, lon: -46.63, continents: ['SA'] }, // São Paulo
  weur: { lat: 50.11, lon: 8.68, continents: ['EU'] }, // Frankfurt
  eeur: { lat: 52.23, lon: 21.01, continents: ['EU'] }, // Warsaw
  apac: { lat: 1.35, lon: 103.82, continents: ['AS'] }, // Singapore
  oc: { lat: -33.87, lon: 151.21, continents: ['OC'] }, // Sydney
  afr: { lat: -26.2, lon: 28.05, continents: ['AF'] }, // Johannesburg
  me: { lat: 25.2, lon: 55.27, continents: ['AS'] }, // Dubai
};

/** The parts of `request.cf` this uses (strings from the edge; numbers accepted too). */
export interface RequestGeo {
  continent?: string;
  latitude?: string | number;
  longitude?: string | number;
}

/** Great-circle distance in km (haversine, mean Earth radius 6,371 km). */
export function distanceKm(a: { lat: number; lon: number }, b: { lat: number; lon: number }): number {
  const rad = Math.PI / 180;
  const dLat = (b.lat - a.lat) * rad;
  const dLon = (b.lon - a.lon) * rad;
  const h = Math.sin(dLat / 2) ** 2 + Math.cos(a.lat * rad) * Math.cos(b.lat * rad) * Math.sin(dLon / 2) ** 2;
  return 2 * 6371 * Math.asin(Math.min(1, Math.sqrt(h)));
}

/**
 * Pools serving the request, nearest region first: the same continent before another, then by
 * distance when the request has coordinates, then configuration order. Pools without a region
 * come after every regional one, in configuration order. Without geo data: configuration order.
 */
export function orderByRegion(pools: readonly PoolRuntime[], geo: RequestGeo | undefined): PoolRuntime[] {
  const lat = Number(geo?.latitude);
  const lon = Number(geo?.longitude);
  const here = geo?.latitude !== undefined && geo?.longitude !== undefined && Number.isFinite(lat) && Number.isFinite(lon) ? { lat, lon } : null;
  const continent = typeof geo?.continent === 'string' ? geo.continent : null;
  const rank = (p: PoolRuntime, i: number): [number, number, number] => {
    if (!p.region) return [2, 0, i];
    const pt = REGION_POINTS[p.region];
    return [continent !== null && pt.continents.includes(continent) ? 0 : 1, here ? distanceKm(here, pt) : 0, i];
  };
  return pools
    .map((p, i) => ({ p, k: rank(p, i) }))
    .sort((a, b) => a.k[0] - b.k[0] || a.k[1] - b.k[1] || a.k[2] - b.k[2])
    .map((x) => x.p);
}

/**
 * The pools to try for a request routed by model to `chosen`: when `chosen` has a region, every
 * pool with a region serving the same model that the tenant may use, nearest first; else just it.
 */
export function regionalCandidates(chosen: PoolRuntime, serving: readonly PoolRuntime[], geo: RequestGeo | undefined): PoolRuntime[] {
  if (!chosen.region) return [chosen];
  const regional = serving.filter((p) => p.region !== undefined);
  if (!regional.includes(chosen)) regional.unshift(chosen);
  return regional.length > 1 ? orderByRegion(regional, geo) : [chosen];
}
