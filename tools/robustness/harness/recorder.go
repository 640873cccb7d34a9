package harness

import (
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"watchcache.local/tools/robustness/record"
)

// interner shares the strings of keys and values between the many watchers that receive them.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

func (in *interner) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	in.mu.Lock()
	s, ok := in.m[string(b)]
	if !ok {
		s = string(b)
		in.m[s] = s
	}
	in.mu.Unlock()
	return s
}

func (in *interner) kv(kv *mvccpb.KeyValue) record.KV {
	return record.KV{Key: in.str(kv.Key), Value: in.str(kv.Value), CreateRevision: kv.CreateRevision,
		ModRevision: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
}

func (in *interner) event(e *mvccpb.Event) record.Event {
	out := record.Event{Type: record.EventType(e.Type)}
	if e.Kv != nil {
		out.KV = in.kv(e.Kv)
	}
	if e.PrevKv != nil {
		p := in.kv(e.PrevKv)
		out.PrevKV = &p
	}
	return out
}

func (in *interner) response(r *pb.WatchResponse, seq int, at time.Duration) record.Response {
	out := record.Response{Seq: seq, At: at, WatchID: r.WatchId, Created: r.Created, Canceled: r.Canceled,
		Fragment: r.Fragment, CompactRevision: r.CompactRevision, CancelReason: r.CancelReason}
	if r.Header != nil {
		out.Revision = r.Header.Revision
	}
	if len(r.Events) > 0 {
		out.Events = make([]record.Event, len(r.Events))
		for i, e := range r.Events {
			out.Events[i] = in.event(e)
		}
	}
	return out
}

// recorder collects a run's records from every goroutine.
type recorder struct {
	start time.Time
	in    interner
	known atomic.Int64 // the highest revision of an acknowledged write

	mu          sync.Mutex
	streams     []*streamRec
	watches     []*record.Watch
	ranges      []record.Range
	writes      []record.Write
	compactions []record.Compaction
	faults      []record.Fault
	notes       []string
}

// streamRec is a stream being recorded, with its own lock and sequence counter.
type streamRec struct {
	mu  sync.Mutex
	seq int
	s   record.Stream
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), in: interner{m: map[string]string{}}}
}

func (r *recorder) now() time.Duration { return time.Since(r.start) }

// ack raises the known revision to rev (a write acknowledged now).
func (r *recorder) ack(rev int64) {
	for {
		k := r.known.Load()
		if rev <= k || r.known.CompareAndSwap(k, rev) {
			return
		}
	}
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	r.notes = append(r.notes, s)
	r.mu.Unlock()
}

func (r *recorder) newStream(client string, slot int, slow bool, target string, c *Creds) *streamRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &streamRec{s: record.Stream{ID: len(r.streams), Client: client, Slot: slot, Slow: slow, Target: target, Opened: r.now()}}
	if c != nil {
		s.s.User = c.User
	}
	r.streams = append(r.streams, s)
	return s
}

func (r *recorder) newWatch(stream int, req record.CreateRequest, kind, startKind string, resumeOf int) *record.Watch {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := &record.Watch{ID: len(r.watches), Stream: stream, Request: req, Kind: kind, StartKind: startKind, ResumeOf: resumeOf}
	r.watches = append(r.watches, w)
	return w
}

// send records a request on the stream (call with s.mu held) and returns its seq.
func (s *streamRec) send(r *recorder, snd record.Send) int {
	s.seq++
	snd.Seq = s.seq
	snd.At = r.now()
	s.s.Sends = append(s.s.Sends, snd)
	return s.seq
}

// recv records a response (call with s.mu held) and returns it.
func (s *streamRec) recv(r *recorder, resp *pb.WatchResponse) *record.Response {
	s.seq++
	s.s.Recvs = append(s.s.Recvs, r.in.response(resp, s.seq, r.now()))
	return &s.s.Recvs[len(s.s.Recvs)-1]
}

// end marks the stream's end (call with s.mu held).
func (s *streamRec) end(r *recorder, how string) {
	if s.s.End != "" {
		return
	}
	s.seq++
	s.s.End, s.s.EndSeq, s.s.EndAt = how, s.seq, r.now()
}

func (r *recorder) addRange(x record.Range) {
	r.mu.Lock()
	x.ID = len(r.ranges)
	r.ranges = append(r.ranges, x)
	r.mu.Unlock()
}

func (r *recorder) addWrite(w record.Write) {
	r.mu.Lock()
	r.writes = append(r.writes, w)
	r.mu.Unlock()
}

func (r *recorder) addCompaction(c record.Compaction) {
	r.mu.Lock()
	r.compactions = append(r.compactions, c)
	r.mu.Unlock()
}

func (r *recorder) addFault(f record.Fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// run assembles the record.Run (after every goroutine has stopped).
func (r *recorder) run(history []record.Event) *record.Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &record.Run{History: history, Ranges: r.ranges, Writes: r.writes, Compactions: r.compactions, Faults: r.faults, Notes: r.notes}
	for _, s := range r.streams {
		s.mu.Lock()
		out.Streams = append(out.Streams, s.s)
		s.mu.Unlock()
	}
	for _, w := range r.watches {
		out.Watches = append(out.Watches, *w)
	}
	return out
}
