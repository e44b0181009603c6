// One modelled vLLM replica: a FIFO waiting queue, continuous batching with chunked prefill
// under a per-step token budget, a paged prefix cache, and a step time that grows with the
// batch and the KV it reads. Pure: the engine drives it with virtual times.
//
// Per engine step (vLLM v1 scheduler order: running requests first, then new ones):
//   budget   = maxBatchedTokens − decoding                  (one token per decoding sequence)
//   prefill  = running prefills in admission order, then waiting requests admitted FIFO while
//              budget > 0, running < maxRunning and their KV blocks fit (head-of-line blocks)
//   stepMs   = stepBaseMs + stepPerSeqMs × seqs + kvReadMsPerKToken × ctxTokens / 1000
//            + Σ chunk / prefillTokensPerSec × (1 + midpoint position / prefillAttentionTokens)
// A request's first token comes out of the step that finishes its prefill:
//   TTFT = that step's end − arrival (queueing, chunked prefill and interleaved decode steps).

import type { SimRequest } from './trace.js';
import { KV_BLOCK_TOKENS, lookupLimit } from './trace.js';
import { PrefixCache } from './prefix-cache.js';
import type { ReplicaProfile } from './profile.js';

export interface Seq {
  readonly req: SimRequest;
  /** Arrival on the virtual clock (after time compression). */
  readonly arrivalMs: number;
  /** Prompt plus output blocks reserved at admission. */
  readonly totalBlocks: number;
  /** Index of the replica the router sent it to. */
  replica: number;
  pinned: number;
  cachedTokens: number;
  /** Prompt tokens computed so far (cached tokens count as computed). */
  pos: number;
  ttftMs: number;
  finishMs: number;
  /** Decoding: the step whose end emitted its first token, and the step whose end finishes it (NaN before). */
  firstStep: number;
  finishStep: number;
}

export function createSeq(req: SimRequest, arrivalMs: number): Seq {
  const total = Math.max(req.blocks.length, Math.ceil((req.promptTokens + req.outputTokens) / KV_BLOCK_TOKENS));
  return { req, arrivalMs, totalBlocks: total, replica: -1, pinned: 0, cachedTokens: 0, pos: 0, ttftMs: NaN, finishMs: NaN, firstStep: NaN, finishStep: NaN };
}

export class ReplicaModel {
  readonly cache: PrefixCache;
  busy = false;
  stepEnd = Infinity;

  // Metrics.
  inFlight = 0;
  peakInFlight = 0;
  requests = 0;
  promptTokens = 0;
  cachedTokens = 0;
  outputTokens = 0;
  busyMs = 0;
  private inFlightArea = 0;
  private lastTouch = 0;

  private waiting: Seq[] = [];
  private waitHead = 0;
  private prefilling: Seq[] = [];
  private decoding = 0;
  /** Σ context tokens of the decoding sequences (the KV a decode step reads). */
  private ctxTokens = 0;
  private readonly finishAt = new Map<number, Seq[]>();
  private step = 0;
  private stepStart = 0;
  private completing: Seq[] = [];
  private stepDecodes = 0;
  /** The waiting head whose KV did not fit; not retried until a request frees its blocks. */
  private blockedHead: Seq | null = null;

  constructor(
    readonly id: string,
    readonly profile: ReplicaProfile,
    private readonly onFinish: (seq: Seq) => void = () => {},
  ) {
    this.cache = new PrefixCache(profile.kvCapacityBlocks);
  }

  /** Requests admitted to this replica and not finished: waiting + running. */
  get load(): number {
    return this.inFlight;
  }

  get hasWork(): boolean {
    return this.waitHead < this.waiting.length || this.prefilling.length > 0 || this.decoding > 0;
  }

  /** Time-weighted mean in-flight up to `t`. */
  meanInFlight(t: number): number {
    this.touch(t);
    return t > 0 ? this.inFlightArea / t : 0;
  }

  enqueue(seq: Seq, t: number): void {
    this.touch(t);
    this.inFlight++;
    if (this.inFlight > this.peakInFlight) this.peakInFlight = this.inFlight;
    this.requests++;
    this.waiting.push(seq);
  }

  /** Plan and start one engine step at `t`; returns false (and stays idle) when there is nothing to run. */
  startStep(t: number): boolean {
    const p = this.profile;
    let budget = p.maxBatchedTokens - this.decoding;
    let prefillMs = 0;
    let seqs = this.decoding;
    const completing = this.completing;
    completing.length = 0;
    const msPerToken = 1000 / p.prefillTokensPerSec;
    const chunkCost = (s: Seq, n: number): number => n * msPerToken * (1 + (s.pos + n / 2) / p.prefillAttentionTokens);

    // Running prefills first, in admission order; only a prefix of them can complete.
    for (let i = 0; i < this.prefilling.length && budget > 0; i++) {
      const s = this.prefilling[i]!;
      const n = Math.min(s.req.promptTokens - s.pos, budget);
      prefillMs += chunkCost(s, n);
      s.pos += n;
      budget -= n;
      seqs++;
      if (s.pos === s.req.promptTokens) completing.push(s);
    }
    // Then admit waiting requests FIFO.
    while (budget > 0 && this.waitHead < this.waiting.length && this.prefilling.length + this.decoding < p.maxRunning) {
      const s = this.waiting[this.waitHead]!;
      if (s === this.blockedHead) break;
      const r = s.req;
      const idle = this.prefilling.length === 0 && this.decoding === 0;
      const adm = this.cache.admit(r.blocks, lookupLimit(r.promptTokens, r.blocks.length), s.totalBlocks, idle);
      if (adm === null) {
        this.blockedHead = s; // head-of-line: vLLM's FIFO policy does not skip ahead
        break;
      }
      this.waitHead++;
      s.pinned = adm.pinned;
      s.cachedTokens = adm.hits * KV_BLOCK_TOKENS;
      s.pos = s.cachedTokens;
      this.promptTokens += r.promptTokens;
      this.cachedTokens += s.cachedTokens;
      this.prefilling.push(s);
      const n = Math.min(r.promptTokens - s.pos, budget);
      prefillMs += chunkCost(s, n);
      s.pos += n;
      budget -= n;
      seqs++;
      if (s.pos === r.promptTokens) completing.push(s);
    }
    if (this.waitHead > 1024 && this.waitHead * 2 > this.waiting.length) {
      this.waiting = this.waiting.slice(this.waitHead);
      this.waitHead = 0;
    }
    if (seqs === 0) {
      this.busy = false;
      this.stepEnd = Infinity;
      return false;
    }
    if (completing.length > 0) this.prefilling.splice(0, completing.length);
    const stepMs = p.stepBaseMs + p.stepPerSeqMs * seqs + (p.kvReadMsPerKToken * this.ctxTokens) / 1000 + prefillMs;
    const end = t + stepMs;
    // A paused stream's continuation keeps the TTFT of its first segment.
    for (const s of completing) if (Number.isNaN(s.ttftMs)) s.ttftMs = end - s.arrivalMs;
    this.stepDecodes = this.decoding;
    this.stepStart = t;
    this.stepEnd = end;
    this.busy = true;
    return true;
  }

  /** Finish the running step at `t` (= stepEnd): emit tokens, retire finished sequences. */
  endStep(t: number): void {
    this.outputTokens += this.stepDecodes + this.completing.length;
    this.ctxTokens += this.decoding;
    const done = this.finishAt.get(this.step);
    if (done !== undefined) {
      this.finishAt.delete(this.step);
      for (const s of done) {
        this.decoding--;
        this.ctxTokens -= s.req.promptTokens + s.req.outputTokens;
        this.retire(s, t);
      }
    }
    for (const s of this.completing) {
      const out = s.req.outputTokens;
      if (out <= 1) {
        this.retire(s, t);
        continue;
      }
      this.decoding++;
      this.ctxTokens += s.req.promptTokens + 1;
      const at = this.step + out - 1;
      s.firstStep = this.step;
      s.finishStep = at;
      const list = this.finishAt.get(at);
      if (list === undefined) this.finishAt.set(at, [s]);
      else list.push(s);
    }
    this.completing.length = 0;
    this.busyMs += t - this.stepStart;
    this.step++;
    this.busy = false;
    this.stepEnd = Infinity;
  }

  /**
   * Take `seq` back before its first token (flow control's preemption): out of the waiting queue, or
   * out of its prefill, the running step's included (its first token comes out at the step's end;
   * its prefill so far is lost, its KV blocks freed). False when it has its first token.
   */
  abort(seq: Seq, t: number): boolean {
    const w = this.waiting.indexOf(seq, this.waitHead);
    if (w >= 0) {
      this.waiting.splice(w, 1);
      if (this.blockedHead === seq) this.blockedHead = null;
    } else {
      const p = this.prefilling.indexOf(seq);
      const c = this.completing.indexOf(seq);
      if (p < 0 && c < 0) return false;
      if (p >= 0) this.prefilling.splice(p, 1);
      else {
        this.completing.splice(c, 1);
        seq.ttftMs = NaN;
      }
      this.cache.release(seq.req.blocks, seq.pinned, seq.totalBlocks);
      this.blockedHead = null;
      // Its prompt is counted again when it runs again.
      this.promptTokens -= seq.req.promptTokens;
      this.cachedTokens -= seq.cachedTokens;
    }
    this.touch(t);
    this.inFlight--;
    this.requests--;
    return true;
  }

  /**
   * Pause `seq` past its first token (flow control's preemptStreams): it leaves the batch at `t`,
   * its KV blocks freed (its prompt stays in the prefix cache as any finished request's). Returns
   * the tokens it produced (the client has them), or -1 when it is not decoding here.
   */
  pause(seq: Seq, t: number): number {
    if (Number.isNaN(seq.finishStep)) return -1;
    const list = this.finishAt.get(seq.finishStep);
    const i = list?.indexOf(seq) ?? -1;
    if (!list || i < 0) return -1;
    list.splice(i, 1);
    if (list.length === 0) this.finishAt.delete(seq.finishStep);
    // Its tokens: one at the end of step firstStep, one each step since; a step under way emits
    // the next one only at its end, so it counts from the steps that ended.
    const produced = this.step - seq.firstStep;
    if (this.busy) this.stepDecodes--;
    this.decoding--;
    this.ctxTokens -= seq.req.promptTokens + produced;
    this.cache.release(seq.req.blocks, seq.pinned, seq.totalBlocks);
    this.blockedHead = null;
    this.touch(t);
    this.inFlight--;
    return produced;
  }

  private retire(s: Seq, t: number): void {
    this.cache.release(s.req.blocks, s.pinned, s.totalBlocks);
    this.blockedHead = null;
    this.touch(t);
    this.inFlight--;
    s.finishMs = t;
    this.onFinish(s);
  }

  private touch(t: number): void {
    this.inFlightArea += this.inFlight * (t - this.lastTouch);
    this.lastTouch = t;
  }
}
