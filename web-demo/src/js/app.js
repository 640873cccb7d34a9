// The application: three modes; the first two share one set of views.
//
// - Playground: the page is the cacher's host (src/js/playground.js). Buttons write to etcd,
//   start watches, lists and gets; time runs at a chosen speed; a load generator writes
//   10 000 events per second in small batches, one batch per animation frame.
// - Scenario library: the scenarios of scenarios/*.json, stepped forward and back
//   (src/js/scenario.js), each step explained in plain words.
// - What-if: a workload run with the core's simulate() in a web worker, its per-second series
//   plotted beside the rule of docs/slo.md (src/js/whatif-panel.js).
//
// One requestAnimationFrame loop does everything: feed the core, then draw. Drawing reads the
// core's cheap getters every frame and the expensive ones (objects, metrics) a few times a
// second; the views write to the DOM only what changed.

import { Stage } from "./stage.js";
import { Lanes } from "./lanes.js";
import { StorePanel, RequestsPanel, LogPanel, MetricsPanel, logLine } from "./panels.js";
import { Playground, RING_PRESETS } from "./playground.js";
import { ScenarioRun, stepSummary, requestText } from "./scenario.js";
import { explainStep, explainTimers, statusText, readText, CLOSE_TEXT } from "./explain.js";
import { WhatIfPanel } from "./whatif-panel.js";
import { h, esc, secText, TYPE_COLOR } from "./util.js";

const $ = (id) => document.getElementById(id);
const EVENT_TYPES = new Set(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]);
const LOAD_RATE = 10000; // events per second of real time
const MAX_FLY_PER_FRAME = 8; // particles started per frame during the load

/** Canonical JSON of trace records (sorted keys, BigInt as numbers) to compare traces. */
function canon(records) {
  const norm = (v) => {
    if (typeof v === "bigint") return Number(v);
    if (Array.isArray(v)) return v.map(norm);
    if (v && typeof v === "object") {
      const o = {};
      for (const k of Object.keys(v).sort()) o[k] = norm(v[k]);
      return o;
    }
    return v;
  };
  return JSON.stringify(norm(records));
}

export class App {
  constructor(wc, scenarioIndex) {
    this.wc = wc;
    this.index = scenarioIndex;
    this.mode = "playground";
    this.settings = { profile: "v1.30", ring: "small", bookmarkMs: 5000, progressAnswers: true };
    this.playing = false;
    this.speed = 1;
    this.load = { on: false, carry: 0, written: 0, startedAt: 0 };
    this.frames = null; // rAF timestamps while recording (the browser test reads them)
    this.fps = { last: 0, count: 0 };
    this.since = []; // notes about what happened after the last explained action
    this.ringCache = { key: "", events: null };

    this.stage = new Stage($("stage"), $("stage-svg"), $("lanes"));
    this.lanes = new Lanes($("lanes"), {
      read: (id, n) => this.userAction(() => this.pg.consume(id, n)),
      stop: (id) => this.userAction(() => this.pg.stopWatch(id)),
      rate: (id, r) => {
        this.pg.setRate(id, r);
        this.note(`<code>${esc(this.pg.nameOf(id))}</code>'s client now reads ${r === 0 ? "nothing: it is a slow watcher" : r === Infinity ? "everything as it comes" : `${r} events per second`}.`);
      },
    });
    this.store = new StorePanel($("store"), $("store-count"));
    this.requests = new RequestsPanel($("requests"));
    this.log = new LogPanel($("log"));
    this.metrics = new MetricsPanel($("metrics"));
    this.whatif = new WhatIfPanel(wc, {
      explain: (title, html) => this.explain(title, html),
      profile: (p) => this.mode === "whatif" && this.setProfileButtons(p, true, "the workload sets the profile (config.profile)"),
      clock: (text) => this.mode === "whatif" && ($("clock").textContent = text),
    });
    this.wireControls();
    this.buildLibrary();
  }

  // ----- the current core --------------------------------------------------------------------

  get cacher() {
    if (this.mode === "whatif") return null;
    return this.mode === "playground" ? this.pg?.cacher : this.run?.cacher;
  }

  /** Names an output's request (scenario ids, or the playground's w1, list1, ...). */
  nameOfOutput(o) {
    if (o.name) return o.name;
    if (o.id === undefined) return "";
    return this.nameOfId(o.id);
  }

  nameOfId(id) {
    return this.mode === "playground" ? this.pg.nameOf(id) : this.run.nameOf(id);
  }

  kindOf(id) {
    if (this.mode === "playground") return this.pg.kinds.get(id);
    return this.scenOps?.get(this.run.nameOf(id));
  }

  /** What the explanations compare: the state before and after an action. */
  snapshot() {
    const c = this.cacher;
    if (!c) return null;
    const cfg = (this.cfgCache ??= c.config());
    return {
      ready: c.readyState,
      rv: c.resourceVersion,
      listRv: c.listResourceVersion,
      parked: c.parked,
      budget: c.budgetMs,
      win: c.window(),
      watchers: new Map(c.watchers().map((w) => [w.id, w])),
      freshMs: cfg.event_fresh_ms,
      upperBound: cfg.upper_bound_capacity,
      lowerBound: cfg.lower_bound_capacity,
    };
  }

  /** Resets every view (a new Cacher). */
  resetViews() {
    this.lanes.reset();
    this.requests.reset();
    this.log.reset();
    this.metrics.reset();
    this.stage.clearParticles();
    this.stage.clearPulse();
    this.stage.prev = {};
    this.metrics.lastDraw = 0;
    this.store.dirty = true;
    this.store.prevRv = new Map();
    this.ringCache = { key: "", events: null };
    this.cfgCache = null;
    this.since = [];
    $("since").replaceChildren();
  }

  // ----- outputs -----------------------------------------------------------------------------

  /**
   * Shows what the core produced: lanes, requests, the log, the particles. `opts.animate`
   * false for quiet replays (scenario seek), `opts.bulk` for the load (sampled particles, no
   * per-event log lines), `opts.writeDelay` to start deliveries after the write has flown.
   */
  showOutputs(outputs, opts = {}) {
    const animate = opts.animate !== false;
    const c = this.cacher;
    let win = null;
    let flown = 0;
    let suppressed = 0;
    for (let i = 0; i < outputs.length; i++) {
      const o = outputs[i];
      const name = this.nameOfOutput(o);
      const kind = o.id === -1 ? opts.kind : this.kindOf(o.id);
      if (EVENT_TYPES.has(o.type)) {
        this.lanes.onOutput(name, o);
        if (o.type === "BOOKMARK" && animate) this.stage.tick();
        if (animate && (!opts.bulk || flown < MAX_FLY_PER_FRAME)) {
          win ??= c.window();
          const slot = this.slotOf(o.rv, win);
          const delay = (opts.writeDelay ?? 0) + (opts.bulk ? 0 : Math.min(i, 40) * 18);
          this.stage.fly(this.stage.deliverPath(slot, win.capacity, name), TYPE_COLOR[o.type], opts.bulk ? 380 : 650, delay);
          flown++;
        }
        if (opts.bulk) suppressed++;
        else this.log.add(logLine(o, name));
        continue;
      }
      switch (o.type) {
        case "STARTED":
        case "ERROR":
        case "CLOSED":
        case "WATCH":
          this.lanes.onOutput(name, o);
          break;
        case "REJECTED":
          if (kind === "watch") this.lanes.onOutput(name, o);
          else this.requests.onOutput(name, o);
          break;
        case "LIST":
        case "GET":
        case "RANGE":
          this.requests.onOutput(name, o);
          break;
        case "NEED_CURRENT_RV":
          this.requests.onOutput(name, o);
          break;
        case "REQUEST_PROGRESS":
          if (animate) this.stage.flashEtcd("progress requested");
          break;
        case "RELIST":
          if (animate) this.stage.pulse("relist requested", "shrink");
          break;
        default:
          break;
      }
      this.log.add(logLine(o, name));
    }
    if (suppressed) this.log.suppress(suppressed);
  }

  /** The ring slot of the event with resource version `rv` (the newest slot otherwise). */
  slotOf(rv, win) {
    const cap = win.capacity;
    const end = Number(win.endIndex);
    const events = this.ringCache.events;
    if (events && rv !== undefined && this.ringCache.key === this.ringKey(win)) {
      // Binary search: the ring is in RV order.
      let lo = 0;
      let hi = events.length - 1;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        if (events[mid].rv < rv) lo = mid + 1;
        else hi = mid - 1;
      }
      if (lo < events.length && events[lo].rv === rv) return (Number(win.startIndex) + lo) % cap;
    }
    return (end - 1 + cap) % cap;
  }

  /** What the ring drawing depends on: redraw only when it changes. */
  ringKey(win) {
    return `${win.startIndex}|${win.endIndex}|${win.capacity}|${win.oldestServable}|${win.evictedSinceRelist}`;
  }

  /** Particles of a storage step: etcd → gate → the ring. Returns the deliveries' delay. */
  flyWrite(step) {
    const c = this.cacher;
    const win = c.window();
    if (step.op === "put" || step.op === "delete" || step.op === "txn") {
      const slot = (Number(win.endIndex) - 1 + win.capacity) % win.capacity;
      this.stage.fly(this.stage.writePath(slot, win.capacity), TYPE_COLOR.WRITE, 520, 0, 5);
      return 480;
    }
    if (step.op === "replace") {
      const n = Math.min(6, Math.max(1, (step.objects ?? []).length));
      for (let i = 0; i < n; i++) this.stage.fly(this.stage.writePath(Math.floor((i * win.capacity) / n), win.capacity), TYPE_COLOR.WRITE, 700, i * 60, 4);
      this.stage.pulse(`relist @${step.rv}`, "grow");
      return 600;
    }
    if (step.op === "progress") {
      this.stage.flashEtcd(`progress notify @${step.rv}`);
      const slot = (Number(win.endIndex) - 1 + win.capacity) % win.capacity;
      this.stage.fly(this.stage.writePath(slot, win.capacity), TYPE_COLOR.PROGRESS, 520, 0, 4);
      return 0;
    }
    if (step.op === "storage_error") {
      this.stage.flashEtcd("watch broken!");
      return 0;
    }
    return 0;
  }

  // ----- explanations --------------------------------------------------------------------------

  explain(title, html) {
    $("explain-title").textContent = title;
    $("explain").innerHTML = html;
    this.since = [];
    $("since").replaceChildren();
  }

  /** A short note under the explanation (things that happen while time runs). */
  note(html) {
    this.since.push(html);
    if (this.since.length > 6) this.since.shift();
    const el = $("since");
    el.innerHTML = `<p class="since-title">Since then:</p><ul>${this.since.map((x) => `<li>${x}</li>`).join("")}</ul>`;
  }

  /** Notes about notable outputs produced while time runs (bookmarks, closes, decisions). */
  noteOutputs(outputs) {
    const bm = new Map();
    for (const o of outputs) {
      const who = `<code>${esc(this.nameOfOutput(o))}</code>`;
      if (o.type === "BOOKMARK") bm.set(this.nameOfOutput(o), o);
      else if (o.type === "CLOSED" && o.cause !== "error") this.note(`${who} ${CLOSE_TEXT[o.cause] ?? o.cause}`);
      else if (o.type === "ERROR") this.note(`${who}: ${statusText(o)}`);
      else if (o.type === "REJECTED") this.note(`${who} rejected: ${statusText(o)}`);
      else if (o.type === "LIST" || o.type === "GET" || o.type === "RANGE") this.note(readText(o, who));
      else if (o.type === "RELIST") this.note(`The cache asks for a relist (${esc(o.reason)}); the reflector retries every 1 s.`);
      else if (o.type === "STARTED" && o.at > 0) this.note(`${who} is let through and starts (initial events: ${o.initial}).`);
    }
    if (bm.size) {
      const list = [...bm].map(([n, o]) => `<code>${esc(n)}</code> @${o.rv}${o.initialEventsEnd ? " (initial-events-end)" : ""}`).join(", ");
      this.note(`BOOKMARK on the 1 s dispatcher tick: ${list}. A bookmark says "you are up to date to this RV" so the client can resume from it without a 410.`);
    }
  }

  // ----- playground ---------------------------------------------------------------------------

  /** A new playground Cacher with the current settings (the etcd model is kept). */
  startPlayground() {
    const etcd = this.pg?.etcd;
    this.pg?.cacher?.free();
    this.pg = new Playground(this.wc, this.settings);
    if (etcd) this.pg.etcd = etcd;
    this.resetViews();
    this.load.on = false;
    this.updateLoadButton();
    const r = this.pg.start();
    this.presentPlay(r);
    const c = this.pg.cacher;
    this.explain(
      `A new cacher (${this.settings.profile})`,
      `<p>The cacher starts <b>pending</b>: its ready gate is closed and it serves nothing. Its reflector lists etcd (${r.step.objects.length} objects at revision ${r.step.rv}) and hands the list to the cache (<code>Replace</code>): the store is filled, the ring is empty, and the <b>gate opens</b>.</p>` +
        `<p>Now write objects, start watchers, list, and let time run — or try one of these little demos:</p>` +
        `<p class="tries"><button class="chip" data-try="slow">a slow watcher is cut off</button> <button class="chip" data-try="lag">a slow watcher lags, then catches up</button> <button class="chip" data-try="gone">410: watch from a too-old RV</button> <button class="chip" data-try="restart">etcd restarts: relist</button> <button class="chip" data-try="load">⚡ 10 000 events/s</button> <button class="chip" data-try="library">the scenario library</button> <button class="chip" data-try="whatif">what if clients stay away longer than the window?</button></p>` +
        `<p class="hint">Ring: capacity ${c.window().capacity}${this.settings.ring === "small" ? " (small on purpose, so it fills, grows and slides)" : ""}; bookmarks every ${this.settings.bookmarkMs / 1000} s.</p>`,
    );
    this.refreshKeys();
  }

  /** Shows a playground action's result (outputs, lanes, requests); returns its outputs. */
  presentPlay(r) {
    const step = r.step;
    const outputs = r.outputs.slice();
    if (r.error) {
      if (typeof r.error.code === "number") {
        outputs.unshift({ at: step.at, type: "REJECTED", id: -1, name: step.id, code: r.error.code, reason: r.error.reason, message: r.error.message, retryAfterS: r.error.retryAfterS });
      } else {
        this.explain("That did not work", `<p class="error">${esc(r.error.message)}</p>`);
        return;
      }
    }
    if (step.op === "watch") {
      const id = typeof r.result === "number" ? r.result : null;
      const cl = id !== null ? this.pg.clients.get(id) : null;
      this.lanes.add(step.id, step, { id, interactive: id !== null, rate: cl?.rate ?? 0 });
    }
    if (step.op === "list" || step.op === "get") this.requests.add(step.id, requestText(step), step.at);
    if (["replace", "put", "delete", "txn"].includes(step.op)) this.store.dirty = true;
    const delay = this.flyWrite(step);
    this.showOutputs(outputs, { writeDelay: delay, kind: step.op });
    return outputs;
  }

  /** Runs a user action in the playground and explains it. */
  userAction(fn) {
    if (this.mode !== "playground") return;
    const before = this.snapshot();
    let r;
    try {
      r = fn();
    } catch (e) {
      this.explain("That did not work", `<p class="error">${esc(e.message)}</p>`);
      return;
    }
    if (!r) return;
    const outputs = this.presentPlay(r);
    if (!outputs) return;
    const after = this.snapshot();
    const html = explainStep(r.step, outputs, (o) => this.nameOfOutput(o), before, after, {
      existed: r.existed,
      watchList: this.cfgCache?.watch_list,
      consumed: typeof r.result === "number" && r.step.op === "consume" ? r.result : undefined,
      nameOfId: (id) => this.nameOfId(id),
    });
    this.explain(`t = ${secText(r.step.at)} · ${stepSummary(r.step)}`, html);
    this.refreshKeys();
    this.metrics.lastDraw = 0;
    this.render(performance.now()); // show it now, not a frame later
  }

  /** The datalist of keys etcd holds (for the write form). */
  refreshKeys() {
    const keys = [...this.pg.etcd.objects.keys()].filter((k) => !k.startsWith("/pods/load/")).slice(0, 30);
    const dl = $("keys");
    const text = keys.join("|");
    if (dl.dataset.keys === text) return;
    dl.dataset.keys = text;
    dl.replaceChildren(...keys.map((k) => h("option", { value: k })));
  }

  /** One frame of the playground: the load, then time. */
  framePlayground(dtReal) {
    const pg = this.pg;
    // The load: 10 000 writes per second of real time, one small batch per frame.
    if (this.load.on) {
      this.load.carry += (LOAD_RATE * dtReal) / 1000;
      // At most 800 per frame, so a stalled tab does not come back with a huge batch.
      const n = Math.min(800, Math.floor(this.load.carry));
      this.load.carry -= n;
      if (n > 0) {
        const r = pg.loadBatch(n);
        this.load.written += r.written;
        this.showOutputs(r.outputs, { bulk: true });
        this.noteOutputs(r.outputs.filter((o) => !EVENT_TYPES.has(o.type)));
        this.store.dirty = true;
      }
    }
    // Time: simulated milliseconds run at `speed` × real time while playing.
    if (this.playing || this.load.on) {
      const to = pg.now + dtReal * (this.playing ? this.speed : 1);
      this.advancePlayground(to, true);
    }
  }

  /** Moves the playground's time, showing what timers and host duties produced. */
  advancePlayground(to, quiet) {
    const pg = this.pg;
    const from = pg.now;
    const before = quiet ? null : this.snapshot();
    const t = pg.cacher.pollTimeout();
    if (t && t.reason === "dispatch_tick" && t.atMs <= to) this.stage.tick();
    const results = pg.advanceTo(to);
    const all = [];
    for (const r of results) {
      all.push(...r.outputs);
      if (r.step.op === "advance" || r.step.op === "consume") {
        this.showOutputs(r.outputs, { bulk: this.load.on });
      } else {
        // A host duty: the relist after a broken watch, etcd's answer to a progress request.
        this.presentPlay(r);
      }
      if (!quiet) continue;
      // While time runs, notable things are noted under the last explanation.
      if (r.step.op === "replace") this.note(`The reflector relisted: etcd's ${r.step.objects.length} objects at revision ${r.step.rv}; the gate opens again. Watchers must re-watch (from a recent enough RV, or they get 410).`);
      else if (r.step.op === "progress") this.note(`etcd answered with a progress notify @${r.step.rv}: the cache's RV is now ${pg.cacher.resourceVersion}.`);
      this.noteOutputs(r.outputs);
    }
    if (quiet) return;
    // A button moved time: explain everything that happened meanwhile.
    const after = this.snapshot();
    const host = results.filter((r) => r.step.op === "replace" || r.step.op === "progress").map((r) =>
      r.step.op === "replace"
        ? `<li>etcd is reachable again and the reflector <b>relisted</b>: ${r.step.objects.length} objects at revision ${r.step.rv} (Kubernetes retries startCaching every 1 s). Watchers must re-watch — from a recent enough RV, or they get 410.</li>`
        : `<li>etcd answered a progress request with a <b>progress notify</b> @${r.step.rv}.</li>`,
    );
    let html = explainStep({ op: "advance", at: pg.now }, all, (o) => this.nameOfOutput(o), before, after, { nameOfId: (id) => this.nameOfId(id) });
    if (host.length) html += `<ul>${host.join("")}</ul>`;
    if (!html.includes("<li>") && !host.length) html += "<p class=\"hint\">Nothing was due: no timer fired.</p>";
    this.explain(`t = ${secText(from)} → ${secText(pg.now)} · time passes`, html);
    this.metrics.lastDraw = 0;
    this.render(performance.now());
  }

  toggleLoad() {
    if (this.mode !== "playground") return;
    this.load.on = !this.load.on;
    this.load.carry = 0;
    if (this.load.on) {
      this.load.startedAt = performance.now();
      this.load.written = 0;
      this.explain(
        "Load: 10 000 events per second",
        "<p>Every animation frame writes a small batch (about 170 events at 60 fps) to the core, which appends each event to the ring and dispatches it. The page then draws only what changed: the ring, the lanes, and a sample of the deliveries.</p>" +
          "<p>Watch the ring: it is full within a frame and, since its oldest event is younger than 75 s, it <b>doubles</b> again and again (up to 102 400). A watcher that reads at a limited rate is soon blocked and, with the Kubernetes policy, cut off once the 100 ms budget is spent; with the etcd policy it lags and is replayed from the ring — or falls out of the window.</p>",
      );
    }
    this.updateLoadButton();
  }

  updateLoadButton() {
    const b = $("load");
    b.classList.toggle("on", this.load.on);
    // Under load the ring, the budget and the store change every frame: their transitions
    // and the store's row flash would then run on every frame too (style recalculated for
    // each animated element: 2.8 of a frame's 11 ms of main-thread work on a 2-core VM), so the
    // stylesheet turns them off while this attribute is set (web-demo/src/css/style.css,
    // "Under load").
    if (this.load.on) document.body.dataset.load = "on";
    else delete document.body.dataset.load;
    b.textContent = this.load.on ? "■ Stop load" : "⚡ Load 10 000 events/s";
    if (!this.load.on) $("load-stat").textContent = "";
  }

  // ----- scenarios ----------------------------------------------------------------------------

  buildLibrary() {
    const ul = $("library");
    const groups = new Map();
    for (const sc of this.index) {
      if (!groups.has(sc.topic)) groups.set(sc.topic, []);
      groups.get(sc.topic).push(sc);
    }
    for (const [topic, list] of groups) {
      ul.append(h("li.lib-topic", {}, topic));
      for (const sc of list) {
        ul.append(
          h(
            "li.lib-item",
            { dataset: { file: sc.file, search: `${sc.file} ${sc.name} ${sc.description ?? ""}`.toLowerCase() } },
            h(
              "button",
              { title: sc.description ?? sc.name, onclick: () => this.loadScenario(sc.file) },
              h("span.lib-name", {}, sc.name),
              h("span.lib-meta", {}, `${sc.file.replace(/\.json$/, "")} · ${sc.steps} steps${sc.profile !== "v1.30" ? ` · ${sc.profile}` : ""}`),
            ),
          ),
        );
      }
    }
    $("s-filter").addEventListener("input", (e) => {
      const q = e.target.value.toLowerCase().trim();
      for (const li of ul.querySelectorAll(".lib-item")) li.hidden = q !== "" && !li.dataset.search.includes(q);
      for (const t of ul.querySelectorAll(".lib-topic")) {
        let n = t.nextElementSibling;
        let any = false;
        while (n && n.classList.contains("lib-item")) {
          if (!n.hidden) any = true;
          n = n.nextElementSibling;
        }
        t.hidden = !any;
      }
    });
  }

  /** Loads a scenario from dist/scenarios/ and checks our stepping against replay(). */
  async loadScenario(file) {
    const res = await fetch(`scenarios/${file}`);
    if (!res.ok) throw new Error(`scenarios/${file}: HTTP ${res.status}`);
    const sc = await res.json();
    this.run?.free();
    this.run = null;
    this.setMode("scenario");
    this.run = new ScenarioRun(this.wc, sc);
    // Request names → their op, to tell a rejected watch from a rejected list.
    this.scenOps = new Map(sc.steps.filter((st) => st.id !== undefined && ["watch", "list", "get", "range"].includes(st.op)).map((st) => [st.id, st.op]));
    this.scenarioFile = file;
    this.sPlaying = false;
    $("s-play").textContent = "▶ Play";
    for (const li of $("library").querySelectorAll(".lib-item")) li.classList.toggle("sel", li.dataset.file === file);
    $("scen-head").hidden = false;
    $("scen-name").textContent = sc.name || file;
    $("scen-desc").textContent = sc.description ?? "";
    const cfg = this.run.cacher.config();
    const diffs = Object.entries(sc.config ?? {}).map(([k, v]) => `${k}=${v}`);
    $("scen-config").textContent = `profile ${cfg.profile}${diffs.length ? ` · ${diffs.filter((d) => !d.startsWith("profile")).join(" · ")}` : ""}`;
    this.setProfileButtons(cfg.profile, true);
    const badge = $("scen-check");
    badge.className = "check-badge";
    badge.textContent = "checking…";
    delete badge.dataset.file;
    this.renderSteps();
    this.resetViews();
    this.explain(`${file}`, `<p>${esc(sc.description ?? sc.name ?? "")}</p><p class="hint">Press <b>Step ▶</b> to apply the first step. <b>◀ Back</b> rebuilds a fresh Cacher and replays up to the previous step.</p>`);
    this.updateScenarioPos();
    await this.checkScenario(sc, file);
  }

  /** Our stepping must equal the core's replay() and the golden trace: show it. */
  async checkScenario(sc, file) {
    const badge = $("scen-check");
    const probe = new ScenarioRun(this.wc, sc);
    while (!probe.done) probe.stepForward();
    const ours = canon(probe.trace);
    probe.free();
    const replayed = canon(this.wc.replay(sc));
    let golden = null;
    try {
      const res = await fetch(`scenarios/${file.replace(/\.json$/, ".trace.json")}`);
      if (res.ok) golden = canon(await res.json());
    } catch {
      golden = null;
    }
    const ok = ours === replayed && (golden === null || golden === ours);
    badge.className = `check-badge ${ok ? "ok" : "bad"}`;
    badge.textContent = ok ? `✓ stepping = replay()${golden !== null ? " = golden trace" : ""}` : "✗ stepping differs from replay()";
    badge.dataset.file = file;
    badge.title = "The page drives the Cacher step by step itself; this checks that it gives exactly the records of the core's own replayer and of the committed golden trace.";
  }

  renderSteps() {
    $("steps-card").hidden = false;
    const ol = $("steps");
    ol.replaceChildren(
      ...this.run.scenario.steps.map((st, i) =>
        h(
          "li",
          {
            dataset: { i: String(i) },
            role: "button",
            tabindex: "0",
            title: `jump to step ${i + 1}: ${stepSummary(st)}`,
            onclick: () => this.seek(i + 1),
            onkeydown: (e) => (e.key === "Enter" || e.key === " ") && (e.preventDefault(), this.seek(i + 1)),
          },
          h("span.st-at", {}, `${st.at} ms`),
          h("span.st-op", { dataset: { op: st.op } }, st.op),
          h("span.st-sum", {}, stepSummary(st)),
        ),
      ),
    );
  }

  updateScenarioPos() {
    const run = this.run;
    if (!run) return;
    const k = run.position;
    const at = k ? run.scenario.steps[k - 1].at : 0;
    $("s-pos").textContent = `step ${k} / ${run.length} · t = ${secText(at)}`;
    $("s-back").disabled = k === 0;
    $("s-reset").disabled = k === 0;
    $("s-step").disabled = run.done;
    $("s-end").disabled = run.done;
    const ol = $("steps");
    for (const li of ol.children) {
      const i = Number(li.dataset.i);
      li.classList.toggle("done", i < k - 1);
      li.classList.toggle("current", i === k - 1);
    }
    const cur = ol.children[k - 1];
    if (cur) {
      // Keep the current step in view without scrolling the page.
      const top = cur.offsetTop - ol.offsetTop;
      if (top < ol.scrollTop || top > ol.scrollTop + ol.clientHeight - 30) ol.scrollTop = Math.max(0, top - 60);
    }
    $("clock").textContent = `t = ${secText(at)}`;
  }

  /** Applies the next step; `animate`/`explainIt` false when seeking quietly. */
  stepScenario(animate = true, explainIt = true) {
    const run = this.run;
    if (!run || run.done) return;
    const step = run.scenario.steps[run.position];
    const fromMs = run.position ? run.scenario.steps[run.position - 1].at : 0;
    const before = explainIt ? this.snapshot() : null;
    // Timers due before the step fire first (drained separately to explain them apart).
    if (animate) this.stage.clearPulse();
    const r = run.stepForward();
    if (step.op === "watch") this.lanes.add(step.id, step, { id: run.ids.get(step.id) || null });
    if (["list", "get", "range"].includes(step.op)) this.requests.add(step.id, requestText(step), step.at);
    if (["replace", "put", "delete", "txn"].includes(step.op)) this.store.dirty = true;
    this.showOutputs(r.timerOutputs, { animate });
    const delay = animate ? this.flyWrite(step) : 0;
    this.showOutputs(r.outputs, { animate, writeDelay: delay, kind: step.op });
    if (explainIt) {
      const after = this.snapshot();
      const nameOf = (o) => this.nameOfOutput(o);
      let html = "";
      if (r.error) html += `<p class="error">This step failed: ${esc(r.error.message)}</p>`;
      html += explainStep(step, r.outputs, nameOf, before, after, { existed: this.existedBefore(run, r.index), watchList: this.cfgCache?.watch_list, nameOfId: (id) => this.nameOfId(id) });
      html += explainTimers(r.timerOutputs, nameOf, fromMs, step.at);
      this.explain(`Step ${r.index + 1} of ${run.length} · t = ${secText(step.at)} · ${stepSummary(step)}`, html);
    }
    if (animate) {
      this.updateScenarioPos();
      this.metrics.lastDraw = 0; // redraw the metrics now
      this.render(performance.now());
    }
  }

  /** Whether a put's key was already in the store (a create or an update). */
  existedBefore(run, index) {
    const step = run.scenario.steps[index];
    if (step.op !== "put") return undefined;
    const key = step.object.key;
    let exists = false;
    for (let i = 0; i < index; i++) {
      const s = run.scenario.steps[i];
      if (s.op === "replace") exists = (s.objects ?? []).some((o) => o.key === key);
      else if (s.op === "put" && s.object.key === key) exists = true;
      else if (s.op === "delete" && s.key === key) exists = false;
    }
    return exists;
  }

  /** Back and jumps: rebuild a fresh Cacher and replay up to `k` steps, quietly but for the last. */
  seek(k) {
    const run = this.run;
    if (!run) return;
    k = Math.max(0, Math.min(k, run.length));
    if (k > run.position) {
      while (run.position < k - 1) this.stepScenario(false, false);
    } else {
      run.reset();
      this.resetViews();
      while (run.position < k - 1) this.stepScenario(false, false);
    }
    if (k > 0) this.stepScenario(true, true);
    else this.explain(this.scenarioFile, `<p>${esc(run.scenario.description ?? run.scenario.name ?? "")}</p>`);
    this.log.flush(0, true);
    this.updateScenarioPos();
  }

  // ----- modes and controls ------------------------------------------------------------------

  setMode(mode) {
    if (this.mode === mode) return;
    this.mode = mode;
    $("tab-play").setAttribute("aria-selected", String(mode === "playground"));
    $("tab-scen").setAttribute("aria-selected", String(mode === "scenario"));
    $("tab-whatif").setAttribute("aria-selected", String(mode === "whatif"));
    $("controls-play").hidden = mode !== "playground";
    $("controls-scen").hidden = mode !== "scenario";
    $("controls-whatif").hidden = mode !== "whatif";
    $("transport-play").hidden = mode !== "playground";
    $("transport-scen").hidden = mode !== "scenario";
    $("transport-whatif").hidden = mode !== "whatif";
    $("scen-head").hidden = mode !== "scenario" || !this.run;
    $("steps-card").hidden = mode !== "scenario" || !this.run;
    // What-if has its own center (results, plots, JSON) and the rule beside them.
    const whatif = mode === "whatif";
    $("whatif").hidden = !whatif;
    $("live-views").hidden = whatif;
    $("wi-verdict-card").hidden = !whatif;
    for (const id of ["primer", "legend", "log-card"]) $(id).hidden = whatif;
    $("clock").textContent = "t = 0.000 s"; // each mode shows its own time
    document.body.dataset.mode = mode;
    this.load.on = false;
    this.updateLoadButton();
    this.playing = false;
    $("play").textContent = "▶ Play";
    this.resetViews();
    if (mode === "playground") {
      this.setProfileButtons(this.settings.profile, false);
      this.startPlayground();
    } else if (mode === "whatif") {
      this.whatif.show().catch((e) => this.whatif.showError("The What-if tab could not start", e.message));
    } else {
      this.sPlaying = false;
      if (this.run) {
        const k = this.run.position;
        this.run.reset();
        this.seek(k);
        this.setProfileButtons(this.run.cacher.config().profile, true);
      } else {
        this.explain("Scenario library", "<p>Pick a scenario on the left. Each is a small, timed script of what etcd says and what clients ask, with its golden trace; the page steps through it with the real core, and explains each step.</p>");
      }
    }
  }

  setProfileButtons(profile, locked, why = "the scenario sets the profile") {
    for (const b of $("profile").querySelectorAll("button")) {
      b.setAttribute("aria-checked", String(b.dataset.profile === profile));
      b.disabled = locked && b.dataset.profile !== profile;
    }
    $("profile").title = locked ? why : "Kubernetes behaviour: v1.30.3, v1.34 or v1.37";
  }

  wireControls() {
    const on = (id, ev, fn) => $(id).addEventListener(ev, fn);
    on("tab-play", "click", () => this.setMode("playground"));
    on("tab-scen", "click", () => this.setMode("scenario"));
    on("tab-whatif", "click", () => this.setMode("whatif"));
    for (const b of $("profile").querySelectorAll("button")) {
      b.addEventListener("click", () => {
        if (this.mode !== "playground") return;
        this.settings.profile = b.dataset.profile;
        this.setProfileButtons(this.settings.profile, false);
        this.startPlayground();
      });
    }
    // Time.
    on("play", "click", () => {
      this.playing = !this.playing;
      $("play").textContent = this.playing ? "❚❚ Pause" : "▶ Play";
    });
    on("speed", "change", (e) => (this.speed = Number(e.target.value)));
    for (const b of document.querySelectorAll("[data-adv]")) b.addEventListener("click", () => this.advancePlayground(this.pg.now + Number(b.dataset.adv), false));
    on("next-timer", "click", () => {
      const t = this.pg.cacher.pollTimeout();
      if (t) this.advancePlayground(Math.max(this.pg.now, t.atMs), false);
      else this.explain("No timer", "<p>The core has no deadline pending.</p>");
    });
    on("load", "click", () => this.toggleLoad());
    // etcd.
    on("f-write", "submit", (e) => {
      e.preventDefault();
      this.userAction(() => this.pg.write($("w-key").value.trim(), "", $("w-labels").value, $("w-node").value.trim()));
    });
    on("b-delete", "click", () => this.userAction(() => this.pg.remove($("w-key").value.trim())));
    on("b-burst", "click", () => {
      if (!this.pg.etcd.up) {
        this.explain("That did not work", '<p class="error">etcd is restarting; try again in a moment</p>');
        return;
      }
      const before = this.snapshot();
      const all = [];
      let last = null;
      for (let i = 0; i < 5; i++) {
        const r = this.pg.write(`/pods/default/web-${i}`, "", "app=web", i % 2 ? "node-b" : "node-a");
        this.presentPlay(r);
        all.push(...r.outputs);
        last = r;
      }
      const after = this.snapshot();
      const html = explainStep({ op: "txn", rv: last.step.rv, ops: new Array(5) }, all, (o) => this.nameOfOutput(o), before, after, { nameOfId: (id) => this.nameOfId(id) })
        .replace(/^<p>.*?<\/p>/, `<p>Five etcd writes (RV ${last.step.rv - 4}–${last.step.rv}), each appended to the ring and dispatched.</p>`);
      this.explain(`t = ${secText(this.pg.now)} · 5 writes`, html);
      this.render(performance.now());
    });
    on("b-progress", "click", () => this.userAction(() => this.pg.progress()));
    on("b-other", "click", () => this.userAction(() => this.pg.bumpRevision(5)));
    on("b-compact", "click", () => this.userAction(() => this.pg.compact()));
    on("b-restart", "click", () => this.userAction(() => this.pg.restartEtcd()));
    on("progress-answers", "change", (e) => {
      this.settings.progressAnswers = e.target.checked;
      this.pg.settings.progressAnswers = e.target.checked;
    });
    // Watches.
    on("f-watch", "submit", (e) => {
      e.preventDefault();
      const sie = $("wt-sie").value;
      this.userAction(() =>
        this.pg.watch({
          key: $("wt-key").value.trim(),
          rv: $("wt-rv").value.trim(),
          send_initial_events: sie === "" ? undefined : sie === "true",
          allow_bookmarks: $("wt-bm").checked,
          label_selector: $("wt-ls").value.trim(),
          field_selector: $("wt-fs").value.trim(),
          consume: $("wt-consume").value,
          slow_policy: $("wt-policy").value,
          timeout_ms: Number($("wt-timeout").value) || undefined,
          rate: $("wt-consume").value === "manual" ? 0 : undefined,
        }),
      );
    });
    const watchPresets = [
      ["fast watcher", "all pods from now on, with bookmarks", () => ({ key: "/pods/", rv: String(this.pg.cacher.resourceVersion), allow_bookmarks: true, consume: "auto", slow_policy: "terminate" })],
      ["slow (terminate)", "a client that stops reading: Kubernetes cuts it off once the 100 ms budget is spent", () => ({ key: "/pods/", rv: String(this.pg.cacher.resourceVersion), consume: "manual", slow_policy: "terminate", rate: 0 })],
      ["slow (lag)", "a client that stops reading, etcd policy: it falls behind and is replayed from the ring", () => ({ key: "/pods/", rv: String(this.pg.cacher.resourceVersion), consume: "manual", slow_policy: "lag", rate: 0 })],
      ["selector app=web", "only pods labelled app=web: ADDED/DELETED as objects enter or leave the selector", () => ({ key: "/pods/", rv: String(this.pg.cacher.resourceVersion), label_selector: "app=web", allow_bookmarks: true, consume: "auto" })],
      ["too old RV → 410", "a watch from an RV before the window", () => {
        const w = this.pg.cacher.window();
        const oldest = w.oldestServable ?? this.pg.cacher.resourceVersion;
        return { key: "/pods/", rv: String(oldest > 2n ? oldest - 2n : 0n), consume: "auto" };
      }],
      ["RV 0: state + stream", "initial state from the store as ADDED events, then the stream", () => ({ key: "/pods/", rv: "0", consume: "auto", allow_bookmarks: true })],
      ["watch-list", "sendInitialEvents=true + bookmarks: the state, then a bookmark annotated initial-events-end", () => ({ key: "/pods/", rv: "", send_initial_events: true, allow_bookmarks: true, consume: "auto" })],
    ];
    for (const [label, title, make] of watchPresets) {
      $("watch-presets").append(h("button.chip", { title, onclick: () => this.userAction(() => this.pg.watch(make())) }, label));
    }
    // Lists and gets.
    on("f-list", "submit", (e) => {
      e.preventDefault();
      this.userAction(() => this.pg.list({ key: $("l-key").value.trim(), rv: $("l-rv").value.trim(), rv_match: $("l-match").value, limit: Number($("l-limit").value) || 0, continue: $("l-continue").value.trim(), label_selector: $("l-ls").value.trim() }));
    });
    on("b-get", "click", () => this.userAction(() => this.pg.get({ key: $("l-key").value.trim(), rv: $("l-rv").value.trim() })));
    const cur = () => String(this.pg.cacher.resourceVersion);
    const listPresets = [
      ["RV 0, limit 2", "served from the cache; the limit is ignored", () => ({ key: "/pods/default", rv: "0", limit: 2 })],
      ['RV ""', "a consistent read: etcd in v1.30, the cache after a progress check in v1.34", () => ({ key: "/pods/default", rv: "" })],
      ['RV "", limit 2', "v1.30: etcd; v1.34: a page from the cache with a continue token", () => ({ key: "/pods/default", rv: "", limit: 2 })],
      ["RV = cache RV", "NotOlderThan semantics: served from the cache", () => ({ key: "/pods/default", rv: cur() })],
      ["RV + 2 (future)", "waits up to 3 s for the cache to catch up, then 504 (v1.34: falls back to etcd)", () => ({ key: "/pods/default", rv: String(this.pg.cacher.resourceVersion + 2n) })],
      ["Exact", "resourceVersionMatch=Exact: etcd in v1.30, a snapshot in v1.34", () => ({ key: "/pods/default", rv: cur(), rv_match: "Exact" })],
    ];
    for (const [label, title, make] of listPresets) {
      $("list-presets").append(h("button.chip", { title, onclick: () => this.userAction(() => this.pg.list(make())) }, label));
    }
    $("list-presets").append(
      h("button.chip", { title: 'get with RV "": always etcd (a quorum read)', onclick: () => this.userAction(() => this.pg.get({ key: "/pods/default/web-0", rv: "" })) }, 'get RV ""'),
      h("button.chip", { title: "get with RV 0: from the cache when it is ready", onclick: () => this.userAction(() => this.pg.get({ key: "/pods/default/web-0", rv: "0" })) }, "get RV 0"),
    );
    // Cacher settings.
    for (const [k, p] of Object.entries(RING_PRESETS)) $("c-ring").append(h("option", { value: k, selected: k === this.settings.ring || undefined }, p.label));
    on("b-new", "click", () => {
      this.settings.ring = $("c-ring").value;
      this.settings.bookmarkMs = Number($("c-bm").value);
      this.startPlayground();
    });
    on("clear-closed", "click", () => this.lanes.clearClosed());
    // The little demos of the first explanation (buttons with data-try).
    on("explain", "click", (e) => {
      const b = e.target.closest("[data-try]");
      if (b) this.tryDemo(b.dataset.try);
    });
    // Scenario transport.
    on("s-step", "click", () => this.stepScenario());
    on("s-back", "click", () => this.seek(this.run.position - 1));
    on("s-reset", "click", () => this.seek(0));
    on("s-end", "click", () => this.seek(this.run.length));
    on("s-play", "click", () => {
      if (!this.run) return;
      this.sPlaying = !this.sPlaying;
      this.sNext = 0;
      $("s-play").textContent = this.sPlaying ? "❚❚ Pause" : "▶ Play";
    });
    // Keyboard: → step, ← back, space play (scenario mode).
    document.addEventListener("keydown", (e) => {
      if (this.mode !== "scenario" || !this.run || e.target.closest("input,select,textarea")) return;
      if (e.key === "ArrowRight") this.stepScenario();
      else if (e.key === "ArrowLeft") this.seek(this.run.position - 1);
    });
  }

  /** Runs a short sequence of playground actions, ~0.6 s apart, so each can be seen. */
  tryDemo(name) {
    const pg = () => this.pg;
    const rv = () => String(this.pg.cacher.resourceVersion);
    const burst = () => $("b-burst").click();
    const adv = (ms) => () => this.advancePlayground(this.pg.now + ms, false);
    const watch = (o) => () => this.userAction(() => pg().watch({ key: "/pods/", rv: rv(), ...o }));
    const demos = {
      // The budget starts empty (0 ms) and refills 50 ms/s: wait 10 s so it is full (100 ms).
      slow: [adv(10000), watch({ consume: "manual", slow_policy: "terminate", rate: 0 }), watch({ allow_bookmarks: true, consume: "auto" }), burst, burst, burst, burst, burst, adv(1000)],
      lag: [watch({ consume: "manual", slow_policy: "lag", rate: 0 }), burst, burst, burst, burst, burst, () => this.userAction(() => pg().consume([...pg().clients.keys()].pop()))],
      gone: [burst, () => this.userAction(() => pg().watch({ key: "/pods/", rv: String(this.pg.cacher.window().oldestServable - 2n), consume: "auto" }))],
      restart: [watch({ allow_bookmarks: true, consume: "auto" }), () => this.userAction(() => pg().restartEtcd()), adv(1000), adv(1000)],
      load: [watch({ allow_bookmarks: true, consume: "auto" }), watch({ label_selector: "app=web", consume: "auto" }), () => this.toggleLoad()],
      library: [() => this.loadScenario("watch_too_old_rv_gets_410.json")],
      whatif: [() => this.setMode("whatif")],
    };
    const steps = demos[name] ?? [];
    steps.forEach((fn, i) => setTimeout(() => this.mode === "playground" && fn(), i * 650));
  }

  // ----- the frame loop ----------------------------------------------------------------------

  start() {
    this.startPlayground();
    this.render(performance.now());
    const loop = (ts) => {
      this.frame(ts);
      requestAnimationFrame(loop);
    };
    requestAnimationFrame(loop);
  }

  frame(ts) {
    const dt = this.lastTs ? Math.min(100, ts - this.lastTs) : 16;
    this.lastTs = ts;
    if (this.frames) this.frames.push(ts);
    // Frames per second, shown twice a second.
    this.fps.count++;
    if (ts - this.fps.last >= 500) {
      const f = Math.round((this.fps.count * 1000) / (ts - this.fps.last));
      $("fps").textContent = `${f} fps`;
      this.fps.last = ts;
      this.fps.count = 0;
    }
    if (this.mode === "playground" && this.pg) {
      this.framePlayground(dt);
    } else if (this.mode === "scenario" && this.run && this.sPlaying) {
      if (ts >= (this.sNext ?? 0)) {
        if (this.run.done) {
          this.sPlaying = false;
          $("s-play").textContent = "▶ Play";
        } else {
          this.stepScenario();
          this.sNext = ts + Number($("s-pace").value);
        }
      }
    }
    this.render(ts);
  }

  /** Draws the current state; cheap getters every frame, the rest throttled. */
  render(ts) {
    const c = this.cacher;
    if (!c) return;
    const win = c.window();
    const key = this.ringKey(win);
    if (key !== this.ringCache.key) {
      // Small rings are drawn slot by slot with their events (a cheap call for ≤ 64 events).
      this.ringCache = { key, events: win.capacity <= 64 ? c.windowEvents() : null };
      this.stage.drawRing(win, this.ringCache.events);
      const d = this.stage.root.dataset;
      d.capacity = String(win.capacity);
      d.len = String(win.len);
      d.oldest = win.oldestRv === undefined ? "" : String(win.oldestRv);
      d.newest = win.newestRv === undefined ? "" : String(win.newestRv);
    }
    const ready = c.readyState;
    this.stage.root.dataset.ready = ready;
    this.stage.drawGate(ready, c.parked, null);
    this.stage.drawCacheRv(c.resourceVersion, c.listResourceVersion);
    const cfg = (this.cfgCache ??= c.config());
    this.stage.drawBudget(c.budgetMs, cfg.budget_max_ms, c.pollTimeout());
    if (this.mode === "playground") {
      this.stage.drawEtcd(this.pg.etcd);
      $("clock").textContent = `t = ${secText(this.pg.now)}`;
      if (this.load.on) {
        const secs = (ts - this.load.startedAt) / 1000;
        $("load-stat").textContent = `${this.load.written.toLocaleString("en")} events in ${secs.toFixed(1)} s`;
      }
    } else if (this.run) {
      this.stage.drawEtcd(this.scenarioEtcd());
    }
    this.lanes.sync(c.watchers(), (id) => this.nameOfId(id));
    this.lanes.render();
    if (this.mode === "playground") this.lanes.prune(24);
    if (this.lanes.changed) {
      this.lanes.changed = false;
      this.stage.layoutDirty = true;
    }
    this.store.render(c, ts, this.load.on ? 500 : 120);
    this.metrics.render(c, ts, this.load.on ? 500 : 100);
    this.log.flush(ts);
    this.stage.drawParticles(ts);
  }

  /** What etcd looks like in a scenario: the highest revision stored or announced so far. */
  scenarioEtcd() {
    const run = this.run;
    let rev = 0;
    let compacted = 0;
    for (let i = 0; i < run.position; i++) {
      const st = run.scenario.steps[i];
      if (st.rv !== undefined && ["replace", "put", "delete", "txn", "progress", "etcd_rv"].includes(st.op)) rev = Math.max(rev, Number(st.rv));
      if (st.op === "compact") compacted = Number(st.rv);
    }
    return { rev, compacted, up: true };
  }

  // ----- the browser tests' hooks ----------------------------------------------------------------

  /** Starts collecting requestAnimationFrame timestamps. */
  recordFrames() {
    this.frames = [];
  }

  /** Stops collecting and returns the timestamps. */
  stopFrames() {
    const f = this.frames ?? [];
    this.frames = null;
    return f;
  }
}

