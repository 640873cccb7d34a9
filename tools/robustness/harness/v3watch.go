package harness

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"watchcache.local/tools/robustness/record"
)

// v3Slot is one clientv3 client (its own connection) whose Watcher carries several watches on
// one gRPC stream; clientv3 reconnects and resumes them itself. Each Watch() call is a record
// (with a Stream record of its own: the channel it reads).
type v3Slot struct {
	l    *load
	id   int
	slow bool
	rng  *rand.Rand
	cli  *clientv3.Client
	w    clientv3.Watcher

	mu      sync.Mutex
	watches []*v3watch
}

type v3watch struct {
	slot      *v3Slot
	req       record.CreateRequest
	kind      string
	sr        *streamRec
	rec       *record.Watch
	cancel    context.CancelFunc
	lastEv    int64
	lastProg  int64
	open      bool
	cancelled bool // by the load
	resume    bool
	dropped   bool
	got       int // matching events of the current record (the drain waits for etcd's count)
}

func (w *v3watch) next() int64 {
	n := w.req.StartRevision
	if m := max(w.lastEv, w.lastProg) + 1; m > 1 && m > n {
		n = m
	}
	return n
}

// start opens a new record for w from rev (never 0: clientv3 resumes a "from now" watch at
// the created header's revision, which would replay that revision).
func (s *v3Slot) start(ctx context.Context, w *v3watch, rev int64, startKind string) {
	l := s.l
	resumeOf := -1
	if w.rec != nil {
		resumeOf = w.rec.ID
	}
	req := w.req
	req.StartRevision = rev
	sr := l.rec.newStream(record.ClientV3, s.id, s.slow, l.targetName, l.slotCreds(s.id))
	rec := l.rec.newWatch(sr.s.ID, req, w.kind, startKind, resumeOf)
	s.mu.Lock()
	w.req, w.sr, w.rec, w.open, w.cancelled, w.resume, w.got = req, sr, rec, true, false, false, 0
	s.mu.Unlock()

	opts := []clientv3.OpOption{clientv3.WithRev(rev), clientv3.WithCreatedNotify()}
	switch req.RangeEnd {
	case "":
	case "\x00":
		opts = append(opts, clientv3.WithFromKey())
	default:
		opts = append(opts, clientv3.WithRange(req.RangeEnd))
	}
	if req.PrevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	if req.ProgressNotify {
		opts = append(opts, clientv3.WithProgressNotify())
	}
	if req.NoPut {
		opts = append(opts, clientv3.WithFilterPut())
	}
	if req.NoDelete {
		opts = append(opts, clientv3.WithFilterDelete())
	}
	wctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	w.cancel = cancel
	s.mu.Unlock()
	sr.mu.Lock()
	sr.send(l.rec, record.Send{Kind: record.SendCreate, Watch: rec.ID, KnownRevision: l.rec.known.Load()})
	sr.mu.Unlock()
	ch := s.w.Watch(wctx, req.Key, opts...)
	s.mu.Lock()
	seed := s.rng.Uint64()
	s.mu.Unlock()
	go s.read(ctx, w, sr, ch, seed)
}

func (s *v3Slot) read(ctx context.Context, w *v3watch, sr *streamRec, ch clientv3.WatchChan, seed uint64) {
	l := s.l
	r := rand.New(rand.NewPCG(seed, 11))
	nextStall := time.Now().Add(time.Duration(3000+r.IntN(10000)) * time.Millisecond)
	var last record.Response
	var compactRev int64 // clientv3 may follow a compaction cancel with a closing response of its own
	for resp := range ch {
		if resp.CompactRevision != 0 {
			compactRev = resp.CompactRevision
		}
		pr := &pb.WatchResponse{Header: resp.Header, Events: resp.Events, CompactRevision: resp.CompactRevision,
			Canceled: resp.Canceled, Created: resp.Created, CancelReason: resp.CancelReason}
		if pr.Canceled && pr.CancelReason == "" && resp.Err() != nil {
			pr.CancelReason = "clientv3: " + resp.Err().Error() // clientv3's own closing response
		}
		sr.mu.Lock()
		rr := sr.recv(l.rec, pr)
		last = *rr
		sr.mu.Unlock()
		s.mu.Lock()
		if n := len(resp.Events); n > 0 && resp.Events[n-1].Kv.ModRevision > w.lastEv {
			w.lastEv = resp.Events[n-1].Kv.ModRevision
		}
		if last.IsProgressNotify() && last.Revision > w.lastProg {
			w.lastProg = last.Revision
		}
		if sr == w.sr {
			w.got += len(resp.Events)
		}
		s.mu.Unlock()
		if s.slow && !l.draining.Load() {
			time.Sleep(time.Duration(2+r.IntN(9)) * time.Millisecond)
			if time.Now().After(nextStall) {
				time.Sleep(time.Duration(1000+r.IntN(5000)) * time.Millisecond)
				nextStall = time.Now().Add(time.Duration(3000+r.IntN(12000)) * time.Millisecond)
			}
		}
	}
	sr.mu.Lock()
	sr.end(l.rec, "closed")
	sr.mu.Unlock()
	s.mu.Lock()
	w.open = false
	cancelled, resume := w.cancelled, w.resume
	s.mu.Unlock()
	if ctx.Err() != nil || l.stopping.Load() {
		return
	}
	switch {
	case cancelled && resume:
		s.start(ctx, w, w.next(), "resume")
	case cancelled, strings.Contains(last.CancelReason, errPermissionDenied):
		s.mu.Lock()
		w.dropped = true // the load's cancel, or refused for good
		s.mu.Unlock()
	case compactRev != 0:
		s.start(ctx, w, compactRev, "after-compaction")
	default:
		// Closed by the server (or clientv3 gave up): start again after a pause.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			s.start(ctx, w, w.next(), "retry")
		}
	}
}

// cancelWatch is the load's own cancel (churn).
func (s *v3Slot) cancelWatch(w *v3watch, resume bool) bool {
	s.mu.Lock()
	if !w.open || w.cancelled {
		s.mu.Unlock()
		return false
	}
	w.cancelled, w.resume = true, resume
	sr, cancel := w.sr, w.cancel
	s.mu.Unlock()
	sr.mu.Lock()
	sr.send(s.l.rec, record.Send{Kind: record.SendCancel, Reason: "client"})
	sr.mu.Unlock()
	cancel()
	return true
}

func (s *v3Slot) requestProgress(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = s.w.RequestProgress(octx)
}

func (s *v3Slot) settled(rev int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		if w.dropped {
			continue
		}
		if !w.open || w.got < s.l.gt.countMatching(&w.req, w.req.StartRevision-1, rev) {
			return false
		}
	}
	return true
}

func (s *v3Slot) finish(final int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		if w.open && !w.cancelled && w.rec != nil {
			w.rec.OpenAtEnd = true
			w.rec.Drained = w.got >= s.l.gt.countMatching(&w.req, w.req.StartRevision-1, final)
		}
	}
}
