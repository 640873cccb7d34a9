// Browser tests of the teaching page, in headless Chromium driven by playwright-core.
//
// They serve web-demo/dist on a free loopback port (scripts/serve.mjs), load the page, wait
// for <body data-ready="true">, drive it through its controls and check what it shows:
// window bounds, a 410 on a too-old watch, bookmarks, a slow watcher closed as unresponsive,
// list decisions, a relist; no console errors and no page errors; the frame rate while
// the 10 000 events/s load runs; and the What-if tab (simulate() in a web worker: its plots
// and totals equal the report Node computes for the same workload, the rule's verdict, bad
// workloads, the page's thread kept free). Screenshots go to artifacts/web/.
//
// Environment: CHROMIUM (default /usr/bin/chromium), WEB_DIST (default web-demo/dist),
// ARTIFACTS (default artifacts/web at the repository root).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { serve } from "../scripts/serve.mjs";
import { executablePath, launchChromium, startLoad } from "../scripts/chromium.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const dist = process.env.WEB_DIST ?? join(here, "..", "dist");
const artifacts = process.env.ARTIFACTS ?? join(root, "artifacts", "web");
const VIEWPORT = { width: 1440, height: 1100 };
// The same wasm package built for Node: what the What-if tab shows must be its report.
const wcNode = createRequire(import.meta.url)("watchcache-wasm");
const workload = (f) => JSON.parse(readFileSync(join(root, "scenarios", "simulate", f), "utf8"));

let server;
let browser;
let base;

/**
 * Runs `fn` with `make test`'s background build of the Kubernetes oracles stopped (the
 * Makefile's oracle-build-start: a session of its own whose leader's pid is in
 * .tools/oracle-build/pid, with a status file once it ended). A frame rate is the page's on two
 * cores, so a compiler beside it is stopped while the rate is measured, and continued after
 * (oracle-build-wait continues it too, should this process die in between).
 */
async function withOracleBuildPaused(fn) {
  const bg = join(root, ".tools", "oracle-build");
  let pgid = null;
  if (existsSync(join(bg, "pid")) && !existsSync(join(bg, "status"))) {
    const pid = Number(readFileSync(join(bg, "pid"), "utf8").trim());
    if (Number.isInteger(pid) && pid > 1 && pid !== process.pid) {
      try {
        process.kill(-pid, "SIGSTOP");
        pgid = pid;
      } catch {
        // it has ended
      }
    }
  }
  try {
    return await fn();
  } finally {
    if (pgid !== null) {
      try {
        process.kill(-pgid, "SIGCONT");
      } catch {
        // it has ended
      }
    }
  }
}

before(async () => {
  assert.ok(existsSync(join(dist, "index.html")), `${dist}/index.html is missing: run \`make web\` first`);
  assert.ok(existsSync(executablePath), `${executablePath} is missing: apt-get install -y chromium`);
  mkdirSync(artifacts, { recursive: true });
  server = await serve(dist, 0, "127.0.0.1");
  base = `http://127.0.0.1:${server.address().port}/`;
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await new Promise((ok) => (server ? server.close(ok) : ok()));
});

/** A fresh page on the demo, ready, with its console errors and page errors collected. */
async function openPage() {
  const page = await browser.newPage({ viewport: VIEWPORT });
  const problems = [];
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console.error: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  page.setDefaultTimeout(5000);
  await page.goto(base);
  await page.waitForSelector("body[data-ready=true]", { timeout: 15000 });
  return { page, problems };
}

async function shot(page, name) {
  await page.screenshot({ path: join(artifacts, name) });
}

async function done({ page, problems }) {
  await page.close();
  assert.deepEqual(problems, [], "no console errors, page errors or failed requests");
}

/**
 * Waits until the text of `target` (a selector or a locator) matches `re`, then asserts it.
 * The page draws in requestAnimationFrame, so what a click changes shows a frame later.
 */
async function see(page, target, re, timeout = 5000) {
  const loc = typeof target === "string" ? page.locator(target) : target;
  const end = Date.now() + timeout;
  let text = "";
  while (Date.now() < end) {
    text = (await loc.textContent()) ?? "";
    if (re.test(text)) return text;
    await page.waitForTimeout(40);
  }
  assert.match(text, re);
  return text;
}

/** The same for an attribute. */
async function seeAttr(page, target, name, value, timeout = 5000) {
  const loc = typeof target === "string" ? page.locator(target) : target;
  const end = Date.now() + timeout;
  let v;
  while (Date.now() < end) {
    v = await loc.getAttribute(name);
    if (v === value) return;
    await page.waitForTimeout(40);
  }
  assert.equal(v, value, `${name} of ${target}`);
}

const lane = (page, name) => page.locator(`[data-testid="lane-${name}"]`);
const stageData = (page) => page.$eval("#stage", (el) => ({ ...el.dataset }));

/** Waits until the stage's data attributes (window bounds, capacity, gate) include `want`. */
async function seeStage(page, want, timeout = 5000) {
  const end = Date.now() + timeout;
  let d;
  while (Date.now() < end) {
    d = await stageData(page);
    if (Object.entries(want).every(([k, v]) => d[k] === v)) return d;
    await page.waitForTimeout(40);
  }
  assert.deepEqual(Object.fromEntries(Object.keys(want).map((k) => [k, d[k]])), want);
  return d;
}

/** Opens a scenario from the library. */
async function openScenario(page, file) {
  await page.click("#tab-scen");
  await page.click(`.lib-item[data-file="${file}"] button`);
  await page.waitForSelector(`#scen-check[data-file="${file}"]`);
}

test("every scenario of the library steps through exactly as replay() and its golden trace", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await page.click("#tab-scen");
  const files = await page.$$eval(".lib-item", (ls) => ls.map((l) => l.dataset.file));
  assert.ok(files.length >= 50, `${files.length} scenarios in the library`);
  const bad = [];
  for (const f of files) {
    await openScenario(page, f);
    if (!(await page.getAttribute("#scen-check", "class")).includes("ok")) bad.push(`${f}: ${await page.textContent("#scen-check")}`);
    await page.click("#s-end");
    if (/This step failed/.test(await page.textContent("#explain"))) bad.push(`${f}: a step failed`);
  }
  assert.deepEqual(bad, []);
  await done(ctx);
});

test("the first view: a cacher that listed etcd and opened its gate", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await seeStage(page, { ready: "ready", capacity: "8" });
  await see(page, "#store-count", /4 objects/);
  await see(page, "#explain", /gate opens/);
  await see(page, ".gate-state", /ready/);
  await shot(page, "01-first-view.png");
  await done(ctx);
});

test("scenario: window bounds, and 410 Expired on a too-old watch; back rebuilds", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await openScenario(page, "watch_too_old_rv_gets_410.json");
  await see(page, "#scen-check", /✓ stepping = replay\(\) = golden trace/);
  // Step to the watch from RV 8 (step 3): 410, since the window starts at listRV+1 = 10.
  for (let i = 0; i < 3; i++) await page.click("#s-step");
  await assert.doesNotReject(lane(page, "w-8").waitFor());
  await see(page, lane(page, "w-8"), /410 Expired/);
  await see(page, "#explain", /410 Expired/);
  // Everything: a capacity-3 ring holding RV 11–13 after one eviction.
  await page.click("#s-end");
  await see(page, "#s-pos", /step 10 \/ 10/);
  await seeStage(page, { capacity: "3", len: "3", oldest: "11", newest: "13" });
  await see(page, ".ring-range", /RV 11 – 13/);
  await see(page, ".ring-evicted", /evicted since relist/);
  await see(page, lane(page, "w-9-after-eviction"), /410 Expired/);
  await see(page, lane(page, "w-12"), /ADDED \/pods\/ns\/d @13/);
  await shot(page, "02-scenario-410-window.png");
  // Back: a fresh Cacher replayed to step 9; the last watch has not happened yet.
  await page.click("#s-back");
  await see(page, "#s-pos", /step 9 \/ 10/);
  assert.equal(await lane(page, "w-12").count(), 0);
  await seeStage(page, { oldest: "11", newest: "13" });
  // Back to step 3: before the eviction, the ring held RV 10 only.
  await page.click("#steps li[data-i='2']");
  await seeStage(page, { len: "1", oldest: "10", newest: "10" });
  await done(ctx);
});

test("scenario: bookmarks on the 1 s tick, only for watchers that allow them", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await openScenario(page, "bookmarks_periodic_with_frequency.json");
  await page.click("#s-end");
  await see(page, lane(page, "bookmarks"), /5 bm/);
  await see(page, lane(page, "bookmarks"), /BOOKMARK @12/);
  assert.doesNotMatch(await lane(page, "no-bookmarks").textContent(), /bm/);
  await see(page, "#explain", /1 s tick/);
  const logTypes = await page.$$eval("#log .log-line", (ls) => ls.map((l) => l.dataset.type));
  assert.equal(logTypes.filter((t) => t === "BOOKMARK").length, 8); // as in the golden trace
  await shot(page, "03-scenario-bookmarks.png");
  await done(ctx);
});

test("scenario: a slow watcher is closed as unresponsive once the budget is spent", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await openScenario(page, "slow_watcher_terminated_after_budget.json");
  // Step 25: the 22nd event finds the queue full (21): blocked, the budget is being spent.
  await page.click("#steps li[data-i='24']");
  await page.waitForSelector('[data-testid="lane-never-reads"][data-state="blocked"]');
  await see(page, "#explain", /blocked/);
  await shot(page, "04-slow-watcher-blocked.png");
  await page.click("#s-end");
  await see(page, lane(page, "never-reads"), /closed: unresponsive/);
  await see(page, lane(page, "reader"), /30 ev/);
  await see(page, "#explain", /unresponsive/);
  await shot(page, "05-slow-watcher-closed.png");
  await done(ctx);
});

test("playground: a slow watcher is cut off (terminate) while another lags and catches up (lag)", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  // The budget starts empty and refills 50 ms per second: after 10 s it is full (100 ms).
  await page.click('[data-adv="10000"]');
  await page.click("text=slow (terminate)");
  await page.click("text=slow (lag)");
  await page.click("text=fast watcher");
  for (let i = 0; i < 5; i++) await page.click("#b-burst"); // 25 writes > 21 queued events
  await page.waitForSelector('[data-testid="lane-w1"][data-state="blocked"]');
  await page.waitForSelector('[data-testid="lane-w2"][data-state="lagging"]');
  await page.click('[data-adv="1000"]'); // the budget timer fires: w1 is cut off
  await page.waitForSelector('[data-testid="lane-w1"][data-state="draining"]');
  await shot(page, "06-playground-slow-watchers.png");
  // w1's client reads what is left, then its stream ends; w2 catches up from the ring.
  await lane(page, "w1").locator("text=read all").click();
  await lane(page, "w1").locator("text=read all").click({ timeout: 1000 }).catch(() => {});
  await page.waitForSelector('[data-testid="lane-w1"][data-state="closed"]');
  await see(page, lane(page, "w1"), /closed: unresponsive/);
  await lane(page, "w2").locator("text=read all").click();
  await page.waitForSelector('[data-testid="lane-w2"][data-state="active"]');
  await see(page, lane(page, "w3"), /25 ev/);
  await done(ctx);
});

test("playground: list decisions in v1.30 and v1.34, with their reasons", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await page.click("text=RV 0, limit 2");
  const l1 = page.locator('[data-testid="req-list1"]');
  await seeAttr(page, l1, "data-source", "cache");
  await see(page, l1, /resourceVersion 0 is served from the cache; the limit is ignored/);
  await page.click('#list-presets >> text=RV ""');
  const l2 = page.locator('[data-testid="req-list2"]');
  await seeAttr(page, l2, "data-source", "storage");
  await see(page, l2, /consistent read, served by storage/);
  await page.click("#list-presets >> text=Exact");
  await see(page, page.locator('[data-testid="req-list3"]'), /Exact is served by storage/);
  // v1.34: the consistent read asks etcd's revision and a progress notify, then the cache serves it.
  await page.click('#profile button[data-profile="v1.34"]');
  await page.click("#b-other"); // etcd's revision moves on: the cache must catch up first
  await page.click('#list-presets >> text=RV ""');
  const l4 = page.locator('[data-testid="req-list1"]');
  await seeAttr(page, l4, "data-source", "waiting");
  await page.click('[data-adv="100"]');
  await page.click('[data-adv="100"]');
  await seeAttr(page, l4, "data-source", "cache");
  await see(page, l4, /consistent read served from the cache once it caught up with storage/);
  await shot(page, "07-list-decisions-v1.34.png");
  await done(ctx);
});

test("playground: the v1.37 profile starts a v1.37 cacher", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await page.click('#profile button[data-profile="v1.37"]');
  await seeAttr(page, page.locator('#profile button[data-profile="v1.37"]'), "aria-checked", "true");
  await see(page, page.locator("body"), /A new cacher \(v1\.37\)/);
  await done(ctx);
});

test("playground: restart etcd closes the gate, terminates the watchers, relists (429 in v1.34)", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await page.click('#profile button[data-profile="v1.34"]');
  await page.click("text=fast watcher");
  await page.click("#b-restart");
  await seeStage(page, { ready: "pending" });
  await page.click("text=RV 0: state + stream");
  await see(page, lane(page, "w2"), /429 TooManyRequests/);
  await see(page, "#explain", /Retry-After/);
  await shot(page, "08-restart-etcd-429.png");
  // 1 s after the watch broke (wait.Until's period) the cacher terminates its watchers and
  // asks for a relist; etcd is back after 1.5 s, so the reflector's retry lists at 2 s.
  await page.click('[data-adv="1000"]');
  await page.waitForSelector('[data-testid="lane-w1"][data-state="closed"]');
  await see(page, lane(page, "w1"), /reinitializing/);
  await page.click('[data-adv="1000"]');
  await seeStage(page, { ready: "ready" });
  await see(page, "#explain", /relisted/);
  await done(ctx);
});

test("load: 10 000 events/s while animating at about 60 frames per second", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await startLoad(page);
  // After a warm-up, collect requestAnimationFrame timestamps in the page for 3 s while the
  // load runs.
  const result = await withOracleBuildPaused(async () => {
    await page.waitForTimeout(700);
    return page.evaluate(async () => {
      const app = window.__demo.app;
      const w0 = app.load.written;
      app.recordFrames();
      const t0 = performance.now();
      await new Promise((r) => setTimeout(r, 3000));
      const frames = app.stopFrames();
      return { frames, written: app.load.written - w0, secs: (performance.now() - t0) / 1000 };
    });
  });
  await shot(page, "09-load-10k-events-per-second.png");
  await page.click("#load");
  const iv = result.frames.slice(1).map((t, i) => t - result.frames[i]).sort((a, b) => a - b);
  const median = iv[Math.floor(iv.length / 2)];
  const p95 = iv[Math.floor(iv.length * 0.95)];
  const rate = result.written / result.secs;
  const report = { frames: result.frames.length, medianFrameMs: +median.toFixed(2), p95FrameMs: +p95.toFixed(2), fps: +(1000 / median).toFixed(1), eventsPerSecond: Math.round(rate) };
  writeFileSync(join(artifacts, "frame-rate.json"), JSON.stringify(report, null, 2) + "\n");
  console.log(`# load: ${JSON.stringify(report)}`);
  // 60 fps: the median frame at the display's 16.7 ms, with a little timer jitter allowed.
  assert.ok(median <= 17.5, `median frame interval ${median} ms > 17.5 ms (under 57 fps)`);
  assert.ok(rate >= 9000, `only ${rate} events/s written`);
  const d = await stageData(page);
  assert.ok(Number(d.capacity) >= 4096, `the ring grew (capacity ${d.capacity})`);
  await seeAttr(page, '[data-testid="lane-w1"]', "data-state", "active");
  await done(ctx);
});

// ----- What-if: simulate(workload) in a web worker ---------------------------------------------

/** Opens the What-if tab and waits for its first preset to be loaded. */
async function openWhatIf(page) {
  await page.click("#tab-whatif");
  await page.waitForFunction(() => document.getElementById("wi-preset").options.length > 1 && document.getElementById("wi-json").value.length > 2 && !document.getElementById("whatif").dataset.loading);
}

/** Selects a preset of scenarios/simulate/ and waits until the editor holds it (selecting the
 * preset already shown loads it again: an edit made before that load ends would be replaced). */
async function pickWorkload(page, file) {
  await page.selectOption("#wi-preset", file);
  await page.waitForFunction((f) => !document.getElementById("whatif").dataset.loading && document.getElementById("wi-meta").textContent.endsWith(f), file);
}

/** Presses Run and waits for the answer; returns the panel's state (done or error). */
async function runWhatIf(page, timeout = 30000) {
  await page.click("#wi-run");
  await page.waitForSelector("#whatif:is([data-state=done], [data-state=error])", { timeout });
  return page.getAttribute("#whatif", "data-state");
}

/** Each plotted series' data attributes, by series key. */
const plotted = (page) => page.$$eval("#wi-charts path.series", (ps) => Object.fromEntries(ps.map((p) => [p.dataset.series, { points: Number(p.dataset.points), sum: Number(p.dataset.sum), max: Number(p.dataset.max) }])));

/** Asserts that the plots and the totals on the page are `report`'s. */
async function assertShowsReport(page, report) {
  const got = await plotted(page);
  const keys = ["window_s", "capacity", "window_events", "watch_410", "relists", "etcd_range_requests", "connected_watchers"];
  assert.deepEqual(Object.keys(got).sort(), [...keys].sort(), "the plotted series");
  for (const k of keys) {
    const values = report.series.map((x) => Number(x[k]));
    const sum = values.reduce((a, b) => a + b, 0);
    assert.equal(got[k].points, report.series.length, `${k}: points`);
    assert.ok(Math.abs(got[k].sum - sum) <= 1e-9 * Math.max(1, Math.abs(sum)), `${k}: sum ${got[k].sum} != ${sum}`);
    assert.equal(got[k].max, Math.max(0, ...values), `${k}: max`);
  }
  // Per-second 410s and relists add up to the summary's totals.
  assert.equal(got.watch_410.sum, Number(report.summary.watch_410));
  assert.equal(got.relists.sum, Number(report.summary.relists));
  const tiles = await page.$$eval("#wi-summary .metric", (ts) => Object.fromEntries(ts.map((t) => [t.dataset.key, t.dataset.value])));
  for (const k of ["events_written", "deliveries", "watch_410", "relists", "etcd_range_requests", "etcd_range_objects", "watcher_terminations", "bookmarks_sent", "p50_delivery_lag_ms", "p99_delivery_lag_ms", "peak_ring_capacity"]) {
    const v = report.summary[k];
    assert.equal(tiles[k], v === null ? "" : String(v), `summary tile ${k}`);
  }
  const text = (await page.textContent("#whatif")) + (await page.textContent("#wi-verdict-card"));
  assert.doesNotMatch(text, /\b(NaN|undefined|null)\b/, "no unformatted values on the panel");
}

test("what-if: a preset runs in a web worker; its plots and totals are the report, the rule's verdict matches", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await openWhatIf(page);
  await pickWorkload(page, "slo_fixed_ring.json");
  // The rule, from the workload alone: W = 2 000 / 50 = 40 s < d = 45 s: every reconnect relists.
  await seeAttr(page, "#wi-verdict", "data-phase", "storm");
  await seeAttr(page, "#wi-verdict", "data-w", "40");
  await see(page, "#wi-verdict", /W = C \/ r = 2,000 \/ 50 = 40 s/);
  assert.equal(await runWhatIf(page), "done");
  const w = workload("slo_fixed_ring.json");
  const report = wcNode.simulate(w);
  await assertShowsReport(page, report);
  // The W and d reference lines on the window plot.
  assert.equal(await page.locator('[data-chart="window"] line.hline[data-y="40"]').count(), 1);
  assert.equal(await page.locator('[data-chart="window"] line.hline[data-y="45"]').count(), 1);
  // Measured: relists among reconnects (watches_started − watchers − relists), as the rule said.
  const relists = Number(report.summary.relists);
  const reconnects = Number(report.summary.watches_started) - w.watchers.count - relists;
  assert.ok(relists > 100 && relists === reconnects, `${relists} relists of ${reconnects} reconnects`);
  await seeAttr(page, "#wi-measured", "data-relists", String(relists));
  await seeAttr(page, "#wi-measured", "data-reconnects", String(reconnects));
  await seeAttr(page, "#wi-measured", "data-phase", "storm");
  await seeAttr(page, "#wi-measured", "data-agrees", "true");
  await see(page, "#wi-measured", /✓ the rule predicted it/);
  // It ran in the worker, not on the page's thread.
  await seeAttr(page, "#wi-status", "data-thread", "worker");
  await see(page, "#wi-status", /600 s simulated in \d[\d,]* ms, in a web worker/);
  assert.ok(page.workers().some((wk) => wk.url().endsWith("/js/whatif-worker.js")), "a dedicated worker runs js/whatif-worker.js");
  await shot(page, "10-whatif-fixed-ring.png");

  // Come back before W (d = 30 s < 40 s): the prediction follows the form at once, the run agrees.
  await page.fill("#wi-delay-a", "30");
  await seeAttr(page, "#wi-verdict", "data-phase", "none");
  await seeAttr(page, "#wi-measured", "data-agrees", ""); // the last run is stale now
  assert.match(await page.inputValue("#wi-json"), /"reconnect_delay_s": \{"dist": "const", "value": 30\}/);
  assert.equal(await runWhatIf(page), "done");
  w.disconnects.reconnect_delay_s.value = 30;
  const report30 = wcNode.simulate(w);
  assert.equal(Number(report30.summary.relists), 0);
  await assertShowsReport(page, report30);
  await seeAttr(page, "#wi-measured", "data-phase", "none");
  await seeAttr(page, "#wi-measured", "data-agrees", "true");

  // A dynamic ring at the same rate settles at 6 400 events: W = 128 s, d = 115 s is safe.
  await pickWorkload(page, "slo_dynamic_ring.json");
  await seeAttr(page, "#wi-verdict", "data-w", "128");
  await seeAttr(page, "#wi-verdict", "data-phase", "none");
  assert.equal(await runWhatIf(page), "done");
  await assertShowsReport(page, wcNode.simulate(workload("slo_dynamic_ring.json")));
  await seeAttr(page, "#wi-measured", "data-agrees", "true");
  await done(ctx);
});

test("what-if: a bad workload shows the simulator's error naming the field, and the page keeps working", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await openWhatIf(page);
  // The preset shown already is loaded again, slowly: the edit below must wait for it (it
  // once raced the load and was replaced by the preset, which then ran).
  await page.route("**/scenarios/simulate/slo_fixed_ring.json", async (route) => {
    await new Promise((r) => setTimeout(r, 300));
    await route.continue();
  });
  await pickWorkload(page, "slo_fixed_ring.json");
  // From the form: a negative write rate, still there after longer than the load took.
  await page.fill('[data-path="writes.rate_per_s"]', "-1");
  await page.waitForTimeout(400);
  assert.match(await page.inputValue("#wi-json"), /"rate_per_s": -1/);
  assert.equal(await runWhatIf(page), "error");
  await see(page, "#wi-error", /writes\.rate_per_s: must be a non-negative number, got -1/);
  assert.equal(await page.locator("#wi-charts svg").count(), 0, "no plots of a workload that did not run");
  assert.equal(await page.locator("#wi-summary .metric").count(), 0);
  await see(page, "#explain", /writes\.rate_per_s/);
  await shot(page, "11-whatif-bad-workload.png");
  // From the JSON editor: an unknown field, then text that is not JSON.
  await page.fill("#wi-json", '{"watchers": {"count": 2}, "foo": 1}');
  assert.equal(await runWhatIf(page), "error");
  await see(page, "#wi-error", /foo: unknown field/);
  await page.fill("#wi-json", '{"duration_s": 10,');
  await see(page, "#wi-json-status", /not JSON/);
  assert.equal(await runWhatIf(page), "error");
  await see(page, "#wi-error", /invalid JSON/);
  await page.fill("#wi-json", '{"disconnects": {"reconnect_delay_s": {"dist": "weird"}}}');
  assert.equal(await runWhatIf(page), "error");
  await see(page, "#wi-error", /disconnects\.reconnect_delay_s\.dist/);
  // A good one runs again in the same worker.
  const small = { duration_s: 20, writes: { rate_per_s: 30 }, watchers: { count: 3 } };
  await page.fill("#wi-json", JSON.stringify(small));
  assert.equal(await runWhatIf(page), "done");
  assert.equal(await page.isHidden("#wi-error"), true);
  await assertShowsReport(page, wcNode.simulate(small));
  await seeAttr(page, "#wi-verdict", "data-phase", "idle"); // no disconnects: nothing to predict
  assert.equal(await page.inputValue('[data-path="watchers.count"]'), "3");
  // The rest of the page is unaffected.
  await page.click("#tab-play");
  await seeStage(page, { ready: "ready" });
  await page.click("text=fast watcher");
  await assert.doesNotReject(lane(page, "w1").waitFor());
  await page.click("#tab-whatif");
  await seeAttr(page, "#whatif", "data-state", "done");
  await done(ctx);
});

test("what-if: the simulation runs off the page's thread, which keeps drawing; a run can be cancelled", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await openWhatIf(page);
  // A cache restart under 500 watchers, run twice as long: about a second of work or more.
  const w = workload("reconnect_storm.json");
  w.duration_s = 1200;
  await page.fill("#wi-json", JSON.stringify(w));
  await page.evaluate(() => window.__demo.app.recordFrames());
  assert.equal(await runWhatIf(page, 60000), "done");
  const frames = await page.evaluate(() => window.__demo.app.stopFrames());
  const ms = Number(await page.getAttribute("#wi-status", "data-ms"));
  await seeAttr(page, "#wi-status", "data-thread", "worker");
  const gaps = frames.slice(1).map((t, i) => t - frames[i]);
  const maxGap = Math.max(...gaps);
  const report = { simulateMs: ms, frames: frames.length, maxFrameGapMs: +maxGap.toFixed(1) };
  console.log(`# what-if off the main thread: ${JSON.stringify(report)}`);
  assert.ok(ms >= 400, `the simulation took only ${ms} ms: too short to tell`);
  // Had simulate() run on the page's thread, no frame could be drawn while it ran.
  assert.ok(maxGap < Math.min(400, ms / 2), `a ${maxGap} ms gap between frames while simulating for ${ms} ms`);
  assert.ok(frames.length >= ms / 100, `${frames.length} frames in ${ms} ms`);
  await assertShowsReport(page, wcNode.simulate(w));
  await seeAttr(page, "#wi-measured", "data-agrees", "true"); // 500 relists for the restart
  // An hour of 1 000 watchers takes seconds: cancel it; the next run gets a fresh worker.
  await pickWorkload(page, "steady_bookmarks.json");
  // Selective watchers with bookmarks every 60 s, W = 128 s, d uniform in 30–120 s: the closed
  // form of docs/slo.md says 19.8 % of the reconnects relist (the simulator: 20.2 %).
  await seeAttr(page, "#wi-verdict", "data-phase", "some");
  const share = Number(await page.getAttribute("#wi-verdict", "data-share"));
  assert.ok(Math.abs(share - 0.198) < 0.005, `predicted share ${share}`);
  await see(page, "#wi-verdict", /≈ 19\.\d % of reconnects relist/);
  assert.doesNotMatch(await page.textContent("#wi-verdict-card"), /\b(NaN|undefined|null)\b/);
  await page.click("#wi-run");
  await seeAttr(page, "#whatif", "data-state", "running");
  await page.waitForTimeout(600);
  await see(page, "#wi-status", /running in a web worker… \d/);
  await shot(page, "12-whatif-running.png");
  await page.click("#wi-cancel");
  await seeAttr(page, "#whatif", "data-state", "cancelled");
  await see(page, "#wi-status", /cancelled after/);
  assert.equal(await page.isEnabled("#wi-run"), true);
  await pickWorkload(page, "slo_bookmarks.json");
  assert.equal(await runWhatIf(page), "done");
  await assertShowsReport(page, wcNode.simulate(workload("slo_bookmarks.json")));
  await done(ctx);
});
