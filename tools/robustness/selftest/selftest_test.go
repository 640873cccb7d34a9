package selftest

import (
	"testing"

	"watchcache.local/tools/robustness/checker"
)

// The synthetic recording is what etcd would have sent: the checker finds nothing in it.
func TestSyntheticIsClean(t *testing.T) {
	rep, err := checker.Check(Synthetic())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("%s", v.String())
	}
}

// Every planted corruption is caught, by its property, on the record it was planted in.
func TestEveryCorruptionCaught(t *testing.T) {
	results, err := Run(Synthetic())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if !r.Caught {
			t.Errorf("%s (%s) missed: %s", r.Name, r.Property, r.Detail)
		} else {
			t.Logf("%s (%s): %s", r.Name, r.Property, r.Detail)
		}
	}
}
