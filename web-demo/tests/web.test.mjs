// Browser tests of the teaching page, in headless Chromium driven by playwright-core.
//
// They serve web-demo/dist on a free loopback port (scripts/serve.mjs), load the page, wait
// for <body data-ready="true">, drive it through its controls and check what it shows:
// window bounds, a 410 on a too-old watch, bookmarks, a slow watcher closed as unresponsive,
// list decisions, a relist; no console errors and no page errors; and the frame rate while
// the 10 000 events/s load runs. Screenshots go to artifacts/web/.
//
// Environment: CHROMIUM (default /usr/bin/chromium), WEB_DIST (default web-demo/dist),
// ARTIFACTS (default artifacts/web at the repository root).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { serve } from "../scripts/serve.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const dist = process.env.WEB_DIST ?? join(here, "..", "dist");
const artifacts = process.env.ARTIFACTS ?? join(root, "artifacts", "web");
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const VIEWPORT = { width: 1440, height: 1100 };

let server;
let browser;
let base;

before(async () => {
  assert.ok(existsSync(join(dist, "index.html")), `${dist}/index.html is missing: run \`make web\` first`);
  assert.ok(existsSync(executablePath), `${executablePath} is missing: apt-get install -y chromium`);
  mkdirSync(artifacts, { recursive: true });
  server = await serve(dist, 0, "127.0.0.1");
  base = `http://127.0.0.1:${server.address().port}/`;
  browser = await chromium.launch({
    executablePath,
    // Without the background-networking flags Chromium misbehaves on a closed network.
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
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

test("playground: restart etcd closes the gate, terminates the watchers, relists (429 in v1.34)", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await page.click('#profile button[data-profile="v1.34"]');
  await page.click("text=fast watcher");
  await page.click("#b-restart");
  await seeStage(page, { ready: "pending" });
  await page.waitForSelector('[data-testid="lane-w1"][data-state="closed"]');
  await see(page, lane(page, "w1"), /reinitializing/);
  await page.click("text=RV 0: state + stream");
  await see(page, lane(page, "w2"), /429 TooManyRequests/);
  await see(page, "#explain", /Retry-After/);
  await shot(page, "08-restart-etcd-429.png");
  // etcd is back after 1.5 s; the reflector retries every 1 s: the relist happens at 2 s.
  for (let i = 0; i < 2; i++) await page.click('[data-adv="1000"]');
  await seeStage(page, { ready: "ready" });
  await see(page, "#explain", /relisted/);
  await done(ctx);
});

test("load: 10 000 events/s while animating at about 60 frames per second", async () => {
  const ctx = await openPage();
  const { page } = ctx;
  await page.click("text=fast watcher");
  await page.click("text=selector app=web");
  await page.click("text=slow (lag)");
  await page.click("#load");
  await page.waitForTimeout(700); // warm up
  // Collect requestAnimationFrame timestamps in the page for 3 s while the load runs.
  const result = await page.evaluate(async () => {
    const app = window.__demo.app;
    const w0 = app.load.written;
    app.recordFrames();
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, 3000));
    const frames = app.stopFrames();
    return { frames, written: app.load.written - w0, secs: (performance.now() - t0) / 1000 };
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
  assert.ok(median <= 20, `median frame interval ${median} ms > 20 ms`);
  assert.ok(rate >= 9000, `only ${rate} events/s written`);
  const d = await stageData(page);
  assert.ok(Number(d.capacity) >= 4096, `the ring grew (capacity ${d.capacity})`);
  await seeAttr(page, '[data-testid="lane-w1"]', "data-state", "active");
  await done(ctx);
});
