// Watchers as lanes: one row per watch with its options, its queue filling and draining, its
// state (active, replaying, blocked, lagging, draining, closed) and the last thing it got.
// Lanes are updated from `c.watchers()` and from the outputs; a lane's DOM is touched only
// when something it shows has changed.

import { h, setText, rvText } from "./util.js";
import { READ_RATES } from "./playground.js";
import { CLOSE_TEXT } from "./explain.js";

const MAX_CELLS = 42; // above this queue capacity the queue is a bar

const STATE_HELP = {
  waiting: "not started yet: parked at the ready gate or waiting for freshness",
  active: "in sync: takes every matching event as it is dispatched",
  replaying: "sending its initial events (from the store or the ring)",
  blocked: "its queue is full: dispatch waits for it out of the time budget",
  lagging: "fell behind (etcd policy): no longer queued, will be replayed from the ring",
  draining: "cut off as unresponsive: its client reads what is left, then the stream ends",
  closed: "the stream has ended",
  storage: "served by etcd, not by the cache",
};

/** What a lane says while its watcher is in a slow state (instead of how it started). */
const STATE_NOTE = {
  blocked: "queue full: dispatch waits for it out of the time budget",
  lagging: "fell behind: will be replayed from the ring when its client reads",
  draining: "cut off as unresponsive: its client reads what is left, then the stream ends",
};

/** One-line description of a watch's options. */
export function watchDesc(step) {
  const bits = [step.key, `rv=${step.rv === undefined || step.rv === null || step.rv === "" ? '""' : step.rv}`];
  if (step.send_initial_events === true) bits.push("sendInitialEvents");
  if (step.send_initial_events === false) bits.push("sendInitialEvents=false");
  if (step.allow_bookmarks) bits.push("bookmarks");
  if (step.label_selector) bits.push(step.label_selector);
  if (step.field_selector) bits.push(step.field_selector);
  if (step.timeout_ms) bits.push(`timeout ${step.timeout_ms} ms`);
  if (step.consume === "manual") bits.push(step.slow_policy === "lag" ? "manual · lag" : "manual · terminate");
  else if (step.slow_policy === "lag") bits.push("lag");
  return bits.join(" · ");
}

export class Lanes {
  /** `el` is the lanes container; `actions` = {read(id, n), stop(id), rate(id, r)} or null. */
  constructor(el, actions) {
    this.el = el;
    this.actions = actions;
    this.lanes = new Map(); // name -> lane
    this.empty = h("div.lanes-empty", {}, "No watchers yet. Start one with the controls on the left (or pick a scenario).");
    this.el.append(this.empty);
    this.changed = false; // lanes added or removed (the stage re-measures)
  }

  reset() {
    this.lanes.clear();
    this.el.replaceChildren(this.empty);
    this.changed = true;
  }

  /** A lane for a new watch request. `opts`: {id, manual, rate, interactive}. */
  add(name, step, opts = {}) {
    if (this.lanes.has(name)) return this.lanes.get(name);
    const lane = {
      name,
      id: opts.id ?? null,
      step,
      state: "waiting",
      received: 0,
      bookmarks: 0,
      queued: 0,
      queueCapacity: 0,
      last: null,
      note: "",
      dirty: true,
      manual: step.consume === "manual",
    };
    const stateEl = h("span.lane-state", {}, "waiting");
    const cells = h("div.cells");
    const qText = h("span.qtext", {}, "");
    const lastEl = h("span.lane-last", {}, "");
    const countEl = h("span.lane-count", {}, "");
    const noteEl = h("div.lane-note", {}, "");
    const ctl = h("div.lane-ctl");
    if (this.actions && opts.interactive) {
      if (lane.manual) {
        const rate = h(
          "select.rate",
          { title: "how fast this client reads (in simulated time)", "aria-label": `${name} reading rate`, onchange: (e) => this.actions.rate(lane.id, Number(e.target.value)) },
          READ_RATES.map(([v, label]) => h("option", { value: String(v), selected: v === (opts.rate ?? 0) || undefined }, `reads ${label}`)),
        );
        ctl.append(
          h("button.mini", { title: "the client reads one event", onclick: () => this.actions.read(lane.id, 1) }, "read 1"),
          h("button.mini", { title: "the client reads everything queued", onclick: () => this.actions.read(lane.id, undefined) }, "read all"),
          rate,
          h("button.mini.warn", { title: "the client stops reading: it becomes a slow watcher", onclick: () => ((rate.value = "0"), this.actions.rate(lane.id, 0)) }, "make slow"),
        );
      }
      ctl.append(h("button.mini", { title: "the client goes away", onclick: () => this.actions.stop(lane.id) }, "stop"));
    }
    const el = h(
      "div.lane",
      { dataset: { name, state: "waiting" }, "data-testid": `lane-${name}` },
      h("div.lane-top", {}, h("span.lane-name", {}, name), h("span.lane-spacer"), stateEl),
      h("div.lane-desc", { title: watchDesc(step) }, watchDesc(step)),
      h("div.lane-mid", {}, h("div.queue", { title: "queued events / queue capacity" }, cells, qText), lastEl, countEl),
      noteEl,
      ctl,
    );
    Object.assign(lane, { el, stateEl, cells, qText, lastEl, countEl, noteEl, ctl, cellCount: -1 });
    this.lanes.set(name, lane);
    if (this.empty.isConnected) this.empty.remove();
    this.el.append(el);
    this.changed = true;
    return lane;
  }

  get(name) {
    return this.lanes.get(name);
  }

  /** Drops closed lanes beyond `keep` (the playground keeps the page tidy). */
  prune(keep = 24) {
    if (this.lanes.size <= keep) return;
    for (const [name, lane] of this.lanes) {
      if (this.lanes.size <= keep) break;
      if (lane.state === "closed" || lane.state === "storage") {
        lane.el.remove();
        this.lanes.delete(name);
        this.changed = true;
      }
    }
  }

  clearClosed() {
    for (const [name, lane] of this.lanes) {
      if (lane.state === "closed" || lane.state === "storage") {
        lane.el.remove();
        this.lanes.delete(name);
      }
    }
    if (!this.lanes.size) this.el.replaceChildren(this.empty);
    this.changed = true;
  }

  /** An output concerning lane `name`. */
  onOutput(name, o) {
    const lane = this.lanes.get(name);
    if (!lane) return;
    lane.dirty = true;
    switch (o.type) {
      case "STARTED":
        if (lane.state === "waiting") lane.state = "active";
        lane.id = o.id;
        lane.startedFrom = o.initial;
        lane.note = o.initial === "ring" ? `replays the ring after RV ${o.rv}` : o.initial === "store" ? `initial state from the store, then after RV ${o.rv}` : `starts now at RV ${o.rv}`;
        break;
      case "ADDED":
      case "MODIFIED":
      case "DELETED":
        lane.received++;
        lane.last = o;
        break;
      case "BOOKMARK":
        lane.bookmarks++;
        lane.last = o;
        break;
      case "ERROR":
        lane.error = o;
        lane.note = `${o.code} ${o.reason}: ${o.message}`;
        lane.el.classList.add("has-error");
        break;
      case "REJECTED":
        lane.state = "closed";
        lane.error = o;
        lane.note = `rejected: ${o.code} ${o.reason}${o.retryAfterS ? ` (Retry-After ${o.retryAfterS} s)` : ""} — ${o.message}`;
        lane.el.classList.add("has-error");
        break;
      case "CLOSED":
        lane.state = "closed";
        lane.cause = o.cause;
        if (!lane.error || o.cause !== "error") lane.note = `closed: ${o.cause}${o.message ? ` (${o.message})` : ""}`;
        else lane.note = `${lane.error.code} ${lane.error.reason} · closed`;
        lane.queued = 0;
        break;
      case "WATCH":
        lane.state = "storage";
        lane.note = `sent to etcd: ${o.reason}`;
        break;
      default:
        break;
    }
  }

  /** Updates the open lanes from `c.watchers()` (info by core id) and the id → name map. */
  sync(infos, nameOfId) {
    for (const info of infos) {
      const lane = this.lanes.get(nameOfId(info.id));
      if (!lane || lane.state === "closed") continue;
      if (lane.state !== info.state || lane.queued !== info.queued || lane.queueCapacity !== info.queueCapacity || lane.lag !== info.lag) {
        lane.state = info.state;
        lane.queued = info.queued;
        lane.queueCapacity = info.queueCapacity;
        lane.lag = info.lag;
        lane.lastSentRv = info.lastSentRv;
        lane.dirty = true;
      }
    }
  }

  /** Writes the dirty lanes to the DOM. */
  render() {
    for (const lane of this.lanes.values()) {
      if (!lane.dirty) continue;
      lane.dirty = false;
      if (lane.el.dataset.state !== lane.state) {
        lane.el.dataset.state = lane.state;
        lane.stateEl.title = STATE_HELP[lane.state] ?? "";
      }
      let stateText = lane.state;
      if (lane.state === "closed") stateText = lane.error ? `${lane.error.code} ${lane.error.reason}` : `closed: ${lane.cause}`;
      if (lane.state === "lagging") stateText = `lagging −${lane.lag}`;
      if (lane.state === "blocked") stateText = `blocked +${lane.lag}`;
      if (lane.state === "draining") stateText = "cut off";
      if (lane.state === "storage") stateText = "etcd";
      setText(lane.stateEl, stateText);
      this.drawQueue(lane);
      if (lane.last) {
        const o = lane.last;
        const txt = o.type === "BOOKMARK" ? `BOOKMARK @${rvText(o.rv)}${o.initialEventsEnd ? " (initial-events-end)" : ""}` : `${o.type} ${o.key} @${rvText(o.rv)}`;
        if (lane.lastEl.textContent !== txt) {
          lane.lastEl.textContent = txt;
          lane.lastEl.dataset.type = o.type;
        }
      }
      setText(lane.countEl, `${lane.received} ev${lane.bookmarks ? ` · ${lane.bookmarks} bm` : ""}`);
      let note = STATE_NOTE[lane.state] ?? lane.note;
      if (lane.state === "closed" && lane.cause && CLOSE_TEXT[lane.cause] && !lane.error) note = `closed: ${lane.cause}`;
      setText(lane.noteEl, note);
      if (lane.state === "closed" && lane.ctl.childElementCount) lane.ctl.replaceChildren();
    }
  }

  /** The queue as cells (small queues) or as a bar. */
  drawQueue(lane) {
    const cap = lane.queueCapacity;
    const q = lane.queued;
    if (cap !== lane.cellCount) {
      lane.cellCount = cap;
      lane.cells.replaceChildren();
      lane.cells.className = cap > MAX_CELLS ? "cells bar" : "cells";
      if (cap > MAX_CELLS) lane.cells.append(h("i.fill"));
      else for (let i = 0; i < cap; i++) lane.cells.append(h("i"));
      lane.shownQ = -1;
    }
    if (lane.shownQ !== q) {
      if (cap > MAX_CELLS) lane.cells.firstChild.style.width = `${Math.min(100, (q / cap) * 100).toFixed(1)}%`;
      else {
        // Only the cells between the old and the new fill level change.
        const kids = lane.cells.children;
        const fresh = lane.shownQ < 0;
        const from = fresh ? 0 : Math.min(q, lane.shownQ);
        const to = fresh ? kids.length : Math.min(kids.length, Math.max(q, lane.shownQ));
        for (let i = from; i < to; i++) kids[i].className = i < q ? "on" : "";
      }
      lane.shownQ = q;
    }
    setText(lane.qText, cap ? `${q}/${cap}` : "");
  }
}
