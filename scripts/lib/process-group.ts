// Stop a child started with `detached: true` together with everything in its process group
// (`npx wrangler dev` → wrangler → workerd, or `npm start` → tsx → node → workerd). Signalling the
// child alone leaves workerd running when the child is a launcher (npx, sh) that does not pass the
// signal on, and the group outlives its leader: a leader that already exited (wrangler dying of
// its own) says nothing about the rest. I/O: signals, /proc.
import type { ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

/** Pids whose process group is `pgid` (Linux /proc; empty elsewhere). */
export function groupPids(pgid: number): number[] {
  const out: number[] = [];
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return out;
  }
  for (const d of entries) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      // Fields after "(comm) ": state ppid pgrp ...
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]) === pgid) out.push(Number(d));
    } catch {
      // went away
    }
  }
  return out;
}

/** True while any process is left in group `pgid`. */
export function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * SIGTERM to the group, SIGKILL to whatever is left after `graceMs` (default 3 s). Runs whether
 * or not the leader has exited; resolves once the group is empty (or after graceMs + 2 s).
 */
export async function killGroup(child: ChildProcess | undefined, graceMs = 3_000): Promise<void> {
  if (!child || child.pid === undefined) return;
  const pgid = child.pid;
  const signal = (sig: NodeJS.Signals) => {
    try {
      process.kill(-pgid, sig);
    } catch {
      /* the group is empty */
    }
  };
  if (!groupAlive(pgid)) return;
  signal('SIGTERM');
  const deadline = Date.now() + graceMs;
  while (groupAlive(pgid) && Date.now() < deadline) await sleep(50);
  if (!groupAlive(pgid)) return;
  signal('SIGKILL');
  const hard = Date.now() + 2_000;
  while (groupAlive(pgid) && Date.now() < hard) await sleep(50);
}
