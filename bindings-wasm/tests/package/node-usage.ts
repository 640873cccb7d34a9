// Type-checked with tsc --strict (module nodenext) in a project that installed the tarball:
// the package by name, from an ES module.
import init, { Cacher, replay, simulate, version, type CacherOutput, type TraceRecord } from "watchcache-wasm";

await init();
const v: string = version();
const trace: TraceRecord[] = replay({ steps: [{ at: 0, op: "replace", rv: 9, objects: [] }] });
const c = new Cacher({ profile: "v1.34", capacity: 100 });
c.handleReplace(0, 9, [{ key: "/pods/ns/a", value: "a" }]);
const id: number = c.startWatch(1, "/pods/", { rv: "9", allowBookmarks: true });
const outs: CacherOutput[] = c.drain();
for (const o of outs) if (o.type === "ADDED") console.log(o.key, o.rv + 1n, o.initialEventsEnd);
const seed: bigint = c.config().seed;
const deliveries: bigint = simulate({ duration_s: 1 }).summary.deliveries;
// @ts-expect-error resource versions come out as bigint, not number
const rv: number = trace[0].rv;
console.log(v, id, seed, deliveries, rv);
