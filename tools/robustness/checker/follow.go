package checker

import (
	"fmt"
	"sync"

	"watchcache.local/tools/robustness/record"
)

// Source is etcd's history while it is still being recorded (the ground truth, live).
type Source interface {
	// WaitRev waits until the history holds every event up to rev (false: it never came).
	WaitRev(rev int64) bool
	// Len is the number of events recorded so far.
	Len() int
	// Event is the i-th event (i < Len()).
	Event(i int) *record.Event
	// Find is the index of the event for key at rev.
	Find(rev int64, key string) (int, bool)
	// FirstAt is the index of the first event at a revision >= rev.
	FirstAt(rev int64) int
}

// Follower checks one watch online, in constant memory, for loads too large to record whole
// (the slow-readers run: 1 000 watchers under 1 000 events/s): ordered, unique, reliable,
// atomic, bookmarkable and events equal to etcd's, with the same property names as Check.
type Follower struct {
	mu       sync.Mutex
	Name     string
	Req      record.CreateRequest
	src      Source
	next     int // index of the next history event the watch should get
	Events   int // events received
	Counts   map[string]int
	Examples []string
}

// NewFollower starts following a watch created with req from revision from.
func NewFollower(name string, req record.CreateRequest, from int64, src Source) *Follower {
	src.WaitRev(from - 1)
	return &Follower{Name: name, Req: req, src: src, next: src.FirstAt(from), Counts: map[string]int{}}
}

func (f *Follower) flag(prop, msg string) {
	f.Counts[prop]++
	if len(f.Examples) < 5 {
		f.Examples = append(f.Examples, fmt.Sprintf("[%s] %s: %s", prop, f.Name, msg))
	}
}

// skip moves next past events the watch does not match.
func (f *Follower) skip() {
	for f.next < f.src.Len() && !f.Req.Matches(f.src.Event(f.next)) {
		f.next++
	}
}

// Response checks one response of the watch.
func (f *Follower) Response(r *record.Response) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Canceled {
		if r.CompactRevision != 0 {
			f.flag(Compaction, fmt.Sprintf("cancelled for compaction at %d (no compaction in this run)", r.CompactRevision))
		} else {
			f.flag(Cancel, fmt.Sprintf("cancelled by the server (%q)", r.CancelReason))
		}
		return
	}
	if r.IsProgressNotify() {
		if !f.src.WaitRev(r.Revision) {
			f.flag(Bookmarkable, fmt.Sprintf("progress at %d beyond etcd's history", r.Revision))
			return
		}
		f.skip()
		if f.next < f.src.Len() && f.src.Event(f.next).Rev() <= r.Revision {
			f.flag(Bookmarkable, fmt.Sprintf("progress at %d before %s", r.Revision, f.src.Event(f.next).Short()))
		}
		return
	}
	for i := range r.Events {
		e := &r.Events[i]
		f.Events++
		if !f.src.WaitRev(e.Rev()) {
			f.flag(Events, e.Short()+" beyond etcd's history")
			continue
		}
		f.skip()
		if f.next < f.src.Len() {
			if want := f.src.Event(f.next); want.Rev() == e.Rev() && want.KV.Key == e.KV.Key {
				if want.Type != e.Type || !want.KV.Equal(&e.KV) {
					f.flag(Events, fmt.Sprintf("%s differs from etcd's %s", e.Long(), want.Long()))
				}
				f.next++
				continue
			}
		}
		idx, ok := f.src.Find(e.Rev(), e.KV.Key)
		switch {
		case !ok:
			f.flag(Events, e.Short()+" is not in etcd's history")
		case idx > f.next:
			lost := 0
			first := ""
			for j := f.next; j < idx; j++ {
				if f.Req.Matches(f.src.Event(j)) {
					if lost == 0 {
						first = f.src.Event(j).Short()
					}
					lost++
				}
			}
			f.flag(Reliable, fmt.Sprintf("%d events lost before %s (first %s)", lost, e.Short(), first))
			f.next = idx + 1
		default:
			f.flag(Unique, fmt.Sprintf("%s again (or out of order; expected next %s)", e.Short(), f.src.Event(f.next).Short()))
		}
	}
	if n := len(r.Events); n > 0 {
		f.skip()
		if last := r.Events[n-1].Rev(); f.next < f.src.Len() && f.src.Event(f.next).Rev() == last {
			f.flag(Atomic, fmt.Sprintf("response ends inside revision %d (%s not in it)", last, f.src.Event(f.next).Short()))
		}
	}
}

// Behind is how many history events up to rev lie ahead of the watch (an upper bound of what
// it still has to receive: some may not match it).
func (f *Follower) Behind(rev int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skip()
	return max(0, f.src.FirstAt(rev+1)-f.next)
}

// Finish flags the events up to final that never came.
func (f *Follower) Finish(final int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skip()
	n := 0
	for j := f.next; j < f.src.Len() && f.src.Event(j).Rev() <= final; j++ {
		if f.Req.Matches(f.src.Event(j)) {
			n++
		}
	}
	if n > 0 {
		f.flag(Reliable, fmt.Sprintf("%d events up to the final revision %d never delivered (first %s)", n, final, f.src.Event(f.next).Short()))
	}
}
