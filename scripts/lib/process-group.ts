// Stop a child started with `detached: true` together with everything in its process group
// (`npx wrangler dev` → wrangler → workerd). Signalling the child alone leaves workerd running
// when the child is a launcher (npx, sh) that does not pass the signal on. I/O: signals.
import type { ChildProcess } from 'node:child_process';

/** SIGTERM to the group, SIGKILL after 3 s, and SIGKILL to stragglers once the leader is gone. */
export async function killGroup(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const signal = (sig: NodeJS.Signals) => {
    try {
      process.kill(-child.pid!, sig);
    } catch {
      /* already gone */
    }
  };
  signal('SIGTERM');
  const timer = setTimeout(() => signal('SIGKILL'), 3_000);
  await Promise.race([exited, new Promise((r) => setTimeout(r, 5_000))]);
  clearTimeout(timer);
  signal('SIGKILL'); // stragglers left in the group (workerd) after wrangler itself exited
}
