// Types of the Node `import` entry: the Node build's API, and the browser build's `init()` so
// that code shared between the two type-checks.
export * from "../pkg-node/watchcache.js";

/** Resolves at once: in Node the module is ready when imported. */
export default function init(): Promise<void>;
