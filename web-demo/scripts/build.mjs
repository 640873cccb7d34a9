// Builds the static site into web-demo/dist: the page (src/), its two scripts (js/main.js and
// the what-if worker js/whatif-worker.js) bundled by esbuild with the npm package
// watchcache-wasm imported by name (web-demo's dependency on ../bindings-wasm; the browser
// build, whose .wasm sits next to the bundles), a copy of every scenario (scenarios/*.json,
// golden traces included) with a generated index, and the simulator's workloads
// (scenarios/simulate/*.json, the what-if panel's presets) with theirs. The output is plain
// files that work from any static server, offline. Fails loudly when an input is missing.
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const demo = join(here, "..");
const root = join(demo, "..");
const src = join(demo, "src");
const scenarios = join(root, "scenarios");
const dist = process.argv[2] ?? join(demo, "dist");

function need(path, what) {
  if (!existsSync(path)) {
    console.error(`build: ${what} is missing: ${path}`);
    process.exit(1);
  }
}
need(join(src, "index.html"), "the page");
need(scenarios, "the scenarios");
// The package as the bundler sees it (by name, through web-demo/node_modules).
let wasm;
try {
  wasm = createRequire(import.meta.url).resolve("watchcache-wasm/watchcache_bg.wasm");
} catch (e) {
  console.error(`build: the npm package watchcache-wasm is not installed in web-demo (npm ci): ${e.message}`);
  process.exit(1);
}
need(wasm, "the wasm package (run `make wasm`)");

rmSync(dist, { recursive: true, force: true });
mkdirSync(dist, { recursive: true });
const js = join(src, "js");
cpSync(src, dist, { recursive: true, filter: (f) => f !== js && !f.startsWith(js + sep) });
await build({
  entryPoints: [join(src, "js", "main.js"), join(src, "js", "whatif-worker.js")],
  outdir: join(dist, "js"),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  sourcemap: true,
  logLevel: "warning",
});
cpSync(wasm, join(dist, "js", "watchcache_bg.wasm"));

// Topics of the library, in the order the page lists them.
const TOPICS = [
  ["ring_", "Ring buffer"],
  ["watch_", "Watch requests"],
  ["watchlist_", "Watch-list (sendInitialEvents)"],
  ["slow_watcher", "Slow watchers"],
  ["bookmark", "Bookmarks"],
  ["progress_", "Freshness and progress"],
  ["read_waits", "Freshness and progress"],
  ["ready_gate", "Ready gate and relists"],
  ["relist", "Ready gate and relists"],
  ["stopped_", "Ready gate and relists"],
  ["list_", "Lists and gets"],
  ["get_", "Lists and gets"],
  ["snapshots_", "Lists and gets"],
];
const topicOf = (f) => (TOPICS.filter(([p]) => f.startsWith(p)).sort((a, b) => b[0].length - a[0].length)[0]?.[1]) ?? "Other";
const ORDER = [...new Set(TOPICS.map(([, t]) => t)), "Other"];

mkdirSync(join(dist, "scenarios"));
const index = [];
for (const f of readdirSync(scenarios).filter((f) => f.endsWith(".json")).sort()) {
  const text = readFileSync(join(scenarios, f), "utf8");
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    console.error(`build: scenarios/${f} is not JSON: ${e.message}`);
    process.exit(1);
  }
  writeFileSync(join(dist, "scenarios", f), text);
  if (f.endsWith(".trace.json")) continue;
  index.push({
    file: f,
    name: parsed.name ?? f,
    description: parsed.description ?? "",
    profile: parsed.config?.profile ?? "v1.30",
    steps: parsed.steps.length,
    topic: topicOf(f),
    trace: existsSync(join(scenarios, f.replace(/\.json$/, ".trace.json"))) ? f.replace(/\.json$/, ".trace.json") : null,
  });
}
index.sort((a, b) => ORDER.indexOf(a.topic) - ORDER.indexOf(b.topic) || a.file.localeCompare(b.file));
writeFileSync(join(dist, "scenarios", "index.json"), JSON.stringify(index, null, 1) + "\n");

// The what-if panel's presets: the simulator's workloads (scenarios/simulate/*.json), copied
// as they are, with an index. The SLO workloads (slo_*) first, in the order docs/slo.md tells.
const simDir = join(scenarios, "simulate");
need(simDir, "the simulator's workloads");
mkdirSync(join(dist, "scenarios", "simulate"));
const SIM_ORDER = ["slo_fixed_ring.json", "slo_dynamic_ring.json", "slo_bookmarks.json", "slo_compaction.json"];
const simIndex = [];
for (const f of readdirSync(simDir).filter((f) => f.endsWith(".json")).sort()) {
  const text = readFileSync(join(simDir, f), "utf8");
  let w;
  try {
    w = JSON.parse(text);
  } catch (e) {
    console.error(`build: scenarios/simulate/${f} is not JSON: ${e.message}`);
    process.exit(1);
  }
  writeFileSync(join(dist, "scenarios", "simulate", f), text);
  simIndex.push({ file: f, name: w.name || f.replace(/\.json$/, ""), description: w.description ?? "", duration_s: w.duration_s ?? 60, watchers: w.watchers?.count ?? 10 });
}
const rank = (f) => (SIM_ORDER.includes(f) ? SIM_ORDER.indexOf(f) : SIM_ORDER.length);
simIndex.sort((a, b) => rank(a.file) - rank(b.file) || a.file.localeCompare(b.file));
writeFileSync(join(dist, "scenarios", "simulate", "index.json"), JSON.stringify(simIndex, null, 1) + "\n");
console.log(`build: ${dist} (${index.length} scenarios, ${simIndex.length} workloads)`);
