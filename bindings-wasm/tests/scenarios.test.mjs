// Every scenario replayed in wasm gives the golden trace: the JSON text byte for byte, and the
// object form field for field (resource versions as BigInt, never rounded).
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { wc, scenarioDir, scenarioFiles, invalidFiles, read, traceText } from "./helpers.mjs";

test("there are scenarios", () => assert.ok(scenarioFiles.length >= 30));

for (const f of scenarioFiles) {
  test(`replayJson ${f}`, () => {
    const golden = read(scenarioDir, f.replace(/\.json$/, ".trace.json"));
    assert.equal(wc.replayJson(read(scenarioDir, f)), golden);
  });
  test(`replay(object) ${f}`, () => {
    const golden = read(scenarioDir, f.replace(/\.json$/, ".trace.json"));
    const trace = wc.replay(JSON.parse(read(scenarioDir, f)));
    assert.equal(traceText(trace), golden);
    for (const r of trace) {
      if ("rv" in r) assert.equal(typeof r.rv, "bigint");
      assert.equal(typeof r.at, "number");
    }
  });
}

for (const f of invalidFiles) {
  test(`invalid ${f}`, () => {
    const want = read(scenarioDir, "invalid", f.replace(/\.json$/, ".error.txt")).trim();
    assert.throws(() => wc.replay(read(scenarioDir, "invalid", f)), (e) => {
      assert.ok(e instanceof Error);
      assert.equal(e.name, "ScenarioError");
      assert.equal(e.code, 400);
      assert.equal(e.message, want);
      return true;
    });
  });
}

test("resource versions above 2^53 stay exact", () => {
  const big = 2n ** 64n - 2n;
  const trace = wc.replay({
    steps: [
      { at: 0, op: "replace", rv: big.toString() },
      { at: 1, op: "put", rv: big + 1n, object: { key: "/a", value: "x" } },
      { at: 2, op: "list", id: "l", key: "/", rv: "0" },
    ],
  });
  assert.equal(trace[0].rv, big + 1n);
  assert.equal(trace[0].items[0].rv, big + 1n);
  assert.match(wc.replayJson({ steps: [{ at: 0, op: "replace", rv: big }, { at: 1, op: "list", id: "l", key: "/", rv: "0" }] }), /"rv":18446744073709551614/);
});
