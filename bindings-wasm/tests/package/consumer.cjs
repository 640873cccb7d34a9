// A CommonJS user: require() by name, every scenario replayed; prints {file: trace JSON}.
const { readdirSync, readFileSync } = require("node:fs");
const { join } = require("node:path");
const wc = require("watchcache-wasm");

const dir = process.argv[2];
const out = { version: wc.version(), traces: {} };
for (const f of readdirSync(dir).filter((f) => f.endsWith(".json") && !f.endsWith(".trace.json"))) {
  out.traces[f] = wc.replayJson(readFileSync(join(dir, f), "utf8"));
}
process.stdout.write(JSON.stringify(out));
