// The API dialects the router serves, and which error shape each path speaks. Pure.

import type { ErrorShape } from '../errors.js';
import type { Dialect } from './dialect.js';
import { KEYLESS_DIALECTS } from './keyless.js';
import { chatDialect, completionDialect } from './openai-chat.js';

export type { Dialect, DialectRequest, ValidRequest } from './dialect.js';
export { chatDialect, completionDialect };

/** Anthropic paths (`/v1/messages`, `/v1/messages/count_tokens`) answer errors in Anthropic's shape. */
export function errorShapeFor(path: string): ErrorShape {
  return path === '/v1/messages' || path.startsWith('/v1/messages/') ? 'anthropic' : 'openai';
}

/** The dialects whose POST routes the app mounts, by path. */
export const DIALECTS: readonly Dialect[] = [chatDialect, completionDialect, ...KEYLESS_DIALECTS];
