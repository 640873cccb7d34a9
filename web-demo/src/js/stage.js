// The stage: etcd, the reflector with the ready gate, the ring buffer drawn as a ring, the
// dispatcher's time budget (SVG), and a canvas overlay on which events fly from etcd into the
// ring and from the ring to the watchers' lanes.
//
// Only what changed is written to the DOM: the ring's slots are diffed, texts are set only
// when they differ, and the canvas is redrawn only while something flies.

import { s, setAttr, setText, rvText, TYPE_COLOR } from "./util.js";

const VB = { w: 540, h: 440 };
const RING = { cx: 292, cy: 212, r0: 100, r1: 142 }; // inner and outer radius of the band
const MAX_SEGMENTS = 64; // above this capacity, one segment stands for several slots
const ETCD_OUT = { x: 92, y: 112 };
const BUDGET_W = 240; // width of the dispatch budget bar
const GATE = { x: 92, y: 262 };

/** A point on the ring at angle `a` (radians, 0 = top, clockwise) and radius `r`. */
function polar(a, r) {
  return { x: RING.cx + r * Math.sin(a), y: RING.cy - r * Math.cos(a) };
}

/** The SVG path of an annular sector between angles a0 and a1. */
function sector(a0, a1, r0, r1) {
  const p0 = polar(a0, r1);
  const p1 = polar(a1, r1);
  const p2 = polar(a1, r0);
  const p3 = polar(a0, r0);
  const large = a1 - a0 > Math.PI ? 1 : 0;
  const f = (n) => n.toFixed(2);
  return `M${f(p0.x)},${f(p0.y)} A${r1},${r1} 0 ${large} 1 ${f(p1.x)},${f(p1.y)} L${f(p2.x)},${f(p2.y)} A${r0},${r0} 0 ${large} 0 ${f(p3.x)},${f(p3.y)} Z`;
}

export class Stage {
  /** `root` is the stage container (position: relative); `lanesEl` the lanes column. */
  constructor(root, svgHost, lanesEl) {
    this.root = root;
    this.lanesEl = lanesEl;
    this.svg = s("svg", { viewBox: `0 0 ${VB.w} ${VB.h}`, class: "stage-svg", role: "img", "aria-label": "etcd, the ready gate, the ring buffer and the dispatcher" });
    svgHost.append(this.svg);
    this.canvas = document.createElement("canvas");
    this.canvas.className = "particles";
    root.append(this.canvas);
    this.ctx = this.canvas.getContext("2d");
    this.particles = [];
    // Readers who asked their system for less motion get no flying particles.
    this.reducedMotion = window.matchMedia?.("(prefers-reduced-motion: reduce)").matches ?? false;
    this.segments = []; // SVG paths of the ring
    this.segCount = 0;
    this.prev = {}; // last drawn values, to write only what changed
    this.build();
    this.layoutDirty = true;
    new ResizeObserver(() => (this.layoutDirty = true)).observe(root);
    lanesEl.addEventListener("scroll", () => (this.layoutDirty = true), { passive: true });
  }

  /** The static parts of the SVG. */
  build() {
    const g = (cls, ...c) => s("g", { class: cls }, ...c);
    const defs = s(
      "defs",
      {},
      s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0 L10,5 L0,10 z", fill: "#94a3b8" })),
    );
    // etcd
    this.etcdRev = s("text", { x: 92, y: 64, class: "etcd-rev", "text-anchor": "middle" }, "rev –");
    this.etcdCompact = s("text", { x: 92, y: 82, class: "etcd-sub", "text-anchor": "middle" }, "");
    this.etcdNote = s("text", { x: 92, y: 100, class: "etcd-note", "text-anchor": "middle" }, "");
    this.etcdBox = s("rect", { x: 14, y: 14, width: 156, height: 98, rx: 12, class: "etcd-box" });
    const etcd = g(
      "etcd",
      this.etcdBox,
      s("ellipse", { cx: 40, cy: 34, rx: 14, ry: 5, class: "etcd-icon" }),
      s("path", { d: "M26,34 v16 a14,5 0 0 0 28,0 v-16", class: "etcd-icon" }),
      s("text", { x: 104, y: 40, class: "etcd-title", "text-anchor": "middle" }, "etcd"),
      this.etcdRev,
      this.etcdCompact,
      this.etcdNote,
    );
    // the reflector: etcd → gate → ring
    const flow = s("path", { d: `M${ETCD_OUT.x},${ETCD_OUT.y} V${GATE.y - 4} Q${GATE.x},${RING.cy + 8} ${GATE.x + 40},${RING.cy + 4} L${RING.cx - RING.r1 - 6},${RING.cy}`, class: "flow", "marker-end": "url(#arrow)" });
    const flowLabel = s("text", { x: 84, y: 150, class: "flow-label", "text-anchor": "end" }, s("tspan", { x: 84, dy: 0 }, "reflector:"), s("tspan", { x: 84, dy: 12 }, "list, then"), s("tspan", { x: 84, dy: 12 }, "watch"));
    // the ready gate
    this.gateBar = s("rect", { x: 0, y: -4, width: 62, height: 8, rx: 4, class: "gate-bar" });
    this.gateArm = s("g", { class: "gate-arm", transform: `translate(${GATE.x - 31},${GATE.y - 18})` }, this.gateBar);
    this.gateState = s("text", { x: GATE.x, y: GATE.y + 40, class: "gate-state", "text-anchor": "middle" }, "pending");
    this.gateParked = s("text", { x: GATE.x, y: GATE.y + 55, class: "gate-sub", "text-anchor": "middle" }, "");
    const gate = g(
      "gate",
      s("rect", { x: GATE.x - 37, y: GATE.y - 26, width: 8, height: 34, rx: 2, class: "gate-post" }),
      s("rect", { x: GATE.x + 31, y: GATE.y - 26, width: 8, height: 34, rx: 2, class: "gate-post" }),
      this.gateArm,
      s("text", { x: GATE.x, y: GATE.y + 24, class: "gate-title", "text-anchor": "middle" }, "ready gate"),
      this.gateState,
      this.gateParked,
    );
    // the ring
    this.ringSegs = s("g", { class: "ring-segs" });
    this.ringLabels = s("g", { class: "ring-labels" });
    this.ptrStart = s("g", { class: "ptr ptr-start" }, s("line", {}), s("text", {}));
    this.ptrEnd = s("g", { class: "ptr ptr-end" }, s("line", {}), s("text", {}));
    this.cLen = s("text", { x: RING.cx, y: RING.cy - 24, class: "ring-big", "text-anchor": "middle" }, "");
    this.cCap = s("text", { x: RING.cx, y: RING.cy - 8, class: "ring-sub", "text-anchor": "middle" }, "");
    this.cRange = s("text", { x: RING.cx, y: RING.cy + 14, class: "ring-range", "text-anchor": "middle" }, "");
    this.cServable = s("text", { x: RING.cx, y: RING.cy + 31, class: "ring-sub", "text-anchor": "middle" }, "");
    this.cEvicted = s("text", { x: RING.cx, y: RING.cy + 46, class: "ring-evicted", "text-anchor": "middle" }, "");
    this.cPulse = s("text", { x: RING.cx, y: RING.cy + 64, class: "ring-pulse", "text-anchor": "middle" }, "");
    const ring = g(
      "ring",
      s("circle", { cx: RING.cx, cy: RING.cy, r: RING.r1 + 3, class: "ring-halo" }),
      this.ringSegs,
      this.ringLabels,
      this.ptrStart,
      this.ptrEnd,
      s("text", { x: RING.cx, y: RING.cy - 52, class: "ring-title", "text-anchor": "middle" }, "ring buffer"),
      this.cPulse,
      this.cLen,
      this.cCap,
      this.cRange,
      this.cServable,
      this.cEvicted,
    );
    // cache RV and the dispatcher's budget
    this.cacheRv = s("text", { x: RING.cx, y: RING.cy + RING.r1 + 32, class: "cache-rv", "text-anchor": "middle" }, "");
    this.budgetFill = s("rect", { x: 172, y: 410, width: 0, height: 10, rx: 5, class: "budget-fill" });
    this.budgetText = s("text", { x: 412, y: 404, class: "budget-text", "text-anchor": "end" }, "");
    this.tickDot = s("circle", { cx: 26, cy: 412, r: 7, class: "tick-dot" });
    this.timerText = s("text", { x: 172, y: 435, class: "timer-text" }, "");
    const disp = g(
      "dispatch",
      s("text", { x: 172, y: 404, class: "budget-title" }, "dispatch budget"),
      s("rect", { x: 172, y: 410, width: BUDGET_W, height: 10, rx: 5, class: "budget-bg" }),
      this.budgetFill,
      this.budgetText,
      this.tickDot,
      s("text", { x: 40, y: 408, class: "tick-label" }, "dispatcher"),
      s("text", { x: 40, y: 420, class: "tick-label" }, "1 s tick"),
      this.timerText,
    );
    this.svg.append(defs, flow, flowLabel, etcd, gate, ring, this.cacheRv, disp);
  }

  // ----- the ring ---------------------------------------------------------------------------

  /** Rebuilds the ring's segments for a capacity (only when it changes). */
  buildSegments(capacity) {
    const n = Math.max(1, Math.min(capacity, MAX_SEGMENTS));
    if (n === this.segCount) return;
    this.ringSegs.replaceChildren();
    this.ringLabels.replaceChildren();
    this.segments = [];
    this.labels = [];
    const gap = n > 1 ? Math.min(0.02, (Math.PI * 2) / n / 6) : 0;
    for (let i = 0; i < n; i++) {
      const a0 = (i / n) * Math.PI * 2 + gap / 2;
      const a1 = ((i + 1) / n) * Math.PI * 2 - gap / 2;
      const p = s("path", { d: sector(a0, a1, RING.r0, RING.r1), class: "seg seg-empty" });
      p.append(s("title", {}, ""));
      this.ringSegs.append(p);
      this.segments.push({ el: p, cls: "seg seg-empty", title: "" });
      if (n <= 32) {
        const mid = polar((a0 + a1) / 2, (RING.r0 + RING.r1) / 2);
        const t = s("text", { x: mid.x.toFixed(1), y: (mid.y + 3).toFixed(1), class: "seg-label", "text-anchor": "middle", "font-size": n <= 16 ? 10 : 7.5 }, "");
        this.ringLabels.append(t);
        this.labels.push(t);
      }
    }
    this.segCount = n;
  }

  /** The centre of slot `slot` (mod capacity), for the particles. */
  slotPoint(slot, capacity, r = (RING.r0 + RING.r1) / 2) {
    const n = Math.min(capacity, MAX_SEGMENTS);
    const seg = capacity <= MAX_SEGMENTS ? slot : Math.floor((slot * n) / capacity);
    return polar(((seg + 0.5) / n) * Math.PI * 2, r);
  }

  /**
   * Draws the ring from the window (`c.window()`) and, for small rings, its events
   * (`c.windowEvents()`, oldest first). `types` maps RV → the last dispatched type (colour).
   */
  drawRing(win, events) {
    const cap = win.capacity;
    this.buildSegments(cap);
    const start = Number(win.startIndex);
    const len = win.len;
    const n = this.segCount;
    const startSlot = start % cap;
    if (cap <= MAX_SEGMENTS) {
      for (let slot = 0; slot < n; slot++) {
        const off = (slot - startSlot + cap) % cap; // position in the window, if < len
        let cls = "seg seg-empty";
        let title = `slot ${slot}: empty`;
        let label = "";
        if (off < len) {
          const e = events?.[off];
          const newest = off === len - 1;
          cls = `seg ${e?.isDelete ? "seg-del" : "seg-put"}${newest ? " seg-newest" : ""}${off === 0 ? " seg-oldest" : ""}`;
          title = e ? `slot ${slot} · index ${start + off} · RV ${e.rv} · ${e.isDelete ? "DELETE" : "PUT"} ${e.key}` : `slot ${slot}`;
          label = e ? String(e.rv) : "";
        }
        const seg = this.segments[slot];
        if (seg.cls !== cls) {
          seg.el.setAttribute("class", cls);
          seg.cls = cls;
        }
        if (seg.title !== title) {
          seg.el.firstChild.textContent = title;
          seg.title = title;
        }
        if (this.labels[slot]) {
          const shown = label.length > 4 && n > 16 ? label.slice(-3) : label.length > 5 ? `…${label.slice(-4)}` : label;
          setText(this.labels[slot], shown);
        }
      }
    } else {
      // Aggregated: segment g covers slots [g*cap/n, (g+1)*cap/n); its fill is the share of
      // those slots inside the (cyclic) window [startSlot, startSlot+len).
      const per = cap / n;
      for (let gi = 0; gi < n; gi++) {
        const a = gi * per;
        const b = a + per;
        let inside = overlap(a, b, startSlot, startSlot + len) + overlap(a, b, startSlot - cap, startSlot - cap + len);
        const f = Math.min(1, inside / per);
        const level = f === 0 ? 0 : Math.max(1, Math.round(f * 4));
        const cls = `seg seg-agg${level}`;
        const seg = this.segments[gi];
        if (seg.cls !== cls) {
          seg.el.setAttribute("class", cls);
          seg.cls = cls;
        }
        const title = `slots ${Math.floor(a)}–${Math.ceil(b) - 1}: ${Math.round(f * 100)}% in the window`;
        if (seg.title !== title) {
          seg.el.firstChild.textContent = title;
          seg.title = title;
        }
      }
    }
    // Pointers: where the window starts (oldest) and where the next event goes (end).
    const endSlot = Number(win.endIndex) % cap;
    // Pointers close to each other get their labels on two lines (start above, end below).
    const dist = Math.abs(((endSlot - startSlot + cap) % cap) / cap);
    const same = Math.min(dist, 1 - dist) < 0.09;
    this.pointer(this.ptrStart, startSlot, cap, `start #${start}`, -1, same);
    this.pointer(this.ptrEnd, endSlot, cap, `end #${win.endIndex}`, 1, same);
    // Centre texts.
    setText(this.cLen, `${len} / ${cap}`);
    setAttr(this.cLen, "class", String(len).length + String(cap).length > 8 ? "ring-big long" : "ring-big");
    setText(this.cCap, `events / capacity`);
    setText(this.cRange, len ? `RV ${rvText(win.oldestRv)} – ${rvText(win.newestRv)}` : "empty");
    setText(this.cServable, win.oldestServable !== undefined && win.oldestServable !== null ? `watch from RV ≥ ${win.oldestServable - 1n}` : "not initialised");
    setText(this.cEvicted, win.evictedSinceRelist ? "evicted since relist" : "");
    if (this.prev.cap !== undefined && this.prev.cap !== cap) this.pulse(cap > this.prev.cap ? `grew ×2 → ${cap}` : `shrank ½ → ${cap}`, cap > this.prev.cap ? "grow" : "shrink");
    this.prev.cap = cap;
  }

  /** Places a pointer line and label at the leading edge of `slot`. */
  pointer(el, slot, cap, text, side, same) {
    const n = Math.min(cap, MAX_SEGMENTS);
    const seg = cap <= MAX_SEGMENTS ? slot : (slot * n) / cap;
    const a = (seg / n) * Math.PI * 2;
    const key = `${a.toFixed(4)}|${text}|${same}`;
    if (el._key === key) return;
    el._key = key;
    const p0 = polar(a, RING.r0 - 4);
    const p1 = polar(a, RING.r1 + 14);
    const line = el.firstChild;
    const label = el.lastChild;
    line.setAttribute("x1", p0.x.toFixed(1));
    line.setAttribute("y1", p0.y.toFixed(1));
    line.setAttribute("x2", p1.x.toFixed(1));
    line.setAttribute("y2", p1.y.toFixed(1));
    const pl = polar(a, RING.r1 + 24);
    label.setAttribute("x", pl.x.toFixed(1));
    // Labels of the two pointers must not overlap: near the top or bottom, or when both
    // pointers are at the same place, start goes left and end goes right (and a line apart).
    const vertical = Math.abs(Math.sin(a)) < 0.35;
    const dy = same ? (side > 0 ? 11 : -3) : 4;
    label.setAttribute("y", (pl.y + dy).toFixed(1));
    label.setAttribute("text-anchor", vertical ? (side > 0 ? "start" : "end") : Math.sin(a) > 0 ? "start" : "end");
    label.textContent = text;
  }

  /** Hides the ring's message at once (a new step starts). */
  clearPulse() {
    clearTimeout(this.pulseTimer);
    this.cPulse.setAttribute("class", "ring-pulse");
  }

  /** A short message in the ring's centre (capacity changes, relists). */
  pulse(text, kind) {
    this.cPulse.textContent = text;
    this.cPulse.setAttribute("class", `ring-pulse on ${kind}`);
    clearTimeout(this.pulseTimer);
    this.pulseTimer = setTimeout(() => this.cPulse.setAttribute("class", "ring-pulse"), 1800);
  }

  // ----- etcd, gate, budget ------------------------------------------------------------------

  drawEtcd(etcd) {
    setText(this.etcdRev, `revision ${etcd.rev}`);
    setText(this.etcdCompact, etcd.compacted ? `compacted at ${etcd.compacted}` : "no compaction");
    setText(this.etcdNote, etcd.up === false ? "restarting…" : etcd.note ?? "");
    setAttr(this.etcdBox, "class", etcd.up === false ? "etcd-box down" : "etcd-box");
  }

  flashEtcd(text) {
    this.etcdNote.textContent = text;
    this.etcdBox.classList.add("flash");
    clearTimeout(this.etcdTimer);
    this.etcdTimer = setTimeout(() => {
      this.etcdBox.classList.remove("flash");
      this.etcdNote.textContent = "";
    }, 900);
  }

  drawGate(state, parked, listRv) {
    setAttr(this.gateArm, "class", `gate-arm ${state}`);
    setText(this.gateState, state === "ready" ? "ready (open)" : state === "pending" ? "pending (closed)" : "stopped");
    setText(this.gateParked, parked ? `${parked} request${parked === 1 ? "" : "s"} parked` : listRv ? `list RV ${listRv}` : "");
  }

  drawCacheRv(rv, listRv) {
    setText(this.cacheRv, `cache resourceVersion ${rvText(rv)}  ·  list RV ${rvText(listRv)}`);
  }

  drawBudget(ms, max, timer) {
    const w = Math.max(0, Math.min(1, ms / max)) * BUDGET_W;
    setAttr(this.budgetFill, "width", w.toFixed(1));
    setAttr(this.budgetFill, "class", ms < max * 0.25 ? "budget-fill low" : "budget-fill");
    setText(this.budgetText, `${ms} / ${max} ms`);
    setText(this.timerText, timer ? `next timer: ${timer.reason.replace(/_/g, " ")} @ ${(timer.atMs / 1000).toFixed(3)} s` : "no timer");
  }

  tick() {
    this.tickDot.classList.remove("on");
    // Restart the CSS animation.
    void this.tickDot.getBoundingClientRect();
    this.tickDot.classList.add("on");
  }

  // ----- particles ----------------------------------------------------------------------------

  /** Measures where things are, in canvas pixels (only after a layout change). */
  measure() {
    if (!this.layoutDirty) return;
    this.layoutDirty = false;
    const rr = this.root.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const w = Math.round(rr.width);
    const hgt = Math.round(rr.height);
    if (this.canvas.width !== w * dpr || this.canvas.height !== hgt * dpr) {
      this.canvas.width = w * dpr;
      this.canvas.height = hgt * dpr;
      this.canvas.style.width = `${w}px`;
      this.canvas.style.height = `${hgt}px`;
    }
    this.dpr = dpr;
    const m = this.svg.getScreenCTM();
    this.toPx = (p) => ({ x: m.a * p.x + m.c * p.y + m.e - rr.left, y: m.b * p.x + m.d * p.y + m.f - rr.top });
    this.lanePos = new Map();
    for (const lane of this.lanesEl.querySelectorAll(".lane")) {
      const r = lane.getBoundingClientRect();
      const lr = this.lanesEl.getBoundingClientRect();
      const y = Math.max(lr.top + 6, Math.min(lr.bottom - 6, r.top + 18));
      this.lanePos.set(lane.dataset.name, { x: r.left - rr.left + 6, y: y - rr.top });
    }
  }

  /** Points of the write path: etcd → gate → the ring slot. */
  writePath(slot, capacity) {
    this.measure();
    return [ETCD_OUT, { x: GATE.x, y: GATE.y - 10 }, { x: GATE.x + 40, y: RING.cy + 4 }, this.slotPoint(slot, capacity)].map((p) => this.toPx(p));
  }

  /** Points of a delivery: the ring slot → the ring's right edge → the lane. */
  deliverPath(slot, capacity, laneName) {
    this.measure();
    const lane = this.lanePos.get(laneName);
    if (!lane) return null;
    const from = this.toPx(this.slotPoint(slot, capacity));
    const edge = this.toPx({ x: RING.cx + RING.r1 + 16, y: RING.cy });
    return [from, edge, lane];
  }

  /** Adds a particle flying along `pts` from `delay` ms from now for `dur` ms. */
  fly(pts, color, dur = 600, delay = 0, radius = 4) {
    if (!pts || this.reducedMotion) return;
    if (this.particles.length > 400) return; // enough is on screen; the counters say the rest
    this.particles.push({ pts, color, t0: performance.now() + delay, dur, radius });
  }

  /** Draws the particles of this frame; returns whether anything is still flying. */
  drawParticles(now) {
    const ctx = this.ctx;
    if (!this.particles.length) {
      if (this.drewLast) {
        ctx.setTransform(1, 0, 0, 1, 0, 0);
        ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
        this.drewLast = false;
      }
      return false;
    }
    this.measure();
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    const keep = [];
    for (const p of this.particles) {
      const t = (now - p.t0) / p.dur;
      if (t < 0) {
        keep.push(p);
        continue;
      }
      if (t >= 1) continue;
      keep.push(p);
      const e = t < 0.5 ? 2 * t * t : 1 - Math.pow(-2 * t + 2, 2) / 2; // ease in-out
      const pos = along(p.pts, e);
      ctx.globalAlpha = t > 0.85 ? (1 - t) / 0.15 : 1;
      ctx.fillStyle = p.color;
      ctx.beginPath();
      ctx.arc(pos.x, pos.y, p.radius, 0, Math.PI * 2);
      ctx.fill();
    }
    ctx.globalAlpha = 1;
    this.particles = keep;
    this.drewLast = true;
    return keep.length > 0;
  }

  clearParticles() {
    this.particles = [];
  }
}

/** Length of [a, b) ∩ [c, d). */
function overlap(a, b, c, d) {
  return Math.max(0, Math.min(b, d) - Math.max(a, c));
}

/** The point at fraction `t` of the polyline `pts` (by length). */
function along(pts, t) {
  let total = 0;
  const segs = [];
  for (let i = 1; i < pts.length; i++) {
    const l = Math.hypot(pts[i].x - pts[i - 1].x, pts[i].y - pts[i - 1].y);
    segs.push(l);
    total += l;
  }
  let d = t * total;
  for (let i = 0; i < segs.length; i++) {
    if (d <= segs[i] || i === segs.length - 1) {
      const f = segs[i] ? Math.min(1, d / segs[i]) : 0;
      return { x: pts[i].x + (pts[i + 1].x - pts[i].x) * f, y: pts[i].y + (pts[i + 1].y - pts[i].y) * f };
    }
    d -= segs[i];
  }
  return pts[pts.length - 1];
}

export { TYPE_COLOR };
