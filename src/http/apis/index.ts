// The API dialects the router serves, one folder each (validation, prompt text, upstream body,
// stream reader, routes), and which error shape each path speaks. Pure: the routes are mounted
// from each folder's routes.ts (http/app.ts).

import type { ErrorShape } from '../errors.js';
import { KEYLESS_DIALECTS } from './keyless/index.js';
import { chatDialect, completionDialect } from './openai-chat/index.js';
import { countTokensDialect, isAnthropicPath, messagesDialect } from './anthropic/index.js';

export type { Dialect, DialectRequest, ValidRequest } from './dialect.js';
export { chatDialect, completionDialect, countTokensDialect, isAnthropicPath, KEYLESS_DIALECTS, messagesDialect };
export { newResponseId, poolTag, poolTagOf, responsesDialect, RESPONSE_ID_PARAM, storedResponseDialect } from './responses/index.js';

/** The error shape of every answer on `path`: Anthropic's on its paths, else OpenAI's. */
export function errorShapeFor(path: string): ErrorShape {
  return isAnthropicPath(path) ? 'anthropic' : 'openai';
}
