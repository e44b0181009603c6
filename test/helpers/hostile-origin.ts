// A hostile and odd origin for the abuse suite, on 127.0.0.1: one node:http server whose first
// path segment picks its behaviour, plus a canary that only records what reaches it.
//
//   /redirect/...   307 to the canary for every path (health, metrics, completions)
//   /vllm-1/...     a path-prefixed gateway: forwards to a mock vLLM with the prefix removed
//                   (and 404 at the root, so a dropped path shows)
//   /odd/...        /health and /metrics answer; completions by the `x-origin-mode` header:
//                     dump      200 JSON of the headers and body it received (the default)
//                     html200   200 text/html
//                     html404   404 text/html
//                     echo400   400 JSON echoing the request's Authorization header (a debug page)
//                     sse-html  200 text/html for a streaming request, as SSE bytes
//                     slow      answers after `x-origin-delay-ms` (default 6 s)
//                     cf524     524 text/html, as Cloudflare's proxy answers for an origin silent 120 s
//
// Every request is recorded. Only loopback; every wait is bounded.

import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface SeenRequest {
  method: string;
  path: string;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export interface HostileOrigin {
  url: string;
  port: number;
  seen: SeenRequest[];
  canary: { url: string; seen: SeenRequest[] };
  close(): Promise<void>;
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
}

async function listen(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ server: Server; port: number }> {
  const server = createServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port };
}

const close = (s: Server) => new Promise<void>((r) => { s.closeAllConnections(); s.close(() => r()); });

/** `gateway`: the mock vLLM the `/vllm-1` prefix forwards to. */
export async function startHostileOrigin(gateway: { port: number }): Promise<HostileOrigin> {
  const canarySeen: SeenRequest[] = [];
  const canary = await listen(async (req, res) => {
    canarySeen.push({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, body: await readBody(req) });
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"stolen":true}');
  });
  const seen: SeenRequest[] = [];
  const origin = await listen(async (req, res) => {
    const body = await readBody(req);
    const path = req.url ?? '/';
    seen.push({ method: req.method ?? '', path, headers: req.headers, body });
    const [, head, ...rest] = path.split('/');
    const tail = '/' + rest.join('/');
    if (head === 'redirect') {
      res.writeHead(307, { location: `http://127.0.0.1:${canary.port}/steal${tail}` }).end();
      return;
    }
    if (head === 'vllm-1') {
      const up = httpRequest({ host: '127.0.0.1', port: gateway.port, method: req.method, path: tail, headers: { ...req.headers, host: `127.0.0.1:${gateway.port}` } }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      });
      up.on('error', () => res.writeHead(502).end());
      up.end(body);
      return;
    }
    if (head === 'odd') {
      if (tail === '/health') return void res.writeHead(200).end();
      if (tail === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end('vllm:num_requests_waiting{model_name="m"} 0\n');
      const mode = String(req.headers['x-origin-mode'] ?? 'dump');
      switch (mode) {
        case 'html200':
          return void res.writeHead(200, { 'content-type': 'text/html', 'cache-control': 'public, max-age=3600', 'set-cookie': 'origin=1' }).end('<html><script>alert(document.cookie)</script></html>');
        case 'html404':
          return void res.writeHead(404, { 'content-type': 'text/html' }).end('<html><body>Not Found</body></html>');
        case 'echo400':
          return void res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: `bad request; you sent authorization: ${String(req.headers.authorization)}`, type: 'BadRequestError', code: 400 } }));
        case 'sse-html':
          return void res.writeHead(200, { 'content-type': 'text/html' }).end('data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n');
        case 'cf524':
          return void res.writeHead(524, { 'content-type': 'text/html' }).end('<html><title>example.com | 524: A timeout occurred</title></html>');
        case 'slow': {
          const ms = Number(req.headers['x-origin-delay-ms'] ?? 6_000);
          const t = setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end('{"late":true}'), Math.min(ms, 20_000));
          res.on('close', () => clearTimeout(t));
          return;
        }
        default:
          return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ headers: req.headers, body: body ? (JSON.parse(body) as unknown) : null }));
      }
    }
    res.writeHead(404, { 'content-type': 'text/plain' }).end('no such path');
  });
  return {
    url: `http://127.0.0.1:${origin.port}`,
    port: origin.port,
    seen,
    canary: { url: `http://127.0.0.1:${canary.port}`, seen: canarySeen },
    async close() {
      await Promise.allSettled([close(origin.server), close(canary.server)]);
    },
  };
}
