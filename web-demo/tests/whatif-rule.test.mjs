// The what-if panel's logic (src/js/whatif.js) in Node, against the nodejs build of the same
// wasm package: the rule of docs/slo.md gives the figures the document states, and agrees with
// simulate() on both sides of the boundary; the JSON the form writes is the workload it edits.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { predict, measure, compare, dynamicCapacity, getPath, setPath, workloadText, delayOf, delayJson, seriesOf, SERIES } from "../src/js/whatif.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const wc = createRequire(import.meta.url)("watchcache-wasm");
const dir = join(root, "scenarios", "simulate");
const load = (f) => JSON.parse(readFileSync(join(dir, f), "utf8"));
const cfgOf = (w) => {
  const c = new wc.Cacher(w.config ?? {});
  try {
    return c.config();
  } finally {
    c.free();
  }
};
const near = (a, b, tol, what) => assert.ok(Math.abs(a - b) <= tol, `${what}: ${a} is not within ${tol} of ${b}`);

test("the dynamic ring settles where docs/slo.md says (W = C / r)", () => {
  const want = { 20: 1600, 50: 6400, 200: 25600, 2000: 102400 };
  for (const [r, c] of Object.entries(want)) assert.equal(dynamicCapacity(Number(r)).capacity, c, `${r} writes/s`);
  const p = predict({ writes: { rate_per_s: 2000 } }, cfgOf({}));
  near(p.W, 51.2, 1e-9, "W at 2 000 writes/s");
});

test("the rule on the SLO workloads: W, the phase, the shares and the compaction effect", () => {
  const fixed = load("slo_fixed_ring.json");
  let p = predict(fixed, cfgOf(fixed));
  assert.equal(p.W, 40);
  assert.equal(p.phase, "storm");
  setPath(fixed, "disconnects.reconnect_delay_s", { dist: "const", value: 30 });
  assert.equal(predict(fixed, cfgOf(fixed)).phase, "none");

  const dyn = load("slo_dynamic_ring.json");
  p = predict(dyn, cfgOf(dyn));
  assert.deepEqual([p.C, p.W, p.phase], [6400, 128, "none"]);
  setPath(dyn, "disconnects.reconnect_delay_s", 140);
  assert.equal(predict(dyn, cfgOf(dyn)).phase, "storm");

  // Out of sample in docs/slo.md: the closed form gives 19.8 % with bookmarks, 60.9 % without.
  const steady = load("steady_bookmarks.json");
  near(predict(steady, cfgOf(steady)).share, 0.198, 0.005, "steady_bookmarks, bookmarks on");
  steady.watchers.bookmarks = false;
  near(predict(steady, cfgOf(steady)).share, 0.609, 0.005, "steady_bookmarks, bookmarks off");

  // clamp((d − I) / I, 0, 1) = 0.5 for d = 60 s, I = 40 s.
  const comp = load("slo_compaction.json");
  p = predict(comp, cfgOf(comp));
  assert.equal(p.phase, "storm");
  near(p.refused, 0.5, 1e-9, "refused share");

  assert.equal(predict(load("slow_consumers.json"), cfgOf({})).phase, "idle");
  assert.equal(predict({ writes: { rate_per_s: -1 } }, cfgOf({})), null);
  assert.equal(predict({ disconnects: { reconnect_delay_s: { dist: "weird" } } }, cfgOf({})), null);
});

test("the rule agrees with simulate() on both sides of W", () => {
  const cases = [
    ["slo_fixed_ring.json", 30, "none"],
    ["slo_fixed_ring.json", 45, "storm"],
    ["slo_dynamic_ring.json", 115, "none"],
    ["slo_dynamic_ring.json", 140, "storm"],
  ];
  for (const [f, d, phase] of cases) {
    const w = load(f);
    setPath(w, "disconnects.reconnect_delay_s", { dist: "const", value: d });
    const p = predict(w, cfgOf(w));
    const report = wc.simulate(w);
    const m = measure(report, w);
    assert.equal(p.phase, phase, `${f} d=${d}: predicted`);
    assert.equal(m.phase, phase, `${f} d=${d}: measured (${m.relists} of ${m.reconnects})`);
    assert.equal(compare(p, m, report.summary).agrees, true);
    // What the panel plots is the report's series, as numbers.
    const S = seriesOf(report);
    for (const { key } of SERIES) {
      assert.equal(S[key].length, report.series.length);
      assert.equal(S[key].reduce((a, b) => a + b, 0), report.series.reduce((a, x) => a + Number(x[key]), 0));
    }
    assert.equal(S.relists.reduce((a, b) => a + b, 0), Number(report.summary.relists));
  }
  // A restart relists every watcher: compared by count.
  const storm = load("reconnect_storm.json");
  const report = wc.simulate(storm);
  const c = compare(predict(storm, cfgOf(storm)), measure(report, storm), report.summary);
  assert.equal(c.agrees, true, c.how);
});

test("the JSON the form writes is the workload, field by field", () => {
  for (const f of readdirSync(dir).filter((f) => f.endsWith(".json"))) {
    const w = load(f);
    assert.deepEqual(JSON.parse(workloadText(w)), w, f);
  }
  const w = {};
  setPath(w, "writes.rate_per_s", 5);
  setPath(w, "config.capacity", 300);
  assert.deepEqual(w, { writes: { rate_per_s: 5 }, config: { capacity: 300 } });
  setPath(w, "config.capacity", undefined);
  assert.deepEqual(w, { writes: { rate_per_s: 5 } });
  assert.equal(getPath(w, "writes.rate_per_s"), 5);
  assert.equal(getPath(w, "watchers.count"), undefined);
  for (const d of [{ dist: "const", value: 3 }, { dist: "exp", mean: 20 }, { dist: "uniform", min: 30, max: 120 }]) assert.deepEqual(delayJson(delayOf(d)), d);
  assert.deepEqual(delayOf(7), { dist: "const", a: 7 });
});
