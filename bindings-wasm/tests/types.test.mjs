// The TypeScript declarations (pkg-node/watchcache.d.ts): precise types (no `any`), camelCase
// names, the Python Cacher's methods, and interfaces that match what the functions return.
// make test-wasm also type-checks tests/types/usage.ts with `tsc --noEmit --strict` (TSC: the
// TypeScript compiler of web-demo's npm packages).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, join } from "node:path";
import { here, read, root, scenarioDir, scenarioFiles, wc } from "./helpers.mjs";

const dtsPath = join(here, "..", "pkg-node", "watchcache.d.ts");
const dts = read(dtsPath);
// Declarations without comments (doc comments may say "any" in prose).
const code = dts.replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");

// `any` we accept, as [declaration, reason]. None today: scenario and workload inputs are
// `ScenarioInput` (JSON text or a JSON object, validated by the core), not `any`. An entry
// here needs a reason the input cannot be typed.
const ANY_ALLOWED = [];

const camel = /^[a-z][A-Za-z0-9]*$/;
const cacherBody = code.match(/export class Cacher \{([\s\S]*?)\n\}/)[1];
const members = cacherBody
  .split("\n")
  .map((l) => l.trim())
  .filter((l) => l && !l.startsWith("free(") && !l.startsWith("[Symbol.dispose]"));
const methods = members
  .map((l) => l.match(/^(\w+)\((.*)\)(?::\s*(.+))?;$/))
  .filter(Boolean)
  .map(([, name, params, ret]) => ({ name, params, ret }));
const getters = members
  .map((l) => l.match(/^(?:readonly\s+)?(\w+):\s*(.+);$/))
  .filter(Boolean)
  .map(([, name, type]) => ({ name, type }));
const functions = [...code.matchAll(/^export function (\w+)\((.*)\):\s*(.+);$/gm)].map(([, name, params, ret]) => ({
  name,
  params,
  ret,
}));
const paramNames = (params) =>
  params
    .split(/,(?![^<{(]*[>})])/)
    .map((p) => p.trim())
    .filter(Boolean)
    .map((p) => p.match(/^(\w+)\??:/)[1]);

test("the declarations parse: the Cacher class and the functions", () => {
  assert.ok(methods.length >= 29, `only ${methods.length} methods parsed`);
  assert.ok(methods.some((m) => m.name === "constructor"));
  assert.deepEqual(functions.map((f) => f.name).sort(), ["replay", "replayJson", "simulate", "version"]);
  assert.ok(getters.some((g) => g.name === "resourceVersion"));
});

test("no `any` in the declarations", () => {
  const lines = code.split("\n").filter((l) => /\bany\b/.test(l));
  const unexpected = lines.filter((l) => !ANY_ALLOWED.some(([decl]) => l.includes(decl)));
  assert.deepEqual(unexpected, [], "untyped declarations: give them a type or list them in ANY_ALLOWED with the reason");
  assert.doesNotMatch(code, /\bunknown\b/, "`unknown` is `any` in disguise for a caller");
});

// The web package (pkg/) declares the same API, then wasm-bindgen's loader: `InitOutput` lists
// the raw wasm exports (externref ABI, `any` by construction) and is not the package's API.
test("the web package declares the same API", () => {
  const web = read(here, "..", "pkg", "watchcache.d.ts");
  const cut = web.indexOf("export type InitInput");
  assert.ok(cut > 0, "pkg/watchcache.d.ts has no loader section");
  assert.equal(web.slice(0, cut).trimEnd(), dts.trimEnd());
});

test("exported names and parameters are camelCase", () => {
  for (const f of [...functions, ...methods]) {
    assert.match(f.name, camel, `${f.name}`);
    for (const p of paramNames(f.params)) assert.match(p, camel, `${f.name}(${p})`);
  }
  for (const g of getters) assert.match(g.name, camel, g.name);
});

test("every declared member exists at runtime, and every runtime member is declared", () => {
  const proto = wc.Cacher.prototype;
  const runtime = Object.getOwnPropertyNames(proto).filter((n) => n !== "constructor" && n !== "free" && n !== "__destroy_into_raw");
  const declared = [...methods.map((m) => m.name).filter((n) => n !== "constructor"), ...getters.map((g) => g.name)];
  assert.deepEqual([...new Set(declared)].sort(), runtime.sort());
  for (const f of functions) assert.equal(typeof wc[f.name], "function", f.name);
});

test("the Cacher has every method and property of Python's Cacher, in camelCase", () => {
  const pyi = read(root, "bindings-python", "python", "watchcache", "_core.pyi");
  const body = pyi.slice(pyi.indexOf("class Cacher:"));
  const py = [...body.matchAll(/^    (?:def (\w+)\(|(\w+): )/gm)].map((m) => m[1] ?? m[2]).filter((n) => !n.startsWith("__"));
  assert.ok(py.includes("poll_output") && py.includes("drain"));
  const js = new Set([...methods.map((m) => m.name), ...getters.map((g) => g.name)]);
  const toCamel = (n) => n.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
  // Python's `range_end`-style keyword arguments are JS option fields; only names are mapped.
  const missing = py.map(toCamel).filter((n) => !js.has(n));
  assert.deepEqual(missing, [], `Python's Cacher has ${missing.join(", ")} that JS lacks`);
});

// ----- the interfaces against the values the functions return ------------------------------------

// `export interface Name { field?: type; ... }` → Map(name → Map(field → {type, optional})).
const interfaces = new Map();
for (const [, name, body] of code.matchAll(/export interface (\w+) \{([\s\S]*?)\n?\}/g)) {
  const fields = new Map();
  for (const [, field, opt, type] of body.matchAll(/^\s*(\w+)(\?)?:\s*([^;]+);/gm)) fields.set(field, { type: type.trim(), optional: !!opt });
  interfaces.set(name, fields);
}
const aliases = new Map([...code.matchAll(/export type (\w+) =\s*([^;]+);/g)].map(([, n, t]) => [n, t.replace(/\s+/g, " ").trim()]));

// The `typeof`s a declared type admits (enough for the output shapes: primitives, literals,
// unions, arrays, records, interfaces).
function kinds(type) {
  const out = new Set();
  for (let t of type.split(/\|(?![^<]*>)/).map((s) => s.trim()).filter(Boolean)) {
    if (aliases.has(t)) for (const k of kinds(aliases.get(t))) out.add(k);
    else if (t === "null") out.add("null");
    else if (/^"/.test(t) || t === "string") out.add("string");
    else if (["number", "bigint", "boolean", "undefined"].includes(t)) out.add(t);
    else if (t.endsWith("[]") || t.startsWith("Record<") || interfaces.has(t)) out.add("object");
    else throw new Error(`kinds: unhandled type ${t}`);
  }
  return out;
}
const kindOf = (v) => (v === null ? "null" : typeof v);

// Checks a value against an interface: no undeclared field, every required field present,
// every value of an admitted kind (and string literals among the declared ones).
function check(name, value, where = name) {
  const fields = interfaces.get(name);
  assert.ok(fields, `no interface ${name}`);
  for (const k of Object.keys(value)) assert.ok(fields.has(k), `${where}: field ${k} is not declared in ${name}`);
  for (const [k, { type, optional }] of fields) {
    if (!(k in value)) {
      assert.ok(optional, `${where}: required field ${k} of ${name} is missing`);
      continue;
    }
    const v = value[k];
    assert.ok(kinds(type).has(kindOf(v)), `${where}.${k}: ${kindOf(v)} is not ${type}`);
    const literals = [...type.matchAll(/"([^"]*)"/g)].map((m) => m[1]);
    if (typeof v === "string" && literals.length && !/\bstring\b/.test(type)) assert.ok(literals.includes(v), `${where}.${k}: ${v} is not ${type}`);
    if (Array.isArray(v) && interfaces.has(type.replace(/\[\]$/, ""))) v.forEach((x, i) => check(type.slice(0, -2), x, `${where}.${k}[${i}]`));
  }
}

// The output union: which interfaces a `type` (and `source`) may be.
const outputUnion = aliases.get("CacherOutput").split("|").map((s) => s.trim()).filter(Boolean);
function checkOutput(o, where) {
  const candidates = outputUnion.filter((n) => {
    const f = interfaces.get(n);
    const lit = (k) => [...(f.get(k)?.type ?? "").matchAll(/"([^"]*)"/g)].map((m) => m[1]);
    return lit("type").includes(o.type) && (!f.has("source") || lit("source").includes(o.source));
  });
  assert.equal(candidates.length, 1, `${where}: type ${o.type}/${o.source} matches ${candidates.join(", ") || "no interface"}`);
  check(candidates[0], o, `${where} (${o.type})`);
}

test("Cacher outputs and getters match their interfaces", () => {
  const c = new wc.Cacher({ profile: "v1.34", dispatch_tick_jitter: 0 });
  check("Window", c.window(), "window() before a list");
  check("Deadline", c.pollTimeout());
  c.handleReplace(0, 10, [{ key: "/pods/ns/a", rv: 3, labels: { app: "x" } }, { key: "/pods/ns/b", value: "b", rv: 4 }]);
  const seen = new Set();
  const take = (outs) => outs.forEach((o, i) => (seen.add(o.type), checkOutput(o, `output ${i}`)));
  const w = c.startWatch(1, "/pods/", { rv: "0", allowBookmarks: true, sendInitialEvents: true, consume: "manual", queueCapacity: 4 });
  c.startWatch(1, "/pods/", { rv: "5" }); // too old: 410
  c.startWatch(1, "/pods/", {}); // unset: to storage
  c.list(2, "/pods/ns", { rv: "0", limit: 1 });
  c.list(2, "/pods/ns", { rvMatch: "Exact", rv: "10" });
  c.list(2, "/pods/ns");
  c.get(2, "/pods/ns/a", { rv: "0" });
  c.get(2, "/pods/ns/zz", { rv: "0" });
  c.range(2, "/pods/ns/", { rangeEnd: "/pods/ns0", revision: 0 });
  c.range(2, "/pods/ns/", { rangeEnd: "/pods/ns0", linearizable: true });
  c.handleTxn(3, 11, [["put", { key: "/pods/ns/c", value: "c" }], ["delete", "/pods/ns/a"]]);
  c.handleProgress(4, 11n);
  c.consume(5, w);
  check("Deadline", c.pollTimeout());
  check("Window", c.window());
  c.windowEvents().forEach((e) => check("WindowEvent", e));
  c.objects().forEach((o) => check("Item", o));
  c.watchers().forEach((x) => check("WatcherInfo", x));
  check("WatcherInfo", c.watcher(w));
  assert.equal(c.watcher(999), null);
  check("Metrics", c.metrics());
  check("CacherConfigInfo", c.config());
  assert.equal(typeof c.resourceVersion, "bigint");
  assert.ok(["pending", "ready", "stopped"].includes(c.readyState));
  c.advance(120_000);
  c.handleStorageError(120_001, "boom");
  c.stop(120_002);
  take(c.drain());
  for (const t of ["STARTED", "ADDED", "DELETED", "BOOKMARK", "ERROR", "CLOSED", "LIST", "GET", "RANGE", "REJECTED", "NEED_CURRENT_RV"]) {
    assert.ok(seen.has(t), `the run produced no ${t} (seen: ${[...seen].join(", ")})`);
  }
});

test("replay records and the simulate report match their interfaces", () => {
  const seen = new Set();
  for (const f of scenarioFiles) {
    wc.replay(read(scenarioDir, f)).forEach((r, i) => {
      seen.add(r.type);
      check("TraceRecord", r, `${f}[${i}]`);
      (r.items ?? []).forEach((it, j) => check("TraceItem", it, `${f}[${i}].items[${j}]`));
    });
  }
  assert.ok(seen.has("RANGE") && seen.has("LIST") && seen.has("BOOKMARK"), [...seen].join(", "));
  const report = wc.simulate({ duration_s: 3, watchers: { count: 2 } });
  check("SimulationReport", report);
  check("SimulationSummary", report.summary);
  report.series.forEach((s, i) => check("SimulationSecond", s, `series[${i}]`));
});

// ----- tsc ------------------------------------------------------------------------------------

function findTsc() {
  if (process.env.TSC) return process.env.TSC;
  for (const dir of (process.env.PATH ?? "").split(delimiter)) if (dir && existsSync(join(dir, "tsc"))) return join(dir, "tsc");
  return null;
}

test("tests/types/usage.ts type-checks with tsc --noEmit --strict", () => {
  const tsc = findTsc();
  // make test-wasm sets TSC (web-demo's npm packages); a missing compiler fails, never skips.
  assert.ok(tsc && existsSync(tsc), `no TypeScript compiler: run make test-wasm (it installs one), or set TSC=/path/to/tsc (got ${tsc})`);
  const r = spawnSync(tsc, ["-p", join(here, "types", "tsconfig.json")], { encoding: "utf8" });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}${r.stderr}`);
});
