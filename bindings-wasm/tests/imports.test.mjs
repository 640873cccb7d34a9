// The core's wasm imports nothing but what wasm-bindgen generates: no WASI, no host functions.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { here } from "./helpers.mjs";

test("wasm imports only wasm-bindgen glue", () => {
  const bytes = readFileSync(join(here, "..", "pkg", "watchcache_bg.wasm"));
  const mod = new WebAssembly.Module(bytes);
  const imports = WebAssembly.Module.imports(mod);
  const modules = new Set(imports.map((i) => i.module));
  for (const m of modules) assert.ok(m === "./watchcache_bg.js" || m === "__wbindgen_placeholder__", `unexpected import module ${m}`);
  for (const i of imports) assert.match(i.name, /^__wbg|^__wbindgen/, `unexpected import ${i.name}`);
});

// wasm-bindgen names js-sys calls after the JS function (`__wbg_now_<hash>`): the prefix alone
// would let a clock or a random source in. The core is sans-IO: none of these may appear.
test("wasm imports no clock, randomness, timer or I/O from JS", () => {
  const bytes = readFileSync(join(here, "..", "pkg", "watchcache_bg.wasm"));
  const names = WebAssembly.Module.imports(new WebAssembly.Module(bytes)).map((i) => i.name.replace(/_[0-9a-f]{16}$/, ""));
  assert.ok(names.length > 0);
  const forbidden = /now|date|random|crypto|performance|timeout|interval|fetch|process|require|fs_|read|write/i;
  const bad = names.filter((n) => forbidden.test(n.replace(/^__wbg_|^__wbindgen_/, "")));
  assert.deepEqual(bad, [], `the core imports ${bad.join(", ")}`);
});
