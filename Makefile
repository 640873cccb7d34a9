# watchcache — two commands: `make run` and `make test`. Everything they need is installed here,
# idempotently, into the project (.tools/, .venv/) or through rustup/cargo.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
TOOLS := $(ROOT)/.tools
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

FUZZ_SECONDS ?= 15
NIGHTLY ?= nightly
CARGO_FUZZ_VERSION ?= 0.13.2

.PHONY: help run test lint test-rust fuzz-smoke bench setup-rust setup-fuzz clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

run: ## replay an example scenario and print its trace
	$(CARGO) run -q -p cacher-core --example replay -- scenarios/watch_too_old_rv_gets_410.json

test: lint test-rust fuzz-smoke ## formatting, lints, every test, a short fuzz run
	@echo "make test: all passed"

lint: setup-rust ## rustfmt, clippy (warnings are errors), the core's dependency rule
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p cacher-core --no-default-features -- -D warnings
	@if $(CARGO) tree -p cacher-core -e normal --prefix none | grep -E '^(tokio|pyo3|wasm-bindgen|js-sys|etcd-client|tonic) ' ; then \
	  echo "cacher-core depends on a host crate" >&2; exit 1; fi

test-rust: setup-rust ## cargo test for the whole workspace
	$(CARGO) test --workspace

fuzz-smoke: setup-fuzz ## run each fuzz target for $(FUZZ_SECONDS)s (nightly + cargo-fuzz)
	cd fuzz && for t in scenario selector ops; do \
	  mkdir -p corpus/$$t; seeds=""; [ $$t = scenario ] && seeds="$(ROOT)/scenarios"; \
	  PATH="$(TOOLS)/bin:$$PATH" $(CARGO) +$(NIGHTLY) fuzz run --sanitizer none $$t corpus/$$t $$seeds -- \
	    -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -artifact_prefix=$(ROOT)/fuzz/artifacts/ \
	    || { echo "fuzz target $$t failed: see fuzz/artifacts/ (commit the crasher under cacher-core/tests/fuzz_regressions/$$t/)" >&2; exit 1; }; \
	done

bench: setup-rust ## criterion benchmarks of the core (figures in BENCHMARKS.md)
	$(CARGO) bench -p cacher-core --bench core

setup-rust:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }

setup-fuzz: setup-rust
	@rustup toolchain list | grep -q '^$(NIGHTLY)' || rustup toolchain install $(NIGHTLY) --profile minimal
	@test -x $(TOOLS)/bin/cargo-fuzz && $(TOOLS)/bin/cargo-fuzz --version | grep -q '$(CARGO_FUZZ_VERSION)' || \
	  $(CARGO) install --locked --root $(TOOLS) cargo-fuzz --version $(CARGO_FUZZ_VERSION)
	@mkdir -p fuzz/artifacts

clean: ## remove build output (keeps installed tools)
	$(CARGO) clean
