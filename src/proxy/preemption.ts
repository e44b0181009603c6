// Flow control's preemption, the Worker's half (the pool's `flowControl.preempt`; the coordinator's
// half is coordinator/queue.ts preemptFor): each attempt that acquires through the queue hands the
// coordinator a callback with its acquire. Called, it answers whether the attempt gives its slot
// back: yes while nothing of the answer went to the client (before the first content event of a
// stream, before the headers of anything else), then the attempt's waits (the headers, the first
// token) end as `preempted` and forward() queues the request again, its replica not charged and the
// attempt not counted against maxRetries (attempt-step.ts, first-token.ts). With the pool's
// `flowControl.preemptStreams`, a stream past its first token may give its slot too: the stream
// step pauses it (aborts its upstream) and the continue step resumes the answer once a slot is
// its tenant's again (stream-step.ts, continue-step.ts). No I/O.

import { MAX_PREEMPTIONS } from '../core/index.js';
import type { PreemptHook } from '../coordinator/types.js';

/** One attempt's side of a preemption: the signal its waits race, and whether it committed. */
export class AttemptPreemption {
  readonly #ctl = new AbortController();
  #committed = false;
  readonly #allowed: boolean;
  #pause: (() => boolean) | null = null;

  /** `preemptedBefore`: how often the request gave its slot back already (MAX_PREEMPTIONS). */
  constructor(preemptedBefore: number) {
    this.#allowed = preemptedBefore < MAX_PREEMPTIONS;
  }

  /** Aborted when the attempt gave its slot back. */
  get signal(): AbortSignal {
    return this.#ctl.signal;
  }

  /** Something of the answer is about to reach the client: from now on the slot is kept. */
  commit(): void {
    this.#committed = true;
  }

  /**
   * After the commit, a stream that may be paused (flowControl.preemptStreams): `pause` stops it
   * and answers true, or answers false when it cannot be continued at that moment.
   */
  pausable(pause: () => boolean): void {
    this.#pause = pause;
  }

  /** The coordinator's callback (sent with the acquire). */
  readonly hook: PreemptHook = () => {
    if (!this.#allowed || this.#ctl.signal.aborted) return false;
    if (this.#committed && (this.#pause === null || !this.#pause())) return false;
    this.#ctl.abort();
    return true;
  };
}
