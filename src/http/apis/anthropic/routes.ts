// The Anthropic Messages routes: POST /v1/messages and /v1/messages/count_tokens through the
// shared dialect request (http/dialect-request.ts). Every answer on /v1/messages paths, errors
// included, is in Anthropic's shape (isAnthropicPath, apis/index.ts errorShapeFor), and the
// tenant key may come as `x-api-key` there (http/app.ts authenticate).

import type { Hono } from 'hono';
import type { AppEnv } from '../../context.js';
import { mountDialect } from '../../dialect-request.js';
import { countTokensDialect, messagesDialect } from './index.js';

export function anthropicRoutes(app: Hono<AppEnv>): void {
  mountDialect(app, messagesDialect);
  mountDialect(app, countTokensDialect);
}
