// A tiny static file server (no dependencies): `node serve.mjs DIR [PORT] [HOST]`. PORT 0
// picks a free port; the chosen address is printed as "serving http://HOST:PORT/". Serves
// .wasm as application/wasm (what WebAssembly.instantiateStreaming wants).
import { createServer } from "node:http";
import { createReadStream, statSync } from "node:fs";
import { extname, join, normalize, resolve, sep } from "node:path";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json; charset=utf-8",
  ".wasm": "application/wasm",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ts": "text/plain; charset=utf-8",
  ".txt": "text/plain; charset=utf-8",
};

/** Starts serving `dir`; resolves to the http.Server once listening. */
export function serve(dir, port = 0, host = "127.0.0.1") {
  const base = resolve(dir);
  statSync(join(base, "index.html")); // fail loudly if there is nothing to serve
  const server = createServer((req, res) => {
    let path;
    try {
      path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    } catch {
      res.writeHead(400).end("bad request");
      return;
    }
    if (path.endsWith("/")) path += "index.html";
    const file = normalize(join(base, path));
    if (file !== base && !file.startsWith(base + sep)) {
      res.writeHead(403).end("forbidden");
      return;
    }
    let st;
    try {
      st = statSync(file);
    } catch {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found");
      return;
    }
    if (!st.isFile()) {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found");
      return;
    }
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream", "content-length": st.size, "cache-control": "no-cache" });
    if (req.method === "HEAD") res.end();
    else createReadStream(file).pipe(res);
  });
  return new Promise((ok, fail) => {
    server.once("error", fail);
    server.listen(port, host, () => ok(server));
  });
}

// Run directly: serve until killed.
if (process.argv[1] && resolve(process.argv[1]) === resolve(new URL(import.meta.url).pathname)) {
  const [dir = "dist", port = "8081", host = "127.0.0.1"] = process.argv.slice(2);
  serve(dir, Number(port), host)
    .then((s) => {
      const a = s.address();
      console.log(`serving http://${a.address}:${a.port}/ (${resolve(dir)})`);
    })
    .catch((e) => {
      console.error(`serve: ${e.message}`);
      process.exit(1);
    });
}
