# The web demo (included by the top Makefile, which defines ROOT and TOOLS).
#   make web        build the static site into web-demo/dist (esbuild; the wasm package by name)
#   make test-web   browser tests in headless Chromium (playwright-core from npm)
#   make serve-web  serve web-demo/dist on http://127.0.0.1:8081/
#   make profile-web  where a frame's time goes under the 10 000 events/s load (THROTTLE=N: a slower CPU)
WEB := $(ROOT)/web-demo
WEB_DIST := $(WEB)/dist
WEB_ARTIFACTS := $(ROOT)/artifacts/web
CHROMIUM ?= /usr/bin/chromium
# Of chromium's recommended packages only what a headless page uses: its fonts and Mesa's
# software GL; not udev (and with it systemd), upower, the printer and notification daemons or
# the sandbox helper. With them, a clean machine installed 115 packages in 43 s; without them,
# on a machine without chromium, 26 (and 7 upgraded) in 21 s, and the browser tests passed.
CHROMIUM_APT := --no-install-recommends chromium fonts-liberation libgl1-mesa-dri
WEB_PORT ?= 8081

.PHONY: web test-web serve-web profile-web setup-web-node

setup-web-node:
	@command -v node >/dev/null || { echo "node not found: installing Debian's nodejs" >&2; apt-get install -y nodejs || { apt-get update && apt-get install -y nodejs; }; }
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || \
	  { echo "web-demo needs Node.js 20 or newer (found $$(node --version))" >&2; exit 1; }

web: wasm setup-web-node $(WEB)/node_modules/.package-lock.json ## build the teaching page into web-demo/dist (static files bundled by esbuild, works offline)
	node $(WEB)/scripts/build.mjs $(WEB_DIST)

# npm ci when node_modules is missing or older than the lock file (npm writes this marker).
$(WEB)/node_modules/.package-lock.json: $(WEB)/package.json $(WEB)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: installing Debian's npm" >&2; apt-get install -y npm || { apt-get update && apt-get install -y npm; }; }
	cd $(WEB) && npm ci --no-audit --no-fund
	touch $@

test-web: web setup-web-node $(WEB)/node_modules/.package-lock.json ## browser tests of the page, and of a page bundling the packed npm package, in headless Chromium (screenshots in artifacts/web)
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) not found: installing Debian's chromium" >&2; \
	  apt-get install -y $(CHROMIUM_APT) || { apt-get update && apt-get install -y $(CHROMIUM_APT); }; }
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) is still missing after apt-get install chromium" >&2; exit 1; }
	mkdir -p $(WEB_ARTIFACTS)
	cd $(WEB) && CHROMIUM=$(CHROMIUM) WEB_DIST=$(WEB_DIST) ARTIFACTS=$(WEB_ARTIFACTS) node --test --test-concurrency=1 tests/

serve-web: web setup-web-node ## serve web-demo/dist on http://127.0.0.1:8081/
	node $(WEB)/scripts/serve.mjs $(WEB_DIST) $(WEB_PORT) 127.0.0.1

profile-web: web setup-web-node $(WEB)/node_modules/.package-lock.json ## per-frame main-thread time of the page under the 10 000 events/s load (one JSON line; THROTTLE=N slows its CPU N times)
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) not found: make test-web installs it" >&2; exit 1; }
	cd $(WEB) && CHROMIUM=$(CHROMIUM) node scripts/frame-profile.mjs $(WEB_DIST)
