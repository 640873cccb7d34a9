// Command etcd-benchmark builds etcd's benchmark tool (tools/benchmark in etcd's repository,
// package go.etcd.io/etcd/v3/tools/benchmark/cmd) from Go modules, for watchcache's
// benchmarks (make bench-etcd-tool, issue 12).
//
// The tool lives in etcd's root module go.etcd.io/etcd/v3, not in a module of its own; the Go
// module proxy serves that root module at v3.7.1 but not at v3.7.2 or v3.7.3 ("This module
// version is not available"), so the tool's code is v3.7.1's while every etcd library it
// links (api, client, pkg, server) is at v3.7.3, the version of the etcd it runs against
// (tools/etcd/go.mod); see go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/v3/tools/benchmark/cmd"
)

func main() {
	if err := cmd.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
