// Shared by the Node tests: the built package (nodejs target) and the scenario files.
import { createRequire } from "node:module";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
export const here = dirname(fileURLToPath(import.meta.url));
export const root = join(here, "..", "..");
export const wc = require(join(here, "..", "pkg-node", "watchcache.js"));

export const scenarioDir = join(root, "scenarios");
export const scenarioFiles = readdirSync(scenarioDir)
  .filter((f) => f.endsWith(".json") && !f.endsWith(".trace.json"))
  .sort();
export const invalidFiles = readdirSync(join(scenarioDir, "invalid"))
  .filter((f) => f.endsWith(".json"))
  .sort();
export const read = (...p) => readFileSync(join(...p), "utf8");

// A JS trace as golden-file text: BigInts printed as exact JSON integers.
export function traceText(trace) {
  const lines = trace.map((r) =>
    JSON.stringify(r, (_k, v) => (typeof v === "bigint" ? `@@big@@${v}` : v)).replace(/"@@big@@(\d+)"/g, "$1"),
  );
  return lines.length ? `[\n${lines.join(",\n")}\n]\n` : "[\n]\n";
}
