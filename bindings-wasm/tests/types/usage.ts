// A typed use of the package: checked with `tsc --noEmit --strict` (tests/types.test.mjs).
// Lines marked @ts-expect-error must fail to type-check: they show the types are precise.
import {
  Cacher,
  replay,
  replayJson,
  simulate,
  version,
  type CacherOutput,
  type Item,
  type SimulationReport,
  type TraceRecord,
  type WatcherInfo,
} from "../../pkg-node/watchcache";

const v: string = version();

const c = new Cacher({ profile: "v1.34", capacity: 100, dispatch_tick_jitter: 0 });
const fresh = new Cacher();
fresh.free();

c.handleReplace(0, 10, [{ key: "/pods/ns/a", value: "a", rv: 3, labels: { app: "web" } }]);
c.handlePut(1, { key: "/pods/ns/b", value: "b", rv: 11n });
const applied: number = c.handlePuts(1, [{ key: "/pods/ns/b", value: "b", rv: 11n }]) + c.handlePuts(1, "[]");
c.handleDelete(2, "/pods/ns/a", "12");
c.handleDelete(2, Uint8Array.from("/pods/ns/zz", (ch) => ch.charCodeAt(0)), 12);
c.handleTxn(3, 13, [["put", { key: "/pods/ns/c" }], ["delete", "/pods/ns/b"]]);
c.handleProgress(4, 13n);
c.handleStorageError(5);
c.handleStorageError(5, "watch failed");
c.handleCompaction(6, 5);
c.setEtcdRv(14);
c.autoCurrentRevision = false;

const w: number = c.startWatch(7, "/pods/", { rv: "0", allowBookmarks: true, consume: "manual", slowPolicy: "lag" });
c.startWatch(7, "/pods/");
c.startWatch(7, "/a", { rangeEnd: new Uint8Array([0x2f, 0x62]) });
const delivered: number = c.consume(8, w);
c.consume(8, w, 2);
c.grantCredit(8, w, 5);
c.list(9, "/pods/ns", { rv: "0", rvMatch: "NotOlderThan", limit: 2, continue: null, labelSelector: "app=web" });
c.get(9, "/pods/ns/a", { rv: 0 });
c.range(9, "/pods/", { rangeEnd: "/pods0", revision: 0n, linearizable: false });
c.handleCurrentRevision(10, 3, 14);
c.advance(11);
const stopped: boolean = c.stopWatch(12, w);

// Outputs narrow on `type` (and `source` for reads).
function describe(o: CacherOutput): string {
  switch (o.type) {
    case "ADDED":
    case "MODIFIED":
    case "DELETED":
    case "BOOKMARK":
      return `${o.id} ${o.key ?? ""} ${o.rv + 1n} ${o.initialEventsEnd ?? false}`;
    case "STARTED":
      return o.initial;
    case "ERROR":
    case "REJECTED":
      return `${o.code} ${o.reason} ${o.retryAfterS ?? 0}`;
    case "CLOSED":
      return `${o.cause} ${o.lastRv}`;
    case "LIST":
    case "GET":
      if (o.source === "cache") return `${o.rv} ${o.items.map((i: Item) => i.key).join()} ${o.continue ?? ""} ${o.remaining ?? 0n}`;
      return o.reason;
    case "RANGE":
      return o.source === "cache" ? `${o.count} ${o.more}` : o.reason;
    case "WATCH":
    case "RELIST":
      return o.reason;
    case "NEED_CURRENT_RV":
      return String(o.id);
    case "REQUEST_PROGRESS":
      return String(o.at);
  }
}
const texts: string[] = c.drain().map(describe);
for (let o = c.pollOutput(); o !== null; o = c.pollOutput()) texts.push(describe(o));

const deadline = c.pollTimeout();
const next: number | undefined = deadline?.atMs;
const win = c.window();
const oldest: bigint | undefined = win.oldestRv;
const events: bigint[] = c.windowEvents().map((e) => e.rv);
const objects: Item[] = c.objects();
const watchers: WatcherInfo[] = c.watchers();
const one: WatcherInfo | null = c.watcher(w);
const received: bigint = c.metrics().events_received;
const profile: "v1.30" | "v1.34" | "v1.37" = c.config().profile;
const rv: bigint = c.resourceVersion + c.listResourceVersion;
const state: "pending" | "ready" | "stopped" = c.readyState;
const numbers: number = c.nowMs + c.storeLen + c.budgetMs + c.parked;
c.stop(13);

const trace: TraceRecord[] = replay({ config: { capacity: 10 }, steps: [] });
const traceText: string = replayJson('{"steps": []}');
const report: SimulationReport = simulate({ duration_s: 1 });
const p50: number | null = report.summary.p50_delivery_lag_ms;

// @ts-expect-error: a boolean is not a resource version
c.handleProgress(14, true);
// @ts-expect-error: options are camelCase
c.startWatch(14, "/pods/", { allow_bookmarks: true });
// @ts-expect-error: consume is "auto" or "manual"
c.startWatch(14, "/pods/", { consume: "sometimes" });
// @ts-expect-error: a put needs the event's rv
c.handlePut(14, { key: "/pods/ns/d" });
// @ts-expect-error: a txn change is ["put", object] or ["delete", key]
c.handleTxn(14, 15, [["patch", "/pods/ns/d"]]);
// @ts-expect-error: nowMs is required
c.advance();
// @ts-expect-error: resource versions come out as bigint
const asNumber: number = c.resourceVersion;
// @ts-expect-error: a list key is a string
c.list(14, new Uint8Array([1]));

export const used = [v, applied, delivered, stopped, texts, next, oldest, events, objects, watchers, one, received, profile, rv, state, numbers, trace, traceText, p50, asNumber];
