// Command etcd builds etcd's server (and its gRPC proxy, `etcd grpc-proxy start`) from the
// released Go module, for watchcache's development and tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
