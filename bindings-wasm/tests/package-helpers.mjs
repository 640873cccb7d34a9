// Packs bindings-wasm with `npm pack` and installs the tarball into a fresh project in a
// temporary directory, as a user would (`npm install ./watchcache-wasm-X.tgz`): shared by
// tests/package.test.mjs (Node, tsc) and web-demo/tests/package-bundle.test.mjs (esbuild,
// Chromium). Nothing is fetched: the package has no dependencies.
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const pkgRoot = join(dirname(fileURLToPath(import.meta.url)), "..");
export const manifest = JSON.parse(readFileSync(join(pkgRoot, "package.json"), "utf8"));

export function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", timeout: 120_000, ...opts });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed (${r.status ?? r.signal}):\n${r.stdout}${r.stderr}`);
  return r.stdout;
}

/** `npm pack` into a temporary directory, then `npm install` the tarball into `app/` there. */
export function packAndInstall(prefix = "watchcache-npm-") {
  const tmp = mkdtempSync(join(tmpdir(), prefix));
  const [info] = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", tmp], { cwd: pkgRoot }));
  const tarball = join(tmp, info.filename);
  const app = join(tmp, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "watchcache-consumer", private: true, type: "module" }, null, 2));
  run("npm", ["install", "--offline", "--no-audit", "--no-fund", tarball], { cwd: app });
  return { tmp, app, tarball, info };
}
