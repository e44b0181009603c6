// CPU time, memory and the workerd processes of this benchmark, from Linux /proc (null or empty
// elsewhere): how the bench scripts charge work to the runtime that did it. I/O: reads /proc.
import { readdirSync, readFileSync } from 'node:fs';

/** utime + stime of a process in ms, from /proc (null elsewhere, or once it is gone). */
export function processCpuMs(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // USER_HZ is 100 on Linux
  } catch {
    return null;
  }
}

/** RSS in MB of a process, from /proc (null elsewhere). */
export function processRssMb(pid: number): number | null {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

/** workerd processes that descend from this process (Miniflare's runtimes). */
export function workerdPids(): number[] {
  const parent = new Map<number, number>();
  const comm = new Map<number, string>();
  try {
    for (const d of readdirSync('/proc')) {
      if (!/^\d+$/.test(d)) continue;
      try {
        const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
        comm.set(Number(d), stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')));
        parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      } catch {
        // process went away
      }
    }
  } catch {
    return [];
  }
  const mine = (pid: number) => {
    for (let p = pid, hops = 0; p > 1 && hops < 10; p = parent.get(p) ?? 0, hops++) if (p === process.pid) return true;
    return false;
  };
  return [...comm].filter(([pid, c]) => c === 'workerd' && mine(pid)).map(([pid]) => pid);
}

/** Run `start` (which launches one Miniflare) and tell which workerd process it added, if exactly one. */
export async function startedWorkerd<T>(start: () => Promise<T>): Promise<{ value: T; pid?: number }> {
  const before = new Set(workerdPids());
  const value = await start();
  const added = workerdPids().filter((p) => !before.has(p));
  return { value, pid: added.length === 1 ? added[0] : undefined };
}
