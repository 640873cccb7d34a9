#!/usr/bin/env bash
# `make run`: starts watchcache on its embedded default (an etcd child process on free loopback
# ports in a temporary directory), writes a few sample keys through it with etcdctl, prints how
# to try it, and runs until Ctrl-C (which stops watchcache and its etcd).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/watchcache"
ETCDCTL="$ROOT/.tools/bin/etcdctl"
GRPC="${WATCHCACHE_GRPC:-127.0.0.1:2479}"
HTTP="${WATCHCACHE_HTTP:-127.0.0.1:8080}"

export WATCHCACHE_ETCD_BIN="$ROOT/.tools/bin/etcd"
"$BIN" serve --listen-grpc "$GRPC" --listen-http "$HTTP" --web-dir "$ROOT/web-demo/dist" "$@" &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT INT TERM

# GET with bash alone (curl may not be installed): prints the status line.
status() {
  exec 3<>"/dev/tcp/${HTTP%:*}/${HTTP##*:}" 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" "$HTTP" >&3
  head -1 <&3
  exec 3<&-
}
ready=""
for _ in $(seq 1 300); do
  if status /readyz 2>/dev/null | grep -q ' 200 '; then ready=1; break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "watchcache exited: see the log above" >&2; exit 1; fi
  sleep 0.1
done
[ -n "$ready" ] || { echo "watchcache did not become ready within 30 s" >&2; exit 1; }

ctl() { "$ETCDCTL" --endpoints="$GRPC" "$@" >/dev/null; }
ctl put /registry/pods/default/web-0 '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"default","labels":{"app":"web"}},"spec":{"nodeName":"node-a"}}'
ctl put /registry/pods/default/web-1 '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"default","labels":{"app":"web"}},"spec":{"nodeName":"node-b"}}'
ctl put /registry/pods/kube-system/dns-0 '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"dns-0","namespace":"kube-system","labels":{"app":"dns"}},"spec":{"nodeName":"node-a"}}'
ctl put /config/feature-x on
ctl put /config/replicas 3

cat <<MSG

watchcache is serving etcd's gRPC API on $GRPC, in front of an embedded etcd (see the log above).
Sample keys are written under /registry/pods/ and /config/. Try, in another terminal:

  $ETCDCTL --endpoints=$GRPC watch --prefix /
  $ETCDCTL --endpoints=$GRPC put /config/replicas 5
  $ETCDCTL --endpoints=$GRPC get --prefix /registry/pods/ --keys-only
  curl -s http://$GRPC/health    # etcd's own HTTP endpoints answer on the gRPC port too, as on etcd's
  curl -s http://$HTTP/debug/state
  curl -s 'http://$HTTP/kube/registry/pods/?labelSelector=app%3Dweb'
  curl -sN 'http://$HTTP/kube/registry/pods/?watch=true&resourceVersion=0'
  curl -s http://$HTTP/metrics | grep -E '^(apiserver|watch_cache|watchcache)_'

The web demo (the core in WebAssembly, animated): http://$HTTP/
Ctrl-C stops watchcache and its etcd.
MSG
wait $pid
