// Command-line flags of the mock vLLM replica and their help text. Pure: parses argv, no I/O.

import { parseArgs } from 'node:util';

import { mergeFaults } from './server.js';
import { PROFILES, type MockProfile } from './profiles.js';
import { DEFAULT_FAULTS, type MetricsFlavor, type MockFaults, type MockVllmOptions } from './types.js';

export const USAGE = `Usage: npm run mock-engine -- --port 9001 --id r1 [options]

A mock vLLM OpenAI-compatible server on 127.0.0.1 with a real prefix cache model, for tests,
benchmarks and the local demo. Endpoints: POST /v1/chat/completions, POST /v1/completions,
GET /v1/models, GET /health, GET /metrics, and the mock's GET /_mock/stats,
POST /_mock/faults (JSON fault flags, merged), POST /_mock/reset.

Engine:
  --profile NAME                whose wire behaviour to follow (from each engine's source):
                                vllm (V1 API server, default flags), vllm-cache-report
                                (--enable-prompt-tokens-details), sglang, sglang-cache-report
                                (--enable-cache-report), llama.cpp (--metrics), legacy (the
                                old mock: no engine's behaviour)                   [vllm]
  --headers-first               send a stream's 200 and headers before queueing and
                                prefill (vLLM, SGLang); overrides the profile
  --no-headers-first            send them with the first chunk (llama.cpp, legacy)
  --responses-store             keep Responses (VLLM_ENABLE_RESPONSES_API_STORE=1);
                                overrides the profile (off for vllm, on for legacy)
  --no-responses-store          do not keep them

Replica:
  --port N                      port on 127.0.0.1 (0 = any free port)              [0]
  --id NAME                     replica id, printed on start and in /_mock/stats  [mock]
  --model NAME                  served model name; repeat or comma-separate for several;
                                the first is the default                           [demo-model]
  --api-key KEY                 require "Authorization: Bearer KEY" on /v1/* (401 otherwise)
  --cache-blocks N              prefix cache capacity in 16-token blocks (num_gpu_blocks) [2048]
  --prefill-tokens-per-sec N    prefill speed for uncached prompt tokens          [50000]
  --decode-ms-per-token N       delay per generated token after the first         [2]
  --max-num-seqs N              concurrent sequences (vLLM's flag); the rest wait in
                                a FIFO queue, counted by vllm:num_requests_waiting [8]
  --max-running N               the same as --max-num-seqs (the mock's older name)
  --max-model-len N             context length; longer requests get a 400         [32768]
  --seed N                      seed of the PRNG behind --error-500-rate          [0]
  --metrics-flavor NAME         current | v1-blocks | v0: which generation of vLLM's
                                prefix-cache metric names /metrics emits; sglang |
                                llamacpp: that engine's names instead             [current]
  --data-parallel-size N        engine cores behind the server (vLLM's flag): each its
                                own prefix cache and slots, engine="<rank>" series in
                                /metrics, X-data-parallel-rank honoured (not on
                                /v1/responses, as vLLM)                           [1]
  --sse-keep-alive-interval S   vLLM's flag: a chat or completions stream idle S
                                seconds writes ': keep-alive' (vLLM profiles)     [0: off]

Faults (also settable at run time with POST /_mock/faults, e.g. {"failHealth": true}):
  --fail-health                 GET /health answers 503                           (failHealth)
  --error-500-rate P            probability 0..1 that a completion answers 500    (error500Rate)
  --stall-before-ms MS          wait MS before admitting a completion, no headers (stallBeforeMs)
  --stall-before-forever        never answer completions (until the client leaves) (stallBeforeForever)
  --stall-mid-stream N          streams: after N SSE chunks (role chunk counts) stop sending,
                                keep the connection and the slot until the client leaves (stallMidStream)
  --slow-factor X               multiply prefill and decode delays by X           (slowFactor)
  --drop-connection             destroy the socket instead of answering, on every path
                                except /_mock/*                                   (dropConnection)
  --in-band-error-after N       chat/completions: the engine fails after N content tokens:
                                the profile's in-band error event on a stream (0 = before
                                the first token), a 500 otherwise                 (inBandErrorAfter)
  --drop-after-tokens N         destroy the connection after N content tokens     (dropAfterTokens)
  --stall-after-tokens N        stop after N content tokens, hold the connection  (stallAfterTokens)

  -h, --help                    this text`;

export type CliResult = { help: true } | { help: false; options: MockVllmOptions };

function num(flag: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n)) throw new Error(`--${flag} must be a number, got "${v}"`);
  return n;
}

/** Parse argv (without the node and script entries); throws with the bad flag named. */
export function parseCliArgs(argv: string[]): CliResult {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      help: { type: 'boolean', short: 'h' },
      port: { type: 'string' },
      id: { type: 'string' },
      model: { type: 'string', multiple: true },
      'api-key': { type: 'string' },
      'cache-blocks': { type: 'string' },
      'prefill-tokens-per-sec': { type: 'string' },
      'decode-ms-per-token': { type: 'string' },
      'max-running': { type: 'string' },
      'max-num-seqs': { type: 'string' },
      'max-model-len': { type: 'string' },
      seed: { type: 'string' },
      'metrics-flavor': { type: 'string' },
      profile: { type: 'string' },
      'headers-first': { type: 'boolean' },
      'no-headers-first': { type: 'boolean' },
      'responses-store': { type: 'boolean' },
      'no-responses-store': { type: 'boolean' },
      'in-band-error-after': { type: 'string' },
      'drop-after-tokens': { type: 'string' },
      'stall-after-tokens': { type: 'string' },
      'data-parallel-size': { type: 'string' },
      'sse-keep-alive-interval': { type: 'string' },
      'fail-health': { type: 'boolean' },
      'error-500-rate': { type: 'string' },
      'stall-before-ms': { type: 'string' },
      'stall-before-forever': { type: 'boolean' },
      'stall-mid-stream': { type: 'string' },
      'slow-factor': { type: 'string' },
      'drop-connection': { type: 'boolean' },
    },
  });
  if (values.help) return { help: true };

  const faults: Partial<MockFaults> = {};
  if (values['fail-health']) faults.failHealth = true;
  if (values['stall-before-forever']) faults.stallBeforeForever = true;
  if (values['drop-connection']) faults.dropConnection = true;
  const rate = num('error-500-rate', values['error-500-rate']);
  if (rate !== undefined) faults.error500Rate = rate;
  const stallMs = num('stall-before-ms', values['stall-before-ms']);
  if (stallMs !== undefined) faults.stallBeforeMs = stallMs;
  const mid = num('stall-mid-stream', values['stall-mid-stream']);
  if (mid !== undefined) faults.stallMidStream = mid;
  const slow = num('slow-factor', values['slow-factor']);
  if (slow !== undefined) faults.slowFactor = slow;
  const inBand = num('in-band-error-after', values['in-band-error-after']);
  if (inBand !== undefined) faults.inBandErrorAfter = inBand;
  const dropAfter = num('drop-after-tokens', values['drop-after-tokens']);
  if (dropAfter !== undefined) faults.dropAfterTokens = dropAfter;
  const stallAfter = num('stall-after-tokens', values['stall-after-tokens']);
  if (stallAfter !== undefined) faults.stallAfterTokens = stallAfter;
  mergeFaults({ ...DEFAULT_FAULTS }, faults); // validate now, with a clear message

  const profile = values.profile;
  if (profile !== undefined && !(PROFILES as readonly string[]).includes(profile)) {
    throw new Error(`--profile must be one of ${PROFILES.join(', ')}, got "${profile}"`);
  }
  const pick = (yes: boolean | undefined, no: boolean | undefined, flag: string): boolean | undefined => {
    if (yes && no) throw new Error(`--${flag} and --no-${flag} contradict each other`);
    return yes ? true : no ? false : undefined;
  };

  const maxNumSeqs = num('max-num-seqs', values['max-num-seqs']);
  const maxRunning = num('max-running', values['max-running']);
  if (maxNumSeqs !== undefined && maxRunning !== undefined && maxNumSeqs !== maxRunning) {
    throw new Error(`--max-num-seqs ${maxNumSeqs} and --max-running ${maxRunning} name the same setting; give one`);
  }

  const models = (values.model ?? []).flatMap((m) => m.split(',')).map((m) => m.trim()).filter(Boolean);
  const options: MockVllmOptions = {
    port: num('port', values.port),
    id: values.id,
    models: models.length ? models : undefined,
    apiKey: values['api-key'],
    cacheBlocks: num('cache-blocks', values['cache-blocks']),
    prefillTokensPerSec: num('prefill-tokens-per-sec', values['prefill-tokens-per-sec']),
    decodeMsPerToken: num('decode-ms-per-token', values['decode-ms-per-token']),
    maxRunning: maxNumSeqs ?? maxRunning,
    maxModelLen: num('max-model-len', values['max-model-len']),
    seed: num('seed', values.seed),
    metricsFlavor: values['metrics-flavor'] as MetricsFlavor | undefined,
    profile: profile as MockProfile | undefined,
    headersFirst: pick(values['headers-first'], values['no-headers-first'], 'headers-first'),
    responsesStore: pick(values['responses-store'], values['no-responses-store'], 'responses-store'),
    dataParallelSize: num('data-parallel-size', values['data-parallel-size']),
    sseKeepAliveMs: ((v) => (v === undefined ? undefined : v * 1000))(num('sse-keep-alive-interval', values['sse-keep-alive-interval'])),
    faults,
  };
  // Drop unset keys so the server's defaults apply.
  for (const k of Object.keys(options) as (keyof MockVllmOptions)[]) if (options[k] === undefined) delete options[k];
  return { help: false, options };
}
