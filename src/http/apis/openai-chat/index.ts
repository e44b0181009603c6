// OpenAI Chat Completions and Completions (`/v1/chat/completions`, `/v1/completions`) as vLLM
// serves them. Pure: validation in body.ts, prompt text in core/keys.ts, upstream body in
// proxy/upstream-request.ts, the stream reading in proxy/sse-tap.ts.

import { canonicalPrompt } from '../../../core/index.js';
import { openAIReader } from '../../../proxy/sse-tap.js';
import { prepareUpstreamBody } from '../../../proxy/upstream-request.js';
import { validateRequest, type OpenAIKind } from '../../body.js';
import type { Dialect } from '../dialect.js';

function openAI(kind: OpenAIKind, path: string): Dialect {
  return {
    name: kind,
    path,
    errors: 'openai',
    validate(body) {
      const v = validateRequest(kind, body);
      return v.ok ? { ok: true, model: body.model as string, stream: body.stream === true } : v;
    },
    promptText: (body) => canonicalPrompt(body),
    prepareBody: (body, opts) => prepareUpstreamBody(body, opts),
    reader: (prepared) => openAIReader(kind, prepared.stripUsageChunk),
  };
}

export const chatDialect: Dialect = openAI('chat', '/v1/chat/completions');
export const completionDialect: Dialect = openAI('completion', '/v1/completions');
