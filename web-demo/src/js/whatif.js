// The what-if panel's logic, without the DOM (tested in Node): reading and writing workload
// fields by path, the rule of docs/slo.md applied to a workload, what a report measured, and
// the per-second series the panel plots.
//
// The rule (docs/slo.md, "The finding"): a watcher that disconnects for d seconds resumes
// without a relist iff d + A < W, where
// - W, the window span, is the ring's capacity over the write rate, C / r (fixed ring: C as
//   configured; Kubernetes' dynamic ring settles at the smallest C0·2^k above the largest 75 s
//   write count, ≈ 75r + 2√(75r), capped at the upper bound);
// - A, the age of the RV the watcher resumes from, is exponential with mean 1 / (r·f) for a
//   watcher matching a share f of the objects, and at most B (the bookmark frequency) with
//   bookmarks: P(A > a) = e^(−r·f·a) · (1 − a/B) (the last factor with bookmarks only);
// - the compaction interval I does not enter; it decides the share of relists whose first list
//   etcd refuses, clamp((d − I) / I, 0, 1).

/** The workload's defaults (cacher-core/src/simulate.rs), for placeholders and the rule. */
export const DEFAULTS = {
  duration_s: 60,
  seed: 0,
  "writes.rate_per_s": 10,
  "writes.keys": 1000,
  "watchers.count": 10,
  "watchers.bookmarks": true,
  "watchers.selector_fraction": 1,
  "disconnects.rate_per_watcher_per_h": 0,
  "disconnects.reconnect_delay_s": 1,
  "etcd.compaction_interval_s": 300,
  "config.profile": "v1.30",
  "config.dynamic_capacity": true,
};

/** The value at a dotted path ("writes.rate_per_s"), or undefined. */
export function getPath(obj, path) {
  let v = obj;
  for (const k of path.split(".")) {
    if (v === null || typeof v !== "object" || Array.isArray(v)) return undefined;
    v = v[k];
  }
  return v;
}

/** Sets (or, for undefined, deletes) the value at a dotted path, creating objects on the way. */
export function setPath(obj, path, value) {
  const keys = path.split(".");
  let o = obj;
  for (const k of keys.slice(0, -1)) {
    if (o[k] === null || typeof o[k] !== "object" || Array.isArray(o[k])) {
      if (value === undefined) return obj;
      o[k] = {};
    }
    o = o[k];
  }
  const last = keys[keys.length - 1];
  if (value === undefined) {
    delete o[last];
    // Drop objects left empty (config: {} and the like), so the JSON stays what was asked.
    for (let i = keys.length - 1; i > 0; i--) {
      const parent = keys.slice(0, i - 1).reduce((a, k) => a[k], obj);
      const child = parent[keys[i - 1]];
      if (child && typeof child === "object" && !Array.isArray(child) && Object.keys(child).length === 0) delete parent[keys[i - 1]];
      else break;
    }
  } else {
    o[last] = value;
  }
  return obj;
}

/** Compact JSON with spaces (`{"a": 1, "b": [2, 3]}`), one top-level field per line. */
export function workloadText(w) {
  const one = (v) => {
    if (Array.isArray(v)) return `[${v.map(one).join(", ")}]`;
    if (v && typeof v === "object") return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${one(x)}`).join(", ")}}`;
    return JSON.stringify(v);
  };
  if (!w || typeof w !== "object" || Array.isArray(w)) return one(w);
  const lines = Object.entries(w).map(([k, v]) => `  ${JSON.stringify(k)}: ${one(v)}`);
  return lines.length ? `{\n${lines.join(",\n")}\n}` : "{}";
}

/** A reconnect delay (a number or {dist, ...}) as {dist, a, b}: const value / exp mean / uniform min–max. */
export function delayOf(d) {
  if (d === undefined || d === null) return { dist: "const", a: DEFAULTS["disconnects.reconnect_delay_s"] };
  if (typeof d === "number") return { dist: "const", a: d };
  if (typeof d !== "object") return null;
  if (d.dist === "const") return { dist: "const", a: d.value };
  if (d.dist === "exp") return { dist: "exp", a: d.mean };
  if (d.dist === "uniform") return { dist: "uniform", a: d.min, b: d.max };
  return null;
}

/** The delay as the workload spells it. */
export function delayJson({ dist, a, b }) {
  if (dist === "exp") return { dist: "exp", mean: a };
  if (dist === "uniform") return { dist: "uniform", min: a, max: b };
  return { dist: "const", value: a };
}

/** Equal-probability samples of a delay's distribution (its quantiles), in seconds. */
function delaySamples(del, n = 400) {
  if (del.dist === "const") return [del.a];
  const out = [];
  for (let i = 0; i < n; i++) {
    const q = (i + 0.5) / n;
    out.push(del.dist === "exp" ? -del.a * Math.log(1 - q) : del.a + (del.b - del.a) * q);
  }
  return out;
}

const num = (v, dflt) => (v === undefined || v === null ? dflt : v);
const isNum = (v) => typeof v === "number" && Number.isFinite(v);

/**
 * The dynamic ring's settled capacity for a steady write rate: from `initial`, doubling while
 * full of events younger than `freshS` seconds, halving while even its newest quarter is
 * older; within [lower, upper]. Returns {capacity, need} (need ≈ fresh·r + 2√(fresh·r)).
 */
export function dynamicCapacity(rate, { initial = 100, lower = 100, upper = 102400, freshS = 75 } = {}) {
  const n = freshS * rate;
  const need = n + 2 * Math.sqrt(n);
  let c = Math.max(1, initial);
  while (c <= need && c < upper) c = Math.min(upper, c * 2);
  while (c / 4 > n && c / 2 >= lower) c /= 2;
  return { capacity: c, need };
}

/**
 * The rule's prediction for a workload (a parsed object) with the cacher's resolved config
 * (`new Cacher(workload.config).config()`). Returns null when the workload has no numbers to
 * predict from (the simulation's own validation reports what is wrong), or
 * {W, C, r, f, B, d (delay), share, phase: "none" | "some" | "storm" | "idle", refused, ...}.
 */
export function predict(w, cfg) {
  if (!w || typeof w !== "object" || Array.isArray(w) || !cfg) return null;
  const r = num(getPath(w, "writes.rate_per_s"), DEFAULTS["writes.rate_per_s"]);
  const f = num(getPath(w, "watchers.selector_fraction"), 1);
  const count = num(getPath(w, "watchers.count"), DEFAULTS["watchers.count"]);
  const bookmarks = num(getPath(w, "watchers.bookmarks"), true);
  const rateH = num(getPath(w, "disconnects.rate_per_watcher_per_h"), 0);
  const I = num(getPath(w, "etcd.compaction_interval_s"), DEFAULTS["etcd.compaction_interval_s"]);
  const del = delayOf(getPath(w, "disconnects.reconnect_delay_s"));
  if (![r, f, count, rateH, I].every(isNum) || r < 0 || f < 0 || f > 1 || typeof bookmarks !== "boolean") return null;
  if (!del || !isNum(del.a) || del.a < 0 || (del.dist === "uniform" && !(isNum(del.b) && del.b >= del.a))) return null;
  const B = cfg.bookmark_frequency_ms / 1000;
  const freshS = cfg.event_fresh_ms / 1000;
  const dyn = cfg.dynamic_capacity
    ? dynamicCapacity(r, { initial: cfg.capacity, lower: cfg.lower_bound_capacity, upper: cfg.upper_bound_capacity, freshS })
    : null;
  const C = dyn ? dyn.capacity : cfg.capacity;
  const W = r > 0 ? C / r : Infinity;
  // P(relist | delay d) = P(A > W − d).
  const rf = r * f;
  const pRelist = (d) => {
    if (d >= W) return 1;
    const a = W - d;
    let p = rf > 0 ? Math.exp(-rf * a) : 1;
    if (bookmarks) p *= Math.max(0, 1 - a / B);
    return p;
  };
  const ds = delaySamples(del);
  let sum = 0;
  let refusedSum = 0;
  for (const d of ds) {
    const p = pRelist(d);
    sum += p;
    refusedSum += p * (I > 0 ? Math.min(1, Math.max(0, (d - I) / I)) : 0);
  }
  const share = sum / ds.length;
  const refused = sum > 0 ? refusedSum / sum : 0;
  const restarts = Array.isArray(w.restarts) ? w.restarts.length : 0;
  const phase = rateH === 0 || count === 0 ? "idle" : phaseOf(share);
  return {
    r, f, count, bookmarks, B, I, C, W, freshS, dynamic: !!dyn, need: dyn?.need, upper: cfg.upper_bound_capacity,
    delay: del, share, refused, phase, restarts,
    bursts: Array.isArray(getPath(w, "writes.bursts")) && getPath(w, "writes.bursts").length > 0,
    slow: isNum(getPath(w, "watchers.consume_rate_per_s")),
    timeouts: isNum(getPath(w, "watchers.timeout_s")),
    // Near W the outcome is decided by the write path: the span of C events fluctuates by √C/r.
    noise: r > 0 ? (2 * Math.sqrt(C)) / r : 0,
    meanA: rf > 0 ? 1 / rf : Infinity,
  };
}

/** none (< 0.5 %), storm (≥ 95 %), some in between. */
export function phaseOf(share) {
  if (share < 0.005) return "none";
  if (share >= 0.95) return "storm";
  return "some";
}

/**
 * What a report measured, for the rule: relists among reconnects (reconnects =
 * watches_started − watchers − relists, exact only when nothing but the clients' own
 * disconnects ends watches), and the window span the run had (median of window_s over the
 * second half of the series, while ready).
 */
export function measure(report, w) {
  const s = report.summary;
  const count = Number(num(getPath(w, "watchers.count"), DEFAULTS["watchers.count"]));
  const relists = Number(s.relists);
  const reconnects = Number(s.watches_started) - count - relists;
  const exact = Number(s.restarts) === 0 && Number(s.watcher_terminations) === 0 && !isNum(getPath(w, "watchers.timeout_s"));
  const share = exact && reconnects > 0 ? relists / reconnects : null;
  const half = report.series.slice(Math.floor(report.series.length / 2)).filter((x) => x.ready);
  const spans = half.map((x) => x.window_s).sort((a, b) => a - b);
  const windowS = spans.length ? spans[spans.length >> 1] : null;
  let phase = null;
  if (exact) phase = reconnects > 0 ? phaseOf(share) : relists === 0 ? "idle" : null;
  return { relists, reconnects, exact, share, phase, windowS, refused: Number(s.etcd_list_410) };
}

/**
 * Whether a run agrees with the prediction: {agrees: true | false | null (cannot tell), how}.
 * With only the clients' own disconnects ending watches, the relist share among reconnects
 * is compared (same phase, or within 5 points); with cache restarts (each relists every
 * watcher, and every watcher re-watches once for it), the count: restarts × watchers + share ×
 * the clients' own reconnects, within 10 % (or 3).
 */
export function compare(p, m, summary) {
  if (!p || !m) return { agrees: null, how: "" };
  if (m.exact && m.phase) {
    if (m.phase === p.phase) return { agrees: true, how: "same phase" };
    if (m.share !== null && Math.abs(m.share - p.share) <= 0.05) return { agrees: true, how: "within 5 points of the predicted share" };
    return { agrees: false, how: "another phase" };
  }
  if (p.restarts > 0 && !p.slow && !p.timeouts) {
    const forRestarts = p.restarts * p.count;
    const own = Math.max(0, m.reconnects - forRestarts);
    const expected = forRestarts + p.share * own;
    const ok = Math.abs(m.relists - expected) <= Math.max(3, 0.1 * expected);
    return { agrees: ok, expected, how: `≈ ${Math.round(expected)} relists expected: ${forRestarts} for the restart${p.restarts > 1 ? "s" : ""} + ${+(p.share * 100).toFixed(1)} % of ≈ ${Math.round(own)} reconnects` };
  }
  return { agrees: null, how: "" };
}

/** The plotted series: per-second values as Numbers (counts cross from wasm as BigInt). */
export const SERIES = [
  { key: "window_s", label: "window span (s)" },
  { key: "capacity", label: "ring capacity (events)" },
  { key: "window_events", label: "events in the ring" },
  { key: "watch_410", label: "410s per second" },
  { key: "relists", label: "relists per second" },
  { key: "etcd_range_requests", label: "etcd range requests per second" },
  { key: "etcd_range_objects", label: "objects read from etcd per second" },
  { key: "connected_watchers", label: "connected watchers" },
  { key: "writes", label: "writes per second" },
];

/** {key: number[]} of the report's series. */
export function seriesOf(report) {
  const out = {};
  for (const { key } of SERIES) out[key] = report.series.map((x) => Number(x[key]));
  return out;
}
