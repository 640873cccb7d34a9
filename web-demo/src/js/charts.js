// Small SVG charts for per-second series (the what-if panel): lines and bars over time, with
// horizontal reference lines. No library: a few paths, three ticks per axis. Each series' path
// carries data attributes (points, sum, max) so tests can check what is drawn.
import { s } from "./util.js";

const W = 600;
const M = { l: 46, r: 10, t: 10, b: 20 };

/** A number as a short tick label: 1234 → "1.2k", 0.5 → "0.5". */
export function short(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (a >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
  if (a >= 10 || v === 0) return String(Math.round(v));
  return String(+v.toFixed(1));
}

/**
 * A chart of series over t = 1..n seconds.
 *
 * `series`: [{key, label, values (numbers), color, kind: "line" | "bars"}];
 * `hlines`: [{y, label, color, dash}]; returns the <svg>.
 */
export function timeChart({ series, hlines = [], height = 120, title = "" }) {
  const H = height;
  const n = Math.max(1, ...series.map((x) => x.values.length));
  let top = 0;
  for (const x of series) for (const v of x.values) if (v > top) top = v;
  for (const l of hlines) if (Number.isFinite(l.y) && l.y > top) top = l.y;
  top = top > 0 ? top * 1.08 : 1;
  const X = (i) => M.l + ((W - M.l - M.r) * i) / n; // i: 0..n (second i ends at X(i))
  const Y = (v) => H - M.b - ((H - M.t - M.b) * v) / top;
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  // Axes and ticks.
  svg.append(s("line", { x1: M.l, y1: H - M.b, x2: W - M.r, y2: H - M.b, class: "axis" }));
  for (const f of [0, 0.5, 1]) {
    const v = (top / 1.08) * f;
    const y = Y(v);
    svg.append(s("line", { x1: M.l, y1: y, x2: W - M.r, y2: y, class: "grid" }));
    svg.append(s("text", { x: M.l - 5, y: y + 3.5, class: "tick", "text-anchor": "end" }, short(v)));
  }
  for (const f of [0, 0.5, 1]) {
    const i = Math.round(n * f);
    svg.append(s("text", { x: X(i), y: H - 5, class: "tick", "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle" }, `${i} s`));
  }
  // Series.
  const barW = Math.max(0.6, (W - M.l - M.r) / n);
  for (const x of series) {
    let d = "";
    let sum = 0;
    let max = 0;
    x.values.forEach((v, i) => {
      sum += v;
      if (v > max) max = v;
      if (x.kind === "bars") {
        if (v > 0) d += `M${(X(i) + barW / 2).toFixed(1)} ${Y(0).toFixed(1)}V${Y(v).toFixed(1)}`;
      } else {
        d += `${i ? "L" : "M"}${X(i + 1).toFixed(1)} ${Y(v).toFixed(1)}`;
      }
    });
    const attrs = { d: d || "M0 0", class: `series ${x.kind ?? "line"}`, stroke: x.color, "data-series": x.key, "data-points": x.values.length, "data-sum": String(sum), "data-max": String(max) };
    if (x.kind === "bars") attrs["stroke-width"] = Math.max(1, Math.min(barW, 6)).toFixed(1);
    svg.append(s("path", attrs, s("title", {}, x.label)));
  }
  // Reference lines; a label that would sit on another one moves to the left end, then below.
  const placed = [];
  for (const l of hlines) {
    if (!Number.isFinite(l.y)) continue;
    const y = Y(l.y);
    svg.append(s("line", { x1: M.l, y1: y, x2: W - M.r, y2: y, class: "hline", stroke: l.color ?? "#64748b", "stroke-dasharray": l.dash ?? "5 4", "data-y": String(l.y) }));
    const spots = [
      [W - M.r - 4, y - 4, "end"],
      [M.l + 6, y - 4, "start"],
      [W - M.r - 4, y + 12, "end"],
      [M.l + 6, y + 12, "start"],
    ];
    const spot = spots.find(([, ty, a]) => !placed.some((p) => p.a === a && Math.abs(p.y - ty) < 11)) ?? spots[0];
    placed.push({ y: spot[1], a: spot[2] });
    svg.append(s("text", { x: spot[0], y: spot[1], class: "hlabel", fill: l.color ?? "#64748b", "text-anchor": spot[2] }, l.label));
  }
  return svg;
}
