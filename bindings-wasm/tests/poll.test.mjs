// Cacher.pollOutput: Python's poll_output, one plain object per call (the items drain gives).
import { test } from "node:test";
import assert from "node:assert/strict";
import { wc } from "./helpers.mjs";

const pod = (name, rv) => ({ key: `/pods/ns/${name}`, value: `${name}@${rv}`, rv });

// The same run on two cachers, so one can be drained and the other polled.
function run(c) {
  c.handleReplace(0, 10, [pod("a", 3), pod("b", 4)]);
  // Three auto watchers: each put is one fan-out to all of them.
  const auto = [0, 1, 2].map((i) => c.startWatch(1 + i, "/pods/", { rv: "10" }));
  // A manual watcher: consume delivers several events in one output.
  const manual = c.startWatch(4, "/pods/", { rv: "10", consume: "manual" });
  for (let rv = 11; rv <= 14; rv++) c.handlePut(5 + rv, pod(`p${rv}`, rv));
  c.consume(30, manual);
  c.list(31, "/pods/ns", { rv: "0", limit: 1 });
  c.stop(40);
  return { auto, manual };
}

function pollAll(c) {
  const out = [];
  for (let o = c.pollOutput(); o !== null; o = c.pollOutput()) out.push(o);
  return out;
}

test("pollOutput yields, one per call, exactly what drain returns", () => {
  const drained = new wc.Cacher({});
  const polled = new wc.Cacher({});
  const { auto, manual } = run(drained);
  run(polled);
  const expected = drained.drain();
  const got = pollAll(polled);
  assert.deepEqual(got, expected);
  // The run did exercise a fan-out (one put, three watchers) and a multi-event delivery.
  const modified = got.filter((o) => o.type === "ADDED" && o.rv === 11n);
  assert.deepEqual(modified.map((o) => o.id), [...auto, manual]);
  const consumed = got.filter((o) => o.id === manual && o.at === 30);
  assert.deepEqual(consumed.map((o) => o.rv), [11n, 12n, 13n, 14n]);
  assert.equal(polled.pollOutput(), null);
  assert.deepEqual(polled.drain(), []);
});

test("pollOutput then drain: nothing lost or repeated in the middle of a fan-out", () => {
  const a = new wc.Cacher({});
  const b = new wc.Cacher({});
  run(a);
  run(b);
  const all = a.drain();
  // Stop inside the first fan-out (items of one put to the three auto watchers).
  const firstFanout = all.findIndex((o) => o.type === "ADDED" && o.rv === 11n);
  assert.ok(firstFanout > 0);
  const head = [];
  for (let i = 0; i <= firstFanout; i++) head.push(b.pollOutput());
  assert.deepEqual(head, all.slice(0, firstFanout + 1));
  assert.deepEqual(b.drain(), all.slice(firstFanout + 1));
  assert.equal(b.pollOutput(), null);
});

test("pollOutput on a fresh cacher is null; outputs are plain objects", () => {
  const c = new wc.Cacher();
  assert.equal(c.pollOutput(), null);
  c.handleReplace(0, 5, []);
  c.get(1, "/pods/ns/x", { rv: "0" });
  const o = c.pollOutput();
  assert.equal(Object.getPrototypeOf(o), Object.prototype);
  assert.equal(o.type, "REJECTED");
  assert.equal(o.code, 404);
});
