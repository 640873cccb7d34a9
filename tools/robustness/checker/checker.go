// Package checker checks a recorded run against etcd's own history: every watch record for
// etcd's watch guarantees (ordered, unique, atomic, reliable, resumable, bookmarkable, prev_kv,
// filters, events equal to etcd's, compaction cancels, one created per watch, watch ids never
// reused on a stream, no cancel etcd would not send) and every Range for etcd's answer at its
// revision (and linearizable Ranges for freshness). Each violation names the stream, the watch
// record and its create request, the responses around it and what etcd's history says.
//
// etcd counterpart: tests/robustness/validate/watch.go (the watch properties, spec/etcd.md 1.7)
// and validate/operations.go (KV answers against the model). The rules beyond etcd's checker are
// the ones etcd's server keeps by construction (spec/etcd.md 1.2–1.5): a progress answer with
// watch_id -1 speaks for every watch of the stream, a compaction cancel names a compaction that
// happened and comes only to a watch that needs a compacted revision, a watch id is never handed
// out twice on one stream, and etcd never refuses a well-formed create, except one whose range
// the stream's user may not read (auth mode), which it refuses with nothing before.
package checker

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"watchcache.local/tools/robustness/model"
	"watchcache.local/tools/robustness/record"
)

// The properties, in the order the tables print them.
const (
	Ordered      = "ordered"
	Unique       = "unique"
	Atomic       = "atomic"
	Reliable     = "reliable"
	Resumable    = "resumable"
	Bookmarkable = "bookmarkable"
	PrevKV       = "prev_kv"
	Filter       = "filter"
	Events       = "events"
	Compaction   = "compaction"
	Cancel       = "cancel"
	Created      = "created"
	WatchID      = "watch_id"
	Range        = "range"
	Linearizable = "linearizable"
	Permission   = "permission"
)

// Properties lists every property.
var Properties = []string{Ordered, Unique, Atomic, Reliable, Resumable, Bookmarkable, PrevKV, Filter, Events, Compaction, Cancel, Created, WatchID, Range, Linearizable, Permission}

// Violation is one incident.
type Violation struct {
	Property string
	Stream   int // -1 if none
	Watch    int // -1 if none
	Range    int // -1 if none
	Rev      int64
	At       time.Duration
	Summary  string
	Details  []string
}

func (v *Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] %s\n", v.Property, v.Summary)
	for _, d := range v.Details {
		b.WriteString("    " + d + "\n")
	}
	return b.String()
}

// Figures are the run's totals.
type Figures struct {
	Writes, WritesFailed         int
	Revisions                    int64
	HistoryEvents                int
	Streams, StreamBreaks        int
	WatchRecords                 int
	Responses                    int
	EventsDelivered              int
	ProgressNotifications        int
	CompactionCancels            int
	Ranges, RangesFailed         int
	Compactions                  int
	Faults                       map[string]int
	WatchesOpenAtEnd, NotDrained int
	// Auth mode: watch records whose range their stream's user may not read, and how many of
	// them the target refused as etcd does.
	DeniedCreates, DeniedRefused int
}

// Report is the checker's answer.
type Report struct {
	Violations []Violation
	Figures    Figures
}

// Count is the number of violations of one property.
func (r *Report) Count(p string) int {
	n := 0
	for i := range r.Violations {
		if r.Violations[i].Property == p {
			n++
		}
	}
	return n
}

// Check checks a whole run. An error means the ground truth itself is unusable.
func Check(run *record.Run) (*Report, error) {
	h, err := model.New(run.History)
	if err != nil {
		return nil, err
	}
	c := &checker{run: run, h: h, rep: &Report{}}
	c.figures()
	for i := range run.Streams {
		c.stream(&run.Streams[i])
	}
	for i := range run.Ranges {
		c.rangeCheck(&run.Ranges[i])
	}
	sort.SliceStable(c.rep.Violations, func(i, j int) bool {
		a, b := &c.rep.Violations[i], &c.rep.Violations[j]
		if a.Property != b.Property {
			return propIndex(a.Property) < propIndex(b.Property)
		}
		return a.At < b.At
	})
	return c.rep, nil
}

func propIndex(p string) int {
	for i, q := range Properties {
		if q == p {
			return i
		}
	}
	return len(Properties)
}

type checker struct {
	run *record.Run
	h   *model.History
	rep *Report
}

func (c *checker) figures() {
	f := &c.rep.Figures
	f.Faults = map[string]int{}
	for _, w := range c.run.Writes {
		f.Writes++
		if w.Err != "" {
			f.WritesFailed++
		}
	}
	f.Revisions = c.h.LastRev
	f.HistoryEvents = len(c.h.Events)
	f.Streams = len(c.run.Streams)
	for _, s := range c.run.Streams {
		if strings.HasPrefix(s.End, "broken") {
			f.StreamBreaks++
		}
		f.Responses += len(s.Recvs)
		for _, r := range s.Recvs {
			f.EventsDelivered += len(r.Events)
			if r.IsProgressNotify() {
				f.ProgressNotifications++
			}
			if r.CompactRevision != 0 {
				f.CompactionCancels++
			}
		}
	}
	f.WatchRecords = len(c.run.Watches)
	for _, w := range c.run.Watches {
		if w.OpenAtEnd {
			f.WatchesOpenAtEnd++
			if !w.Drained {
				f.NotDrained++
			}
		}
	}
	for _, r := range c.run.Ranges {
		f.Ranges++
		if r.Err != "" {
			f.RangesFailed++
		}
	}
	for _, cp := range c.run.Compactions {
		if cp.Err == "" {
			f.Compactions++
		}
	}
	for _, ft := range c.run.Faults {
		f.Faults[ft.Kind]++
	}
}

func (c *checker) add(v Violation) { c.rep.Violations = append(c.rep.Violations, v) }

// compactedBefore is the highest revision compacted by a compaction sent before at (one that
// failed without an answer counts: etcd may have applied it).
func (c *checker) compactedBefore(at time.Duration) int64 {
	var m int64
	for _, cp := range c.run.Compactions {
		if cp.MayHaveApplied() && cp.At < at && cp.Revision > m {
			m = cp.Revision
		}
	}
	return m
}

func (c *checker) isCompaction(rev int64, at time.Duration) bool {
	for _, cp := range c.run.Compactions {
		if cp.MayHaveApplied() && cp.Revision == rev && cp.At < at {
			return true
		}
	}
	return false
}

func (c *checker) compactionList(at time.Duration) string {
	var revs []string
	for _, cp := range c.run.Compactions {
		if cp.MayHaveApplied() && cp.At < at {
			r := fmt.Sprint(cp.Revision)
			if cp.Err != "" {
				r += " (failed without an answer: " + cp.Err + ")"
			}
			revs = append(revs, r)
		}
	}
	if len(revs) == 0 {
		return "none"
	}
	return strings.Join(revs, ", ")
}

func (c *checker) describeEvents(idx []int, max int) string {
	var parts []string
	for i, hi := range idx {
		if i == max {
			parts = append(parts, fmt.Sprintf("… %d more", len(idx)-max))
			break
		}
		parts = append(parts, c.h.Events[hi].Short())
	}
	return strings.Join(parts, ", ")
}

// ---------------------------------------------------------------------------------------------
// Ranges

func (c *checker) rangeCheck(r *record.Range) {
	v := func(prop, summary string, details ...string) {
		c.add(Violation{Property: prop, Stream: -1, Watch: -1, Range: r.ID, Rev: r.Header, At: r.Start,
			Summary: summary, Details: append([]string{r.Describe()}, details...)})
	}
	if r.Err != "" {
		if strings.Contains(r.Err, "required revision has been compacted") {
			if r.Revision == 0 || r.Revision >= c.compactedBefore(r.End) {
				v(Range, fmt.Sprintf("range#%d: refused as compacted, but revision %d was never compacted (compactions before its answer: %s)",
					r.ID, r.Revision, c.compactionList(r.End)), "error: "+r.Err)
			}
		}
		return
	}
	if !r.Serializable && r.Header < r.KnownRevision {
		what := "answered at revision"
		if r.Revision != 0 {
			what = fmt.Sprintf("(for the past revision %d) has header revision", r.Revision)
		}
		v(Linearizable, fmt.Sprintf("range#%d: linearizable Range %s %d, but a write at revision %d had been acknowledged before it was sent",
			r.ID, what, r.Header, r.KnownRevision))
	}
	at := r.Revision
	if at == 0 {
		at = r.Header
	}
	if at > c.h.LastRev {
		v(Range, fmt.Sprintf("range#%d: answered at revision %d, beyond etcd's last revision %d", r.ID, at, c.h.LastRev))
		return
	}
	all := c.h.Range(r.Key, r.RangeEnd, at)
	want := all
	more := false
	if r.Limit > 0 && int64(len(want)) > r.Limit {
		want = want[:r.Limit]
		more = true
	}
	if r.CountOnly {
		want, more = nil, false
	}
	var problems []string
	if r.Count != int64(len(all)) {
		problems = append(problems, fmt.Sprintf("count %d, etcd's %d", r.Count, len(all)))
	}
	if r.More != more {
		problems = append(problems, fmt.Sprintf("more=%v, etcd's %v", r.More, more))
	}
	if len(r.KVs) != len(want) {
		problems = append(problems, fmt.Sprintf("%d kvs, etcd's %d", len(r.KVs), len(want)))
	}
	for i := 0; i < len(r.KVs) && i < len(want); i++ {
		w := want[i]
		if r.KeysOnly {
			// etcd 3.7 answers keys_only from its index: no value, and no lease either.
			w.Value, w.Lease = "", 0
		}
		if !r.KVs[i].Equal(&w) {
			problems = append(problems, fmt.Sprintf("kv %d is {%s}, etcd's {%s}", i, r.KVs[i].String(), w.String()))
			if len(problems) > 6 {
				break
			}
		}
	}
	if len(problems) > 0 {
		v(Range, fmt.Sprintf("range#%d at revision %d differs from etcd's state: %s", r.ID, at, problems[0]), problems...)
	}
}
