// Plain-language explanations of what a step did, built from the step itself (scenario
// format), the outputs the core produced, and the state before and after. Everything here
// is grounded in the Kubernetes cacher (k8s.io/apiserver/pkg/storage/cacher, v1.30.3, and the
// later versions' changes behind the v1.34 profile); the constants are the upstream ones.

import { esc, rvText, secText } from "./util.js";

const code = (x) => `<code>${esc(x)}</code>`;
const rvOf = (x) => (x === undefined || x === null || x === "" ? '""' : String(x));

/** What each CLOSED cause means for the client. */
export const CLOSE_TEXT = {
  unresponsive:
    "closed as <b>unresponsive</b>: its queue (Kubernetes: 2×chanSize+1, 21 events for a 100-event ring) was full, and dispatch waited for it out of the shared time budget (at most 100 ms, refilled 50 ms per second) in vain. The stream ends <i>without</i> an error event; the client re-watches from its last RV, and gets 410 if that fell out of the window.",
  stopped: "closed because its client went away (or the cacher stopped).",
  reinitializing:
    "closed because the cacher is <b>re-initialising</b>: before every relist Kubernetes terminates all watchers (terminateAllWatchers). The stream ends without an error; clients re-watch.",
  timeout: "closed because the request's timeout expired (a bookmark is sent 2 s before the deadline when bookmarks are allowed).",
  error: "closed right after its ERROR event.",
};

/** What each error or rejection code means. */
export function statusText(o) {
  switch (o.code) {
    case 410:
      return "<b>410 Expired</b> (too old resource version): the requested RV is older than the window the ring buffer still holds — a watch from X is allowed only if X ≥ oldest−1. The client must relist.";
    case 504:
      return "<b>504 Too large resource version</b>: the cache did not reach the requested RV within the 3 s freshness wait (Retry-After 1 s).";
    case 429:
      return `<b>429 Too Many Requests</b>, Retry-After ${o.retryAfterS ?? o.retry_after_s ?? 1} s: the cache is (re)initialising, and since v1.31 (ResilientWatchCacheInitialization) requests are turned away instead of waiting; Retry-After grows with the downtime (v1.33+).`;
    case 503:
      return "<b>503 Service Unavailable</b>: the cacher is not ready or has stopped.";
    case 400:
      return "<b>400 Invalid</b>: the request is malformed.";
    case 404:
      return "<b>404 Not Found</b>: no such object in the cache at that RV.";
    case 500:
      return "<b>500 Internal error</b>.";
    default:
      return `<b>${o.code}</b>.`;
  }
}

/** Groups event deliveries by watcher: "w1 ← ADDED /pods/a @10" or "w1 ← 21 events (RV 101–121)". */
function deliveries(outputs, nameOf) {
  const by = new Map();
  for (const o of outputs) {
    if (!["ADDED", "MODIFIED", "DELETED", "BOOKMARK"].includes(o.type)) continue;
    const n = nameOf(o);
    if (!by.has(n)) by.set(n, []);
    by.get(n).push(o);
  }
  const lines = [];
  for (const [n, list] of by) {
    if (list.length <= 3) {
      const parts = list.map((o) =>
        o.type === "BOOKMARK"
          ? `<span class="t-BOOKMARK">BOOKMARK</span> @${rvText(o.rv)}${o.initialEventsEnd ? " <i>(initial-events-end)</i>" : ""}`
          : `<span class="t-${o.type}">${o.type}</span> ${code(o.key)} @${rvText(o.rv)}`,
      );
      lines.push(`${code(n)} ← ${parts.join(", ")}`);
    } else {
      const counts = {};
      for (const o of list) counts[o.type] = (counts[o.type] ?? 0) + 1;
      const kinds = Object.entries(counts)
        .map(([t, c]) => `${c} <span class="t-${t}">${t}</span>`)
        .join(", ");
      lines.push(`${code(n)} ← ${list.length} events (${kinds}; RV ${rvText(list[0].rv)}–${rvText(list[list.length - 1].rv)})`);
    }
  }
  return lines;
}

/** The consequences visible in the outputs, one bullet each (shared by every op). */
function outcomeBullets(outputs, nameOf, skipIds = new Set()) {
  const out = [];
  const del = deliveries(outputs, nameOf);
  if (del.length) out.push(`Delivered: ${del.join("; ")}.`);
  for (const o of outputs) {
    const who = o.id !== undefined ? code(nameOf(o)) : "";
    if (o.id !== undefined && skipIds.has(o.id)) continue;
    switch (o.type) {
      case "BOOKMARK":
        break;
      case "ERROR":
        out.push(`${who} gets an ERROR event inside its stream: ${statusText(o)}`);
        break;
      case "CLOSED":
        if (o.cause !== "error") out.push(`${who} is ${CLOSE_TEXT[o.cause] ?? o.cause}`);
        break;
      case "REJECTED":
        out.push(`${who} is rejected: ${statusText(o)} <span class="msg">${esc(o.message ?? "")}</span>`);
        break;
      case "LIST":
      case "GET":
      case "RANGE":
        out.push(readText(o, who));
        break;
      case "WATCH":
        out.push(`${who} is sent to etcd: ${esc(o.reason)}.`);
        break;
      case "REQUEST_PROGRESS":
        break;
      case "NEED_CURRENT_RV":
        out.push(`${who} needs etcd's current revision first (Kubernetes asks with a quorum LIST, limit 1); the host answers it.`);
        break;
      case "RELIST":
        out.push(`The cache asks its reflector to <b>relist</b> (${esc(o.reason)}).`);
        break;
      default:
        break;
    }
  }
  const progress = outputs.filter((o) => o.type === "REQUEST_PROGRESS").length;
  if (progress)
    out.push(
      `The cache asked etcd for a progress notify${progress > 1 ? ` ${progress} times` : ""} (every 100 ms while a request waits to be fresh: that is how a consistent read from the cache learns that it has caught up).`,
    );
  return out;
}

/** A LIST or GET decision in words. */
export function readText(o, who) {
  if (o.source === "cache") {
    const n = o.items?.length ?? 0;
    let extra = "";
    if (o.count !== undefined) extra += `, count ${o.count}${o.more ? ", more" : ""}`;
    if (o.continue) extra += `, with a continue token${o.remaining !== undefined ? ` (${o.remaining} remaining)` : ""}`;
    return `${who} ${o.type} is <b class="src-cache">served from the cache</b> at RV ${rvText(o.rv)} (${n} item${n === 1 ? "" : "s"}${extra}): ${esc(o.reason)}.`;
  }
  return `${who} ${o.type} goes <b class="src-storage">to etcd</b>: ${esc(o.reason)}.`;
}

/** What changed in the ring, the gate, the cache RV and the watchers between two snapshots. */
function stateBullets(before, after, nameOfId, opIsReplace) {
  const out = [];
  if (!before || !after) return out;
  const b = before.win;
  const a = after.win;
  if (a.capacity > b.capacity)
    out.push(
      `The ring was full and its oldest event is younger than ${secText(after.freshMs)} (eventFreshDuration, 75 s), so capacity <b>doubles</b>: ${b.capacity} → ${a.capacity} (dynamic capacity; upper bound ${after.upperBound}).`,
    );
  else if (a.capacity < b.capacity)
    out.push(
      `The ring was full and even its newest quarter is older than ${secText(after.freshMs)}, so capacity <b>halves</b>: ${b.capacity} → ${a.capacity} (never below the lower bound ${after.lowerBound}).`,
    );
  if (!opIsReplace && a.startIndex > b.startIndex) {
    const n = Number(a.startIndex - b.startIndex);
    out.push(
      `${n === 1 ? "One event was" : `${n} events were`} evicted from the ring: the window now starts at RV ${rvText(a.oldestRv)}, so a watch needs RV ≥ ${a.oldestServable !== undefined ? rvText(a.oldestServable - 1n) : "–"} (oldest−1) or it gets 410.`,
    );
  }
  if (before.ready !== after.ready) {
    if (after.ready === "ready") out.push('The <b>ready gate opens</b>: the cache serves again, and parked requests proceed.');
    else if (after.ready === "pending") out.push('The <b>ready gate closes</b> ("pending") until the relist completes.');
    else out.push("The cacher is <b>stopped</b> for good.");
  }
  if (after.rv !== before.rv && !opIsReplace) out.push(`The cache's resourceVersion is now ${rvText(after.rv)}.`);
  if (after.parked !== before.parked)
    out.push(`${after.parked} request${after.parked === 1 ? "" : "s"} parked (waiting for the gate, for etcd's revision, or for freshness).`);
  for (const [id, w] of after.watchers) {
    const prev = before.watchers.get(id);
    const n = code(nameOfId(id));
    if (!prev || prev.state === w.state) continue;
    if (w.state === "blocked")
      out.push(
        `${n}'s queue is full (${w.queued}/${w.queueCapacity}): it is <b>blocked</b>. Dispatch takes the shared time budget available (${before.budget} ms: it refills 50 ms per second, up to 100 ms) and waits for ${n} at most that long${before.budget === 0 ? " — here nothing, so it is cut off at once" : ""}; the other watchers are not delayed.`,
      );
    else if (w.state === "lagging")
      out.push(`${n} falls behind (etcd policy <i>lag</i>): it stops queueing and keeps a position in the ring; it will be replayed from there when its client reads again.`);
    else if (w.state === "draining")
      out.push(
        `${n} is cut off as <b>unresponsive</b> (Kubernetes policy <i>terminate</i>): the budget ran out. Its client can still read the ${w.queued} events already in its result channel, then the stream ends.`,
      );
    else if (w.state === "active" && prev.state === "lagging") out.push(`${n} has caught up and takes live events again.`);
    else if (w.state === "active" && prev.state === "blocked") out.push(`${n} made room in time: it is active again.`);
  }
  return out;
}

/** The intro sentence of each op. */
function intro(step, before, after, ctx) {
  switch (step.op) {
    case "replace": {
      const n = (step.objects ?? []).length;
      return `etcd's <b>LIST</b> completed at RV ${step.rv} with ${n} object${n === 1 ? "" : "s"} (the reflector's ${before && before.listRv > 0n ? "relist" : "initial list"}). The cache replaces its store, empties the ring (startIndex = endIndex: the indices never go back), and sets listResourceVersion = resourceVersion = ${step.rv}.`;
    }
    case "put": {
      const existed = ctx.existed;
      return `etcd's watch reports a <b>put</b> of ${code(step.object.key)} at RV ${step.rv} (${existed ? "an update" : "a create"}). The cache appends it to the ring buffer at slot endIndex mod capacity, updates its store, and dispatches it to every watcher whose key range and selectors match — ADDED or MODIFIED for each, DELETED for one whose selector no longer matches.`;
    }
    case "delete":
      return `etcd's watch reports a <b>delete</b> of ${code(step.key)} at RV ${step.rv}. Watchers that saw the object get DELETED with its last stored value and the deletion RV.`;
    case "txn":
      return `One etcd revision (${step.rv}) with ${step.ops.length} changes: the cache keeps it whole, every change at the same RV.`;
    case "progress":
      return `etcd sends a <b>progress notify</b> at RV ${step.rv}: nothing changed under this prefix, but etcd is at ${step.rv}. The cache's RV advances (KEP-1904); nothing is fanned out, but the next bookmark carries it.`;
    case "storage_error":
      return `The cacher's watch on etcd <b>broke</b>${step.reason ? ` (${esc(step.reason)})` : ""}. Its reflector must list again: the gate closes, every watcher is terminated, and the cache asks for a relist (Kubernetes retries startCaching every 1 s).`;
    case "etcd_rv":
      return `etcd's current revision is now ${step.rv} (other resources wrote to etcd; revisions are global). The cache does not know yet; it will ask when it needs a consistent RV.`;
    case "compact":
      return `etcd <b>compacts</b> its history at revision ${step.rv}: older revisions are gone from etcd, and the cache drops its list snapshots below it (v1.34).`;
    case "watch": {
      const bits = [];
      if (step.send_initial_events !== undefined && step.send_initial_events !== null) bits.push(`sendInitialEvents=${step.send_initial_events}`);
      if (step.allow_bookmarks) bits.push("allowWatchBookmarks");
      if (step.label_selector) bits.push(`labelSelector ${code(step.label_selector)}`);
      if (step.field_selector) bits.push(`fieldSelector ${code(step.field_selector)}`);
      if (step.timeout_ms) bits.push(`timeout ${step.timeout_ms} ms`);
      if (step.consume === "manual") bits.push("a client that reads only when told");
      if (step.slow_policy === "lag") bits.push("slow policy <i>lag</i> (etcd)");
      return `A client <b>watches</b> ${code(step.key)} from resourceVersion ${code(rvOf(step.rv))}${bits.length ? `, ${bits.join(", ")}` : ""}.`;
    }
    case "consume":
      return `The client of ${code(step.id)} reads ${step.max ? `up to ${step.max} events` : "everything queued"}${ctx.consumed !== undefined ? ` (${ctx.consumed} read)` : ""}.`;
    case "credit":
      return `The client of ${code(step.id)} is given credit for ${step.n} more events.`;
    case "stop_watch":
      return `The client of ${code(step.id)} goes away.`;
    case "list": {
      const bits = [`resourceVersion ${code(rvOf(step.rv))}`];
      if (step.rv_match) bits.push(`resourceVersionMatch=${step.rv_match}`);
      if (step.limit) bits.push(`limit=${step.limit}`);
      if (step.continue) bits.push("a continue token");
      if (step.label_selector) bits.push(`labelSelector ${code(step.label_selector)}`);
      if (step.field_selector) bits.push(`fieldSelector ${code(step.field_selector)}`);
      return `A client <b>lists</b> ${code(step.key)} with ${bits.join(", ")}. Cache or etcd?`;
    }
    case "get":
      return `A client <b>gets</b> ${code(step.key)} with resourceVersion ${code(rvOf(step.rv))}. Cache or etcd?`;
    case "range":
      return `An etcd client sends a <b>Range</b> (the etcd host's gRPC API) for ${code(step.key)}${step.range_end !== undefined ? ` up to ${code(step.range_end)}` : ""}, ${step.revision ? `at revision ${step.revision}` : "at the latest revision"}${step.linearizable ? ", linearizable" : ", serializable"}${step.limit ? `, limit ${step.limit}` : ""}. Served from the cache when that is what etcd would answer.`;
    case "advance":
      return `Time passes to ${secText(step.at)}. Timers due by then fire at their own deadlines: the dispatcher's 1 s tick (bookmarks), watch timeouts, freshness waits (3 s), progress requests (every 100 ms while a read waits), the budget of a blocked watcher. The dispatch budget refills 50 ms per second, up to 100 ms.`;
    case "stop_cacher":
      return "The cacher <b>stops</b> for good: its watchers are closed and every later request fails.";
    default:
      return esc(step.op);
  }
}

/** The fate of a new watch, from its own outputs. */
function watchFate(step, outputs, id, before, after) {
  const mine = outputs.filter((o) => o.id === id);
  if (mine.some((o) => o.type === "REJECTED" || o.type === "ERROR" || o.type === "WATCH")) return null; // the generic bullets say it
  const started = mine.find((o) => o.type === "STARTED");
  const initial = mine.filter((o) => ["ADDED", "MODIFIED", "DELETED"].includes(o.type)).length;
  if (started) {
    if (started.initial === "ring" && initial === 0)
      return `It starts at RV ${rvText(started.rv)}; nothing in the ring is newer yet, so it gets what comes next.`;
    if (started.initial === "ring")
      return `It starts at RV ${rvText(started.rv)} and <b>replays the ring</b>: the ${initial} buffered event${initial === 1 ? "" : "s"} after RV ${rvText(started.rv)}, then the live stream.`;
    if (started.initial === "store")
      return `It gets the <b>current state from the store</b>: ${initial} object${initial === 1 ? "" : "s"} as ADDED events (initial events), then the live stream after RV ${rvText(started.rv)}.`;
    if (/^[1-9][0-9]*$/.test(String(step.rv ?? "")))
      return `Nothing in the ring is newer than RV ${rvText(started.rv)} yet: there is nothing to replay, it gets what comes next.`;
    return `It <b>starts now</b> at RV ${rvText(started.rv)}: no initial events, only what comes next.`;
  }
  if (after && before && after.parked > before.parked) {
    if (after.ready !== "ready") return "It <b>waits for the ready gate</b> (v1.30 blocks the request until the cache is initialised; v1.34 would answer 429).";
    return `It <b>waits</b> until the cache has caught up with RV ${esc(rvOf(step.rv))} — at most 3 s (the freshness wait), then 504.`;
  }
  if (after && after.watchers.has(id)) return "It is registered and waits for events.";
  return null;
}

/**
 * The explanation of a step: `{title, html}`. `outputs` are raw outputs (numeric ids; a
 * REJECTED of a request refused at once has `name`), `nameOf(output)` names an output's
 * request, `before`/`after` are snapshots (see App.snapshot).
 */
export function explainStep(step, outputs, nameOf, before, after, ctx = {}) {
  const paras = [];
  paras.push(`<p>${intro(step, before, after, ctx)}</p>`);
  const bullets = [];
  if (step.op === "watch") {
    const newId = outputs.find((o) => nameOf(o) === step.id)?.id;
    const fate = watchFate(step, outputs, newId, before, after);
    if (fate) bullets.push(fate);
    if (step.send_initial_events !== undefined && step.send_initial_events !== null && ctx.watchList === false)
      bullets.push("Here the WatchList feature gate is off (alpha in v1.30), so <code>sendInitialEvents</code> is dropped and the request is a legacy watch.");
  }
  if (["list", "get", "range"].includes(step.op) && !outputs.some((o) => nameOf(o) === step.id && ["LIST", "GET", "RANGE", "REJECTED"].includes(o.type))) {
    if (after && before && after.parked > before.parked)
      bullets.push(
        after.ready !== "ready"
          ? "It <b>waits for the ready gate</b> (v1.30 behaviour)."
          : "It <b>waits</b> until the cache is fresh enough (at most 3 s; in v1.34 a consistent read falls back to etcd on timeout).",
      );
  }
  if (step.op === "put" || step.op === "delete" || step.op === "txn") {
    // Watchers that got no delivery: either their client has not read yet (the event waits
    // in their queue), or the event is not for them (key range, selectors, or not newer).
    const receivers = new Set(outputs.filter((o) => ["ADDED", "MODIFIED", "DELETED"].includes(o.type)).map((o) => o.id));
    const queued = [];
    const idle = [];
    for (const [id, w] of after?.watchers ?? []) {
      const prev = before?.watchers.get(id);
      if (!prev || receivers.has(id)) continue;
      if (w.queued > prev.queued) queued.push(`${code(ctx.nameOfId(id))} (${w.queued}/${w.queueCapacity})`);
      else if (w.state === "active" && prev.state === "active") idle.push(code(ctx.nameOfId(id)));
    }
    if (queued.length && queued.length <= 6)
      bullets.push(`Queued for ${queued.join(", ")}: ${queued.length === 1 ? "its client has" : "their clients have"} not read yet.`);
    if (idle.length && idle.length <= 6)
      bullets.push(`Not for ${idle.join(", ")}: ${idle.length === 1 ? "its" : "their"} key range or selectors do not match (or the event is not newer than ${idle.length === 1 ? "its" : "their"} RV).`);
  }
  if (step.op === "put" || step.op === "txn") {
    const left = outputs.filter((o) => o.type === "DELETED").map((o) => code(nameOf(o)));
    if (left.length && step.op === "put")
      bullets.push(`${left.join(", ")} get${left.length === 1 ? "s" : ""} <b>DELETED</b> although the object still exists: it no longer matches ${left.length === 1 ? "that watcher's" : "their"} selector, so for ${left.length === 1 ? "it" : "them"} the object is gone (with its previous content, at the new RV).`);
    const entered = ctx.existed ? outputs.filter((o) => o.type === "ADDED").map((o) => code(nameOf(o))) : [];
    if (entered.length) bullets.push(`${entered.join(", ")} get${entered.length === 1 ? "s" : ""} <b>ADDED</b> for an object that already existed: it now matches ${entered.length === 1 ? "that watcher's" : "their"} selector.`);
  }
  const bm = outputs.filter((o) => o.type === "BOOKMARK");
  if (bm.length && step.op === "advance") bullets.push(bookmarkText(bm));
  bullets.push(...outcomeBullets(outputs, nameOf));
  bullets.push(...stateBullets(before, after, ctx.nameOfId ?? String, step.op === "replace"));
  if (bullets.length) paras.push(`<ul>${bullets.map((b) => `<li>${b}</li>`).join("")}</ul>`);
  return paras.join("");
}

/** Bookmarks in words. */
function bookmarkText(bm) {
  const end = bm.some((o) => o.initialEventsEnd);
  return `${bm.length} bookmark${bm.length === 1 ? "" : "s"} went out on the dispatcher's <b>1 s tick</b> (jittered 1–1.25 s): each tells its watcher "you are up to date to RV ${rvText(bm[bm.length - 1].rv)}", so it can resume from there without a 410. A watcher's next bookmark is due every bookmark frequency (1 min in Kubernetes), from 1 s time buckets.${end ? " One is annotated <code>k8s.io/initial-events-end</code>: the initial state of a watch-list is complete." : ""}`;
}

/** What timers did before a step (bookmarks, timeouts, freshness waits ending). */
export function explainTimers(outputs, nameOf, fromMs, toMs) {
  if (!outputs.length) return "";
  const bullets = outcomeBullets(outputs, nameOf);
  const bm = outputs.filter((o) => o.type === "BOOKMARK");
  if (bm.length) bullets.unshift(bookmarkText(bm));
  if (!bullets.length) return "";
  return `<p class="timers">Between ${secText(fromMs)} and ${secText(toMs)}, timers fired:</p><ul>${bullets.map((b) => `<li>${b}</li>`).join("")}</ul>`;
}
