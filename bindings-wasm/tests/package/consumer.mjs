// An ES module user: a static import by name, a dynamic import(), and require() in the same
// process (one instance for all three); every scenario replayed; prints {file: trace JSON}.
import { readdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import init, { Cacher, replay, replayJson, version } from "watchcache-wasm";

await init();
const dynamic = await import("watchcache-wasm");
const required = createRequire(import.meta.url)("watchcache-wasm");
if (dynamic.Cacher !== Cacher || required.Cacher !== Cacher) throw new Error("import, import() and require() gave different instances");

const dir = process.argv[2];
const out = { version: version(), traces: {} };
for (const f of readdirSync(dir).filter((f) => f.endsWith(".json") && !f.endsWith(".trace.json"))) {
  const text = readFileSync(join(dir, f), "utf8");
  out.traces[f] = replayJson(text);
  if (dynamic.replay(text).length !== replay(text).length) throw new Error(`${f}: import() and import disagree`);
}
const c = new Cacher({ capacity: 3 });
c.handleReplace(0, 9, []);
c.startWatch(1, "/pods/", { rv: "9" });
out.started = c.drain()[0].type;
process.stdout.write(JSON.stringify(out));
