// The mock engine's command line (tools/mock-engine/cli-args.ts): vLLM's --max-num-seqs flag.
import { describe, expect, it } from 'vitest';

import { parseCliArgs, USAGE } from '../../../tools/mock-engine/cli-args.js';

describe('mock-engine CLI', () => {
  it('takes vLLM\'s --max-num-seqs for the running slots, and --max-running as the same setting', () => {
    expect(parseCliArgs(['--max-num-seqs', '4'])).toEqual({ help: false, options: { maxRunning: 4, faults: {} } });
    expect(parseCliArgs(['--max-running', '3'])).toEqual({ help: false, options: { maxRunning: 3, faults: {} } });
    expect(parseCliArgs(['--max-num-seqs', '4', '--max-running', '4'])).toEqual({ help: false, options: { maxRunning: 4, faults: {} } });
    expect(() => parseCliArgs(['--max-num-seqs', '4', '--max-running', '8'])).toThrow(/same setting/);
    expect(() => parseCliArgs(['--max-num-seqs', 'four'])).toThrow(/--max-num-seqs must be a number/);
    expect(USAGE).toContain('--max-num-seqs');
    expect(USAGE).toContain('--decode-ms-per-token');
  });
});
