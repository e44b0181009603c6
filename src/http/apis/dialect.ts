// The one interface every API dialect implements (Chat Completions, Completions, Responses,
// Anthropic Messages, the keyless APIs): how its body is validated, what it routes by, how the
// origin's body is rewritten and how its answer is read. Pure: no I/O; the Worker, the proxy,
// leases, limits, metrics and the trace log stay shared (http/request-flow.ts, proxy/forward.ts).

import type { EngineName, KeylessApi } from '../../engines/index.js';
import type { UpstreamDialect } from '../../proxy/forward.js';
import type { BodyFailure } from '../body.js';
import type { ErrorShape } from '../errors.js';

export type { ErrorShape };

/** A validated request: what the shared path needs to know about it. */
export interface ValidRequest {
  ok: true;
  /** Selects the pool. */
  model: string;
  /** The answer is an SSE stream. */
  stream: boolean;
}

/** The client request as a dialect may read it (headers for its own session identity). */
export interface DialectRequest {
  readonly headers: Headers;
  readonly body: Record<string, unknown>;
}

export interface Dialect extends UpstreamDialect {
  /** Name in logs and metrics (`chat`, `completion`, `responses`, `messages`, ...). */
  readonly name: string;
  /** The origin path the request is forwarded to. */
  readonly path: string;
  /** The shape of every error on this dialect's paths (errors.ts). */
  readonly errors: ErrorShape;
  /** Validate the fields the router relies on; unknown fields pass through to the origin. */
  validate(body: Record<string, unknown>): ValidRequest | BodyFailure;
  /**
   * A session identity this API's clients send on their own (Claude Code's session header, the
   * Messages API's `metadata.user_id`), used for the pool's first `header:` key source when the
   * request lacks that header. Hashed like the header, so it is namespaced the same way.
   */
  sessionId?(req: DialectRequest): string | undefined;
  /**
   * The canonical prompt start for `prefix:` keys and prefix-index blocks, in the order the
   * engine's prompt is built: tool schemas, then system / instructions, then each message's role
   * and content (core/keys.ts `canonicalPrompt` for Chat Completions). '' when there is none.
   */
  promptText(body: Record<string, unknown>): string;
  /**
   * Keyless APIs (embeddings, rerank, score, tokenize; apis/keyless/): no prefix to keep, so no
   * routing key is resolved and no prompt blocks are hashed, and the pool's fallback strategy
   * (least-load by default) picks. A pool whose engine lacks `api` (config `engine` /
   * `endpoints`) answers 404; the origin path can differ per engine.
   */
  readonly keyless?: {
    readonly api: KeylessApi;
    upstreamPath(engine: EngineName): string;
    /** Prompt tokens for the admission charge (quotas); these APIs generate none. */
    promptTokens(body: Record<string, unknown>): number;
  };
}
