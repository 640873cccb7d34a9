// After wasm-bindgen (make wasm): turns pkg/ (web target, ESM) and pkg-node/ (nodejs target,
// CommonJS) into the npm package `watchcache-wasm` whose root is bindings-wasm/:
// - the version in package.json is the crate's (the workspace's Cargo.toml);
// - pkg/ and pkg-node/ say which module system their .js is in (a package.json each);
// - one .wasm ships: the Node glue loads pkg/watchcache_bg.wasm;
// - every file that package.json lists or exports exists.
// Fails loudly when the generated glue is not what it expects (wasm-bindgen is pinned).
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgRoot = join(dirname(fileURLToPath(import.meta.url)), "..");
const root = join(pkgRoot, "..");
const fail = (msg) => {
  console.error(`package: ${msg}`);
  process.exit(1);
};

const cargo = readFileSync(join(root, "Cargo.toml"), "utf8");
const version = /\[workspace\.package\][^[]*?\nversion = "([^"]+)"/.exec(cargo)?.[1];
if (!version) fail("no [workspace.package] version in Cargo.toml");
const manifestPath = join(pkgRoot, "package.json");
const manifestText = readFileSync(manifestPath, "utf8");
const manifest = JSON.parse(manifestText);
if (manifest.version !== version) {
  writeFileSync(manifestPath, manifestText.replace(`"version": "${manifest.version}"`, `"version": "${version}"`));
  console.log(`package: version ${manifest.version} -> ${version} (from Cargo.toml)`);
}

writeFileSync(join(pkgRoot, "pkg", "package.json"), '{\n  "type": "module"\n}\n');
writeFileSync(join(pkgRoot, "pkg-node", "package.json"), '{\n  "type": "commonjs"\n}\n');
for (const dir of ["pkg", "pkg-node"]) rmSync(join(pkgRoot, dir, ".gitignore"), { force: true });

const glue = join(pkgRoot, "pkg-node", "watchcache.js");
const own = "const wasmPath = `${__dirname}/watchcache_bg.wasm`;";
const shared = "const wasmPath = `${__dirname}/../pkg/watchcache_bg.wasm`;";
const js = readFileSync(glue, "utf8");
if (js.includes(own)) writeFileSync(glue, js.replace(own, shared));
else if (!js.includes(shared)) fail(`${glue}: the line that loads the .wasm is not \`${own}\` (a new wasm-bindgen?)`);
rmSync(join(pkgRoot, "pkg-node", "watchcache_bg.wasm"), { force: true });

const exported = [];
const walk = (v) => (typeof v === "string" ? exported.push(v) : Object.values(v).forEach(walk));
walk(manifest.exports);
for (const f of [...manifest.files, manifest.main, manifest.module, manifest.types, ...exported]) {
  if (!existsSync(join(pkgRoot, f))) fail(`${f} is listed in package.json but missing`);
}
console.log(`package: watchcache-wasm ${version} in ${pkgRoot}`);
