// Runs the calls of calls.json on the JS Cacher (and simulate, replay) and prints what came
// back as JSON: the JS half of the surface comparison. bindings-python/tests/
// test_surface_parity.py runs the same calls from Python and compares the two field by field.
// Usage: node dump.mjs [PACKAGE_DIR]  (default: ../../pkg-node)
// BigInts are printed as {"$bigint": "123"}; undefined fields are left out.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..", "..");
const pkg = resolve(process.argv[2] ?? join(here, "..", "..", "pkg-node"));
const wc = createRequire(import.meta.url)(join(pkg, "watchcache.js"));
const spec = JSON.parse(readFileSync(join(here, "calls.json"), "utf8"));

const camel = (n) => n.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
// Python keyword arguments → the JS options object (`continue` is a Python keyword).
const optionName = (k) => (k === "continue_token" ? "continue" : camel(k));

function errorOf(e) {
  return { error: e.name, code: e.code ?? null, reason: e.reason ?? null };
}

function snapshot(c) {
  const getters = ["nowMs", "resourceVersion", "listResourceVersion", "readyState", "storeLen", "budgetMs", "parked", "autoCurrentRevision"];
  const out = Object.fromEntries(getters.map((g) => [g, c[g]]));
  return {
    ...out,
    window: c.window(),
    windowEvents: c.windowEvents(),
    objects: c.objects(),
    watchers: c.watchers(),
    pollTimeout: c.pollTimeout(),
    metrics: c.metrics(),
    config: c.config(),
  };
}

function run(r) {
  let c;
  try {
    c = new wc.Cacher(r.config);
  } catch (e) {
    return { name: r.name, created: errorOf(e), steps: [] };
  }
  const names = {};
  const arg = (a) => (a && typeof a === "object" && "$ref" in a ? names[a.$ref] : a);
  const steps = r.steps.map((s) => {
    if (s.call === "snapshot") return { call: s.call, snapshot: snapshot(c) };
    if (s.call === "set") {
      c[camel(s.args[0])] = s.args[1];
      return { call: s.call };
    }
    const args = s.args.map(arg);
    if (s.kwargs) args.push(Object.fromEntries(Object.entries(s.kwargs).map(([k, v]) => [optionName(k), arg(v)])));
    let ret;
    try {
      ret = c[camel(s.call)](...args);
    } catch (e) {
      return { call: s.call, raised: errorOf(e) };
    }
    if (s.name) names[s.name] = ret;
    // pollOutput hands out one output; the others leave theirs for the next drain.
    const outputs = s.call === "poll_output" ? [] : c.drain();
    return { call: s.call, ret: ret ?? null, outputs };
  });
  return { name: r.name, steps };
}

const result = {
  runs: spec.runs.map(run),
  simulate: spec.simulate.map((w) => wc.simulate(w)),
  replay: Object.fromEntries(spec.replay.map((f) => [f, wc.replay(readFileSync(join(root, "scenarios", f), "utf8"))])),
};
process.stdout.write(JSON.stringify(result, (_k, v) => (typeof v === "bigint" ? { $bigint: v.toString() } : v)) + "\n");
