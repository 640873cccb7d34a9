// Package record holds what a robustness run records: every watch stream's requests and
// responses exactly as they were sent and received, every Range with its answer, the writes'
// acknowledgements, the compactions, and etcd's own history (the ground-truth watch). It knows
// nothing of processes or of the checks; the harness fills it and the checker reads it.
//
// etcd counterpart: tests/robustness/report (the recorded client reports: watch operations with
// their responses, KV operations with their times) and tests/robustness/model/history.go.
package record

import (
	"bytes"
	"compress/gzip"
	"encoding/gob"
	"fmt"
	"os"
	"strings"
	"time"
)

// EventType is etcd's mvccpb.Event_EventType.
type EventType int8

const (
	Put    EventType = 0
	Delete EventType = 1
)

func (t EventType) String() string {
	if t == Delete {
		return "DELETE"
	}
	return "PUT"
}

// KV is etcd's mvccpb.KeyValue.
type KV struct {
	Key            string
	Value          string
	CreateRevision int64
	ModRevision    int64
	Version        int64
	Lease          int64
}

// Equal compares every field.
func (kv *KV) Equal(o *KV) bool {
	if kv == nil || o == nil {
		return kv == o
	}
	return *kv == *o
}

func (kv *KV) String() string {
	if kv == nil {
		return "<none>"
	}
	s := fmt.Sprintf("%s=%q create=%d mod=%d ver=%d", kv.Key, short(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version)
	if kv.Lease != 0 {
		s += fmt.Sprintf(" lease=%x", kv.Lease)
	}
	return s
}

func short(s string) string {
	if len(s) > 24 {
		return s[:21] + "..."
	}
	return s
}

// Event is etcd's mvccpb.Event.
type Event struct {
	Type   EventType
	KV     KV
	PrevKV *KV
}

// Rev is the event's revision (its kv's mod_revision).
func (e *Event) Rev() int64 { return e.KV.ModRevision }

// Short names the event: "PUT /registry/pods/p-1@4478".
func (e *Event) Short() string { return fmt.Sprintf("%s %s@%d", e.Type, e.KV.Key, e.KV.ModRevision) }

// Long spells every field.
func (e *Event) Long() string {
	s := fmt.Sprintf("%s %s", e.Type, e.KV.String())
	if e.PrevKV != nil {
		s += " prev{" + e.PrevKV.String() + "}"
	}
	return s
}

// Response is one etcdserverpb.WatchResponse as received (clientv3 watches: one
// clientv3.WatchResponse off the channel, whose WatchID is not visible and is recorded as 0).
type Response struct {
	Seq             int           // position in the stream's log; sends and receives share the counter
	At              time.Duration // since the run started
	WatchID         int64
	Revision        int64 // header.revision
	Created         bool
	Canceled        bool
	Fragment        bool
	CompactRevision int64
	CancelReason    string
	Events          []Event
}

// IsProgressNotify is clientv3's rule: no events, not created, not canceled, no compaction,
// header revision non-zero.
func (r *Response) IsProgressNotify() bool {
	return len(r.Events) == 0 && !r.Created && !r.Canceled && r.CompactRevision == 0 && r.Revision != 0
}

// Describe prints the response on one line, with at most maxEvents events spelled out
// (first and last), and every event that `mark` names.
func (r *Response) Describe(maxEvents int, mark func(i int, e *Event) bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d +%.3fs id=%d rev=%d", r.Seq, r.At.Seconds(), r.WatchID, r.Revision)
	if r.Created {
		b.WriteString(" created")
	}
	if r.Canceled {
		b.WriteString(" canceled")
	}
	if r.CompactRevision != 0 {
		fmt.Fprintf(&b, " compact_revision=%d", r.CompactRevision)
	}
	if r.CancelReason != "" {
		fmt.Fprintf(&b, " reason=%q", r.CancelReason)
	}
	if r.Fragment {
		b.WriteString(" fragment")
	}
	if r.IsProgressNotify() {
		b.WriteString(" progress")
	}
	if n := len(r.Events); n > 0 {
		fmt.Fprintf(&b, " %d events [%d..%d]:", n, r.Events[0].Rev(), r.Events[n-1].Rev())
		skipped := 0
		for i := range r.Events {
			e := &r.Events[i]
			show := i < maxEvents/2 || i >= n-maxEvents/2 || (mark != nil && mark(i, e))
			if !show {
				skipped++
				continue
			}
			if skipped > 0 {
				fmt.Fprintf(&b, " …%d…", skipped)
				skipped = 0
			}
			prefix := " "
			if mark != nil && mark(i, e) {
				prefix = " >>"
			}
			b.WriteString(prefix + e.Short())
		}
		if skipped > 0 {
			fmt.Fprintf(&b, " …%d…", skipped)
		}
	}
	return b.String()
}

// CreateRequest is etcdserverpb.WatchCreateRequest (the fields the suite uses).
type CreateRequest struct {
	Key            string
	RangeEnd       string
	StartRevision  int64
	PrevKV         bool
	ProgressNotify bool
	NoPut          bool
	NoDelete       bool
}

// Matches says whether the event falls in the watch's range and passes its filters.
func (c *CreateRequest) Matches(e *Event) bool {
	if !c.InRange(e.KV.Key) {
		return false
	}
	if c.NoPut && e.Type == Put {
		return false
	}
	if c.NoDelete && e.Type == Delete {
		return false
	}
	return true
}

// InRange applies etcd's key/range_end rules (empty end: one key; "\x00": every key from key on;
// otherwise [key, range_end)). An empty key is "\x00", as etcd makes it.
func (c *CreateRequest) InRange(k string) bool { return InRange(c.Key, c.RangeEnd, k) }

// InRange is etcd's range rule for a key and range end (shared by Watch and Range).
func InRange(key, end, k string) bool {
	if key == "" {
		key = "\x00"
	}
	switch end {
	case "":
		return k == key
	case "\x00":
		return k >= key
	default:
		return k >= key && k < end
	}
}

func (c CreateRequest) String() string {
	s := fmt.Sprintf("key=%q", c.Key)
	switch c.RangeEnd {
	case "":
	case "\x00":
		s += " range_end=\"\\x00\" (from key)"
	default:
		s += fmt.Sprintf(" range_end=%q", c.RangeEnd)
	}
	s += fmt.Sprintf(" start_revision=%d", c.StartRevision)
	for _, f := range []struct {
		on   bool
		name string
	}{{c.PrevKV, "prev_kv"}, {c.ProgressNotify, "progress_notify"}, {c.NoPut, "NOPUT"}, {c.NoDelete, "NODELETE"}} {
		if f.on {
			s += " " + f.name
		}
	}
	return s
}

// SendKind says what a client sent on a watch stream.
type SendKind int8

const (
	SendCreate SendKind = iota
	SendCancel
	SendProgress
)

// Send is one WatchRequest sent on a stream.
type Send struct {
	Seq  int
	At   time.Duration
	Kind SendKind
	// Create: the watch record it opens (index into Run.Watches) and the highest write
	// revision acknowledged before it was sent (a "start from now" watch must not deliver
	// anything at or below it).
	Watch         int
	KnownRevision int64
	// Cancel: the id, and why the client sent it ("client" for the load's own cancels,
	// "after server cancel" and "unknown id" for clientv3's automatic ones).
	WatchID int64
	Reason  string
}

// Client kinds.
const (
	Raw      = "raw"      // etcdserverpb.WatchClient, every response recorded as sent
	ClientV3 = "clientv3" // clientv3.Watcher, one record per Watch() call
)

// Stream is one gRPC watch stream (raw) or one clientv3 Watch() call's channel.
type Stream struct {
	ID     int
	Client string
	Slot   int  // the load's logical stream this one belongs to (a reconnect opens a new Stream)
	Slow   bool // a slow reader (small HTTP/2 windows, sleeps, stalls)
	Target string
	User   string // the etcd user whose token the stream carries ("" with auth off)
	Opened time.Duration
	Sends  []Send
	Recvs  []Response
	// How it ended: "broken: <error>" (the transport failed), "closed" (the client closed it at
	// the end of the run or after its only watch ended), or "" (open at the end).
	End    string
	EndSeq int
	EndAt  time.Duration
}

// Watch is one create request and what it got: a new record per create, so a watch that is
// resumed (after a cancel, a compaction or a broken stream) is a chain of records.
type Watch struct {
	ID        int
	Stream    int
	Request   CreateRequest
	Kind      string // what the load meant by it: "prefix", "key", "range", "across", ...
	StartKind string // "0", "recent", "old", "compacted", "1", "future", "resume", ...
	ResumeOf  int    // the record it continues, or -1
	// OpenAtEnd: the watch was still open when the load stopped and the drain ended
	// (every matching event up to Run.FinalRevision should have arrived).
	OpenAtEnd bool
	Drained   bool // a progress notification at >= FinalRevision arrived during the drain
}

// Range is one KV Range request and its answer.
type Range struct {
	ID            int
	Start, End    time.Duration
	Key, RangeEnd string
	Revision      int64
	Limit         int64
	KeysOnly      bool
	CountOnly     bool
	Serializable  bool
	// KnownRevision: the highest write revision acknowledged before the Range was sent.
	KnownRevision int64
	Err           string
	Header        int64
	KVs           []KV
	Count         int64
	More          bool
}

func (r *Range) Describe() string {
	s := fmt.Sprintf("range#%d +%.3fs key=%q", r.ID, r.Start.Seconds(), r.Key)
	if r.RangeEnd != "" {
		s += fmt.Sprintf(" range_end=%q", r.RangeEnd)
	}
	if r.Revision != 0 {
		s += fmt.Sprintf(" revision=%d", r.Revision)
	}
	if r.Limit != 0 {
		s += fmt.Sprintf(" limit=%d", r.Limit)
	}
	if r.KeysOnly {
		s += " keys_only"
	}
	if r.CountOnly {
		s += " count_only"
	}
	if r.Serializable {
		s += " serializable"
	} else {
		s += " linearizable"
	}
	return s
}

// Write is one write's acknowledgement (or failure).
type Write struct {
	Start, End time.Duration
	Via        string // "etcd" or "target"
	Op         string
	Revision   int64 // header revision of the answer
	Err        string
}

// Compaction is one compaction sent to etcd.
type Compaction struct {
	Revision int64
	At       time.Duration // when it was sent
	Err      string
}

// MayHaveApplied says whether etcd may have compacted at this revision: it answered OK, or the
// call failed without an answer (a timeout, a broken connection), and etcd may still have
// applied it, as it does a request it took before it went quiet. A refusal is an answer:
// below the compaction or beyond etcd's revision, or auth's.
func (c Compaction) MayHaveApplied() bool {
	if c.Err == "" {
		return true
	}
	for _, refusal := range []string{"required revision has been compacted", "required revision is a future revision",
		"invalid auth token", "permission denied", "user name is empty", "revision of auth store is old"} {
		if strings.Contains(c.Err, refusal) {
			return false
		}
	}
	return true
}

// Fault is one injected failure.
type Fault struct {
	Kind  string // "etcd-kill", "target-kill", "etcd-stop"
	At    time.Duration
	Until time.Duration // when the process was back (restart done, or SIGCONT)
	Note  string
}

// Run is everything one run recorded.
type Run struct {
	Seed     int64
	FlagSet  int
	Target   string // "watchcache" or "etcd"
	Duration time.Duration
	Args     []string // the target's command line

	History       []Event // etcd's own, from the ground-truth watch, in etcd's order
	FinalRevision int64   // etcd's revision when the load had stopped
	Streams       []Stream
	Watches       []Watch
	Ranges        []Range
	Writes        []Write
	Compactions   []Compaction
	Faults        []Fault
	Notes         []string
	// Denied: key ranges a user may not read (etcd's RBAC, auth mode). A create of that user
	// whose range meets one is refused by etcd (isWatchPermitted).
	Denied []Denied
}

// Denied is a key range [Key, End) that User may not read (End "\x00": every key from Key).
type Denied struct{ User, Key, End string }

// Meets says whether the create's range has a key in d: etcd permits a watch only when every
// key of its range is readable (IsRangePermitted).
func (d *Denied) Meets(c *CreateRequest) bool {
	below := func(a, b string) bool { return b == "\x00" || a < b } // a < b, with "\x00" as +inf
	switch c.RangeEnd {
	case "":
		return d.Key <= c.Key && below(c.Key, d.End)
	default:
		return below(c.Key, d.End) && (c.RangeEnd == "\x00" || d.Key < c.RangeEnd) && below(c.Key, c.RangeEnd)
	}
}

// DeniedTo says which denial, if any, refuses user the create's range.
func (r *Run) DeniedTo(user string, c *CreateRequest) *Denied {
	for i := range r.Denied {
		if d := &r.Denied[i]; d.User == user && user != "" && d.Meets(c) {
			return d
		}
	}
	return nil
}

// Save writes the run as gzip'd gob.
func (r *Run) Save(path string) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := gob.NewEncoder(zw).Encode(r); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// Load reads a run written by Save.
func Load(path string) (*Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	var r Run
	if err := gob.NewDecoder(zr).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}
