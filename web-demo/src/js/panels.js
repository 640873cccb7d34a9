// The HTML panels: the store (current objects), the requests with their cache-or-etcd
// decisions, the event log and the metrics. Each is redrawn at most a few times a second,
// and only when something changed, so a 10 000 events/s load does not flood the DOM.

import { h, esc, rvText, labelsText, secText } from "./util.js";

const MAX_STORE_ROWS = 40;
const MAX_LOG = 200;
const MAX_REQUESTS = 30;

export class StorePanel {
  constructor(el, countEl) {
    this.el = el;
    this.countEl = countEl;
    this.dirty = true;
    this.lastDraw = 0;
    this.prevRv = new Map();
  }

  /** Redraws from `c.objects()` if dirty and at most every `minMs`. */
  render(cacher, now, minMs = 250) {
    if (!this.dirty || now - this.lastDraw < minMs) return;
    this.dirty = false;
    this.lastDraw = now;
    const objs = cacher.objects();
    this.countEl.textContent = `${objs.length} object${objs.length === 1 ? "" : "s"}`;
    const rows = [];
    const nextRv = new Map();
    for (let i = 0; i < objs.length; i++) {
      const o = objs[i];
      nextRv.set(o.key, o.rv);
      if (i >= MAX_STORE_ROWS) continue;
      const changed = this.prevRv.has(o.key) ? this.prevRv.get(o.key) !== o.rv : this.prevRv.size > 0;
      rows.push(
        `<tr${changed ? ' class="changed"' : ""}><td class="k">${esc(o.key)}</td><td class="rv">${rvText(o.rv)}</td><td class="v">${esc(o.value ?? "")}</td><td class="l">${esc(labelsText(o.labels))}</td></tr>`,
      );
    }
    if (objs.length > MAX_STORE_ROWS) rows.push(`<tr><td colspan="4" class="more">… and ${objs.length - MAX_STORE_ROWS} more</td></tr>`);
    if (!objs.length) rows.push('<tr><td colspan="4" class="more">empty</td></tr>');
    this.prevRv = nextRv;
    this.el.innerHTML = rows.join("");
  }
}

/** The requests: one row per list/get (and per watch that did not start normally). */
export class RequestsPanel {
  constructor(el) {
    this.el = el;
    this.rows = new Map(); // name -> row element
    this.reset();
  }

  reset() {
    this.rows.clear();
    this.el.replaceChildren(h("li.req-empty", {}, "Lists and gets appear here, with where they were served and why."));
  }

  /** A new request: `what` is its description. */
  add(name, what, at) {
    if (this.rows.has(name)) return;
    const empty = this.el.querySelector(".req-empty");
    if (empty) empty.remove();
    const li = h(
      "li.req",
      { "data-testid": `req-${name}`, dataset: { name, source: "waiting" } },
      h("div.req-head", {}, h("span.req-name", {}, name), h("span.req-what", {}, what), h("span.req-at", {}, secText(at))),
      h("div.req-decision", {}, h("span.badge.b-waiting", {}, "waiting"), h("span.req-reason", {}, "parked: waiting for the gate, for etcd's revision, or for freshness")),
    );
    this.rows.set(name, li);
    this.el.prepend(li);
    while (this.el.children.length > MAX_REQUESTS) {
      const last = this.el.lastElementChild;
      this.rows.delete(last.dataset.name);
      last.remove();
    }
  }

  /** A LIST/GET/REJECTED/NEED_CURRENT_RV output for request `name`. */
  onOutput(name, o) {
    const li = this.rows.get(name);
    if (!li) return;
    const dec = li.querySelector(".req-decision");
    if (o.type === "NEED_CURRENT_RV") {
      li.querySelector(".req-reason").textContent = "asks etcd's current revision first (consistent read)…";
      return;
    }
    let badge;
    let reason;
    if (o.type === "REJECTED") {
      li.dataset.source = "rejected";
      badge = h("span.badge.b-rejected", {}, `${o.code} ${o.reason}`);
      reason = `${o.message}${o.retryAfterS ? ` · Retry-After ${o.retryAfterS} s` : ""}`;
    } else if (o.source === "cache") {
      li.dataset.source = "cache";
      const n = o.items?.length ?? 0;
      badge = h("span.badge.b-cache", {}, "cache");
      reason = `${o.reason} — ${o.type === "RANGE" ? "revision" : "RV"} ${rvText(o.rv)}, ${n} item${n === 1 ? "" : "s"}${o.count !== undefined ? `, count ${o.count}${o.more ? ", more" : ""}` : ""}${o.continue ? `, continue token${o.remaining !== undefined ? `, ${o.remaining} remaining` : ""}` : ""}`;
    } else {
      li.dataset.source = "storage";
      badge = h("span.badge.b-storage", {}, "etcd");
      reason = o.reason;
    }
    dec.replaceChildren(badge, h("span.req-reason", {}, reason));
    if (o.items && o.items.length) {
      dec.append(h("div.req-items", {}, o.items.slice(0, 6).map((i) => `${i.key}@${i.rv}`).join("  ") + (o.items.length > 6 ? `  … +${o.items.length - 6}` : "")));
    }
    li.classList.remove("flash");
    void li.offsetWidth;
    li.classList.add("flash");
  }
}

/** The log of outputs, newest first, flushed at most every 100 ms. */
export class LogPanel {
  constructor(el) {
    this.el = el;
    this.pending = [];
    this.lastFlush = 0;
    this.suppressed = 0;
  }

  reset() {
    this.pending = [];
    this.suppressed = 0;
    this.suppressedTotal = 0;
    this.summary = null;
    this.el.replaceChildren();
  }

  /** Adds a line: `{at, who, type, text}`. */
  add(line) {
    this.pending.push(line);
    if (this.pending.length > MAX_LOG) this.pending.splice(0, this.pending.length - MAX_LOG);
  }

  /** Counts events not logged one by one (during the load). */
  suppress(n) {
    this.suppressed += n;
  }

  flush(now, force = false) {
    if (!force && now - this.lastFlush < 100) return;
    if (!this.pending.length && !this.suppressed) return;
    this.lastFlush = now;
    const frag = document.createDocumentFragment();
    if (this.suppressed) {
      // One summary line, on top and counting up, rather than a line per flush; a new one
      // starts when other lines were logged since.
      if (!this.summary || !this.summary.isConnected || this.el.firstChild !== this.summary || this.pending.length) {
        this.summary = h("li.log-line.t-summary", {}, h("span.log-text"));
        this.suppressedTotal = 0;
      }
      this.suppressedTotal += this.suppressed;
      this.suppressed = 0;
      this.summary.firstChild.textContent = `… ${this.suppressedTotal.toLocaleString("en")} deliveries during the load, not logged one by one`;
      if (!this.summary.isConnected) frag.append(this.summary);
    }
    for (let i = this.pending.length - 1; i >= 0; i--) {
      const l = this.pending[i];
      frag.append(
        h(
          "li.log-line",
          { dataset: { type: l.type } },
          h("span.log-at", {}, `${(l.at / 1000).toFixed(3)}`),
          l.who ? h("span.log-who", {}, l.who) : null,
          h("span.log-type", {}, l.type),
          h("span.log-text", {}, l.text ?? ""),
        ),
      );
    }
    this.pending = [];
    this.el.prepend(frag);
    while (this.el.children.length > MAX_LOG) this.el.lastElementChild.remove();
  }
}

/** A line of the log for an output. */
export function logLine(o, who) {
  let text = "";
  switch (o.type) {
    case "ADDED":
    case "MODIFIED":
    case "DELETED":
      text = `${o.key} @${rvText(o.rv)}${o.value !== undefined ? ` = ${o.value}` : ""}`;
      break;
    case "BOOKMARK":
      text = `@${rvText(o.rv)}${o.initialEventsEnd ? " k8s.io/initial-events-end" : ""}`;
      break;
    case "STARTED":
      text = `from RV ${rvText(o.rv)}, initial events: ${o.initial}`;
      break;
    case "ERROR":
    case "REJECTED":
      text = `${o.code} ${o.reason}: ${o.message}${o.retryAfterS ? ` (Retry-After ${o.retryAfterS} s)` : ""}`;
      break;
    case "CLOSED":
      text = `${o.cause}${o.message ? ` — ${o.message}` : ""}`;
      break;
    case "LIST":
    case "GET":
    case "RANGE":
      text = o.source === "cache" ? `cache @${rvText(o.rv)} (${o.items?.length ?? 0} items): ${o.reason}` : `etcd: ${o.reason}`;
      break;
    case "WATCH":
      text = `etcd: ${o.reason}`;
      break;
    case "RELIST":
      text = o.reason;
      break;
    case "REQUEST_PROGRESS":
      text = "asks etcd for a progress notify";
      break;
    case "NEED_CURRENT_RV":
      text = "asks etcd's current revision";
      break;
    default:
      text = "";
  }
  return { at: o.at, who, type: o.type, text };
}

/** The metrics strip (Kubernetes' watch-cache metric names where they apply). */
export class MetricsPanel {
  constructor(el) {
    this.el = el;
    this.lastDraw = 0;
    this.cells = new Map();
    const defs = [
      ["events_received", "events received", "apiserver_watch_cache_events_received_total"],
      ["deliveries", "deliveries", "events handed to watchers"],
      ["bookmarks_sent", "bookmarks", "bookmark events sent"],
      ["init_events", "initial events", "apiserver_init_events_total"],
      ["terminated_watchers", "terminated", "apiserver_terminated_watchers_total: closed as unresponsive"],
      ["capacity_increases", "capacity ↑", "watch_cache_capacity_increase_total"],
      ["capacity_decreases", "capacity ↓", "watch_cache_capacity_decrease_total"],
      ["initializations", "(re)lists", "apiserver_watch_cache_initializations_total"],
      ["lists_delegated", "lists → etcd", "lists delegated to storage"],
      ["watch_expired", "410s", "watches refused as too old"],
    ];
    for (const [key, label, title] of defs) {
      const v = h("b", {}, "0");
      this.el.append(h("div.metric", { title }, v, h("span", {}, label)));
      this.cells.set(key, v);
    }
    this.rate = h("b", {}, "0");
    this.el.append(h("div.metric", { title: "events received per second of real time" }, this.rate, h("span", {}, "events/s")));
    this.prevReceived = 0n;
    this.prevT = 0;
  }

  render(cacher, now, minMs = 500) {
    if (now - this.lastDraw < minMs) return;
    const m = cacher.metrics();
    for (const [k, el] of this.cells) {
      const v = (m[k] ?? 0n).toLocaleString("en");
      if (el.textContent !== v) el.textContent = v;
    }
    if (this.prevT) {
      const rate = Number(m.events_received - this.prevReceived) / ((now - this.prevT) / 1000);
      this.rate.textContent = rate > 0 ? Math.round(rate).toLocaleString("en") : "0";
    }
    this.prevReceived = m.events_received;
    this.prevT = now;
    this.lastDraw = now;
  }

  reset() {
    this.prevReceived = 0n;
    this.prevT = 0;
  }
}
