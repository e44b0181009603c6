// Shared plain-data types of the routing core. Pure: types only.

/** One replica as the routing core sees it at the moment of a pick. */
export interface ReplicaView {
  readonly id: string;
  /** Relative capacity, 1-256. */
  readonly weight: number;
  /** The load signal: requests in flight (optionally plus the replica's vLLM waiting queue). */
  readonly inFlight: number;
  readonly healthy: boolean;
  readonly draining: boolean;
}

/** Why a pick could not produce a replica. */
export type PickFailureReason = 'no_healthy_replica' | 'pinned_replica_gone' | 'pinned_replica_unavailable';

export interface PickSuccess {
  readonly ok: true;
  /** Index into the replica array handed to the pick. */
  readonly index: number;
  readonly replica: string;
  /** True when a keyed pick went past the key's home replica (load bound, health, exclusion). */
  readonly spilled: boolean;
  /** Distinct replicas rejected on the ring before this one (0 for keyless strategies). */
  readonly steps: number;
  /** Round-robin position after this pick (passed back in with the next pick). */
  readonly cursor?: number;
}

export interface PickFailure {
  readonly ok: false;
  readonly reason: PickFailureReason;
}

export type PickResult = PickSuccess | PickFailure;

/** Source of randomness in [0, 1); injected so the core stays deterministic under test. */
export type RandomSource = () => number;
