// The Worker as one ES module: esbuild with the conditions and externals workerd needs, for the
// processes that run it under Miniflare directly (`npm start`, the e2e tests, the benchmarks).
// I/O: reads the source tree; writes nothing (the bundle stays in memory).
import { build, context, type BuildContext, type BuildOptions } from 'esbuild';

/** esbuild options for a Worker entry; `write: false`, so the code arrives in `outputFiles`. */
export function workerBuildOptions(entry: string): BuildOptions & { write: false } {
  return {
    entryPoints: [entry],
    bundle: true,
    write: false,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    conditions: ['workerd', 'worker', 'browser'],
    external: ['cloudflare:*', 'node:*'],
    sourcemap: false,
    logLevel: 'silent',
  };
}

/** Bundle `entry` once; resolves to the module's code. */
export async function bundleWorker(entry: string): Promise<string> {
  const r = await build(workerBuildOptions(entry));
  return r.outputFiles[0]!.text;
}

/**
 * Bundle `entry` and rebuild on every change under its imports: `onBuild` gets each new bundle,
 * `onError` the messages of a failed rebuild (the previous bundle stays in use).
 */
export async function watchWorker(
  entry: string,
  onBuild: (code: string) => void | Promise<void>,
  onError: (messages: string[]) => void,
): Promise<BuildContext> {
  const ctx = await context({
    ...workerBuildOptions(entry),
    plugins: [
      {
        name: 'on-rebuild',
        setup(b) {
          b.onEnd(async (r) => {
            if (r.errors.length > 0) return onError(r.errors.map((e) => `${e.location ? `${e.location.file}:${e.location.line}: ` : ''}${e.text}`));
            const code = r.outputFiles?.[0]?.text;
            if (code !== undefined) await onBuild(code);
          });
        },
      },
    ],
  });
  await ctx.watch();
  return ctx;
}
