// The page's scenario stepper (src/js/scenario.js) must give, step by step, exactly the records
// of the core's own replayer (`replay(scenario)`): same order, same fields, same values.
// It runs against the Node build of the same npm package (watchcache-wasm, by name).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ScenarioRun, stepSummary } from "../src/js/scenario.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const wc = createRequire(import.meta.url)("watchcache-wasm");
const dir = join(root, "scenarios");
const files = readdirSync(dir).filter((f) => f.endsWith(".json") && !f.endsWith(".trace.json")).sort();

// BigInt-safe canonical text of a record list.
const canon = (recs) => JSON.stringify(recs, (_k, v) => (typeof v === "bigint" ? `${v}n` : v));

test("there are scenarios to step through", () => assert.ok(files.length > 10));

for (const f of files) {
  test(`stepping ${f} gives replay()'s records`, () => {
    const sc = JSON.parse(readFileSync(join(dir, f), "utf8"));
    const run = new ScenarioRun(wc, sc);
    while (!run.done) {
      const r = run.stepForward();
      assert.equal(r.error, null, `step ${r.index}: ${r.error}`);
      assert.equal(typeof stepSummary(r.step), "string");
    }
    assert.equal(canon(run.trace), canon(wc.replay(sc)));
    // Back = rebuild and replay: seeking to the middle and forward again is the same trace.
    const mid = Math.floor(run.length / 2);
    run.seek(mid);
    assert.equal(run.position, mid);
    run.seek(run.length);
    assert.equal(canon(run.trace), canon(wc.replay(sc)));
    run.free();
  });
}
