// The npm package in a browser, as a user bundles it: `npm pack` of bindings-wasm, `npm install`
// of the tarball into a fresh project, esbuild (web-demo's pinned one) bundles two small pages
// that import "watchcache-wasm" by name, headless Chromium runs them:
// - readme.html: the README's browser example as it is (`await init()`: the .wasm loaded next
//   to the module, so it is copied next to the bundle, as the README says for esbuild);
// - golden.html: the .wasm imported with esbuild's file loader and passed to init(), every
//   scenario replayed in the page and compared with its golden trace.
// The bundle sizes go to artifacts/web/bundle-size.json.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium } from "playwright-core";
import { serve } from "../scripts/serve.mjs";
import { packAndInstall } from "../../bindings-wasm/tests/package-helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const artifacts = process.env.ARTIFACTS ?? join(root, "artifacts", "web");
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const scenarios = readdirSync(join(root, "scenarios")).filter((f) => f.endsWith(".json") && !f.endsWith(".trace.json")).sort();

let installed, site, server, browser, base;

function readmeBrowserExample() {
  const readme = readFileSync(join(root, "bindings-wasm", "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("## Browser"));
  return /```js\n([\s\S]*?)```/.exec(section)[1];
}

const GOLDEN_PAGE = `
import init, { replayJson, version } from "watchcache-wasm";
import wasmUrl from "watchcache-wasm/watchcache_bg.wasm";

await init({ module_or_path: wasmUrl });
const names = await (await fetch("scenarios.json")).json();
const traces = {};
for (const f of names) traces[f] = replayJson(await (await fetch("scenarios/" + f)).text());
window.__result = { version: version(), traces };
document.body.dataset.done = "true";
`;

before(async () => {
  installed = packAndInstall("watchcache-bundle-");
  const app = installed.app;
  writeFileSync(join(app, "readme.js"), readmeBrowserExample() + '\ndocument.body.dataset.done = "true";\n');
  writeFileSync(join(app, "golden.js"), GOLDEN_PAGE);
  site = join(app, "site");
  mkdirSync(join(site, "scenarios"), { recursive: true });
  await build({
    absWorkingDir: app,
    entryPoints: ["readme.js", "golden.js"],
    outdir: site,
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    loader: { ".wasm": "file" },
    logLevel: "warning",
  });
  copyFileSync(join(app, "node_modules", "watchcache-wasm", "pkg", "watchcache_bg.wasm"), join(site, "watchcache_bg.wasm"));
  for (const page of ["readme", "golden"]) writeFileSync(join(site, `${page}.html`), `<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><title>${page}</title><body><script type="module" src="${page}.js"></script></body>`);
  writeFileSync(join(site, "index.html"), "<!doctype html><title>bundles</title>");
  writeFileSync(join(site, "scenarios.json"), JSON.stringify(scenarios));
  for (const f of scenarios) copyFileSync(join(root, "scenarios", f), join(site, "scenarios", f));
  server = await serve(site, 0, "127.0.0.1");
  base = `http://127.0.0.1:${server.address().port}/`;
  browser = await chromium.launch({
    executablePath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});

after(async () => {
  await browser?.close();
  await new Promise((ok) => (server ? server.close(ok) : ok()));
  if (installed) rmSync(installed.tmp, { recursive: true, force: true });
});

async function open(page) {
  const p = await browser.newPage();
  const problems = [];
  p.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  p.on("console", (m) => m.type() === "error" && problems.push(`console.error: ${m.text()}`));
  p.on("response", (r) => r.status() >= 400 && problems.push(`HTTP ${r.status()}: ${r.url()}`));
  await p.goto(base + page);
  await p.waitForSelector("body[data-done=true]", { state: "attached", timeout: 20000 }).catch((e) => {
    throw new Error(`${page}: ${e.message}\n${problems.join("\n")}`);
  });
  return { p, problems };
}

test("esbuild bundles the installed package's browser build; sizes recorded", () => {
  const size = (f) => statSync(join(site, f)).size;
  const wasmFile = readdirSync(site).find((f) => f.endsWith(".wasm") && f !== "watchcache_bg.wasm");
  assert.ok(wasmFile, "the file loader emitted the .wasm");
  const sizes = { "readme.js": size("readme.js"), "golden.js": size("golden.js"), wasm: size(wasmFile), tarball: installed.info.size };
  mkdirSync(artifacts, { recursive: true });
  writeFileSync(join(artifacts, "bundle-size.json"), JSON.stringify(sizes, null, 2) + "\n");
  console.log(`# bundle sizes (minified): ${JSON.stringify(sizes)}`);
  // The glue is small; the core is the .wasm. A bundle that pulled in the Node build would be larger.
  assert.ok(sizes["readme.js"] < 40_000, `readme.js is ${sizes["readme.js"]} bytes`);
});

test("the README's browser example runs from the bundle in headless Chromium", async () => {
  const { p, problems } = await open("readme.html");
  const text = await p.textContent("body");
  await p.close();
  assert.deepEqual(problems, []);
  // The watch from RV 8 is older than the list at RV 9: 410 Expired, then closed.
  assert.match(text, /^20 w1 ERROR 410\s*\n20 w1 CLOSED/m);
});

test("a bundled page replays every scenario equal to its golden trace in headless Chromium", async () => {
  const { p, problems } = await open("golden.html");
  const result = await p.evaluate(() => window.__result);
  await p.close();
  assert.deepEqual(problems, []);
  assert.equal(result.version, JSON.parse(readFileSync(join(root, "bindings-wasm", "package.json"), "utf8")).version);
  for (const f of scenarios) assert.equal(result.traces[f], readFileSync(join(root, "scenarios", f.replace(/\.json$/, ".trace.json")), "utf8"), f);
});
