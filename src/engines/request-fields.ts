// Engine control fields: request-body extensions of vLLM, SGLang and llama.cpp that steer the
// engine itself (its scheduling, its request ids, its KV cache and transfer, code it loads)
// rather than one request's sampling. A tenant must not reach them on a shared replica, so the
// upstream body drops them unless the pool allows a field by name; the router's own (cache_salt,
// request_id) are always overwritten. Bounds on n, best_of and output tokens live here too.
// Pure: plain data in and out.

/**
 * Removed from every upstream body unless the pool's `allowEngineFields` names them. Sources:
 * vLLM's protocol.py ChatCompletionRequest / CompletionRequest extra params, SGLang's
 * GenerateReqInput and OpenAI protocol, llama.cpp's server (`id_slot`).
 */
export const ENGINE_CONTROL_FIELDS: Readonly<Record<string, string>> = {
  // vLLM
  priority: 'scheduling priority (vLLM priority scheduling; SGLang priority)',
  kv_transfer_params: 'KV transfer for disaggregated prefill (vLLM)',
  ec_transfer_params: 'encoder-cache transfer for disaggregated multimodal serving (vLLM)',
  vllm_xargs: 'custom engine extension arguments (vLLM)',
  logits_processors: 'server-side logits processor classes to load (vLLM)',
  chat_template: 'a Jinja template rendered by the server (vLLM)',
  mm_processor_kwargs: 'multimodal processor arguments, memory and compute per request (vLLM)',
  guided_decoding_backend: 'overrides the server\'s structured output backend (vLLM)',
  data_parallel_rank: 'pins the request to a data-parallel engine rank (vLLM, SGLang)',
  // SGLang
  rid: 'the engine\'s request id (SGLang)',
  bootstrap_host: 'prefill/decode disaggregation peer (SGLang)',
  bootstrap_port: 'prefill/decode disaggregation peer (SGLang)',
  bootstrap_room: 'prefill/decode disaggregation room (SGLang)',
  custom_logit_processor: 'serialized logits processor code (SGLang)',
  return_hidden_states: 'the model\'s hidden states (SGLang)',
  session_params: 'engine-side session state (SGLang)',
  extra_key: 'prefix cache namespace (SGLang)',
  lora_path: 'which LoRA adapter to load (SGLang)',
  routed_dp_rank: 'pins the request to a data-parallel rank (SGLang)',
  // llama.cpp
  id_slot: 'which server slot (and its cached prompt) to use (llama.cpp)',
};

/** Fields the router always sets itself (or removes): never allowed to a client. */
export const ROUTER_OWNED_FIELDS = ['cache_salt', 'request_id'] as const;

/** Why `name` cannot be in a pool's allowEngineFields, or null. */
export function engineFieldProblem(name: string): string | null {
  if ((ROUTER_OWNED_FIELDS as readonly string[]).includes(name)) return `"${name}" is always set by the router and cannot be allowed`;
  if (!Object.hasOwn(ENGINE_CONTROL_FIELDS, name)) return `"${name}" is not an engine control field (known: ${Object.keys(ENGINE_CONTROL_FIELDS).join(', ')})`;
  return null;
}

export interface RequestBounds {
  maxN: number;
  maxBestOf: number;
  maxOutputTokens: number;
}

export interface BoundViolation {
  param: string;
  message: string;
}

/**
 * The first bound the body exceeds, in OpenAI's words ("Invalid 'n': integer above maximum
 * value..."), or null. Only numbers are judged here; a value of the wrong type is the engine's to
 * refuse (or the validator's).
 */
export function exceededBound(body: Record<string, unknown>, b: RequestBounds): BoundViolation | null {
  const check = (param: string, max: number): BoundViolation | null => {
    const v = body[param];
    if (typeof v !== 'number' || v <= max) return null;
    return { param, message: `Invalid '${param}': integer above maximum value. Expected a value <= ${max}, but got ${v} instead.` };
  };
  return check('n', b.maxN) ?? check('best_of', b.maxBestOf) ?? check('max_tokens', b.maxOutputTokens) ?? check('max_completion_tokens', b.maxOutputTokens) ?? check('max_output_tokens', b.maxOutputTokens) ?? check('min_tokens', b.maxOutputTokens);
}

/**
 * Sequences the engine runs for this request: `n` choices, or `best_of` candidates when larger
 * (vLLM generates best_of and returns the n best). What the tenant's concurrency cap counts.
 */
export function sequencesOf(body: Record<string, unknown>): number {
  const n = typeof body.n === 'number' && Number.isInteger(body.n) && body.n > 1 ? body.n : 1;
  const best = typeof body.best_of === 'number' && Number.isInteger(body.best_of) && body.best_of > n ? body.best_of : n;
  return best;
}
