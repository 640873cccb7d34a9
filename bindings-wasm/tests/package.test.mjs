// The npm package as a user gets it: `npm pack`, `npm install` of the tarball into a fresh
// project in a temporary directory, then require("watchcache-wasm") and
// import("watchcache-wasm") replay every scenario equal to its golden trace, and tsc --strict
// type-checks files that import the package by name (ESM and CommonJS in Node, the browser
// build as a bundler resolves it). The browser bundle is tested in web-demo (esbuild,
// Chromium). TSC: the TypeScript compiler (make test-wasm passes web-demo's).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { manifest, packAndInstall, pkgRoot, run } from "./package-helpers.mjs";
import { here, root, scenarioDir, scenarioFiles } from "./helpers.mjs";

let installed;
before(() => {
  installed = packAndInstall();
});
after(() => rmSync(installed.tmp, { recursive: true, force: true }));

test("the version is the crate's", () => {
  const cargo = readFileSync(join(root, "Cargo.toml"), "utf8");
  assert.equal(manifest.version, /\[workspace\.package\][^[]*?\nversion = "([^"]+)"/.exec(cargo)[1]);
  assert.equal(manifest.name, "watchcache-wasm");
});

test("the tarball holds exactly the files listed, the README and package.json", () => {
  const shipped = installed.info.files.map((f) => f.path).sort();
  assert.deepEqual(shipped, [...manifest.files, "README.md", "package.json"].sort());
  // One .wasm: the Node build loads the browser build's.
  assert.equal(shipped.filter((f) => f.endsWith(".wasm")).length, 1);
  console.log(`# ${installed.info.filename}: ${installed.info.size} bytes packed, ${installed.info.unpackedSize} unpacked`);
});

function consume(script) {
  copyFileSync(join(here, "package", script), join(installed.app, script));
  return JSON.parse(run(process.execPath, [script, scenarioDir], { cwd: installed.app }));
}

function assertGoldens(out) {
  assert.equal(out.version, manifest.version);
  assert.deepEqual(Object.keys(out.traces).sort(), [...scenarioFiles].sort());
  for (const f of scenarioFiles) assert.equal(out.traces[f], readFileSync(join(scenarioDir, f.replace(/\.json$/, ".trace.json")), "utf8"), f);
}

test('require("watchcache-wasm") replays every scenario equal to its golden trace', () => {
  assertGoldens(consume("consumer.cjs"));
});

test('import "watchcache-wasm" and import("watchcache-wasm") replay every scenario equal to its golden trace', () => {
  const out = consume("consumer.mjs");
  assertGoldens(out);
  assert.equal(out.started, "STARTED");
});

test("the README's Node example runs as written against the installed package", () => {
  const readme = readFileSync(join(pkgRoot, "README.md"), "utf8");
  const example = /```js\n([\s\S]*?)```/.exec(readme.slice(readme.indexOf("## Node")))[1];
  assert.ok(example.trim().split("\n").length <= 10, "the Node example is at most 10 lines");
  writeFileSync(join(installed.app, "readme-node.cjs"), example);
  const out = run(process.execPath, ["readme-node.cjs"], { cwd: installed.app });
  assert.equal(out, "STARTED true undefined 9n\nADDED true /pods/ns/a 10n\n10n 1n\n");
});

test("tsc --strict type-checks files that import the package by name", () => {
  const tsc = process.env.TSC;
  assert.ok(tsc, "TSC is not set (make test-wasm sets it to web-demo's tsc)");
  for (const f of readdirSync(join(here, "package")).filter((f) => /\.(c?ts)$/.test(f))) copyFileSync(join(here, "package", f), join(installed.app, f));
  const common = { strict: true, noEmit: true, target: "es2022", types: [], skipLibCheck: false, noUnusedLocals: true };
  const configs = {
    "tsconfig.node.json": { compilerOptions: { ...common, module: "nodenext", moduleResolution: "nodenext", lib: ["es2022", "esnext.disposable", "dom"] }, files: ["node-usage.ts", "cjs-usage.cts"] },
    "tsconfig.browser.json": {
      compilerOptions: { ...common, module: "esnext", moduleResolution: "bundler", customConditions: ["browser"], lib: ["es2022", "esnext.disposable", "dom"] },
      files: ["browser-usage.ts", "wasm-module.d.ts"],
    },
  };
  for (const [name, cfg] of Object.entries(configs)) {
    writeFileSync(join(installed.app, name), JSON.stringify(cfg, null, 2));
    run(tsc, ["-p", name], { cwd: installed.app });
  }
});

test("the package's files are where package.json says", () => {
  // `make wasm` checks this too (scripts/package.mjs); here against the installed copy.
  const inst = join(installed.app, "node_modules", "watchcache-wasm");
  const got = JSON.parse(readFileSync(join(inst, "package.json"), "utf8"));
  assert.deepEqual(got.exports, manifest.exports);
  assert.equal(readFileSync(join(inst, "pkg", "watchcache_bg.wasm")).length, readFileSync(join(pkgRoot, "pkg", "watchcache_bg.wasm")).length);
});
