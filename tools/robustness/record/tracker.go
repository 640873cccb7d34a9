package record

import "sort"

// OutcomeKind says what a response on a raw stream was, for the watch it belongs to.
type OutcomeKind int8

const (
	OutCreated            OutcomeKind = iota // the create acknowledgement of the oldest pending create
	OutCreateRejected                        // created and canceled at once
	OutWatch                                 // events, a periodic progress notification, anything else for an open watch
	OutStreamProgress                        // watch_id -1 progress: an answer to RequestProgress for every watch of the stream
	OutCancelAck                             // canceled, after the client asked for it
	OutServerCancel                          // canceled without the client asking (compaction, or an error)
	OutUnsolicitedCreated                    // a created response while no create was pending
	OutUnknownID                             // a response for an id no open watch holds
	OutLateCancelAck                         // canceled, for an id the server had already cancelled and the client then cancelled (etcd acks it)
)

// Outcome is where one response goes.
type Outcome struct {
	Kind  OutcomeKind
	Watch int // the record, or -1
	// OutCreated: the record that had been given the same id earlier on this stream, or -1.
	ReusedFrom int
	// OutStreamProgress: the records it speaks for: created before it at a lower header
	// revision (etcd sends created responses and progress answers through two channels, so an
	// answer computed before a create can arrive after its created response), not closed, and
	// not being cancelled by the client.
	Applies []int
}

// Tracker follows a raw watch stream as clientv3's watchGrpcStream does: creates are answered in
// the order they were sent (the client sends the next one only after the previous `created`), a
// created response names the watch id, and later responses go to the open watch holding that id.
// The harness runs it live to drive its client; the checker replays it over the recorded log.
type Tracker struct {
	pending    []int
	byID       map[int64]int
	used       map[int64]int
	cancelSent map[int]bool
	// ids whose watch the server cancelled and the client cancelled afterwards (as clientv3
	// does): etcd still holds the id in its stream and acknowledges that cancel.
	lateAck    map[int64]bool
	createdRev map[int]int64
}

func NewTracker() *Tracker {
	return &Tracker{byID: map[int64]int{}, used: map[int64]int{}, cancelSent: map[int]bool{}, lateAck: map[int64]bool{}, createdRev: map[int]int64{}}
}

// Create notes a create request sent for watch record w.
func (t *Tracker) Create(w int) { t.pending = append(t.pending, w) }

// Cancel notes a cancel request sent for id, returning the open record it targets, or -1.
func (t *Tracker) Cancel(id int64) int {
	w, ok := t.byID[id]
	if !ok {
		if _, known := t.used[id]; known {
			t.lateAck[id] = true
		}
		return -1
	}
	t.cancelSent[w] = true
	return w
}

// Pending is the record whose create awaits its acknowledgement, or -1.
func (t *Tracker) Pending() int {
	if len(t.pending) == 0 {
		return -1
	}
	return t.pending[0]
}

// Open lists the open records (sorted) and the pending creates.
func (t *Tracker) Open() (open []int, pending []int) {
	for _, w := range t.byID {
		open = append(open, w)
	}
	sort.Ints(open)
	return open, append([]int(nil), t.pending...)
}

// CancelSent says whether the client asked to cancel record w.
func (t *Tracker) CancelSent(w int) bool { return t.cancelSent[w] }

// Recv attributes one response.
func (t *Tracker) Recv(r *Response) Outcome {
	if r.Created {
		if len(t.pending) == 0 {
			return Outcome{Kind: OutUnsolicitedCreated, Watch: -1, ReusedFrom: -1}
		}
		w := t.pending[0]
		t.pending = t.pending[1:]
		if r.Canceled {
			return Outcome{Kind: OutCreateRejected, Watch: w, ReusedFrom: -1}
		}
		prev, reused := t.used[r.WatchID]
		if !reused {
			prev = -1
		}
		t.used[r.WatchID] = w
		if old, ok := t.byID[r.WatchID]; ok {
			// An id still open is handed out again: the old watch can no longer be told apart.
			prev = old
			delete(t.cancelSent, old)
		}
		t.byID[r.WatchID] = w
		t.createdRev[w] = r.Revision
		delete(t.lateAck, r.WatchID)
		return Outcome{Kind: OutCreated, Watch: w, ReusedFrom: prev}
	}
	if r.WatchID == -1 && r.IsProgressNotify() {
		var applies []int
		for _, w := range t.byID {
			if !t.cancelSent[w] && t.createdRev[w] < r.Revision {
				applies = append(applies, w)
			}
		}
		sort.Ints(applies)
		return Outcome{Kind: OutStreamProgress, Watch: -1, Applies: applies}
	}
	w, ok := t.byID[r.WatchID]
	if !ok {
		if r.Canceled && t.lateAck[r.WatchID] && len(r.Events) == 0 {
			delete(t.lateAck, r.WatchID)
			return Outcome{Kind: OutLateCancelAck, Watch: -1}
		}
		return Outcome{Kind: OutUnknownID, Watch: -1}
	}
	if r.Canceled {
		delete(t.byID, r.WatchID)
		kind := OutServerCancel
		if r.CompactRevision != 0 {
			// etcd's compaction cancel, even if the client had asked to cancel: its ack follows.
			if t.cancelSent[w] {
				t.lateAck[r.WatchID] = true
			}
		} else if t.cancelSent[w] {
			kind = OutCancelAck
		}
		delete(t.cancelSent, w)
		return Outcome{Kind: kind, Watch: w}
	}
	return Outcome{Kind: OutWatch, Watch: w}
}
