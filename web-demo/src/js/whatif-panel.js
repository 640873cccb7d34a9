// The What-if tab: a workload (form, presets from scenarios/simulate/, a raw-JSON editor), run
// with the core's `simulate(workload)` in a web worker (src/js/whatif-worker.js) so the page
// keeps drawing, its report shown as totals and per-second plots (src/js/charts.js), and the
// rule of docs/slo.md — d + A < W — applied to the same workload beside the plots, with
// whether the run agrees.
//
// The JSON text is the workload: the form reads from it and writes into it (only the field
// that changed, so whatever else the workload says — bursts, restarts, slow clients — stays).
// A bad workload is the simulator's to judge: its error (naming the field) is shown in place
// of the results, and the page goes on.

import { timeChart, short } from "./charts.js";
import { DEFAULTS, getPath, setPath, workloadText, delayOf, delayJson, predict, measure, compare, seriesOf } from "./whatif.js";
import { h, esc } from "./util.js";

const $ = (id) => document.getElementById(id);
const FIRST_PRESET = "slo_fixed_ring.json";

/** Totals shown as tiles: [field, label, title]. */
const TILES = [
  ["events_written", "events written", "writes to etcd, each an event in the cache"],
  ["deliveries", "deliveries", "events delivered to watchers"],
  ["watch_410", "410 Expired", "watches that asked for an RV older than the window"],
  ["relists", "relists", "watchers that relisted from etcd after a 410"],
  ["etcd_range_requests", "etcd range reqs", "range requests to etcd (lists, pages)"],
  ["etcd_range_objects", "etcd objects read", "objects etcd returned"],
  ["etcd_list_410", "lists refused", "relists whose first list at the last RV etcd refused (compacted)"],
  ["watcher_terminations", "terminated", "watches the cacher ended (unresponsive, reinitialising)"],
  ["bookmarks_sent", "bookmarks", "bookmarks sent"],
  ["disconnects", "disconnects", "client-side disconnects"],
  ["watches_started", "watches started", "watches started (first ones, re-watches, after relists)"],
  ["p50_delivery_lag_ms", "p50 lag (ms)", "median time from write to the client reading the event"],
  ["p99_delivery_lag_ms", "p99 lag (ms)", "99th percentile delivery lag"],
  ["peak_ring_capacity", "peak capacity", "largest ring-buffer capacity"],
  ["final_ring_capacity", "final capacity", "ring-buffer capacity at the end"],
];

const C = { blue: "#2563eb", indigo: "#4f46e5", red: "#dc2626", amber: "#d97706", teal: "#0891b2", green: "#16a34a", slate: "#64748b", light: "#93c5fd" };

/** A value of the report as text: BigInt and integers with separators, others to 3 digits. */
export function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "bigint") return v.toLocaleString("en");
  if (typeof v === "number") {
    if (!Number.isFinite(v)) return v > 0 ? "∞" : "–";
    if (Number.isInteger(v) || Math.abs(v) >= 100) return Math.round(v).toLocaleString("en");
    return String(+v.toPrecision(3));
  }
  return String(v);
}

const pct = (x) => (x === null || x === undefined ? "–" : x === 0 ? "0 %" : x < 0.001 ? "< 0.1 %" : `${+(x * 100).toFixed(1)} %`);

const PHASE_TEXT = {
  none: "no relists",
  some: "some reconnects relist",
  storm: "every reconnect relists",
  idle: "no disconnects: nothing to predict",
};

export class WhatIfPanel {
  /**
   * `wc`: the wasm package ({Cacher}), used on this thread only to resolve a workload's config
   * for the rule (defaults of its profile); `hooks`: {explain(title, html), profile(p), clock(text)}.
   */
  constructor(wc, hooks) {
    this.wc = wc;
    this.hooks = hooks;
    this.worker = null;
    this.runId = 0;
    this.presetId = 0; // the latest preset asked for: an older one that arrives late is dropped
    this.running = null; // {id, workload, started}
    this.index = null;
    this.loaded = false;
    this.last = null; // {report, workload, ms, thread}
    this.workload = {};
    this.wire();
  }

  // ----- showing the tab -------------------------------------------------------------------------

  /** The tab is shown: on the first time, load the preset index and the first preset. */
  async show() {
    this.hooks.profile(this.profile());
    if (this.last) this.hooks.clock(`${fmt(this.last.report.summary.duration_s)} s simulated`);
    else this.hooks.clock("t = –");
    this.explainIntro();
    if (this.loaded) return;
    this.loaded = true;
    try {
      const res = await fetch("scenarios/simulate/index.json");
      if (!res.ok) throw new Error(`scenarios/simulate/index.json: HTTP ${res.status}`);
      this.index = await res.json();
    } catch (e) {
      this.index = [];
      this.showError("The presets could not be loaded", e.message);
    }
    const sel = $("wi-preset");
    sel.replaceChildren(
      h("option", { value: "" }, "(defaults: an empty workload)"),
      ...this.index.map((p) => h("option", { value: p.file, title: p.description }, `${p.file.replace(/\.json$/, "")} · ${fmt(p.duration_s)} s · ${fmt(p.watchers)} watchers`)),
    );
    const first = this.index.find((p) => p.file === FIRST_PRESET) ?? this.index[0];
    if (first) await this.loadPreset(first.file);
    else this.setWorkload({}, null);
  }

  explainIntro() {
    this.hooks.explain(
      "What-if: simulate a workload",
      "<p>Pick a workload (or edit one), press <b>▶ Run</b>: the real core runs it in simulated time — etcd writes, client-go-like watchers with bookmarks and selectors, disconnects and reconnects, compaction, cache restarts — in a <b>web worker</b>, so this page keeps drawing.</p>" +
        "<p>The plots show each simulated second: how many seconds of history the ring holds (<b>W</b>), its capacity, the 410s and relists, what etcd is asked to read, and how many watchers are connected.</p>" +
        "<p>Beside them, the rule of <code>docs/slo.md</code> predicts from the workload alone whether reconnecting watchers relist — then the run says whether it was right.</p>",
    );
  }

  // ----- the workload: presets, form, JSON ---------------------------------------------------------

  async loadPreset(file) {
    $("wi-preset").value = file;
    const id = ++this.presetId;
    if (!file) {
      this.setWorkload({}, null);
      return;
    }
    // While it loads, the panel says so (data-loading), and the editor holds the previous
    // workload: an edit made meanwhile is replaced by the preset when it arrives.
    $("whatif").dataset.loading = file;
    try {
      const res = await fetch(`scenarios/simulate/${file}`);
      if (!res.ok) throw new Error(`scenarios/simulate/${file}: HTTP ${res.status}`);
      const w = await res.json();
      if (id === this.presetId) this.setWorkload(w, file);
    } catch (e) {
      if (id === this.presetId) this.showError(`The preset ${file} could not be loaded`, e.message);
    } finally {
      if (id === this.presetId) delete $("whatif").dataset.loading;
    }
  }

  /** Replaces the workload (text, form, verdict). */
  setWorkload(w, file) {
    this.workload = w;
    this.preset = file;
    this.presetText = workloadText(w);
    $("wi-json").value = this.presetText;
    this.jsonOk(true);
    this.toForm();
    this.changed();
  }

  /** The form shows the workload's values (empty where it takes the default). */
  toForm() {
    const w = this.workload;
    for (const el of $("f-whatif").querySelectorAll("[data-path]")) {
      const v = getPath(w, el.dataset.path);
      if (el.type === "checkbox") el.checked = v === undefined ? DEFAULTS[el.dataset.path] : v === true;
      // A select's empty option is the default: an explicit default shows as it.
      else if (el.tagName === "SELECT") el.value = v === undefined || v === null || v === DEFAULTS[el.dataset.path] ? "" : String(v);
      else el.value = typeof v === "number" ? String(v) : v === undefined || v === null ? "" : String(v);
      // A value the form cannot show (a string in a number field) stays in the JSON only.
      el.classList.toggle("odd", v !== undefined && el.type === "number" && typeof v !== "number");
    }
    const raw = getPath(w, "disconnects.reconnect_delay_s");
    const d = delayOf(raw) ?? { dist: "const", a: undefined };
    $("wi-delay-dist").value = d.dist;
    $("wi-delay-a").value = raw === undefined ? "" : d.a ?? "";
    $("wi-delay-b").value = d.b ?? "";
    this.delayLabels();
  }

  delayLabels() {
    const dist = $("wi-delay-dist").value;
    $("wi-delay-a-label").textContent = dist === "exp" ? "mean (s)" : dist === "uniform" ? "min (s)" : "d (s)";
    $("wi-delay-b-row").hidden = dist !== "uniform";
  }

  /** One form field changed: write it into the workload and the JSON text. */
  fromField(el) {
    const path = el.dataset.path;
    let v;
    if (el.type === "checkbox") v = el.checked;
    else if (el.tagName === "SELECT") v = el.value === "" ? undefined : el.dataset.kind === "bool" ? el.value === "true" : el.value;
    else v = el.value.trim() === "" ? undefined : Number(el.value);
    if (typeof v === "number" && Number.isNaN(v)) v = el.value; // let the simulator say what is wrong
    setPath(this.workload, path, v);
    this.writeJson();
  }

  fromDelay() {
    this.delayLabels();
    const dist = $("wi-delay-dist").value;
    const a = $("wi-delay-a").value.trim();
    const b = $("wi-delay-b").value.trim();
    if (a === "" && dist === "const") setPath(this.workload, "disconnects.reconnect_delay_s", undefined);
    else setPath(this.workload, "disconnects.reconnect_delay_s", delayJson({ dist, a: a === "" ? 0 : Number(a), b: b === "" ? Number(a || 0) : Number(b) }));
    this.writeJson();
  }

  writeJson() {
    $("wi-json").value = workloadText(this.workload);
    this.jsonOk(true);
    this.changed();
  }

  /** The JSON text was edited: parse it; if it parses into an object, it is the workload. */
  fromJson() {
    const text = $("wi-json").value;
    let w;
    try {
      w = JSON.parse(text);
    } catch (e) {
      this.jsonOk(false, `not JSON yet: ${e.message} (Run shows the simulator's own error)`);
      this.changed(null);
      return;
    }
    if (!w || typeof w !== "object" || Array.isArray(w)) {
      this.jsonOk(false, "a workload is a JSON object");
      this.changed(null);
      return;
    }
    this.workload = w;
    this.jsonOk(true);
    this.toForm();
    this.changed();
  }

  jsonOk(ok, msg = "") {
    const st = $("wi-json-status");
    st.classList.toggle("bad", !ok);
    st.textContent = ok ? "valid JSON · Ctrl+Enter runs it" : msg;
    $("wi-json").classList.toggle("bad", !ok);
  }

  profile() {
    const p = getPath(this.workload, "config.profile");
    return p === "v1.34" ? "v1.34" : "v1.30";
  }

  /** The workload changed: the header, the rule's prediction, and whether a run is stale. */
  changed(w = this.workload) {
    const edited = $("wi-json").value !== this.presetText;
    $("wi-name").textContent = w?.name || (this.preset ? this.preset.replace(/\.json$/, "") : "What if…");
    $("wi-desc").textContent = typeof w?.description === "string" ? w.description : "";
    $("wi-meta").textContent = this.preset ? `scenarios/simulate/${this.preset}${edited ? " (edited)" : ""}` : "a workload of your own";
    this.hooks.profile(this.profile());
    this.prediction = w ? predict(w, this.configOf(w)) : null;
    this.renderVerdict();
    const stale = this.last && $("wi-json").value !== this.last.text;
    $("whatif").classList.toggle("stale", !!stale);
    this.renderMeasured(stale);
  }

  /** The cacher's resolved config for a workload (the profile's defaults), or null. */
  configOf(w) {
    const cfg = getPath(w, "config");
    if (cfg !== undefined && (cfg === null || typeof cfg !== "object" || Array.isArray(cfg))) return null;
    let c;
    try {
      c = new this.wc.Cacher(cfg ?? {});
      return c.config();
    } catch {
      return null; // the simulator's validation names the field when it runs
    } finally {
      c?.free();
    }
  }

  // ----- running ---------------------------------------------------------------------------------

  ensureWorker() {
    if (this.worker) return this.worker;
    const wk = new Worker(new URL("./whatif-worker.js", import.meta.url), { type: "module" });
    wk.onmessage = (e) => this.onResult(e.data);
    wk.onerror = (e) => {
      e.preventDefault();
      this.dropWorker();
      if (this.running) this.finish({ id: this.running.id, ok: false, error: { name: "WorkerError", message: e.message || "the web worker failed to start" } });
    };
    this.worker = wk;
    return wk;
  }

  dropWorker() {
    this.worker?.terminate();
    this.worker = null;
  }

  run() {
    if (this.running) return;
    const text = $("wi-json").value;
    const id = ++this.runId;
    let parsed = null;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
    this.running = { id, text, workload: parsed, started: performance.now() };
    this.setState("running", "running in a web worker…");
    $("wi-run").disabled = true;
    $("wi-cancel").disabled = false;
    this.tick = setInterval(() => {
      if (this.running) this.status(`running in a web worker… ${((performance.now() - this.running.started) / 1000).toFixed(1)} s`);
    }, 250);
    // The text goes as is: the simulator parses it and names what is wrong.
    this.ensureWorker().postMessage({ id, workload: text });
  }

  cancel() {
    if (!this.running) return;
    this.dropWorker();
    const secs = ((performance.now() - this.running.started) / 1000).toFixed(1);
    this.endRun();
    this.setState(this.last ? "done" : "idle", `cancelled after ${secs} s (the worker was stopped)`);
    $("whatif").dataset.state = "cancelled";
  }

  endRun() {
    clearInterval(this.tick);
    this.running = null;
    $("wi-run").disabled = false;
    $("wi-cancel").disabled = true;
  }

  onResult(msg) {
    if (!this.running || msg.id !== this.running.id) return; // a cancelled run's late answer
    this.finish(msg);
  }

  finish(msg) {
    const run = this.running;
    this.endRun();
    if (!msg.ok) {
      // Not a workload error: the wasm instance may be poisoned (a panic); start afresh next time.
      if (msg.error?.name !== "ScenarioError") this.dropWorker();
      this.last = null;
      this.showError(msg.error?.name === "ScenarioError" ? "The simulator refused this workload" : "The simulation failed", `${msg.error?.name ?? "Error"}: ${msg.error?.message ?? "unknown error"}`);
      return;
    }
    const w = run.workload ?? {};
    this.last = { report: msg.report, workload: w, text: run.text, ms: msg.ms, thread: msg.thread, wall: performance.now() - run.started };
    $("wi-error").hidden = true;
    $("whatif").classList.remove("stale");
    this.prediction = predict(w, this.configOf(w));
    this.renderSummary();
    this.renderCharts();
    this.renderVerdict();
    this.renderMeasured(false);
    const s = msg.report.summary;
    this.setState("done", `${fmt(s.duration_s)} s simulated in ${fmt(Math.round(msg.ms))} ms, in a web worker`);
    $("wi-status").dataset.thread = msg.thread;
    $("wi-status").dataset.ms = String(Math.round(msg.ms));
    this.hooks.clock(`${fmt(s.duration_s)} s simulated`);
    const m = measure(msg.report, w);
    this.hooks.explain(
      `Ran ${fmt(s.duration_s)} simulated seconds in ${fmt(Math.round(msg.ms))} ms`,
      `<p><b>${fmt(s.events_written)}</b> writes, <b>${fmt(s.deliveries)}</b> deliveries to ${fmt(Number(getPath(w, "watchers.count") ?? DEFAULTS["watchers.count"]))} watchers; <b>${fmt(s.watch_410)}</b> watches got 410 and <b>${fmt(s.relists)}</b> watchers relisted${m.exact && m.reconnects > 0 ? ` (of ${fmt(m.reconnects)} reconnects)` : ""}; etcd served ${fmt(s.etcd_range_requests)} range requests (${fmt(s.etcd_range_objects)} objects).</p>` +
        `<p>The ring peaked at ${fmt(s.peak_ring_capacity)} events${m.windowS !== null ? ` and held about <b>${fmt(m.windowS)} s</b> of history in the second half` : ""}. The rule's verdict is beside the plots.</p>` +
        `<p class="hint">Change a field (the rule's prediction follows at once) and run again. The same seed gives the same report here, in Python and in the CLI.</p>`,
    );
  }

  setState(state, text) {
    $("whatif").dataset.state = state;
    $("wi-status").dataset.state = state;
    this.status(text);
  }

  status(text) {
    $("wi-status").textContent = text;
  }

  showError(title, message) {
    const el = $("wi-error");
    el.hidden = false;
    el.replaceChildren(h("b", {}, title), h("div.wi-error-msg", {}, message));
    $("wi-summary").replaceChildren();
    $("wi-charts").replaceChildren();
    this.renderMeasured(false);
    this.setState("error", "error: see above the plots");
    this.hooks.explain("That workload did not run", `<p class="error">${esc(message)}</p><p>Fix the field it names (in the form or the JSON) and run again; nothing else on the page is affected.</p>`);
  }

  // ----- drawing ---------------------------------------------------------------------------------

  renderSummary() {
    const s = this.last.report.summary;
    $("wi-summary").replaceChildren(
      ...TILES.map(([k, label, title]) =>
        h("div.metric", { title, dataset: { key: k, value: s[k] === null || s[k] === undefined ? "" : String(s[k]) } }, h("b", {}, fmt(s[k])), h("span", {}, label)),
      ),
    );
  }

  renderCharts() {
    const { report, workload: w } = this.last;
    const S = seriesOf(report);
    const p = this.prediction;
    const del = delayOf(getPath(w, "disconnects.reconnect_delay_s"));
    const dLines = [];
    const rateH = getPath(w, "disconnects.rate_per_watcher_per_h") ?? 0;
    if (del && rateH > 0) {
      if (del.dist === "const") dLines.push({ y: del.a, label: `d = ${fmt(del.a)} s`, color: C.red });
      else if (del.dist === "exp") dLines.push({ y: del.a, label: `mean d = ${fmt(del.a)} s`, color: C.red });
      else dLines.push({ y: del.a, label: `d min ${fmt(del.a)} s`, color: C.red }, { y: del.b, label: `d max ${fmt(del.b)} s`, color: C.red });
    }
    const count = getPath(w, "watchers.count") ?? DEFAULTS["watchers.count"];
    const charts = [
      {
        id: "window",
        title: "Window span",
        sub: "seconds of history a watch can resume from (W); a watcher away longer than W − A gets 410",
        series: [{ key: "window_s", label: "window span (s)", values: S.window_s, color: C.blue }],
        hlines: [...(p && Number.isFinite(p.W) ? [{ y: p.W, label: `W = ${fmt(p.W)} s (rule)`, color: C.indigo }] : []), ...dLines],
      },
      {
        id: "capacity",
        title: "Ring buffer",
        sub: "capacity and events held",
        series: [
          { key: "capacity", label: "capacity", values: S.capacity, color: C.indigo },
          { key: "window_events", label: "events in the ring", values: S.window_events, color: C.light },
        ],
        hlines: p ? [{ y: p.C, label: `C = ${fmt(p.C)} (rule)`, color: C.slate }] : [],
      },
      {
        id: "expired",
        title: "410s and relists",
        sub: "per second",
        series: [
          { key: "relists", label: "relists", values: S.relists, color: C.red },
          { key: "watch_410", label: "410 Expired", values: S.watch_410, color: C.amber, kind: "bars" },
        ],
      },
      {
        id: "etcd",
        title: "etcd reads",
        sub: "range requests per second (initial lists, relist pages, refused lists)",
        series: [{ key: "etcd_range_requests", label: "range requests", values: S.etcd_range_requests, color: C.teal, kind: "bars" }],
      },
      {
        id: "watchers",
        title: "Connected watchers",
        sub: "with an open watch at the end of each second",
        series: [{ key: "connected_watchers", label: "connected", values: S.connected_watchers, color: C.green }],
        hlines: [{ y: count, label: `${fmt(count)} watchers`, color: C.slate, dash: "2 3" }],
      },
    ];
    $("wi-charts").replaceChildren(
      ...charts.map((c) =>
        h(
          "div.card.wi-chart",
          { dataset: { chart: c.id } },
          h("h3", {}, c.title, h("small", {}, c.sub)),
          h("div.wi-legend", {}, ...c.series.map((x) => h("span", {}, h(`i.${x.kind === "bars" ? "bar" : "line"}`, { style: `background:${x.color}` }), `${x.label} · max ${short(Math.max(0, ...x.values))}, total ${short(x.values.reduce((a, b) => a + b, 0))}`))),
          timeChart({ series: c.series, hlines: c.hlines ?? [], height: 118, title: c.title }),
        ),
      ),
    );
  }

  /** The rule's prediction for the current workload (no run needed). */
  renderVerdict() {
    const el = $("wi-verdict");
    const p = this.prediction;
    if (!p) {
      el.dataset.phase = "";
      delete el.dataset.w;
      el.replaceChildren(h("p.hint", {}, "No prediction: the workload does not parse or a field the rule needs is not a number (run it to see the simulator's message)."));
      return;
    }
    el.dataset.phase = p.phase;
    el.dataset.w = Number.isFinite(p.W) ? String(+p.W.toFixed(3)) : "inf";
    el.dataset.share = String(+p.share.toFixed(4));
    const rows = [];
    // W.
    const wText = !Number.isFinite(p.W)
      ? "no writes: the window never moves"
      : p.dynamic
        ? `dynamic ring: it settles at <b>${fmt(p.C)}</b> events, the smallest doubling above ${fmt(Math.round(p.freshS))} s of writes (${fmt(Math.round(p.need))} with margin)${p.C >= p.upper ? `, capped at the upper bound ${fmt(p.upper)}` : ""} → W = ${fmt(p.C)} / ${fmt(p.r)} = <b>${fmt(p.W)} s</b>`
        : `fixed ring: W = C / r = ${fmt(p.C)} / ${fmt(p.r)} = <b>${fmt(p.W)} s</b>`;
    rows.push(["W", wText]);
    // A.
    let aText;
    if (p.f >= 1 && p.r > 0) aText = `≈ 0: watchers see every object (a matching write every ${fmt(1 / p.r)} s)`;
    else if (p.bookmarks) aText = `≤ B = ${fmt(p.B)} s with bookmarks (the age of the last matching event, mean ${fmt(p.meanA)} s, otherwise)`;
    else aText = `the age of the last matching event: exponential, mean 1 / (r·f) = ${fmt(p.meanA)} s — without bookmarks no delay is quite safe`;
    rows.push(["A", aText]);
    // d.
    const d = p.delay;
    const dText = d.dist === "const" ? `${fmt(d.a)} s` : d.dist === "exp" ? `exponential, mean ${fmt(d.a)} s` : `uniform ${fmt(d.a)}–${fmt(d.b)} s`;
    rows.push(["d", `${dText}${p.phase === "idle" ? " (but no watcher disconnects)" : ""}`]);
    const notes = [];
    if (p.phase !== "idle" && d.dist === "const" && Number.isFinite(p.W) && Math.abs(d.a - p.W) <= p.noise) notes.push(`d is within ±2√C/r = ${fmt(p.noise)} s of W: there the write path's fluctuation decides, and the step from none to all is that wide.`);
    if (p.phase !== "idle" && p.share >= 0.005) {
      if (p.I > 0 && p.refused >= 0.001) notes.push(`Compaction every ${fmt(p.I)} s (I): etcd refuses the first list, at the last RV, of about ${pct(p.refused)} of the relists, clamp((d − I) / I, 0, 1). It does not change the 410s.`);
      else notes.push(`Compaction${p.I > 0 ? ` every ${fmt(p.I)} s` : ": never"}: etcd still has the relists' last RVs, so it refuses none of their first lists. The interval does not change the 410s.`);
    }
    if (p.restarts) notes.push(`${p.restarts} cache restart${p.restarts > 1 ? "s" : ""}: each relists every connected watcher at once (≈ ${fmt(p.restarts * p.count)} relists), whatever the window.`);
    if (p.bursts) notes.push("Bursts are not in the rule (it uses the base rate): a burst shortens a fixed ring's W while it lasts, and grows a dynamic ring, which keeps its size afterwards.");
    if (p.slow) notes.push("Slow clients (consume_rate_per_s) are terminated and re-watch: not what the rule is about.");
    if (p.bookmarks && p.f < 1 && p.phase !== "idle") notes.push("With bookmarks, a watcher that drops again before its new watch's first bookmark (B after it starts) can still relist: the rule leaves out those few.");
    const verdictText = p.phase === "idle" ? PHASE_TEXT.idle : p.phase === "none" ? `${PHASE_TEXT.none} (d + A < W)` : p.phase === "storm" ? `${PHASE_TEXT.storm} (d + A ≥ W)` : `≈ ${pct(p.share)} of reconnects relist`;
    const parts = [
      h("dl", {}, ...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { html: v })])),
      h("p.prediction", {}, h("span.label", {}, "Predicted: "), h("span.phase", { dataset: { phase: p.phase } }, verdictText)),
      p.phase === "none" || p.phase === "storm" ? h("p.share", {}, `predicted relist share: ${pct(p.share)} of reconnects`) : null,
      notes.length ? h("ul.notes", {}, ...notes.map((n) => h("li", {}, n))) : null,
    ];
    el.replaceChildren(...parts.filter(Boolean));
  }

  /** What the last run measured, and whether the prediction was right. */
  renderMeasured(stale) {
    const el = $("wi-measured");
    if (!this.last) {
      el.dataset.phase = "";
      el.dataset.agrees = "";
      el.replaceChildren(h("p.hint", {}, "Run the workload to compare with the simulator."));
      return;
    }
    const { report, workload } = this.last;
    const m = measure(report, workload);
    const p = this.prediction;
    el.dataset.phase = m.phase ?? "";
    el.dataset.relists = String(m.relists);
    el.dataset.reconnects = String(m.reconnects);
    const cmp = stale ? { agrees: null, how: "" } : compare(p, m, report.summary);
    const agrees = cmp.agrees === null ? "" : String(cmp.agrees);
    el.dataset.agrees = agrees;
    const lines = [];
    if (m.exact && m.reconnects > 0) lines.push(h("p", {}, h("span.label", {}, "Measured: "), h("span.phase", { dataset: { phase: m.phase } }, `${fmt(m.relists)} relists of ${fmt(m.reconnects)} reconnects (${pct(m.share)})`)));
    else if (m.exact) lines.push(h("p", {}, h("span.label", {}, "Measured: "), h("span.phase", { dataset: { phase: m.phase ?? "" } }, `${fmt(m.relists)} relists, no reconnects`)));
    else if (cmp.expected !== undefined) lines.push(h("p", {}, h("span.label", {}, "Measured: "), `${fmt(m.relists)} relists, ${fmt(m.reconnects)} re-watches in all (the restarts' included): compared by count.`));
    else lines.push(h("p", {}, h("span.label", {}, "Measured: "), `${fmt(m.relists)} relists. Terminations or timeouts end watches too, so the clients' reconnects cannot be told apart here.`));
    if (m.windowS !== null) lines.push(h("p.hint", {}, `The run's window held ${fmt(m.windowS)} s (median of the second half) against W = ${p && Number.isFinite(p.W) ? fmt(p.W) : "–"} s by the rule.`));
    if (agrees === "true") lines.push(h("p.agree.ok", {}, `✓ the rule predicted it (${cmp.how})`));
    else if (agrees === "false") lines.push(h("p.agree.bad", {}, `✗ the run differs from the rule's prediction (${cmp.how})`));
    if (stale) lines.push(h("p.hint", {}, "The workload changed since this run: run it again to compare."));
    el.replaceChildren(...lines);
  }

  // ----- controls --------------------------------------------------------------------------------

  wire() {
    const form = $("f-whatif");
    form.addEventListener("submit", (e) => e.preventDefault());
    form.addEventListener("input", (e) => {
      const el = e.target;
      if (el.dataset.path) this.fromField(el);
      else if (el.id?.startsWith("wi-delay")) this.fromDelay();
    });
    $("wi-preset").addEventListener("change", (e) => this.loadPreset(e.target.value));
    $("wi-json").addEventListener("input", () => this.fromJson());
    $("wi-json").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        this.run();
      }
    });
    $("wi-run").addEventListener("click", () => this.run());
    $("wi-cancel").addEventListener("click", () => this.cancel());
  }
}
