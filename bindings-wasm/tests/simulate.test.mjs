// simulate(workload): the workload simulator of the core, its report as a plain object.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { wc, read, scenarioDir } from "./helpers.mjs";

const small = {
  duration_s: 60,
  seed: 4,
  config: { capacity: 100, dynamic_capacity: false },
  writes: { rate_per_s: 50, keys: 500 },
  watchers: { count: 20, selector_fraction: 0.25 },
  disconnects: { rate_per_watcher_per_h: 120, reconnect_delay_s: { dist: "const", value: 5 } },
};

// BigInt-safe canonical text.
const canon = (v) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? `${x}n` : x));

test("the report: summary and one record per second, counts as BigInt", () => {
  const r = wc.simulate(small);
  assert.deepEqual(Object.keys(r), ["summary", "series"]);
  const s = r.summary;
  for (const k of ["events_written", "deliveries", "watch_410", "relists", "etcd_range_requests",
    "etcd_range_objects", "watcher_terminations", "bookmarks_sent", "final_etcd_rv"]) {
    assert.equal(typeof s[k], "bigint", k);
  }
  assert.equal(typeof s.p99_delivery_lag_ms, "number");
  assert.equal(typeof s.peak_ring_capacity, "number");
  assert.equal(r.series.length, 60);
  assert.deepEqual(r.series.map((x) => x.t_s), Array.from({ length: 60 }, (_, i) => i + 1));
  const x = r.series[30];
  assert.equal(typeof x.etcd_rv, "bigint");
  assert.equal(typeof x.window_s, "number");
  assert.equal(typeof x.connected_watchers, "number");
  assert.equal(typeof x.ready, "boolean");
  // A 2 s window and 5 s reconnects: 410s, each a relist of 500 objects from etcd.
  assert.ok(s.watch_410 > 0n);
  assert.equal(s.relists, s.watch_410);
  assert.equal(s.etcd_range_objects, 500n * (s.relists + 1n));
});

test("deterministic, and the same for an object and its JSON text", () => {
  const a = canon(wc.simulate(small));
  assert.equal(canon(wc.simulate(small)), a);
  assert.equal(canon(wc.simulate(JSON.stringify(small))), a);
  assert.notEqual(canon(wc.simulate({ ...small, seed: 5 })), a);
});

test("no watchers: no deliveries, a null percentile", () => {
  const s = wc.simulate({ duration_s: 10, watchers: { count: 0 } }).summary;
  assert.equal(s.deliveries, 0n);
  assert.equal(s.p50_delivery_lag_ms, null);
});

test("a restart closes the ready gate and every watcher relists", () => {
  const r = wc.simulate({ duration_s: 20, watchers: { count: 5 }, restarts: [{ at_s: 5, outage_s: 3 }] });
  assert.deepEqual(r.series.filter((x) => !x.ready).map((x) => x.t_s), [6, 7, 8]);
  assert.equal(r.summary.relists, 5n);
});

test("bad workloads throw ScenarioError naming the field; wrong types are TypeErrors", () => {
  const throwsNamed = (fn, name, msg) =>
    assert.throws(fn, (e) => {
      assert.ok(e instanceof Error, String(e));
      assert.equal(e.name, name);
      if (msg) assert.ok(e.message.startsWith(msg), e.message);
      if (name === "ScenarioError") assert.equal(e.code, 400);
      return true;
    });
  throwsNamed(() => wc.simulate({ writes: { rate_per_s: -1 } }), "ScenarioError",
    "writes.rate_per_s: must be a non-negative number, got -1");
  throwsNamed(() => wc.simulate({ watchers: { count: 1.5 } }), "ScenarioError", "watchers.count:");
  throwsNamed(() => wc.simulate({ etcd: { objects_per_page: 0 } }), "ScenarioError", "etcd.objects_per_page");
  throwsNamed(() => wc.simulate("{"), "ScenarioError", "invalid JSON");
  throwsNamed(() => wc.simulate(42), "TypeError");
  throwsNamed(() => wc.simulate([1]), "TypeError");
  // The instance keeps working.
  assert.equal(wc.simulate({ duration_s: 1 }).series.length, 1);
});

test("the example workloads of scenarios/simulate run", () => {
  const dir = join(scenarioDir, "simulate");
  const files = readdirSync(dir).filter((f) => f.endsWith(".json"));
  assert.ok(files.length >= 2);
  for (const f of files) {
    const w = JSON.parse(read(dir, f));
    w.duration_s = Math.min(w.duration_s ?? 60, 20);
    assert.ok(wc.simulate(w).summary.events_written > 0n, f);
  }
});
