// The keyless APIs' routes (embeddings, rerank, score, tokenize, detokenize, with vLLM's aliases
// outside /v1) through the shared dialect request (http/dialect-request.ts).

import type { Hono } from 'hono';
import type { AppEnv } from '../../context.js';
import { mountDialect } from '../../dialect-request.js';
import { KEYLESS_DIALECTS } from './index.js';

/** Keyless API paths outside /v1 (vLLM's /tokenize, /detokenize, /rerank, /v2/rerank): authenticated like /v1. */
export const KEYLESS_ROOT_PATHS: readonly string[] = KEYLESS_DIALECTS.map((d) => d.path).filter((p) => !p.startsWith('/v1/'));

export function keylessRoutes(app: Hono<AppEnv>): void {
  for (const dialect of KEYLESS_DIALECTS) mountDialect(app, dialect);
}
