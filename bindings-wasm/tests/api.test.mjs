// The Cacher class: the Python API's methods in camelCase, outputs as plain objects.
import { test } from "node:test";
import assert from "node:assert/strict";
import { wc } from "./helpers.mjs";

const pod = (name, rv, labels = {}) => ({ key: `/pods/ns/${name}`, value: `${name}@${rv}`, rv, labels });
const items = (outs, id) => outs.filter((o) => o.id === id && ["ADDED", "MODIFIED", "DELETED"].includes(o.type)).map((o) => [o.type, o.key, Number(o.rv)]);

test("watch replays the window and streams", () => {
  const c = new wc.Cacher({ capacity: 5, dynamic_capacity: false });
  c.handleReplace(0, 10, [pod("a", 3)]);
  c.handlePut(1, pod("a", 11));
  c.handlePut(2, pod("b", 12));
  const w = c.startWatch(3, "/pods/", { rv: "10" });
  let out = c.drain();
  assert.deepEqual(out[0], { at: 3, type: "STARTED", id: w, rv: 10n, initial: "ring" });
  assert.deepEqual(items(out, w), [["MODIFIED", "/pods/ns/a", 11], ["ADDED", "/pods/ns/b", 12]]);
  c.handleDelete(4, "/pods/ns/a", 13);
  out = c.drain();
  assert.deepEqual(items(out, w), [["DELETED", "/pods/ns/a", 13]]);
  assert.equal(out[0].value, "a@11");
  const win = c.window();
  assert.equal(win.newestRv, 13n);
  assert.equal(win.len, 3);
  assert.equal(c.resourceVersion, 13n);
});

test("lists, gets and pagination", () => {
  const c = new wc.Cacher({ profile: "v1.34" });
  c.handleReplace(0, 10, ["a", "b", "c", "d", "e"].map((n, i) => pod(n, i + 1, { app: i % 2 ? "web" : "db" })));
  c.list(1, "/pods/ns", { rv: "0", labelSelector: "app=web" });
  c.list(2, "/pods/ns", { limit: 2 });
  c.get(3, "/pods/ns/zz", { rv: "0" });
  const [web, page, missing] = c.drain().filter((o) => o.type !== "NEED_CURRENT_RV");
  assert.equal(web.source, "cache");
  assert.deepEqual(web.items.map((i) => i.key), ["/pods/ns/b", "/pods/ns/d"]);
  assert.deepEqual(web.items[0].labels, { app: "web" });
  assert.equal(page.remaining, 3n);
  assert.equal(missing.type, "REJECTED");
  assert.equal(missing.code, 404);
  c.list(4, "/pods/ns", { limit: 2, continue: page.continue });
  assert.deepEqual(c.drain()[0].items.map((i) => i.key), ["/pods/ns/c", "/pods/ns/d"]);
});

test("time, timers and bookmarks", () => {
  const c = new wc.Cacher({ dispatch_tick_jitter: 0, bookmark_frequency_ms: 1000 });
  c.handleReplace(0, 10, []);
  const w = c.startWatch(0, "/pods/", { rv: "10", allowBookmarks: true, timeoutMs: 5000 });
  c.handlePut(100, pod("a", 11));
  assert.deepEqual(c.pollTimeout(), { atMs: 1000, reason: "dispatch_tick" });
  c.advance(5000);
  const out = c.drain();
  assert.deepEqual(out.filter((o) => o.type === "BOOKMARK").map((o) => o.at), [1000, 2000, 3000, 4000]);
  const closed = out.find((o) => o.type === "CLOSED");
  assert.deepEqual([closed.id, closed.cause, closed.at], [w, "timeout", 5000]);
});

test("slow watchers, txns, getters", () => {
  const c = new wc.Cacher({ dispatch_tick_jitter: 0 });
  c.handleReplace(0, 100, []);
  const slow = c.startWatch(0, "/pods/", { rv: "100", consume: "manual", slowPolicy: "lag", queueCapacity: 2 });
  for (let rv = 101; rv < 106; rv++) c.handlePut(10, pod("p", rv));
  assert.equal(c.watcher(slow).state, "lagging");
  assert.equal(c.consume(20, slow), 5);
  assert.equal(c.watcher(slow).state, "active");
  c.handleTxn(30, 106, [["put", pod("q", 106)], ["delete", "/pods/ns/p"]]);
  c.consume(31, slow);
  const out = c.drain();
  assert.deepEqual(items(out, slow).slice(-2), [["ADDED", "/pods/ns/q", 106], ["DELETED", "/pods/ns/p", 106]]);
  const m = c.metrics();
  assert.equal(m.events_received, 7n);
  assert.equal(c.config().profile, "v1.30");
  assert.equal(c.storeLen, 1);
  assert.deepEqual(c.windowEvents().map((e) => e.rv), [101n, 102n, 103n, 104n, 105n, 106n, 106n]);
});

test("manual current revision", () => {
  const c = new wc.Cacher({ profile: "v1.34" });
  c.autoCurrentRevision = false;
  c.handleReplace(0, 10, []);
  const id = c.list(1, "/pods/");
  assert.deepEqual(c.drain(), [{ at: 1, type: "NEED_CURRENT_RV", id }]);
  c.handleCurrentRevision(2, id, 12);
  assert.equal(c.parked, 1);
  c.handleProgress(3, 12n);
  const [res] = c.drain();
  assert.deepEqual([res.source, res.rv], ["cache", 12n]);
});

test("handlePuts: a batch, as an array or its JSON text, is handlePut for each", () => {
  const run = (feed) => {
    const c = new wc.Cacher({ capacity: 8, dynamic_capacity: false, dispatch_tick_jitter: 0 });
    c.handleReplace(0, 10, [pod("a", 3, { app: "web" })]);
    const w = c.startWatch(1, "/pods/", { rv: "10" });
    const s = c.startWatch(1, "/pods/", { rv: "10", labelSelector: "app=web" });
    const puts = [pod("a", 11, { app: "db" }), pod("b", 12, { app: "web" }), pod("a", 13, { app: "web" })];
    feed(c, puts);
    return { out: c.drain(), rv: c.resourceVersion, objects: c.objects(), window: c.windowEvents(), w, s };
  };
  const one = run((c, puts) => puts.forEach((p) => c.handlePut(5, p)));
  const arr = run((c, puts) => assert.equal(c.handlePuts(5, puts), 3));
  const text = run((c, puts) => assert.equal(c.handlePuts(5, JSON.stringify(puts)), 3));
  assert.deepEqual(arr, one);
  assert.deepEqual(text, one);
  assert.equal(one.rv, 13n);
  // The selector watcher saw a@11 leave (DELETED), b arrive, a come back.
  assert.deepEqual(items(one.out, one.s), [["DELETED", "/pods/ns/a", 11], ["ADDED", "/pods/ns/b", 12], ["ADDED", "/pods/ns/a", 13]]);
  const c = new wc.Cacher({});
  c.handleReplace(0, 10, []);
  assert.equal(c.handlePuts(1, "[]"), 0);
  assert.equal(c.resourceVersion, 10n);
});
