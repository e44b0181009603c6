// The Chat Completions and Completions routes: POST /v1/chat/completions and /v1/completions
// through the shared dialect request (http/dialect-request.ts).

import type { Hono } from 'hono';
import type { AppEnv } from '../../context.js';
import { mountDialect } from '../../dialect-request.js';
import { chatDialect, completionDialect } from './index.js';

export function openAIChatRoutes(app: Hono<AppEnv>): void {
  mountDialect(app, chatDialect);
  mountDialect(app, completionDialect);
}
