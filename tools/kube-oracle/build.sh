#!/usr/bin/env bash
# Builds the kube-oracle binary of one profile into .tools/bin/kube-oracle-<profile>.
#
#   tools/kube-oracle/build.sh v1.30|v1.34|v1.37          (make setup-kube-oracle builds all three)
#   UPDATE_MODULES=1 tools/kube-oracle/build.sh v1.34      re-resolve the dependencies (go mod tidy)
#                                                          and write versions/<apiserver>.go.{mod,sum}
#
# Idempotent. In the git-ignored .tools/kube-oracle/<apiserver version>/:
#   apiserver/  a copy of the k8s.io/apiserver module from Go's module cache (Go refuses -overlay
#               inside the module cache), plus one file of ours in pkg/storage/cacher
#               (export/<profile>/zz_kube_oracle.go) that exports the knobs the whitebox tests set
#   driver/     the driver's sources (*.go + compat/<profile>/*.go) and a go.mod that requires that
#               k8s.io/apiserver version and replaces it with apiserver/
# Nothing from Kubernetes is committed: versions/*.go.{mod,sum} only pin module versions/hashes.
set -euo pipefail

profile=${1:?usage: build.sh v1.30|v1.34|v1.37}
case $profile in
  v1.30) apiserver=v0.30.3 ;;
  v1.34) apiserver=v0.34.13 ;;
  v1.37) apiserver=v0.37.2 ;;
  *) echo "build.sh: unknown profile $profile" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
build=$root/.tools/kube-oracle/$apiserver
bin=$root/.tools/bin/kube-oracle-$profile
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
mkdir -p "$build" "$root/.tools/bin"

# 1. The module, copied once (its content is fixed by its version; the stamp names it).
if [ "$(cat "$build/apiserver/.kube-oracle-copy" 2>/dev/null)" != "k8s.io/apiserver@$apiserver" ]; then
  src=$("$GO" mod download -json "k8s.io/apiserver@$apiserver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -d "$src" ] || { echo "build.sh: go mod download k8s.io/apiserver@$apiserver failed" >&2; exit 1; }
  rm -rf "$build/apiserver"
  cp -r "$src" "$build/apiserver"
  chmod -R u+w "$build/apiserver"
  echo "k8s.io/apiserver@$apiserver" > "$build/apiserver/.kube-oracle-copy"
fi
install_if_changed() { cmp -s "$1" "$2" 2>/dev/null || cp "$1" "$2"; }
install_if_changed "$here/export/$profile/zz_kube_oracle.go" "$build/apiserver/pkg/storage/cacher/zz_kube_oracle.go"

# 2. The driver: sources and a go.mod for this version.
mkdir -p "$build/driver"
for f in "$build"/driver/*.go; do  # drop files that are no longer sources
  [ -e "$f" ] || continue
  b=$(basename "$f")
  [ -e "$here/$b" ] || [ -e "$here/compat/$profile/$b" ] || rm -f "$f"
done
for f in "$here"/*.go "$here"/compat/"$profile"/*.go; do
  install_if_changed "$f" "$build/driver/$(basename "$f")"
done
# The driver needs Go 1.25 (testing/synctest); a newer k8s.io/apiserver may need more.
gover=$(printf '%s\n' 1.25.0 "$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$build/apiserver/go.mod")" | sort -V | tail -1)
pinned=$here/versions/$apiserver.go.mod
if [ -z "${UPDATE_MODULES:-}" ] && [ -f "$pinned" ]; then
  sed "s|@APISERVER@|$build/apiserver|" "$pinned" > "$build/driver/go.mod.new"
  install_if_changed "$build/driver/go.mod.new" "$build/driver/go.mod"
  install_if_changed "$here/versions/$apiserver.go.sum" "$build/driver/go.sum"
  rm -f "$build/driver/go.mod.new"
  export GOFLAGS=-mod=readonly
else
  cat > "$build/driver/go.mod" <<EOF
module watchcache/kube-oracle

go $gover

require k8s.io/apiserver $apiserver

replace k8s.io/apiserver => $build/apiserver
EOF
  rm -f "$build/driver/go.sum"
  (cd "$build/driver" && "$GO" mod tidy)
  sed "s|$build/apiserver|@APISERVER@|" "$build/driver/go.mod" > "$pinned"
  cp "$build/driver/go.sum" "$here/versions/$apiserver.go.sum"
  export GOFLAGS=-mod=readonly
fi

# 3. The binary: the driver's test binary, since a scenario runs in a testing/synctest bubble
# (oracle_test.go). Go's build cache makes this quick after the first time; skipped when nothing
# it is built from changed, this script included).
if [ -x "$bin" ] && [ -z "$(find "$build/driver" "$build/apiserver/pkg/storage/cacher/zz_kube_oracle.go" "$here/build.sh" -type f -newer "$bin" -print -quit)" ]; then
  echo "kube-oracle-$profile: up to date (k8s.io/apiserver $apiserver)"
  exit 0
fi
# TRIM_GO_CACHE=1 (CI's clean runs) builds with a build cache of its own, deleted afterwards: one
# oracle's packages take about 1.2 GB there, and nothing else reuses them.
if [ -n "${TRIM_GO_CACHE:-}" ]; then
  GOCACHE=$(mktemp -d "$build/gocache.XXXXXX")
  export GOCACHE
  trap 'chmod -R u+w "$GOCACHE" 2>/dev/null; rm -rf "$GOCACHE"' EXIT
fi
# Built without the compiler's optimisations and inlining (-N -l, every package): make test builds
# the three oracles on a clean clone, and its last minute was spent waiting for them. Measured on
# the 2-core EPYC VM, v1.30 with an empty build cache: 146 s (243 s of CPU) against 178 s (298 s);
# the diff of every scenario then takes 4 s longer. A scenario's outcome does not depend on it: it
# runs in a testing/synctest bubble, with the cacher's own code.
(cd "$build/driver" && "$GO" test -c -trimpath -gcflags='all=-N -l' -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
echo "kube-oracle-$profile: k8s.io/apiserver $apiserver -> ${bin#$root/}"
