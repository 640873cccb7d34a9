// What the browser test (tests/web.test.mjs) and the frame profile (scripts/frame-profile.mjs)
// share, so that the profile measures the page the test asserts on: how Chromium is started,
// and the clicks that start the playground's 10 000 events/s load.
import { chromium } from "playwright-core";

/** The Chromium binary: $CHROMIUM, or Debian's. */
export const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";

/** Headless Chromium. Without the background-networking flags it misbehaves on a closed network. */
export function launchChromium() {
  return chromium.launch({
    executablePath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

/** Three watchers (fast, selective, slow with lag), then the load button. */
export async function startLoad(page) {
  await page.click("text=fast watcher");
  await page.click("text=selector app=web");
  await page.click("text=slow (lag)");
  await page.click("#load");
}
