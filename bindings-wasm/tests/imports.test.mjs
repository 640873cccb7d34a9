// The core's wasm imports nothing but what wasm-bindgen generates: no WASI, no host functions.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { here } from "./helpers.mjs";

test("wasm imports only wasm-bindgen glue", () => {
  const bytes = readFileSync(join(here, "..", "pkg-node", "watchcache_bg.wasm"));
  const mod = new WebAssembly.Module(bytes);
  const imports = WebAssembly.Module.imports(mod);
  const modules = new Set(imports.map((i) => i.module));
  for (const m of modules) assert.ok(m === "./watchcache_bg.js" || m === "__wbindgen_placeholder__", `unexpected import module ${m}`);
  for (const i of imports) assert.match(i.name, /^__wbg|^__wbindgen/, `unexpected import ${i.name}`);
});
