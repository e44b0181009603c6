// The request trace log: one JSON line per finished request, replayable by the simulator
// (docs/observability.md). Pure formatting; the caller writes the line. Raw keys, prompt text and
// credentials never appear: the key is an 8-hex-digit hash, the tenant an id.

import type { FinishedRequest } from '../proxy/forward.js';

/** What the proxy reports about a finished request, plus who sent it and how it was keyed. */
export interface TraceRecord extends Omit<FinishedRequest, 'error'> {
  /** How it failed; `rate_limited`: refused by a requests- or tokens-per-minute limit. */
  error?: FinishedRequest['error'] | 'rate_limited';
  at: number;
  /** The model the request named (usage is metered per tenant and model). */
  model?: string;
  requestId: string;
  /** The API (dialect name: chat, completion, embeddings, ...). */
  api?: string;
  pool: string;
  tenant: string;
  keyKind: string;
  keyHash: string | null;
  /** The id the engine saw (x-request-id, `request_id`): the router's own, never the client's. */
  upstreamRequestId?: string;
  /** Cross-region failover: the regional pools this request spilled past before `pool`. */
  spilledFrom?: readonly string[];
  /** Chained hashes (hex) of the canonical prompt's blocks, at most `traceBlocks` of them. */
  blocks?: readonly string[];
}

const round = (x: number | null) => (x === null ? null : Math.round(x * 10) / 10);

export function formatTraceLine(r: TraceRecord): string {
  return JSON.stringify({
    type: 'request',
    ts: r.at,
    requestId: r.requestId,
    ...(r.api !== undefined ? { api: r.api } : {}),
    ...(r.upstreamRequestId ? { upstreamRequestId: r.upstreamRequestId } : {}),
    pool: r.pool,
    tenant: r.tenant,
    ...(r.model !== undefined ? { model: r.model } : {}),
    keyKind: r.keyKind,
    keyHash: r.keyHash,
    replica: r.replica,
    status: r.status,
    ...(r.error ? { error: r.error } : {}),
    promptTokens: r.promptTokens,
    cachedTokens: r.cachedTokens,
    completionTokens: r.completionTokens,
    ttftMs: round(r.ttftMs),
    durationMs: round(r.durationMs),
    retried: r.retried,
    spilled: r.spilled,
    attempts: r.attempts,
    ...(r.matchedBlocks !== undefined ? { matchedBlocks: r.matchedBlocks } : {}),
    ...(r.earlyConnect !== undefined ? { earlyConnect: r.earlyConnect } : {}),
    ...(r.failOpen ? { failOpen: true } : {}),
    ...(r.continuations ? { continuations: r.continuations, continuationGapMs: round(r.continuationGapMs ?? 0), reprefillTokens: r.reprefillTokens ?? 0 } : {}),
    ...(r.notContinued !== undefined ? { notContinued: r.notContinued } : {}),
    ...(r.warning !== undefined ? { warning: r.warning } : {}),
    ...(r.segments && r.segments.length > 0 ? { segments: r.segments } : {}),
    // Flow control: the request's priority band and its wait in the coordinator's queue.
    ...(r.band !== undefined ? { band: r.band } : {}),
    ...(r.queueMs !== undefined ? { queueMs: round(r.queueMs) } : {}),
    ...(r.preempted ? { preempted: r.preempted } : {}),
    ...(r.spilledFrom && r.spilledFrom.length > 0 ? { spilledFrom: r.spilledFrom } : {}),
    ...(r.blocks ? { blocks: r.blocks } : {}),
  });
}
