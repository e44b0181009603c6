// `npm test`'s pretest step: makes sure the two tools the suite needs beyond npm are present —
// Chromium (the dashboard e2e test drives it through playwright-core) and promtool (the /metrics
// lint and the Prometheus rule tests). Present: returns in milliseconds without touching apt.
// Missing, on Debian as root: apt-get installs them (`apt-get update` first when the package lists
// are empty or stale, and once more if the install fails on stale lists). Missing otherwise: stops
// at once with the one command to run. I/O: the file system, apt-get/apt-cache child processes.
import { spawnSync } from 'node:child_process';
import { accessSync, constants, readdirSync, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/** Where the dashboard test looks for Chromium (test/e2e/dashboard.test.ts reads the same). */
const CHROMIUM_PATH = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
/** Package lists older than this are refreshed before an install (Debian's security archive moves). */
const STALE_LISTS_MS = 24 * 3600_000;
const APT_LISTS = '/var/lib/apt/lists';

interface Tool {
  name: string;
  /** The Debian package that ships it. */
  pkg: string;
  present(): boolean;
}

const TOOLS: Tool[] = [
  { name: `Chromium (${CHROMIUM_PATH})`, pkg: 'chromium', present: () => isExecutable(CHROMIUM_PATH) },
  { name: 'promtool', pkg: 'prometheus', present: () => onPath('promtool') },
];

function isExecutable(p: string): boolean {
  try {
    accessSync(p, constants.X_OK);
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

function onPath(cmd: string): boolean {
  return (process.env.PATH ?? '').split(delimiter).some((d) => d !== '' && isExecutable(join(d, cmd)));
}

function log(line: string): void {
  process.stderr.write(`test-deps: ${line}\n`);
}

/** Runs quietly; the command's own output is shown only when it fails. */
function run(cmd: string, args: string[]): number {
  log(`$ ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
  });
  if (r.error) throw r.error;
  if (r.status !== 0) process.stderr.write(`${r.stdout ?? ''}${r.stderr ?? ''}`);
  return r.status ?? 1;
}

/** Empty when there are no Packages files at all, stale when the newest is older than a day. */
function listsState(): 'empty' | 'stale' | 'fresh' {
  let newest = 0;
  try {
    for (const f of readdirSync(APT_LISTS)) if (f.includes('_Packages')) newest = Math.max(newest, statSync(join(APT_LISTS, f)).mtimeMs);
  } catch {
    return 'empty';
  }
  if (newest === 0) return 'empty';
  return Date.now() - newest > STALE_LISTS_MS ? 'stale' : 'fresh';
}

// Other engineers' or CI jobs' apt runs on the same machine: wait for their lock instead of failing.
const LOCK_WAIT = ['-o', 'DPkg::Lock::Timeout=300'];
const aptUpdate = () => run('apt-get', [...LOCK_WAIT, 'update', '-qq']);
const aptInstall = (pkgs: string[]) => run('apt-get', [...LOCK_WAIT, 'install', '-y', '-qq', '--no-install-recommends', ...pkgs]);

function main(): number {
  const missing = TOOLS.filter((t) => !t.present());
  if (missing.length === 0) return 0;
  const pkgs = missing.map((t) => t.pkg);
  log(`missing: ${missing.map((t) => t.name).join(', ')}`);
  if (process.env.CHROMIUM_PATH && pkgs.includes('chromium')) {
    log(`CHROMIUM_PATH=${process.env.CHROMIUM_PATH} is not an executable file: point it at Chromium, or unset it to use /usr/bin/chromium`);
    return 1;
  }

  const hasApt = onPath('apt-get');
  const root = process.getuid?.() === 0;
  if (!hasApt || !root) {
    const cmd = hasApt
      ? `sudo apt-get update && sudo apt-get install -y --no-install-recommends ${pkgs.join(' ')}`
      : process.platform === 'darwin'
        ? [pkgs.includes('prometheus') ? 'brew install prometheus' : '', pkgs.includes('chromium') ? 'brew install --cask chromium && export CHROMIUM_PATH=/Applications/Chromium.app/Contents/MacOS/Chromium' : ''].filter(Boolean).join(' && ')
        : `install ${pkgs.map((p) => (p === 'prometheus' ? 'promtool (Prometheus)' : 'Chromium')).join(' and ')}; set CHROMIUM_PATH if Chromium is not at /usr/bin/chromium`;
    log(`npm test needs ${missing.length > 1 ? 'them' : 'it'}. Run:\n\n    ${cmd}\n\nthen npm test again.`);
    return 1;
  }

  const state = listsState();
  if (state !== 'fresh') {
    log(`apt package lists are ${state}: updating them first`);
    if (aptUpdate() !== 0) return fail(pkgs);
  }
  log(`installing ${pkgs.join(' ')} with apt-get (once; about a minute on a slow mirror)`);
  if (aptInstall(pkgs) !== 0) {
    // Lists fresh by our clock can still name a version the mirror has since replaced.
    log('install failed; updating the package lists and trying once more');
    if (aptUpdate() !== 0 || aptInstall(pkgs) !== 0) return fail(pkgs);
  }
  const still = TOOLS.filter((t) => !t.present());
  if (still.length > 0) {
    log(`installed ${pkgs.join(' ')} but still missing: ${still.map((t) => t.name).join(', ')}`);
    return 1;
  }
  log(`installed ${pkgs.join(' ')}`);
  return 0;
}

function fail(pkgs: string[]): number {
  log(`apt-get failed. Run by hand:\n\n    apt-get update && apt-get install -y --no-install-recommends ${pkgs.join(' ')}\n`);
  return 1;
}

process.exitCode = main();
