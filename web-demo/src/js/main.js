// Entry point: load the WebAssembly core, the scenario index, then start the app. When the
// first view is drawn, <body data-ready="true"> tells the browser tests (and anyone) so.
import init, { Cacher, replay, version } from "watchcache-wasm";
import { App } from "./app.js";

async function main() {
  await init();
  const res = await fetch("scenarios/index.json");
  if (!res.ok) throw new Error(`scenarios/index.json: HTTP ${res.status}`);
  const index = await res.json();
  const app = new App({ Cacher, replay }, index);
  app.start();
  document.getElementById("version").textContent = `· watchcache ${version()}`;
  // Hooks for the browser tests and for curious readers' consoles.
  window.__demo = { app, Cacher, replay };
  requestAnimationFrame(() => {
    document.body.dataset.ready = "true";
  });
}

main().catch((e) => {
  // Visible, not only in the console: a teaching page must say why it cannot run.
  const p = document.createElement("p");
  p.className = "fatal";
  p.textContent = `The demo could not start: ${e.message}`;
  document.body.prepend(p);
  console.error(e);
});
