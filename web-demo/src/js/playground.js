// The playground: the page plays the cacher's host. It keeps a small model of etcd (a
// revision counter and the objects), feeds the Cacher what etcd says, answers what the Cacher
// asks of its host (RELIST, REQUEST_PROGRESS; NEED_CURRENT_RV is answered by the Cacher
// itself from `setEtcdRv`), moves time, and plays the clients of manual watchers.
//
// Every action is also written down as a scenario step (the conformance language of
// scenarios/*.json), so the explainer treats playground actions and scenario steps alike.

import { parseLabels } from "./util.js";

/** Ring presets: a small ring to watch it grow and shrink, or Kubernetes' defaults. */
export const RING_PRESETS = {
  small: { capacity: 8, lower_bound_capacity: 4, label: "small: capacity 8, lower bound 4, dynamic" },
  fixed: { capacity: 8, lower_bound_capacity: 8, dynamic_capacity: false, label: "small and fixed: capacity 8" },
  k8s: { capacity: 100, lower_bound_capacity: 100, label: "Kubernetes: 100, up to 102400, dynamic" },
};

/** The objects etcd holds when the playground starts. */
const SEED = [
  ["/pods/default/web-0", { app: "web" }, "node-a"],
  ["/pods/default/web-1", { app: "web" }, "node-b"],
  ["/pods/default/db-0", { app: "db" }, "node-a"],
  ["/pods/kube-system/dns-0", { app: "dns" }, "node-b"],
];

/** The fields a Kubernetes object would expose to field selectors, from its key. */
export function fieldsOf(key, node) {
  const parts = key.split("/").filter(Boolean);
  const f = {};
  if (parts.length >= 3) {
    f["metadata.namespace"] = parts[1];
    f["metadata.name"] = parts[parts.length - 1];
  }
  if (node) f["spec.nodeName"] = node;
  return f;
}

/** Manual clients' reading rates (events per simulated second); 0 = stalled. */
export const READ_RATES = [
  [0, "stalled"],
  [1, "1 / s"],
  [5, "5 / s"],
  [50, "50 / s"],
  [Infinity, "everything"],
];

export class Playground {
  /**
   * `wc` is the wasm module. `settings`: `{profile, ring, bookmarkMs, progressAnswers}`.
   */
  constructor(wc, settings) {
    this.wc = wc;
    this.settings = { ...settings };
    // The etcd model survives a new Cacher (a profile switch restarts the apiserver, not etcd).
    this.etcd = { rev: 100, compacted: 0, objects: new Map(), up: true, progressSent: 0 };
    for (const [key, labels, node] of SEED) {
      this.etcd.objects.set(key, { key, value: `${key.split("/").pop()}@100`, rv: 100, labels, fields: fieldsOf(key, node) });
    }
    this.loadSeq = 0;
  }

  /** The Cacher config of the current settings (scenario config field names). */
  config() {
    const { label: _label, ...ring } = RING_PRESETS[this.settings.ring] ?? RING_PRESETS.small;
    return { profile: this.settings.profile, bookmark_frequency_ms: this.settings.bookmarkMs, ...ring };
  }

  /** A fresh Cacher (time 0, gate pending) whose reflector lists etcd at once. */
  start() {
    if (this.cacher) this.cacher.free();
    this.cacher = new this.wc.Cacher(this.config());
    this.now = 0;
    this.deferred = []; // host actions due later: {at, kind}
    this.names = new Map(); // core id -> lane name
    this.kinds = new Map(); // core id -> "watch" | "list" | "get"
    this.clients = new Map(); // core id -> {rate, credit} for manual watchers
    this.counter = { w: 0, l: 0, g: 0 };
    this.relistPending = false;
    this.cacher.setEtcdRv(this.etcd.rev);
    return this.relist("initial list");
  }

  nameOf(id) {
    return this.names.get(id) ?? `#${id}`;
  }

  /** Runs `fn(now)` on the Cacher and returns `{step, outputs}`; `step` is the scenario form. */
  act(step, fn) {
    const c = this.cacher;
    step.at = this.now;
    let result;
    let error = null;
    try {
      result = fn(this.now);
    } catch (e) {
      error = e;
    }
    const outputs = c.drain();
    this.hostDuties(outputs);
    return { step, outputs, result, error };
  }

  // ----- what etcd says ------------------------------------------------------------------------

  /** The reflector's (re)list: everything etcd holds, at its revision. */
  relist(why) {
    const objects = [...this.etcd.objects.values()];
    this.relistPending = false;
    const step = { op: "replace", rv: this.etcd.rev, objects, why };
    return this.act(step, (t) => this.cacher.handleReplace(t, this.etcd.rev, objects));
  }

  /** A write to etcd, seen by the cacher's watch. */
  write(key, value, labelsText, node) {
    if (!this.etcd.up) throw new Error("etcd is restarting; try again in a moment");
    if (!/^\/[^/]+\/.+/.test(key)) throw new Error(`a key looks like /pods/<namespace>/<name>, not ${JSON.stringify(key)}`);
    const rv = ++this.etcd.rev;
    const obj = { key, value: value || `${key.split("/").pop()}@${rv}`, rv, labels: parseLabels(labelsText), fields: fieldsOf(key, node) };
    const existed = this.etcd.objects.has(key);
    this.etcd.objects.set(key, obj);
    this.cacher.setEtcdRv(rv);
    const r = this.act({ op: "put", rv, object: obj }, (t) => this.cacher.handlePut(t, obj));
    r.existed = existed;
    return r;
  }

  /** A delete in etcd. */
  remove(key) {
    if (!this.etcd.up) throw new Error("etcd is restarting; try again in a moment");
    if (!this.etcd.objects.has(key)) throw new Error(`${key} is not in etcd`);
    const rv = ++this.etcd.rev;
    this.etcd.objects.delete(key);
    this.cacher.setEtcdRv(rv);
    return this.act({ op: "delete", rv, key }, (t) => this.cacher.handleDelete(t, key, rv));
  }

  /** Another resource wrote to etcd: the global revision moves, nothing changes here. */
  bumpRevision(n = 5) {
    this.etcd.rev += n;
    this.cacher.setEtcdRv(this.etcd.rev);
    return this.act({ op: "etcd_rv", rv: this.etcd.rev }, () => {});
  }

  /** etcd's progress notify at its current revision. */
  progress() {
    this.etcd.progressSent += 1;
    return this.act({ op: "progress", rv: this.etcd.rev }, (t) => this.cacher.handleProgress(t, this.etcd.rev));
  }

  /** etcd compacts its history at its current revision. */
  compact() {
    this.etcd.compacted = this.etcd.rev;
    return this.act({ op: "compact", rv: this.etcd.rev }, (t) => this.cacher.handleCompaction(t, this.etcd.rev));
  }

  /** etcd restarts: the cacher's watch breaks; etcd is back 1.5 s later; the reflector relists. */
  restartEtcd() {
    this.etcd.up = false;
    this.deferred.push({ at: this.now + 1500, kind: "etcd-up" });
    return this.act({ op: "storage_error", reason: "etcd restarted: watch stream closed" }, (t) =>
      this.cacher.handleStorageError(t, "etcd restarted: watch stream closed"),
    );
  }

  // ----- what clients ask ----------------------------------------------------------------------

  /** Starts a watch. `o` uses the scenario field names plus `rate` for manual clients. */
  watch(o) {
    const name = o.name || `w${++this.counter.w}`;
    const step = {
      op: "watch",
      id: name,
      key: o.key,
      rv: o.rv,
      send_initial_events: o.send_initial_events,
      allow_bookmarks: o.allow_bookmarks,
      label_selector: o.label_selector || undefined,
      field_selector: o.field_selector || undefined,
      consume: o.consume,
      slow_policy: o.slow_policy,
      timeout_ms: o.timeout_ms || undefined,
    };
    const opts = {
      rv: o.rv,
      allowBookmarks: !!o.allow_bookmarks,
      consume: o.consume,
      slowPolicy: o.slow_policy,
    };
    if (o.send_initial_events !== undefined && o.send_initial_events !== null) opts.sendInitialEvents = o.send_initial_events;
    if (o.label_selector) opts.labelSelector = o.label_selector;
    if (o.field_selector) opts.fieldSelector = o.field_selector;
    if (o.timeout_ms) opts.timeoutMs = o.timeout_ms;
    const r = this.act(step, (t) => {
      const id = this.cacher.startWatch(t, o.key, opts);
      this.names.set(id, name);
      this.kinds.set(id, "watch");
      if (o.consume === "manual") this.clients.set(id, { rate: o.rate ?? 0, credit: 0 });
      return id;
    });
    r.name = name;
    return r;
  }

  /** A list. `o`: {key, rv, rv_match, limit, continue, label_selector}. */
  list(o) {
    const name = `list${++this.counter.l}`;
    const opts = { rv: o.rv ?? "" };
    if (o.rv_match) opts.rvMatch = o.rv_match;
    if (o.limit) opts.limit = Number(o.limit);
    if (o.continue) opts.continue = o.continue;
    if (o.label_selector) opts.labelSelector = o.label_selector;
    const step = { op: "list", id: name, key: o.key, rv: o.rv, rv_match: o.rv_match || undefined, limit: Number(o.limit) || undefined, continue: o.continue || undefined, label_selector: o.label_selector || undefined };
    const r = this.act(step, (t) => {
      const id = this.cacher.list(t, o.key, opts);
      this.names.set(id, name);
      this.kinds.set(id, "list");
      return id;
    });
    r.name = name;
    return r;
  }

  /** A get. `o`: {key, rv}. */
  get(o) {
    const name = `get${++this.counter.g}`;
    const step = { op: "get", id: name, key: o.key, rv: o.rv };
    const r = this.act(step, (t) => {
      const id = this.cacher.get(t, o.key, { rv: o.rv ?? "" });
      this.names.set(id, name);
      this.kinds.set(id, "get");
      return id;
    });
    r.name = name;
    return r;
  }

  /** A manual client reads `n` events (all if undefined). */
  consume(id, n) {
    const step = { op: "consume", id: this.nameOf(id), max: n };
    const r = this.act(step, (t) => this.cacher.consume(t, id, n));
    return r;
  }

  /** The client of a watch goes away. */
  stopWatch(id) {
    this.clients.delete(id);
    return this.act({ op: "stop_watch", id: this.nameOf(id) }, (t) => this.cacher.stopWatch(t, id));
  }

  /** Sets a manual client's reading rate (events per simulated second). */
  setRate(id, rate) {
    const cl = this.clients.get(id);
    if (cl) {
      cl.rate = rate;
      cl.credit = 0;
    }
  }

  // ----- the host's duties -------------------------------------------------------------------

  /** Answers what the Cacher asks of its host. */
  hostDuties(outputs) {
    for (const o of outputs) {
      if (o.type === "RELIST" && !this.relistPending) {
        // The core asks once wait.Until's 1 s period has passed (relist_delay_ms): list now,
        // or, while etcd is down, again every second.
        this.relistPending = true;
        this.deferred.push({ at: this.now, kind: "relist" });
      } else if (o.type === "REQUEST_PROGRESS" && this.settings.progressAnswers && this.etcd.up) {
        // etcd answers a progress request on the watch stream a few ms later.
        if (!this.deferred.some((d) => d.kind === "progress")) this.deferred.push({ at: this.now + 20, kind: "progress" });
      } else if (o.type === "CLOSED" || (o.type === "ERROR" && this.kinds.get(o.id) === "watch")) {
        if (o.type === "CLOSED") this.clients.delete(o.id);
      }
    }
  }

  /**
   * Moves time to `to` (ms): due host actions run at their own times, timers fire, manual
   * clients read at their rates. Returns a list of `{step, outputs}` results (host actions
   * are steps of their own; the plain passing of time is `{step: {op: "advance"}}`).
   */
  advanceTo(to) {
    const results = [];
    to = Math.floor(to);
    if (to < this.now) return results;
    const from = this.now;
    this.deferred.sort((a, b) => a.at - b.at);
    while (this.deferred.length && this.deferred[0].at <= to) {
      const d = this.deferred.shift();
      this.now = Math.max(this.now, d.at);
      if (d.kind === "relist") {
        if (this.etcd.up) results.push(this.relist("the reflector relists after the watch broke"));
        else this.deferred.push({ at: this.now + 1000, kind: "relist" }); // etcd still down: retry in 1 s
      } else if (d.kind === "progress") {
        results.push(this.progress());
      } else if (d.kind === "etcd-up") {
        this.etcd.up = true;
      }
    }
    this.now = to;
    const timed = this.act({ op: "advance", from }, (t) => this.cacher.advance(t));
    if (timed.outputs.length) results.push(timed);
    // Manual clients read at their rate, in simulated time.
    const dt = to - from;
    for (const [id, cl] of this.clients) {
      if (cl.rate === 0) continue;
      const info = this.cacher.watcher(id);
      if (!info) {
        this.clients.delete(id);
        continue;
      }
      if (cl.rate === Infinity) {
        if (info.queued > 0 || info.state === "lagging" || info.state === "blocked") results.push(this.consume(id));
        continue;
      }
      cl.credit += (cl.rate * dt) / 1000;
      if (cl.credit >= 1) {
        const n = Math.floor(cl.credit);
        cl.credit -= n;
        if (info.queued > 0 || info.state !== "active") results.push(this.consume(id, n));
      }
    }
    return results;
  }

  /**
   * The load generator: `n` writes at the current time, to 200 keys whose labels alternate
   * (so selector watchers see ADDED/DELETED transitions). The batch goes to the core as one
   * JSON text (`handlePuts`: one call, not one per put and per field), with one drain.
   */
  loadBatch(n) {
    const c = this.cacher;
    if (!this.etcd.up || n <= 0) return { outputs: [], written: 0 };
    const batch = new Array(n);
    for (let i = 0; i < n; i++) {
      const rv = ++this.etcd.rev;
      const k = this.loadSeq++ % 200;
      const key = `/pods/load/pod-${String(k).padStart(3, "0")}`;
      const obj = { key, value: `v${rv}`, rv, labels: { app: (rv >> 1) % 2 ? "web" : "db" }, fields: { "metadata.namespace": "load", "metadata.name": `pod-${k}` } };
      this.etcd.objects.set(key, obj);
      batch[i] = obj;
    }
    const written = c.handlePuts(this.now, JSON.stringify(batch));
    c.setEtcdRv(this.etcd.rev);
    const outputs = c.drain();
    this.hostDuties(outputs);
    return { outputs, written };
  }
}
