// OpenAI Chat Completions and Completions (`/v1/chat/completions`, `/v1/completions`) as vLLM
// serves them: validation (validate.ts), the upstream body (body.ts), the stream reader
// (reader.ts), continuing a broken stream elsewhere (continuation.ts), the routes (routes.ts); the prompt text for routing keys is core/keys.ts
// canonicalPrompt, which the simulator shares. Pure.

import { canonicalPrompt } from '../../../core/index.js';
import type { Dialect } from '../dialect.js';
import { prepareOpenAIBody } from './body.js';
import { openAIReader } from './reader.js';
import { OpenAIAnswer } from './continuation.js';
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
    prepareBody: (body, opts) => prepareOpenAIBody(body, opts),
    reader: (prepared) => openAIReader(kind, prepared.stripUsageChunk),
    continuation: (body) => new OpenAIAnswer(kind, body),
  };
}

export const chatDialect: Dialect = openAI('chat', '/v1/chat/completions');
export const completionDialect: Dialect = openAI('completion', '/v1/completions');
