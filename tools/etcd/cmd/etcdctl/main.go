// Command etcdctl builds etcd's command-line client from the released Go module.
package main

import (
	"go.etcd.io/etcd/etcdctl/v3/ctlv3"
)

func main() {
	ctlv3.MustStart()
}
