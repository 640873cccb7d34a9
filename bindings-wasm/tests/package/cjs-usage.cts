// Type-checked with tsc --strict (module nodenext): the package by name, from CommonJS.
import wc = require("watchcache-wasm");

const c = new wc.Cacher();
c.handleReplace(0, 1, []);
const n: number = c.storeLen;
const text: string = wc.replayJson('{"steps": []}');
// @ts-expect-error the CommonJS build needs no init(): there is none
wc.initSync;
console.log(n, text);
