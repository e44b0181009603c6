// The API dialects the router serves, and which error shape each path speaks. Pure.

import type { ErrorShape } from '../errors.js';
import type { Dialect } from './dialect.js';
import { KEYLESS_DIALECTS } from './keyless/index.js';
import { chatDialect, completionDialect } from './openai-chat/index.js';
import { countTokensDialect, messagesDialect } from './anthropic/index.js';

export type { Dialect, DialectRequest, ValidRequest } from './dialect.js';
export { chatDialect, completionDialect, countTokensDialect, messagesDialect };
export { newResponseId, poolTag, poolTagOf, responsesDialect, RESPONSE_ID_PARAM, storedResponseDialect } from './responses/index.js';

/** Anthropic paths (`/v1/messages`, `/v1/messages/count_tokens`) answer errors in Anthropic's shape. */
export function errorShapeFor(path: string): ErrorShape {
  return path === '/v1/messages' || path.startsWith('/v1/messages/') ? 'anthropic' : 'openai';
}

/** The dialects whose POST routes the app mounts as they are, by path (Responses has its own routes). */
export const DIALECTS: readonly Dialect[] = [chatDialect, completionDialect, messagesDialect, countTokensDialect, ...KEYLESS_DIALECTS];
