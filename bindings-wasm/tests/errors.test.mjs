// Errors are JS Errors with a name and a code; no input traps the wasm instance.
import { test } from "node:test";
import assert from "node:assert/strict";
import { wc } from "./helpers.mjs";

const ready = () => {
  const c = new wc.Cacher({});
  c.handleReplace(0, 10, [{ key: "/pods/ns/a", value: "a" }]);
  return c;
};

const throwsNamed = (fn, name, code) =>
  assert.throws(fn, (e) => {
    assert.ok(e instanceof Error, String(e));
    assert.equal(e.name, name);
    if (code !== undefined) assert.equal(e.code, code);
    return true;
  });

test("bad requests are InvalidRequest 400", () => {
  const c = ready();
  throwsNamed(() => c.startWatch(1, "/pods/", { rv: "ten" }), "InvalidRequest", 400);
  throwsNamed(() => c.startWatch(1, "/pods/", { labelSelector: "a=b," }), "InvalidRequest", 400);
  throwsNamed(() => c.startWatch(1, "/b", { rangeEnd: "/a" }), "InvalidRequest", 400);
  // List options that fail validation are 422 Invalid, as Kubernetes answers them.
  throwsNamed(() => c.list(1, "/pods/", { rv: "0", rvMatch: "Exact" }), "InvalidRequest", 422);
});

test("wrong types are TypeErrors", () => {
  const c = ready();
  throwsNamed(() => c.startWatch("soon", "/pods/"), "TypeError");
  throwsNamed(() => c.startWatch(1, 42), "TypeError");
  throwsNamed(() => c.startWatch(1, "/pods/", { allowBookmark: true }), "TypeError");
  throwsNamed(() => c.handlePut(1, "nope"), "TypeError");
  throwsNamed(() => c.handlePut(1, { key: "/a", rv: -1 }), "TypeError");
  throwsNamed(() => c.handlePut(1, { key: "/a", rv: 2 ** 60 }), "TypeError");
  throwsNamed(() => c.handleReplace(1, 11, {}), "TypeError");
  throwsNamed(() => wc.replay(42), "TypeError");
  throwsNamed(() => c.advance(-5), "TypeError");
});

test("storage input errors leave the state unchanged", () => {
  const c = ready();
  throwsNamed(() => c.handlePut(1, { key: "/pods/ns/b", value: "b", rv: 9 }), "StorageInputError", 400);
  throwsNamed(() => c.handleDelete(1, "/pods/ns/zz", 11), "StorageInputError", 400);
  assert.equal(c.resourceVersion, 10n);
  assert.equal(c.storeLen, 1);
});

test("handlePuts: a malformed batch applies nothing; a refused put stops it there", () => {
  const c = ready();
  throwsNamed(() => c.handlePuts(1, "[{"), "TypeError");
  throwsNamed(() => c.handlePuts(1, '{"key": "/pods/ns/b"}'), "TypeError");
  throwsNamed(() => c.handlePuts(1, 42), "TypeError");
  throwsNamed(() => c.handlePuts(1, '[{"key": "/pods/ns/b", "rv": 11}, 7]'), "TypeError");
  // Every object is read before any is applied: the second lacks its rv, the first stays out.
  assert.throws(() => c.handlePuts(1, [{ key: "/pods/ns/b", rv: 11 }, { key: "/pods/ns/c" }]), /puts\[1\]: rv/);
  assert.equal(c.resourceVersion, 10n);
  assert.equal(c.storeLen, 1);
  // A put the store refuses (its rv is not above the last) stops the batch; the ones before stay.
  assert.throws(
    () => c.handlePuts(2, JSON.stringify([{ key: "/pods/ns/b", rv: 11 }, { key: "/pods/ns/c", rv: 11 }, { key: "/pods/ns/d", rv: 12 }])),
    (e) => e.name === "StorageInputError" && e.code === 400 && /puts\[1\]: .*\(1 of 3 applied\)/.test(e.message),
  );
  assert.equal(c.resourceVersion, 11n);
  assert.equal(c.storeLen, 2);
});

test("config errors name the field", () => {
  throwsNamed(() => new wc.Cacher({ capacity: 0 }), "ConfigError", 400);
  assert.throws(() => new wc.Cacher({ capcity: 1 }), /capcity: unknown field/);
});

test("statuses come as outputs with code and reason", () => {
  const c = ready();
  c.startWatch(1, "/pods/", { rv: "5" });
  const err = c.drain().find((o) => o.type === "ERROR");
  assert.deepEqual([err.code, err.reason], [410, "Expired"]);
  const c2 = new wc.Cacher({ profile: "v1.34" });
  c2.startWatch(0, "/pods/", { rv: "0" });
  const [rej] = c2.drain();
  assert.deepEqual([rej.type, rej.code, rej.retryAfterS], ["REJECTED", 429, 1]);
});

test("nothing traps the instance", () => {
  const bad = ["", "{", "[]", '{"steps": 3}', '{"steps": [{"at": 1e400, "op": "advance"}]}', { steps: [{ at: 0, op: "watch", id: "w", key: "/", rv: "\u0000" }] }];
  for (const s of bad) {
    try {
      wc.replay(s);
    } catch (e) {
      assert.ok(e instanceof Error);
    }
  }
  const deep = {};
  let cur = deep;
  for (let i = 0; i < 10000; i++) cur = cur.x = {};
  assert.throws(() => wc.replay({ steps: [], x: deep }));
  // The instance still works.
  assert.equal(wc.replay('{"steps": []}').length, 0);
  const c = ready();
  c.startWatch(1, "/pods/");
  assert.ok(c.drain().length > 0);
});

test("a step far into the future is refused, not a frozen page; the cacher goes on", () => {
  const c = ready();
  c.startWatch(0, "/pods/", { rv: "10", allowBookmarks: true });
  // 10^12 ms is a billion dispatch ticks: the call stops after a million and says where.
  let stopped = 0;
  assert.throws(() => c.advance(1e12), (e) => {
    assert.equal(e.name, "InvalidRequest");
    assert.equal(e.code, 400);
    const m = /smaller steps \(time stopped at (\d+) ms\)/.exec(e.message);
    assert.ok(m, e.message);
    stopped = Number(m[1]);
    return true;
  });
  assert.ok(stopped > 0 && stopped < 1e12, `time stopped at ${stopped}`);
  c.advance(stopped + 5000);
  c.handlePut(stopped + 5000, { key: "/pods/ns/b", value: "b", rv: 11 });
  assert.ok(c.drain().some((o) => o.type === "ADDED" && o.key === "/pods/ns/b"));
});
