package checker

import (
	"sort"
	"testing"

	"watchcache.local/tools/robustness/record"
)

// fixed is a Source over a complete history.
type fixed []record.Event

func (f fixed) WaitRev(rev int64) bool    { return len(f) > 0 && rev <= f[len(f)-1].Rev() }
func (f fixed) Len() int                  { return len(f) }
func (f fixed) Event(i int) *record.Event { return &f[i] }
func (f fixed) Find(rev int64, key string) (int, bool) {
	for i := range f {
		if f[i].Rev() == rev && f[i].KV.Key == key {
			return i, true
		}
	}
	return 0, false
}
func (f fixed) FirstAt(rev int64) int {
	return sort.Search(len(f), func(i int) bool { return f[i].Rev() >= rev })
}

func TestFollower(t *testing.T) {
	src := fixed(history())
	cases := []struct {
		name  string
		resps []record.Response
		prop  string
	}{
		{"whole", []record.Response{{Revision: 3, Events: evs(0, 1)}, {Revision: 5, Events: evs(2, 3, 4)}}, ""},
		{"lost", []record.Response{{Revision: 3, Events: evs(0)}, {Revision: 5, Events: evs(2, 3, 4)}}, Reliable},
		{"twice", []record.Response{{Revision: 3, Events: evs(0, 1)}, {Revision: 5, Events: evs(1, 2, 3, 4)}}, Unique},
		{"split", []record.Response{{Revision: 4, Events: evs(0, 1, 2)}, {Revision: 5, Events: evs(3, 4)}}, Atomic},
		{"false progress", []record.Response{{Revision: 3, Events: evs(0)}, {Revision: 3}, {Revision: 5, Events: evs(1, 2, 3, 4)}}, Bookmarkable},
		{"never", []record.Response{{Revision: 3, Events: evs(0, 1)}}, Reliable},
	}
	for _, c := range cases {
		f := NewFollower(c.name, prefix, 2, src)
		for i := range c.resps {
			f.Response(&c.resps[i])
		}
		f.Finish(5)
		if c.prop == "" {
			if len(f.Counts) != 0 {
				t.Errorf("%s: %v", c.name, f.Examples)
			}
			continue
		}
		if f.Counts[c.prop] == 0 {
			t.Errorf("%s: not flagged as %s (%v)", c.name, c.prop, f.Examples)
		}
	}
}
