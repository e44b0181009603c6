// Tenant quota admission, the request flow's admit step (http/request-flow.ts): requests-per-minute
// and tokens-per-minute limits decided by the tenant's TenantMeter Durable Object
// (src/quota/tenant-meter.ts), OpenAI's x-ratelimit-* headers on every answer, a 429 in the
// route's dialect, and settlement of the token charge from the usage the proxy read.
// I/O: TenantMeter RPCs.
//
//   const q = await admitRequest(c, { model, body, dialect: 'openai' });
//   if (q.refused) return q.refused;
//   forward({ ..., admitted: q.pendingDecision(), leaseMemory: q.earlyConnect ? memory : undefined,
//             onFinish: (r) => { q.settle(r); ... } })
//   → q.withHeaders(response), or q.refused when forward() failed as `rate_limited`
//
// Round trips (docs/operations.md, "Tenant quotas"): a tenant without limits costs no admission
// call. Far from its limits, an isolate admits from an allowance the meter handed it ahead of
// time (limits.ts, Allowance), with no call. A tenant this isolate recently saw with headroom is
// admitted *while* the lease is acquired (forward() waits for both before any origin is
// contacted, so a refusal still never reaches an origin); near a limit, or unseen, the meter is
// asked first. A tenant refused on requests is refused here without a call until its bucket can
// hold a request again.

import type { FinishedRequest } from '../proxy/forward.js';
import { admissionCharge, advanceState, anthropicRateLimitHeaders, bucketsFor, estimatePromptTokens, rateLimitHeaders, requestedMaxTokens, type Allowance, type LimitKind, type RateState, type TenantLimits } from '../quota/limits.js';
import type { AdmitResult, SettleRequest, SettleResult, TenantMeterImpl } from '../quota/tenant-meter.js';
import { settleOutbox, type SettleOutbox } from '../quota/settle-outbox.js';
import { rateLimitResponse, type ErrorShape } from './errors.js';
import type { Tenant } from './tenants.js';

/** The tenant's meter: one Durable Object per tenant id. */
export function meterFor(env: Env, tenant: string): DurableObjectStub<TenantMeterImpl> {
  return env.TENANT_METER.get(env.TENANT_METER.idFromName(tenant)) as unknown as DurableObjectStub<TenantMeterImpl>;
}

/** What an isolate remembers of a (tenant, model) between requests. */
interface View {
  state: RateState;
  at: number;
  /** Refused on a requests limit: nothing of this tenant and model fits before `until`. */
  blocked: { until: number; refusal: Extract<AdmitResult, { ok: false }> } | null;
}

/** Overlap the admission with the lease only with this share of every limit to spare. */
const OVERLAP_HEADROOM = 0.1;
/** An isolate's view older than this is not trusted for overlapping. */
const VIEW_TTL_MS = 10_000;
const MAX_VIEWS = 10_000;

/** Per-isolate state of the quota gate: views of tenants' limits and refusals not yet reported. */
export class QuotaGate {
  private readonly views = new Map<string, View>();
  private readonly localRefusals = new Map<string, { requests: number; tokens: number }>();
  private readonly allowances = new Map<string, Allowance>();

  /** Admit from this isolate's allowance, without a round trip, if it holds enough. */
  takeAllowance(key: string, charge: number, now: number): boolean {
    const a = this.allowances.get(key);
    if (!a || a.until <= now) return false;
    if ((a.requests !== null && a.requests < 1) || (a.tokens !== null && a.tokens < charge)) return false;
    if (a.requests !== null) a.requests -= 1;
    if (a.tokens !== null) a.tokens -= charge;
    return true;
  }

  addAllowance(key: string, a: Allowance, now: number): void {
    // One allowance per isolate and model at a time: what is left of the previous one goes back
    // with the next call, so an isolate never holds more than one grant (5 % of a limit).
    const cur = this.allowances.get(key);
    if (cur) this.keepReturn(key, cur);
    if (!cur && this.allowances.size >= MAX_VIEWS) this.allowances.delete(this.allowances.keys().next().value!);
    this.allowances.set(key, a);
    void now;
  }

  private readonly returns = new Map<string, { requests: number; tokens: number }>();
  private keepReturn(key: string, a: Allowance): void {
    const r = this.returns.get(key) ?? { requests: 0, tokens: 0 };
    r.requests += a.requests ?? 0;
    r.tokens += a.tokens ?? 0;
    if (r.requests > 0 || r.tokens > 0) this.returns.set(key, r);
  }

  /** Ask for a new allowance with the next call: none, expired, or nearly used up. */
  wantsAllowance(key: string, charge: number, now: number): boolean {
    const a = this.allowances.get(key);
    if (!a || a.until <= now) return true;
    return (a.requests !== null && a.requests < 2) || (a.tokens !== null && a.tokens < 2 * charge);
  }

  /** What this isolate gives back with its next call: replaced or expired allowances' rest (once). */
  takeReturn(key: string, now: number): { requests: number; tokens: number } | undefined {
    const a = this.allowances.get(key);
    if (a && a.until <= now) {
      this.allowances.delete(key);
      this.keepReturn(key, a);
    }
    const r = this.returns.get(key);
    if (r) this.returns.delete(key);
    return r;
  }

  view(key: string): View | undefined {
    return this.views.get(key);
  }

  learn(key: string, v: View): void {
    const cur = this.views.get(key);
    if (cur && cur.at > v.at) return;
    this.views.delete(key);
    if (this.views.size >= MAX_VIEWS) this.views.delete(this.views.keys().next().value!);
    this.views.set(key, v);
  }

  /** Locally: take the request and its charge from the view, so this isolate does not overrun it. */
  spend(key: string, tokens: number): void {
    const v = this.views.get(key);
    if (!v) return;
    const r = v.state.requests;
    const t = v.state.tokens;
    v.state = { ...(r ? { requests: { ...r, remaining: Math.max(0, r.remaining - 1) } } : {}), ...(t ? { tokens: { ...t, remaining: Math.max(0, t.remaining - tokens) } } : {}) };
  }

  private readonly answered = new Map<string, { state: RateState; at: number }>();

  /** The tenant-wide buckets as this isolate last read them for an answer without admission. */
  answerView(tenant: string, now: number): RateState | null {
    const v = this.answered.get(tenant);
    return v && now - v.at < VIEW_TTL_MS ? advanceState(v.state, now - v.at) : null;
  }

  learnAnswerView(tenant: string, state: RateState, at: number): void {
    this.answered.delete(tenant);
    if (this.answered.size >= MAX_VIEWS) this.answered.delete(this.answered.keys().next().value!);
    this.answered.set(tenant, { state, at });
  }

  countLocalRefusal(tenantModel: string, kind: LimitKind): void {
    let r = this.localRefusals.get(tenantModel);
    if (!r) this.localRefusals.set(tenantModel, (r = { requests: 0, tokens: 0 }));
    r[kind]++;
  }

  /** Refusals answered here since the last call, handed to the meter with the next RPC. */
  takeLocalRefusals(tenantModel: string): { requests: number; tokens: number } | undefined {
    const r = this.localRefusals.get(tenantModel);
    if (r) this.localRefusals.delete(tenantModel);
    return r;
  }
}

/** This isolate's gate. */
export const quotaGate = new QuotaGate();

export interface AdmitInput {
  model: string;
  body: Record<string, unknown>;
  /** The error shape of the route: OpenAI JSON, or Anthropic's on /v1/messages. */
  dialect?: ErrorShape;
  /** The route's own prompt-token estimate (default: estimatePromptTokens(body)). */
  promptTokens?: number;
  /** The route's own completion budget (default: the body's max_tokens); 0 for APIs that generate nothing (embeddings, rerank, ...). */
  completionTokens?: number;
}

export interface AdmissionEnv {
  env: Env;
  tenant: Pick<Tenant, 'id' | 'limits'>;
  requestId: string;
  waitUntil: (p: Promise<unknown>) => void;
  gate?: QuotaGate;
  meter?: (tenant: string) => Pick<TenantMeterImpl, 'admit' | 'settle'> | DurableObjectStub<TenantMeterImpl>;
  now?: () => number;
  /** Where settles wait until they land (default: the isolate's). */
  outbox?: SettleOutbox;
}

interface MeterClient {
  admit(req: Parameters<TenantMeterImpl['admit']>[0]): Promise<AdmitResult>;
  settle(req: SettleRequest): Promise<SettleResult | undefined>;
}

export class Admission {
  /** The 429 to answer: refused before anything else ran, or by the decision forward() awaited (pendingDecision). */
  refused: Response | null = null;
  /** Early connect may be used: admission is already decided when forward() starts. */
  earlyConnect = true;
  private state: RateState | null = null;
  private pending: Promise<AdmitResult | null> | null = null;
  private refusal: Extract<AdmitResult, { ok: false }> | null = null;
  private settled = false;

  constructor(
    private readonly a: AdmissionEnv,
    private readonly meter: MeterClient,
    private readonly input: AdmitInput,
    private readonly limits: TenantLimits | undefined,
    private readonly charge: number,
    private readonly estimate: number,
    /** Buckets apply to this request (the tenant has limits for it). */
    private readonly applies: boolean,
    private readonly limited: boolean,
  ) {}

  private get gate(): QuotaGate {
    return this.a.gate ?? quotaGate;
  }
  private get viewKey(): string {
    return `${this.a.tenant.id}\u0000${this.input.model}`;
  }
  private now(): number {
    return (this.a.now ?? Date.now)();
  }

  /** Decide (or start deciding) the admission. */
  async start(): Promise<void> {
    if (!this.applies) return;
    const key = this.viewKey;
    const now = this.now();
    const view = this.gate.view(key);
    if (view?.blocked && view.blocked.until > now) {
      this.gate.countLocalRefusal(key, view.blocked.refusal.kind);
      this.refuse({ ...view.blocked.refusal, retryAfterMs: view.blocked.until - now, state: advanceState(view.state, now - view.at), at: now });
      return;
    }
    if (this.gate.takeAllowance(key, this.charge, now)) {
      // From this isolate's allowance: no round trip. The headers are this isolate's view.
      this.gate.spend(key, this.charge);
      const v = this.gate.view(key);
      this.state = v ? advanceState(v.state, now - v.at) : null;
      return;
    }
    const decision = this.ask(key);
    if (view && now - view.at < VIEW_TTL_MS && hasHeadroom(view.state, this.charge)) {
      // Far from every limit: decided while the lease is acquired (see pendingDecision).
      this.gate.spend(key, this.charge);
      this.earlyConnect = false;
      this.pending = decision;
      return;
    }
    await this.conclude(await decision);
  }

  private async ask(key: string): Promise<AdmitResult | null> {
    try {
      const now = this.now();
      const returned = this.gate.takeReturn(key, now);
      return await this.meter.admit({ tenant: this.a.tenant.id, model: this.input.model, limits: this.limits!, tokens: this.charge, localRefusals: this.gate.takeLocalRefusals(key), wantAllowance: this.gate.wantsAllowance(key, this.charge, now), ...(returned ? { returned } : {}) });
    } catch (e) {
      // The meter is unreachable: fail open (serve the request, unmetered against the limit).
      console.error(JSON.stringify({ type: 'quota_fail_open', tenant: this.a.tenant.id, requestId: this.a.requestId, message: e instanceof Error ? e.message : String(e) }));
      return null;
    }
  }

  private async conclude(r: AdmitResult | null): Promise<void> {
    if (!r) return;
    const key = this.viewKey;
    if (r.ok) {
      this.state = r.state;
      this.gate.learn(key, { state: r.state, at: r.at, blocked: null });
      if (r.allowance) this.gate.addAllowance(key, r.allowance, this.now());
      return;
    }
    this.gate.learn(key, { state: r.state, at: r.at, blocked: r.kind === 'requests' && r.retryAfterMs !== null ? { until: r.at + r.retryAfterMs, refusal: r } : null });
    this.refuse(r);
  }

  private refuse(r: Extract<AdmitResult, { ok: false }>): void {
    this.refusal = r;
    this.state = r.state;
    this.settled = true; // nothing was taken: nothing to settle
    const where = r.scope === '*' ? `tenant ${this.a.tenant.id}` : `${this.a.tenant.id} on model ${r.scope}`;
    const per = r.kind === 'requests' ? 'requests per min (RPM)' : 'tokens per min (TPM)';
    const message =
      r.retryAfterMs === null
        ? `Request too large for ${where} on ${per}: Limit ${r.limit}, Requested ${r.requested}. The input or output tokens must be reduced in order to run successfully.`
        : `Rate limit reached for ${where} on ${per}: Limit ${r.limit}, Used ${r.limit - r.available}, Requested ${r.requested}. Please try again in ${formatWait(r.retryAfterMs)}.`;
    this.refused = rateLimitResponse(this.input.dialect ?? 'openai', r.kind, message, r.retryAfterMs, { 'x-request-id': this.a.requestId, ...Object.fromEntries(this.headers(r.state)) });
  }

  /**
   * The decision still under way, if any (a tenant this isolate saw with headroom is admitted
   * while its lease is acquired): true to go on. forward() awaits it with its first acquire
   * (`admitted`), so a refused request never reaches an origin; a refusal then ends it as
   * `rate_limited` and the answer is `refused`. Undefined when the decision was already made.
   */
  pendingDecision(): Promise<boolean> | undefined {
    const pending = this.pending;
    if (!pending) return undefined;
    this.pending = null;
    return pending.then((d) => this.conclude(d)).then(() => this.refusal === null);
  }

  /** Set the rate-limit headers on a response (mutable headers: forward()'s and errors.ts's are). */
  withHeaders(res: Response): Response {
    if (!this.state) return res;
    for (const [k, v] of this.headers(this.state)) res.headers.set(k, v);
    return res;
  }

  /** OpenAI's x-ratelimit-* headers; on Anthropic's paths also its anthropic-ratelimit-* ones. */
  private headers(state: RateState): [string, string][] {
    const h = rateLimitHeaders(state);
    return this.input.dialect === 'anthropic' ? [...h, ...anthropicRateLimitHeaders(state, this.now())] : h;
  }

  /**
   * Settle the charge and meter the usage when the request is finished (from onFinish).
   * `deferred`: the answer came before the generation (a Responses `background: true` request
   * answers `queued`), so a 2xx without usage keeps the whole reservation, as a cut stream does.
   */
  settle(r: FinishedRequest, opts: { deferred?: boolean } = {}): void {
    if (this.settled) return;
    this.settled = true;
    const usage = r.promptTokens !== null ? { promptTokens: r.promptTokens, cachedTokens: r.cachedTokens, completionTokens: r.completionTokens ?? 0 } : null;
    const deferred = opts.deferred === true && usage === null && r.replica !== null && r.status >= 200 && r.status < 300;
    const req: SettleRequest = {
      tenant: this.a.tenant.id,
      model: this.input.model,
      ...(this.limits ? { limits: this.limits } : {}),
      charged: this.charge,
      used: deferred ? this.charge : tokensUsed(r, usage, this.charge, this.estimate),
      limited: this.limited,
      usage,
      localRefusals: this.gate.takeLocalRefusals(this.viewKey),
    };
    if (this.applies) {
      // Allowances ride on settlements: a busy tenant's isolate keeps admitting without a round trip.
      const now = this.now();
      const returned = this.gate.takeReturn(this.viewKey, now);
      if (returned) req.returned = returned;
      req.wantAllowance = this.gate.wantsAllowance(this.viewKey, this.charge, now);
    }
    const key = this.viewKey;
    // Retried until it lands (quota/settle-outbox.ts); the id is drawn here, never the client's
    // request id, which a tenant could repeat to have its usage counted once.
    (this.a.outbox ?? settleOutbox).deliver(this.meter, { ...req, id: crypto.randomUUID() }, this.a.waitUntil, (res) => {
      if (res?.allowance) this.gate.addAllowance(key, res.allowance, this.now());
    });
  }
}

/**
 * What a finished request is charged: the engine's usage when it came. Without usage: nothing
 * when no origin answered with a 2xx (router failures, 4xx, 5xx: nothing was generated); the
 * prompt estimate when the answer completed without reporting usage (count_tokens, tokenize, an
 * engine that does not report it); the whole reservation when the answer was cut short (the
 * client left, the stream failed or ran too long), since what the engine generated until then is
 * unknown and may be all of it.
 */
export function tokensUsed(r: Pick<FinishedRequest, 'replica' | 'status' | 'error'>, usage: { promptTokens: number; completionTokens: number } | null, charge: number, estimate: number): number {
  if (usage) return usage.promptTokens + usage.completionTokens;
  if (r.replica === null || r.status < 200 || r.status >= 300) return 0;
  return r.error === undefined ? Math.min(estimate, charge) : charge;
}

function hasHeadroom(s: RateState, charge: number): boolean {
  const r = s.requests;
  const t = s.tokens;
  if (r && r.remaining - 1 < Math.max(2, r.limit * OVERLAP_HEADROOM)) return false;
  if (t && t.remaining - charge < Math.max(charge, t.limit * OVERLAP_HEADROOM)) return false;
  return true;
}

function formatWait(ms: number): string {
  return ms < 1000 ? `${Math.max(1, Math.ceil(ms))}ms` : `${(Math.ceil(ms / 100) / 10).toFixed(1).replace(/\.0$/, '')}s`;
}

/**
 * Admit a request for `input.model` under its tenant's limits. Always returns an Admission: check
 * `refused` first; call `settle` from forward()'s onFinish and `withHeaders` on the answer.
 */
export async function admit(a: AdmissionEnv, input: AdmitInput): Promise<Admission> {
  const limits = a.tenant.limits;
  const refs = bucketsFor(limits, input.model);
  const estimate = input.promptTokens ?? estimatePromptTokens(input.body);
  const charge = admissionCharge(estimate, input.completionTokens ?? requestedMaxTokens(input.body), refs);
  const stub = (a.meter ?? ((t: string) => meterFor(a.env, t)))(a.tenant.id) as unknown as MeterClient;
  const adm = new Admission(a, stub, input, limits, charge, estimate, refs.length > 0, refs.some((r) => r.kind === 'tokens'));
  await adm.start();
  return adm;
}

/** A route's admission from its Hono context (the tenant and request id the middleware set). */
export function admitRequest(c: { env: Env; executionCtx: { waitUntil(p: Promise<unknown>): void }; var: { tenant: Pick<Tenant, 'id' | 'limits'>; requestId: string } }, input: AdmitInput): Promise<Admission> {
  return admit({ env: c.env, tenant: c.var.tenant, requestId: c.var.requestId, waitUntil: (p) => c.executionCtx.waitUntil(p) }, input);
}

/**
 * OpenAI's x-ratelimit-* headers (and Anthropic's on its paths) for an answer that ran no
 * admission: a 400 or 404 found before it, GET /v1/models, a by-id route refused early. OpenAI
 * sends them on every answer, and an SDK pacing itself reads them from whatever came back. The
 * state is the tenant-wide buckets (model "*"): this isolate's last reading while fresh
 * (VIEW_TTL_MS), else one read of the meter that charges nothing, so a tenant sending only bad
 * requests costs at most one meter call per isolate per 10 s. A tenant without limits gets none;
 * a meter that cannot be read leaves the answer as it is.
 */
export async function withAnswerRateLimitHeaders(
  a: { env: Env; tenant: Pick<Tenant, 'id' | 'limits'>; gate?: QuotaGate; now?: () => number; meter?: (tenant: string) => Pick<TenantMeterImpl, 'state'> | DurableObjectStub<TenantMeterImpl> },
  res: Response,
  shape: ErrorShape,
): Promise<Response> {
  const limits = a.tenant.limits;
  if (!limits || res.headers.has('x-ratelimit-limit-requests') || res.headers.has('x-ratelimit-limit-tokens')) return res;
  const gate = a.gate ?? quotaGate;
  const now = (a.now ?? Date.now)();
  let state = gate.answerView(a.tenant.id, now);
  if (!state) {
    try {
      const meter = a.meter ? a.meter(a.tenant.id) : meterFor(a.env, a.tenant.id);
      state = (await meter.state(limits, '*')) as RateState;
      gate.learnAnswerView(a.tenant.id, state, now);
    } catch {
      return res;
    }
  }
  const headers = shape === 'anthropic' ? [...rateLimitHeaders(state), ...anthropicRateLimitHeaders(state, now)] : rateLimitHeaders(state);
  if (headers.length === 0) return res;
  let out = res;
  try {
    for (const [k, v] of headers) out.headers.set(k, v);
  } catch {
    // Immutable headers (a response taken as it came): copy it once.
    out = new Response(res.body, res);
    for (const [k, v] of headers) out.headers.set(k, v);
  }
  return out;
}
