// Tenant rate limits as token buckets: requests per minute and tokens per minute, tenant-wide and
// per model, with OpenAI's header formats. Pure: no I/O, no clock (every function takes `now`).
//
// A bucket holds up to `limit` units and refills continuously at `limit` per 60 s (OpenAI's
// "the time until the rate limit resets to its initial state" is the time until the bucket is
// full again). A request takes 1 request unit and its token charge from every bucket that
// applies, all or none. Token buckets may go below zero when a request used more than it was
// charged at admission: that debt is repaid by the refill before the next admission.

import { sequencesOf } from '../engines/request-fields.js';

export const WINDOW_MS = 60_000;
/** Charged for the completion when a request names no max_tokens (then settled from usage). */
export const DEFAULT_COMPLETION_CHARGE = 1024;

export interface RateLimits {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
}

/** The tenant record's `limits`: tenant-wide, plus optional per-model limits (both apply). */
export interface TenantLimits extends RateLimits {
  models?: Record<string, RateLimits>;
}

export type LimitKind = 'requests' | 'tokens';

/** A bucket's level (units available) at time `at` (epoch ms). */
export interface Bucket {
  level: number;
  at: number;
}

/** One bucket that applies to a request: which limit, in which scope ("*" = tenant-wide). */
export interface BucketRef {
  kind: LimitKind;
  scope: string;
  limit: number;
}

export const bucketKey = (b: { kind: LimitKind; scope: string }) => `${b.kind}:${b.scope}`;

/** The buckets a request to `model` is subject to, tenant-wide first. */
export function bucketsFor(limits: TenantLimits | undefined, model: string): BucketRef[] {
  if (!limits) return [];
  const out: BucketRef[] = [];
  const add = (l: RateLimits | undefined, scope: string) => {
    if (!l) return;
    if (l.requestsPerMinute !== undefined) out.push({ kind: 'requests', scope, limit: l.requestsPerMinute });
    if (l.tokensPerMinute !== undefined) out.push({ kind: 'tokens', scope, limit: l.tokensPerMinute });
  };
  add(limits, '*');
  add(limits.models?.[model], model);
  return out;
}

export function hasLimits(limits: TenantLimits | undefined): boolean {
  if (!limits) return false;
  if (limits.requestsPerMinute !== undefined || limits.tokensPerMinute !== undefined) return true;
  return Object.values(limits.models ?? {}).some((l) => l.requestsPerMinute !== undefined || l.tokensPerMinute !== undefined);
}

/** The bucket's level at `now`: refilled at limit/60 s since `at`, never above the limit. */
export function levelAt(b: Bucket | undefined, limit: number, now: number): number {
  if (!b) return limit;
  const elapsed = Math.max(0, now - b.at);
  return Math.min(limit, b.level + (elapsed * limit) / WINDOW_MS);
}

/** Milliseconds until a bucket at `level` holds `need` units (0 when it already does). */
export function msUntil(level: number, need: number, limit: number): number {
  if (level >= need) return 0;
  return Math.ceil(((need - level) * WINDOW_MS) / limit);
}

/** The state of one kind of limit as the headers report it: the tightest bucket of that kind. */
export interface LimitState {
  limit: number;
  remaining: number;
  /** Milliseconds until the bucket is full again. */
  resetMs: number;
}

export interface RateState {
  requests?: LimitState;
  tokens?: LimitState;
}

export interface AdmitDecisionOk {
  ok: true;
  state: RateState;
  /** New bucket levels to store (all taken at `now`). */
  levels: Map<string, number>;
}

export interface AdmitDecisionRefused {
  ok: false;
  kind: LimitKind;
  scope: string;
  limit: number;
  /** What the bucket held (floored) and what the request needed. */
  available: number;
  requested: number;
  /** Milliseconds until the request would fit; null when it never can (charge above the limit). */
  retryAfterMs: number | null;
  state: RateState;
}

export type AdmitDecision = AdmitDecisionOk | AdmitDecisionRefused;

/**
 * Decide one admission against `buckets` (levels read through `get`), at `now`, for a request of
 * `tokens` charged tokens. Nothing is taken on a refusal. The reported state per kind is the
 * bucket with the fewest units left relative to its limit (what binds first).
 */
export function decideAdmission(refs: readonly BucketRef[], get: (key: string) => Bucket | undefined, tokens: number, now: number): AdmitDecision {
  const levels = new Map<string, number>();
  let refused: AdmitDecisionRefused | null = null;
  for (const r of refs) {
    const level = levelAt(get(bucketKey(r)), r.limit, now);
    const need = r.kind === 'requests' ? 1 : tokens;
    levels.set(bucketKey(r), level);
    if (level >= need || refused) continue;
    refused = {
      ok: false,
      kind: r.kind,
      scope: r.scope,
      limit: r.limit,
      available: Math.max(0, Math.floor(level)),
      requested: need,
      retryAfterMs: need > r.limit ? null : msUntil(level, need, r.limit),
      state: {},
    };
  }
  if (refused) {
    refused.state = stateOf(refs, levels);
    return refused;
  }
  for (const r of refs) levels.set(bucketKey(r), levels.get(bucketKey(r))! - (r.kind === 'requests' ? 1 : tokens));
  return { ok: true, levels, state: stateOf(refs, levels) };
}

/**
 * An isolate allowance: requests and tokens the meter takes from the buckets ahead of time and
 * hands to one isolate, which admits from it without a round trip until it runs out or expires.
 * The buckets never give out more than they hold, so allowances cannot admit more than a limit;
 * what an isolate does not use comes back with its next call (or is lost if the isolate is gone:
 * the refill replaces it). `null` for a kind the request has no limit of.
 */
export interface Allowance {
  requests: number | null;
  tokens: number | null;
  /** Epoch ms after which the isolate must not use it. */
  until: number;
}

/** Share of a limit one grant hands out, and the share a bucket keeps back from grants. */
export const ALLOWANCE_SHARE = 0.05;
export const ALLOWANCE_RESERVE = 0.25;
/** A requests grant smaller than this is not worth it: small limits are decided per request. */
export const MIN_REQUEST_ALLOWANCE = 5;
export const ALLOWANCE_TTL_MS = 2_000;

/**
 * The grant the buckets can make at these levels for requests of about `charge` tokens, or null.
 * Each kind gets the smallest grant over its buckets: ALLOWANCE_SHARE of the limit, keeping
 * ALLOWANCE_RESERVE of it back, so near a limit nothing is granted and every request is decided
 * by the meter (exact at the boundary). Tokens must cover at least two requests.
 */
export function grantAllowance(refs: readonly BucketRef[], levels: ReadonlyMap<string, number>, charge: number, now: number): Allowance | null {
  let requests: number | null = null;
  let tokens: number | null = null;
  for (const r of refs) {
    const level = levels.get(bucketKey(r)) ?? r.limit;
    const g = Math.floor(Math.min(r.limit * ALLOWANCE_SHARE, level - r.limit * ALLOWANCE_RESERVE));
    if (r.kind === 'requests') requests = requests === null ? g : Math.min(requests, g);
    else tokens = tokens === null ? g : Math.min(tokens, g);
  }
  if (requests === null && tokens === null) return null;
  if (requests !== null && requests < MIN_REQUEST_ALLOWANCE) return null;
  if (tokens !== null && tokens < 2 * Math.max(1, charge)) return null;
  return { requests, tokens, until: now + ALLOWANCE_TTL_MS };
}

/** Header state from levels taken at the same instant. */
export function stateOf(refs: readonly BucketRef[], levels: ReadonlyMap<string, number>): RateState {
  const out: RateState = {};
  for (const r of refs) {
    const level = levels.get(bucketKey(r)) ?? r.limit;
    const s: LimitState = { limit: r.limit, remaining: Math.max(0, Math.floor(level)), resetMs: msUntil(level, r.limit, r.limit) };
    const cur = out[r.kind];
    if (!cur || s.remaining / s.limit < cur.remaining / cur.limit) out[r.kind] = s;
  }
  return out;
}

/**
 * A duration the way OpenAI writes it in x-ratelimit-reset-* (Go's time.Duration format at
 * millisecond precision): "0s", "12ms", "1s", "1.5s", "6m0s", "1h2m3.4s".
 */
export function formatResetDuration(ms: number): string {
  const t = Math.max(0, Math.ceil(ms));
  if (t === 0) return '0s';
  if (t < 1000) return `${t}ms`;
  const h = Math.floor(t / 3_600_000);
  const m = Math.floor((t % 3_600_000) / 60_000);
  const sMs = t % 60_000;
  const s = (sMs / 1000).toFixed(3).replace(/\.?0+$/, '');
  if (h > 0) return `${h}h${m}m${s}s`;
  if (m > 0) return `${m}m${s}s`;
  return `${s}s`;
}

/** OpenAI's rate-limit headers for a state (a kind without a limit is left out). */
export function rateLimitHeaders(state: RateState): [string, string][] {
  const out: [string, string][] = [];
  for (const kind of ['requests', 'tokens'] as const) {
    const s = state[kind];
    if (!s) continue;
    out.push([`x-ratelimit-limit-${kind}`, String(s.limit)], [`x-ratelimit-remaining-${kind}`, String(s.remaining)], [`x-ratelimit-reset-${kind}`, formatResetDuration(s.resetMs)]);
  }
  return out;
}

/**
 * Anthropic's names for the same state, sent beside OpenAI's on /v1/messages:
 * anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, reset as an RFC 3339 time.
 */
export function anthropicRateLimitHeaders(state: RateState, now: number): [string, string][] {
  const out: [string, string][] = [];
  for (const kind of ['requests', 'tokens'] as const) {
    const s = state[kind];
    if (!s) continue;
    out.push([`anthropic-ratelimit-${kind}-limit`, String(s.limit)], [`anthropic-ratelimit-${kind}-remaining`, String(s.remaining)], [`anthropic-ratelimit-${kind}-reset`, new Date(now + Math.ceil(s.resetMs / 1000) * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z')]);
  }
  return out;
}

/** A state extrapolated `elapsedMs` later with nothing taken (for answers given without a round trip). */
export function advanceState(state: RateState, elapsedMs: number): RateState {
  const out: RateState = {};
  for (const kind of ['requests', 'tokens'] as const) {
    const s = state[kind];
    if (!s) continue;
    const level = Math.min(s.limit, s.remaining + (Math.max(0, elapsedMs) * s.limit) / WINDOW_MS);
    out[kind] = { limit: s.limit, remaining: Math.floor(level), resetMs: Math.max(0, s.resetMs - elapsedMs) };
  }
  return out;
}

const CHARS_PER_TOKEN = 4;

/** Where a request's prompt text is, for estimatePromptTokens. */
export interface PromptFields {
  /** Top-level fields whose text (at any depth up to 8) is counted. */
  readonly fields: readonly string[];
  /** Object keys whose values are not text (images, audio, files): skipped at any depth. */
  readonly skipKeys?: ReadonlySet<string>;
  /** A number counts as one token (token-id inputs). */
  readonly tokenIds?: boolean;
  /** Characters the engine sees more than once (a rerank query paired with every document). */
  extraChars?(body: Record<string, unknown>): number;
}

/** The generation APIs: chat and Responses messages, Anthropic `system`, completions `prompt`, tool schemas. */
export const GENERATION_PROMPT: PromptFields = {
  fields: ['messages', 'prompt', 'input', 'instructions', 'system', 'tools'],
  skipKeys: new Set(['image_url', 'input_audio', 'file', 'source']),
};

/**
 * A cheap estimate of a request's prompt tokens for the admission charge: characters of its text
 * over 4, OpenAI's rule of thumb for English, plus one per token id where `where` counts them.
 * Data URLs and other binary parts are not counted; the charge is settled from the engine's
 * usage when the request ends. Every API's estimate (the keyless ones pass their own fields).
 */
export function estimatePromptTokens(body: Record<string, unknown>, where: PromptFields = GENERATION_PROMPT): number {
  let chars = 0;
  let ids = 0;
  const visit = (v: unknown, depth: number): void => {
    if (depth > 8) return;
    if (typeof v === 'string') {
      if (!v.startsWith('data:')) chars += v.length;
    } else if (typeof v === 'number') {
      if (where.tokenIds) ids++;
    } else if (Array.isArray(v)) {
      for (const x of v) visit(x, depth + 1);
    } else if (v && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) {
        if (where.skipKeys?.has(k)) continue;
        visit(x, depth + 1);
      }
    }
  };
  for (const field of where.fields) visit(body[field], 0);
  return Math.ceil((chars + (where.extraChars?.(body) ?? 0)) / CHARS_PER_TOKEN) + ids;
}

/**
 * The completion budget a request names (OpenAI chat/completions, Responses, Anthropic), or null:
 * the largest of the budget fields present, times the sequences it runs (n / best_of). Engines
 * differ in which field wins (vLLM versions read `max_completion_tokens or max_tokens`, so a 0
 * in one lets the other through): the charge must cover whichever the engine obeys.
 */
export function requestedMaxTokens(body: Record<string, unknown>): number | null {
  let most: number | null = null;
  for (const f of ['max_completion_tokens', 'max_tokens', 'max_output_tokens']) {
    const v = body[f];
    if (typeof v === 'number' && Number.isFinite(v) && v >= 0) most = Math.max(most ?? 0, Math.floor(v));
  }
  return most === null ? null : most * sequencesOf(body);
}

/**
 * Tokens charged at admission: the prompt estimate plus the completion budget. Without an explicit
 * budget the default is charged, capped so the charge alone never exceeds the tightest token
 * limit (such a request is not "too large"; its real usage is settled afterwards).
 */
export function admissionCharge(promptEstimate: number, maxTokens: number | null, refs: readonly BucketRef[]): number {
  if (maxTokens !== null) return promptEstimate + maxTokens;
  const cap = Math.min(...refs.filter((r) => r.kind === 'tokens').map((r) => r.limit));
  return Math.min(promptEstimate + DEFAULT_COMPLETION_CHARGE, Number.isFinite(cap) ? Math.max(promptEstimate, cap) : Infinity);
}
