// Drives a Cacher from a scenario, one step at a time, the way the core's replayer does
// (cacher-core/src/replay.rs): before a step at time `at`, every timer due by then fires;
// then the step's op becomes one Cacher call; then the outputs are drained.
//
// The page uses this to step through the scenario library forward, and backward (back =
// a fresh Cacher replayed up to the previous step; scenarios are small). It has no DOM code,
// so the Node tests check it against `replay(scenario)` record for record.

/** Drop the keys whose value is null or undefined (the wasm API refuses no key, but a
 * `null` is not always "unset" for it). */
function defined(obj) {
  const out = {};
  for (const [k, v] of Object.entries(obj)) if (v !== null && v !== undefined) out[k] = v;
  return out;
}

/** The Cacher call of one scenario step; returns the request id the core gave, if any. */
function applyStep(c, step) {
  const at = step.at;
  switch (step.op) {
    case "replace":
      c.handleReplace(at, step.rv, step.objects ?? []);
      return null;
    case "put":
      c.handlePut(at, { ...step.object, rv: step.object.rv ?? step.rv });
      return null;
    case "delete":
      c.handleDelete(at, step.key, step.rv);
      return null;
    case "txn":
      c.handleTxn(
        at,
        step.rv,
        step.ops.map((o) => (o.op === "put" ? ["put", { ...o.object, rv: o.object.rv ?? step.rv }] : ["delete", o.key])),
      );
      return null;
    case "progress":
      c.handleProgress(at, step.rv);
      return null;
    case "storage_error":
      c.handleStorageError(at, step.reason ?? "watch failed");
      return null;
    case "etcd_rv":
      // Only the host's knowledge changes; the Cacher answers NEED_CURRENT_RV with it.
      c.advance(at);
      c.setEtcdRv(step.rv);
      return null;
    case "compact":
      c.handleCompaction(at, step.rv);
      return null;
    case "watch":
      return c.startWatch(
        at,
        step.key,
        defined({
          recursive: step.recursive,
          rangeEnd: step.range_end,
          rv: step.rv ?? "",
          sendInitialEvents: step.send_initial_events,
          allowBookmarks: step.allow_bookmarks,
          labelSelector: step.label_selector,
          fieldSelector: step.field_selector,
          timeoutMs: step.timeout_ms,
          consume: step.consume,
          slowPolicy: step.slow_policy,
          queueCapacity: step.queue_capacity,
          // A scenario's watch is a request at the API server, as in replay().
          requestLayer: true,
        }),
      );
    case "list":
      return c.list(
        at,
        step.key,
        defined({
          recursive: step.recursive,
          rv: step.rv ?? "",
          rvMatch: step.rv_match,
          limit: step.limit,
          continue: step.continue,
          labelSelector: step.label_selector,
          fieldSelector: step.field_selector,
        }),
      );
    case "get":
      return c.get(at, step.key, { rv: step.rv ?? "" });
    case "range":
      // An etcd-style read (the etcd host's Range): [key, range_end), at a revision or latest.
      return c.range(
        at,
        step.key,
        defined({ rangeEnd: step.range_end, revision: step.revision, linearizable: step.linearizable, limit: step.limit }),
      );
    case "advance":
      c.advance(at);
      return null;
    case "stop_cacher":
      c.stop(at);
      return null;
    default:
      throw new Error(`unknown op ${JSON.stringify(step.op)}`);
  }
}

/** Ops that act on an existing request (by its scenario id). */
function applyToRequest(c, step, rid) {
  switch (step.op) {
    case "consume":
      return c.consume(step.at, rid, step.max ?? undefined);
    case "credit":
      return c.grantCredit(step.at, rid, step.n);
    case "stop_watch":
      return c.stopWatch(step.at, rid);
    default:
      throw new Error(`unknown op ${JSON.stringify(step.op)}`);
  }
}

const REQUEST_OPS = new Set(["watch", "list", "get", "range"]);
const BY_ID_OPS = new Set(["consume", "credit", "stop_watch"]);

/** One drained output as a trace record (the golden-file shape; ids are scenario names). */
export function recordOf(o, nameOf) {
  const r = { at: o.at };
  if (o.id !== undefined) r.id = nameOf(o.id);
  r.type = o.type;
  switch (o.type) {
    case "ADDED":
    case "MODIFIED":
    case "DELETED":
      Object.assign(r, { key: o.key, rv: o.rv, value: o.value });
      break;
    case "BOOKMARK":
      r.rv = o.rv;
      if (o.initialEventsEnd) r.annotations = { "k8s.io/initial-events-end": "true" };
      break;
    case "ERROR":
    case "REJECTED":
      Object.assign(r, { code: o.code, reason: o.reason, message: o.message });
      // The trace carries Retry-After only on a request that never started.
      if (o.type === "REJECTED" && o.retryAfterS !== undefined) r.retry_after_s = o.retryAfterS;
      break;
    case "CLOSED":
      r.cause = o.cause;
      if (o.message !== undefined) r.message = o.message;
      break;
    case "LIST":
    case "GET":
    case "RANGE":
    case "WATCH":
      r.source = o.source;
      if (o.rv !== undefined) r.rv = o.rv;
      r.reason = o.reason;
      if (o.items) r.items = o.items.map((i) => ({ key: i.key, rv: i.rv, value: i.value }));
      if (o.continue !== undefined) r.continue = o.continue;
      if (o.remaining !== undefined) r.remaining = o.remaining;
      if (o.count !== undefined) r.count = o.count;
      if (o.more !== undefined) r.more = o.more;
      break;
    case "RELIST":
      r.reason = o.reason;
      break;
    default:
      break;
  }
  for (const k of Object.keys(r)) if (r[k] === undefined || r[k] === null) delete r[k];
  return r;
}

/**
 * A scenario being stepped through. `wc` is the wasm module (`{Cacher}`), `scenario` the parsed
 * JSON. `position` is the number of steps applied so far (0 = a fresh Cacher, nothing done).
 */
export class ScenarioRun {
  constructor(wc, scenario) {
    this.wc = wc;
    this.scenario = scenario;
    this.reset();
  }

  /** A fresh Cacher with the scenario's config; no step applied. */
  reset() {
    if (this.cacher) this.cacher.free();
    this.cacher = new this.wc.Cacher(this.scenario.config ?? {});
    this.position = 0;
    this.ids = new Map(); // scenario id -> core id (0 when the request was rejected at once)
    this.names = new Map(); // core id -> scenario id
    this.trace = []; // every record so far
  }

  get length() {
    return this.scenario.steps.length;
  }

  get done() {
    return this.position >= this.length;
  }

  nameOf(id) {
    return this.names.get(id) ?? `#${id}`;
  }

  /**
   * Applies the next step. Returns `{index, step, timerOutputs, outputs, records, error}`:
   * `timerOutputs` are what timers due before the step produced, `outputs` what the step
   * itself produced (raw outputs with numeric ids, for the animation), `records` all of it as
   * trace records.
   */
  stepForward() {
    if (this.done) return null;
    const index = this.position;
    const step = this.scenario.steps[index];
    const c = this.cacher;
    // 1. Time moves to the step's `at`: timers due by then fire at their own deadlines.
    c.advance(step.at);
    const timerOutputs = c.drain();
    const records = [];
    for (const o of timerOutputs) if (o.type !== "STARTED") records.push(recordOf(o, (id) => this.nameOf(id)));
    // 2. The op. A request the core refuses at once (bad RV, 429, ...) is a REJECTED record
    //    under the scenario's id, as the replayer writes it.
    let error = null;
    const rejectedNow = [];
    try {
      if (REQUEST_OPS.has(step.op)) {
        if (this.ids.has(step.id)) throw new Error(`id ${JSON.stringify(step.id)} is already used`);
        try {
          const rid = applyStep(c, step);
          this.ids.set(step.id, rid);
          this.names.set(rid, step.id);
        } catch (e) {
          if (typeof e.code !== "number" || e.name === "ScenarioError" || e.name === "StorageInputError") throw e;
          this.ids.set(step.id, 0);
          const rec = { at: step.at, id: step.id, type: "REJECTED", code: e.code, reason: e.reason, message: e.message };
          if (e.retryAfterS !== undefined) rec.retry_after_s = e.retryAfterS;
          records.push(rec);
          rejectedNow.push({ at: step.at, type: "REJECTED", id: -1, name: step.id, code: e.code, reason: e.reason, message: e.message, retryAfterS: e.retryAfterS });
        }
      } else if (BY_ID_OPS.has(step.op)) {
        if (!this.ids.has(step.id)) throw new Error(`no request with id ${JSON.stringify(step.id)}`);
        applyToRequest(c, step, this.ids.get(step.id));
      } else {
        applyStep(c, step);
      }
    } catch (e) {
      error = e;
    }
    // 3. Drain what the step produced.
    const outputs = rejectedNow.concat(c.drain());
    // STARTED is host information (the watch is set up); the trace shows what clients see.
    for (const o of outputs) if (o.id !== -1 && o.type !== "STARTED") records.push(recordOf(o, (id) => this.nameOf(id)));
    this.trace.push(...records);
    this.position += 1;
    return { index, step, timerOutputs, outputs, records, error };
  }

  /** Rebuilds the Cacher and replays quietly up to `k` steps applied. */
  seek(k) {
    const target = Math.max(0, Math.min(k, this.length));
    if (target < this.position) this.reset();
    let last = null;
    while (this.position < target) last = this.stepForward();
    return last;
  }

  /** Releases the wasm memory of the Cacher. */
  free() {
    if (this.cacher) this.cacher.free();
    this.cacher = null;
  }
}

/** A request without its id: `LIST /pods/ns · rv=0 · limit=2` (the requests panel's rows). */
export function requestText(step) {
  const rv = step.rv === undefined || step.rv === null || step.rv === "" ? '""' : String(step.rv);
  const bits = [`rv=${rv}`];
  if (step.rv_match) bits.push(step.rv_match);
  if (step.limit) bits.push(`limit=${step.limit}`);
  if (step.continue) bits.push("continue");
  if (step.label_selector) bits.push(step.label_selector);
  if (step.field_selector) bits.push(step.field_selector);
  if (step.op === "range") {
    const rb = [step.range_end !== undefined ? `[${step.key}, ${JSON.stringify(step.range_end).slice(1, -1)})` : step.key];
    rb.push(step.revision ? `revision ${step.revision}` : "latest");
    if (step.linearizable) rb.push("linearizable");
    if (step.limit) rb.push(`limit=${step.limit}`);
    return `RANGE ${rb.join(" · ")}`;
  }
  return `${step.op.toUpperCase()} ${step.key} · ${bits.join(" · ")}`;
}

/** A short human-readable summary of a step (the timeline's row). */
export function stepSummary(step) {
  const rv = (x) => (x === undefined || x === null || x === "" ? '""' : String(x));
  switch (step.op) {
    case "replace":
      return `relist @${step.rv} (${(step.objects ?? []).length} objects)`;
    case "put":
      return `put ${step.object.key} @${step.rv}`;
    case "delete":
      return `delete ${step.key} @${step.rv}`;
    case "txn":
      return `txn @${step.rv} (${step.ops.length} changes)`;
    case "progress":
      return `progress notify @${step.rv}`;
    case "storage_error":
      return `etcd watch broke${step.reason ? `: ${step.reason}` : ""}`;
    case "etcd_rv":
      return `etcd revision is ${step.rv}`;
    case "compact":
      return `etcd compacts @${step.rv}`;
    case "watch": {
      const bits = [`rv=${rv(step.rv)}`];
      if (step.send_initial_events !== undefined && step.send_initial_events !== null) bits.push(`sendInitialEvents=${step.send_initial_events}`);
      if (step.allow_bookmarks) bits.push("bookmarks");
      if (step.label_selector) bits.push(`labels ${step.label_selector}`);
      if (step.field_selector) bits.push(`fields ${step.field_selector}`);
      if (step.consume === "manual") bits.push("manual");
      if (step.slow_policy === "lag") bits.push("lag");
      return `watch ${step.id} ${step.key} ${bits.join(", ")}`;
    }
    case "consume":
      return `${step.id} reads ${step.max ?? "all"}`;
    case "credit":
      return `${step.id} credit ${step.n}`;
    case "stop_watch":
      return `${step.id} stops`;
    case "list": {
      const bits = [`rv=${rv(step.rv)}`];
      if (step.rv_match) bits.push(step.rv_match);
      if (step.limit) bits.push(`limit=${step.limit}`);
      if (step.continue) bits.push("continue");
      if (step.label_selector) bits.push(`labels ${step.label_selector}`);
      return `list ${step.id} ${step.key} ${bits.join(", ")}`;
    }
    case "get":
      return `get ${step.id} ${step.key} rv=${rv(step.rv)}`;
    case "range":
      return `etcd range ${step.id} ${step.key}${step.range_end !== undefined ? "…" : ""}${step.revision ? ` @${step.revision}` : ""}${step.linearizable ? " linearizable" : ""}${step.limit ? ` limit=${step.limit}` : ""}`;
    case "advance":
      return "time passes";
    case "stop_cacher":
      return "cacher stops";
    default:
      return step.op;
  }
}
