// `npm start`: four mock vLLM replicas (r1..r4 on 127.0.0.1:9001-9004) and the router under
// `wrangler dev` on 127.0.0.1:8787 with the demo configuration in wrangler.toml. Ctrl-C (or a
// SIGTERM to this process alone, as a supervisor sends) stops all: wrangler runs in its own process
// group, stopped whole, so no workerd outlives it.
import { spawn, type ChildProcess } from 'node:child_process';
import { startMockVllm, type MockVllm } from './mock-vllm.js';
import { DEV_ADMIN_TOKEN, DEV_CACHE_SALT_KEY, DEV_ORIGIN_API_KEY, DEV_TENANTS, tenantKeysSecret } from './lib/dev-credentials.js';
import { killGroup } from './lib/process-group.js';

const PORT = Number(process.env.PORT ?? 8787);
const mocks: MockVllm[] = [];
let wrangler: ChildProcess | undefined;
let stopping = false;

async function main(): Promise<void> {
  for (let i = 1; i <= 4; i++) {
    const m = await startMockVllm({ id: `r${i}`, port: 9000 + i, apiKey: DEV_ORIGIN_API_KEY, models: ['demo-model'] });
    mocks.push(m);
    console.log(`mock vLLM ${m.id} on ${m.url}`);
  }
  const args = [
    'wrangler', 'dev', '--ip', '127.0.0.1', '--port', String(PORT), '--inspector-port', String(Number(process.env.INSPECTOR_PORT ?? 9229)),
    '--var', `ADMIN_TOKEN:${DEV_ADMIN_TOKEN}`,
    '--var', `ORIGIN_API_KEY:${DEV_ORIGIN_API_KEY}`,
    '--var', `CACHE_SALT_KEY:${DEV_CACHE_SALT_KEY}`,
    '--var', `TENANT_KEYS:${tenantKeysSecret(DEV_TENANTS)}`,
    // No keyboard shortcuts: in its own process group wrangler must not read the terminal.
    '--show-interactive-dev-session=false',
  ];
  wrangler = spawn('npx', args, {
    detached: true, // own process group: shutdown() stops wrangler and its workerd together
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, WRANGLER_SEND_METRICS: 'false', CLOUDFLARE_CF_FETCH_ENABLED: 'false' },
  });
  let announced = false;
  wrangler.stdout!.on('data', (buf: Buffer) => {
    process.stdout.write(buf);
    if (!announced && buf.toString().includes('Ready on')) {
      announced = true;
      printTryIt();
    }
  });
  wrangler.on('exit', (code) => {
    if (!stopping) {
      console.error(`wrangler dev exited with ${code}`);
      void shutdown(code ?? 1);
    }
  });
}

function printTryIt(): void {
  const base = `http://127.0.0.1:${PORT}`;
  console.log(`
prefix-router is up on ${base} (tenant key sk-demo-acme, admin token ${DEV_ADMIN_TOKEN})

Try it:
  curl -sN ${base}/v1/chat/completions \\
    -H 'authorization: Bearer sk-demo-acme' -H 'content-type: application/json' -H 'x-session-id: demo-1' \\
    -d '{"model":"demo-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

  // openai SDK (npm i openai)
  import OpenAI from 'openai';
  const client = new OpenAI({ baseURL: '${base}/v1', apiKey: 'sk-demo-acme' });
  const r = await client.chat.completions.create(
    { model: 'demo-model', messages: [{ role: 'user', content: 'Hello' }] },
    { headers: { 'x-session-id': 'demo-1' } });

  # Rate limits: sk-demo-globex may send 120 requests/min and 20,000 tokens/min. The headers on
  # every answer, then a burst of 130: about 120 × 200, the rest 429 with retry-after.
  curl -si ${base}/v1/chat/completions -H 'authorization: Bearer sk-demo-globex' -H 'content-type: application/json' \
    -d '{"model":"demo-model","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}' | grep -iE '^(HTTP|x-ratelimit|retry-after)'
  for i in $(seq 130); do curl -s -o /dev/null -w '%{http_code}\n' ${base}/v1/chat/completions \
    -H 'authorization: Bearer sk-demo-globex' -H 'content-type: application/json' \
    -d '{"model":"demo-model","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}'; done | sort | uniq -c

  npm run demo:traffic                   # round-robin vs bounded-hash, per-replica hit rate and TTFT
  curl -s ${base}/admin/pools/chat -H 'authorization: Bearer ${DEV_ADMIN_TOKEN}'
Ctrl-C stops everything.
`);
}

async function shutdown(code = 0): Promise<void> {
  if (stopping) return;
  stopping = true;
  await Promise.allSettled([killGroup(wrangler), ...mocks.map((m) => m.close())]);
  setTimeout(() => process.exit(code), 500).unref();
}

process.on('SIGINT', () => void shutdown(0));
process.on('SIGTERM', () => void shutdown(0));
main().catch((e: unknown) => {
  console.error(`npm start failed: ${(e as Error).message}`);
  void shutdown(1);
});
