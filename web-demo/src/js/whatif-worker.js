// The what-if panel's simulations run here, off the page's thread: the same wasm package,
// `simulate(workload)` (an object or its JSON text), its report posted back as is (BigInt
// counts survive structured clone). An error is posted back with its name and message (a bad
// workload's ScenarioError names the field); the page never sees an exception from here.
import init, { simulate } from "watchcache-wasm";

const ready = init();
// Where this code runs, reported with every answer (the browser test checks it is a worker).
const thread = typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope ? "worker" : "main";

self.onmessage = async (e) => {
  const { id, workload } = e.data;
  try {
    await ready;
    const t0 = performance.now();
    const report = simulate(workload);
    self.postMessage({ id, ok: true, report, ms: performance.now() - t0, thread });
  } catch (err) {
    self.postMessage({ id, ok: false, thread, error: { name: err?.name ?? "Error", message: err?.message ?? String(err) } });
  }
};
