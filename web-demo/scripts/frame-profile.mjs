// Where a frame's main-thread time goes while the playground's 10 000 events/s load runs:
// the same page and clicks as the browser test "load: 10 000 events/s while animating", then
// 3 s of requestAnimationFrame intervals, Chromium's own per-frame split (CDP
// Performance.getMetrics: script, style recalculation, layout, all tasks) and the time spent
// in the page's hot functions. `make profile-web`, or
//   node scripts/frame-profile.mjs [DIST]
// Environment: CHROMIUM (default /usr/bin/chromium); THROTTLE=N slows the page's CPU N times
// (CDP Emulation.setCPUThrottlingRate: a slower machine); NOOP=obj.method,... turns page
// methods into no-ops (e.g. NOOP=store.render) to see what each costs; CSS=... adds a style
// sheet. Prints one JSON line.
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { serve } from "./serve.mjs";
import { launchChromium, startLoad } from "./chromium.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const dist = process.argv[2] ?? join(here, "..", "dist");
const server = await serve(dist, 0, "127.0.0.1");
const base = `http://127.0.0.1:${server.address().port}/`;
const browser = await launchChromium();
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1100 } });
  await page.goto(base);
  await page.waitForSelector('body[data-ready="true"]');
  if (process.env.CSS) await page.addStyleTag({ content: process.env.CSS });
  await startLoad(page);
  await page.waitForTimeout(700);
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Performance.enable");
  const throttle = Number(process.env.THROTTLE ?? 1);
  if (throttle > 1) await cdp.send("Emulation.setCPUThrottlingRate", { rate: throttle });
  const metrics = async () => Object.fromEntries((await cdp.send("Performance.getMetrics")).metrics.map((m) => [m.name, m.value]));
  const m0 = await metrics();
  const noop = (process.env.NOOP ?? "").split(",").filter(Boolean);
  const r = await page.evaluate(async (noop) => {
    const app = window.__demo.app;
    const owner = (o) => (o === "app" ? app : app[o]);
    for (const p of noop) {
      const [o, m] = p.split(".");
      owner(o)[m] = () => {};
    }
    const acc = {};
    const wrap = (obj, name) => {
      const f = obj[name].bind(obj);
      obj[name] = (...a) => {
        const t = performance.now();
        try {
          return f(...a);
        } finally {
          acc[name] = (acc[name] ?? 0) + performance.now() - t;
        }
      };
    };
    wrap(app, "framePlayground");
    wrap(app.pg, "loadBatch");
    wrap(app.pg.cacher, "handlePuts");
    wrap(app.pg.cacher, "drain");
    wrap(app, "showOutputs");
    wrap(app, "render");
    const w0 = app.load.written;
    app.recordFrames();
    const t0 = performance.now();
    await new Promise((res) => setTimeout(res, 3000));
    const frames = app.stopFrames();
    const secs = (performance.now() - t0) / 1000;
    const n = frames.length;
    const perFrameMs = Object.fromEntries(Object.entries(acc).map(([k, v]) => [k, +(v / n).toFixed(2)]));
    const iv = frames.slice(1).map((t, i) => t - frames[i]).sort((a, b) => a - b);
    return { frames: n, medianFrameMs: iv[Math.floor(iv.length / 2)], p95FrameMs: iv[Math.floor(iv.length * 0.95)], eventsPerSecond: Math.round((app.load.written - w0) / secs), perFrameMs };
  }, noop);
  const m1 = await metrics();
  const chromiumPerFrameMs = {};
  for (const k of ["ScriptDuration", "RecalcStyleDuration", "LayoutDuration", "TaskDuration"]) chromiumPerFrameMs[k] = +(((m1[k] - m0[k]) * 1000) / r.frames).toFixed(2);
  console.log(JSON.stringify({ throttle, noop, ...r, chromiumPerFrameMs }));
} finally {
  await browser.close();
  server.close();
}
