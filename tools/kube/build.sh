#!/usr/bin/env bash
# Builds kube-apiserver and kubectl (Kubernetes $KUBE_VERSION, from the k8s.io/kubernetes module
# with each staging module at its published release; see go.mod) and the kube harness into
# $TOOLS/bin. Idempotent: the Kubernetes binaries are rebuilt only when their version or go.sum
# changed; the harness is rebuilt by go build's cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
TOOLS=${TOOLS:-$here/../../.tools}
bin=$TOOLS/bin
mkdir -p "$bin"
cd "$here"
version=$(sed -n 's/^[[:space:]]*\(require \)\{0,1\}k8s.io\/kubernetes \(v[0-9.]*\)$/\2/p' go.mod)
[ -n "$version" ] || { echo "tools/kube/build.sh: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
minor=$(cut -d. -f2 <<<"$version")
stamp="$version $(sha256sum go.sum | cut -c1-16)"
ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
if [ "$(cat "$bin/.kube-stamp" 2>/dev/null)" != "$stamp" ] || [ ! -x "$bin/kube-apiserver" ] || [ ! -x "$bin/kubectl" ]; then
  echo "building kube-apiserver and kubectl $version with $($GO version) (a cold build takes several minutes)"
  start=$(date +%s)
  $GO build -ldflags "$ldflags" -o "$bin/kube-apiserver" ./cmd/kube-apiserver
  $GO build -ldflags "$ldflags" -o "$bin/kubectl" ./cmd/kubectl
  echo "$stamp" > "$bin/.kube-stamp"
  echo "built in $(( $(date +%s) - start )) s"
fi
"$bin/kube-apiserver" --version
$GO build -o "$bin/kube-harness" ./harness
