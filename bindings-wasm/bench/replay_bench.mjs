// Replaying a 100 000-event scenario in wasm (Node) vs the same replay natively.
// Usage: node bench/replay_bench.mjs PATH_TO_NATIVE_replay_bench
import { execFileSync } from "node:child_process";
import { writeFileSync, unlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { wc } from "../tests/helpers.mjs";

function scenario(events = 100_000) {
  const steps = [{ at: 0, op: "replace", rv: 1, objects: Array.from({ length: 1000 }, (_, i) => ({ key: `/pods/ns/p${String(i).padStart(4, "0")}`, value: "x".repeat(64) })) }];
  steps.push({ at: 0, op: "watch", id: "w0", key: "/pods/", rv: "1" });
  for (let i = 0; i < events; i++) {
    const rv = 2 + i;
    steps.push({ at: Math.floor(i / 10), op: "put", rv, object: { key: `/pods/ns/p${String(i % 1000).padStart(4, "0")}`, value: `v${rv}`, labels: { app: "web" } } });
  }
  return { name: "bench", config: { dispatch_tick_jitter: 0 }, steps };
}

function timeIt(f, runs = 7) {
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t = process.hrtime.bigint();
    f();
    times.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  times.sort((a, b) => a - b);
  return { best: times[0], median: times[Math.floor(runs / 2)] };
}

const sc = scenario();
const text = JSON.stringify(sc);
const path = join(tmpdir(), `wc-bench-${process.pid}.json`);
writeFileSync(path, text);
const native = JSON.parse(execFileSync(process.argv[2], [path, "7"], { encoding: "utf8" }));
unlinkSync(path);
const jsonText = timeIt(() => wc.replayJson(text));
const objects = timeIt(() => wc.replay(text));
const records = wc.replay(text).length;
if (records !== native.records) throw new Error(`records differ: ${records} vs ${native.records}`);
console.log(JSON.stringify({
  events: 100000, records,
  native_median_ms: native.median_ms,
  wasm_replay_json_median_ms: +jsonText.median.toFixed(2),
  wasm_replay_objects_median_ms: +objects.median.toFixed(2),
  ratio_replay_json: +(jsonText.median / native.median_ms).toFixed(2),
  ratio_replay_objects: +(objects.median / native.median_ms).toFixed(2),
}));
