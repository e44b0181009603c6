// OpenAI Chat Completions and Completions (`/v1/chat/completions`, `/v1/completions`) as vLLM
// serves them: validation (validate.ts), the stream reader (reader.ts), the upstream body
// (proxy/upstream-request.ts, shared with the other dialects' fencing), the prompt text for
// routing keys (core/keys.ts, which the simulator shares). Pure.

import { canonicalPrompt } from '../../../core/index.js';
import { prepareUpstreamBody } from '../../../proxy/upstream-request.js';
import type { Dialect } from '../dialect.js';
import { openAIReader } from './reader.js';
import { validateRequest, type OpenAIKind } from './validate.js';

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
