// Type-checked with tsc --strict (moduleResolution bundler, condition "browser", DOM): the
// browser build by name, as a bundled page imports it.
import init, { replayJson, version, type InitOutput } from "watchcache-wasm";
import wasmUrl from "watchcache-wasm/watchcache_bg.wasm";

const out: InitOutput = await init({ module_or_path: wasmUrl });
document.body.textContent = `${version()} ${replayJson('{"steps": []}')} ${out.memory.buffer.byteLength}`;
