// synctest needs Go 1.23's synchronous timer channels (the default of the driver's go 1.25
// module, said here explicitly). Kubernetes 1.30 was built with Go 1.22's buffered ones; its
// timer code (Stop, then drain only if Stop returned false) behaves the same under both.
//
//go:debug asynctimerchan=0
package main

// The kube-oracle binary is this package's test binary (build.sh: go test -c), because the
// scenario runs inside a testing/synctest bubble, which only a test can open: in it the time
// package's clock is a fake one that advances only when every goroutine is durably blocked, so
// the real cacher, with all its goroutines and real-time timers, runs deterministically on
// scenario time, and synctest.Wait says exactly when it has done all it can.

import (
	"fmt"
	"os"
	"testing"
	"testing/synctest"
)

var bubbleBody func() int

func TestMain(m *testing.M) {
	code, body := cli(os.Args[1:])
	if body == nil {
		os.Exit(code)
	}
	bubbleBody = body
	os.Args = []string{os.Args[0], "-test.run=^TestOracle$"}
	m.Run()
	fmt.Fprintln(os.Stderr, "kube-oracle: the scenario run ended without a result")
	os.Exit(1)
}

func TestOracle(t *testing.T) {
	synctest.Test(t, func(*testing.T) { os.Exit(bubbleBody()) })
}
