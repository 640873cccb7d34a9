// The package's entry for `import` in Node: the CommonJS build (pkg-node), so that `import` and
// `require()` in one process share one instance. The module is ready when imported; `init()`
// resolves at once and is there for code shared with the browser build, where it loads the
// .wasm.
import wc from "../pkg-node/watchcache.js";

export const { Cacher, replay, replayJson, simulate, version } = wc;

export default async function init() {}
