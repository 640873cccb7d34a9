package harness

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"watchcache.local/tools/robustness/record"
)

// Logical watch states: what the load wants of one watch across its records.
const (
	wsWant       = iota // to be created (queued on the slot's current stream)
	wsPending           // create sent, created not yet received
	wsOpen              // created
	wsCancelling        // the client sent a cancel
	wsWaitRetry         // cancelled by the server; created again after a pause
	wsDropped           // gone for good
)

// lwatch is one watch the load keeps, recorded as a chain of records (one per create).
type lwatch struct {
	req             record.CreateRequest // StartRevision: the current record's
	kind            string
	rec             *record.Watch
	state           int
	queued          bool
	id              int64
	createdRev      int64
	lastEv          int64
	lastProg        int64
	nextStart       int64
	nextKind        string
	resumeOnCancel  bool
	lastCreateStart int64
	// got counts the current record's matching events above countFrom (its start - 1, or the
	// created header for "from now"): the drain waits until it reaches etcd's count.
	got       int
	countFrom int64
}

// next is where a resume starts: after the last revision seen (an event or a progress
// notification), else the record's own start (for "from now": the created header + 1).
func (w *lwatch) next() int64 {
	n := w.req.StartRevision
	if n == 0 && w.createdRev > 0 {
		n = w.createdRev + 1
	}
	if m := max(w.lastEv, w.lastProg) + 1; m > 1 && m > n {
		n = m
	}
	return n
}

// rawSlot is one logical raw watch stream of the load: a gRPC stream of its own (its own
// connection; small windows for slow readers), reopened when it breaks, every watch resumed.
type rawSlot struct {
	l       *load
	id      int
	slow    bool
	rng     *rand.Rand
	actions chan func(*session)

	mu      sync.Mutex
	watches []*lwatch
	cur     *session
}

// session is one gRPC stream of a slot.
type session struct {
	slot    *rawSlot
	sr      *streamRec
	conn    *grpc.ClientConn
	stream  pb.Watch_WatchClient
	cancel  context.CancelFunc
	tracker *record.Tracker
	byRec   map[int]*lwatch // guarded by sr.mu (the sender writes it)
	sendq   chan sendItem
	created chan struct{}
	broken  chan struct{}
	closing atomic.Bool
	// cancelled: ids whose unexpected responses already got a cancel (clientv3's cancelSet).
	cancelled  map[int64]bool
	streamProg atomic.Int64
}

type sendItem struct {
	req  *pb.WatchRequest
	snd  record.Send
	lw   *lwatch
	done chan struct{}
}

func (s *rawSlot) add(lw *lwatch) {
	s.mu.Lock()
	s.watches = append(s.watches, lw)
	s.mu.Unlock()
}

// do runs f on the slot's control loop (with the current stream).
func (s *rawSlot) do(f func(*session)) {
	select {
	case s.actions <- f:
	default:
		go func() { s.actions <- f }()
	}
}

func (s *rawSlot) serve(ctx context.Context) {
	for ctx.Err() == nil {
		sess, err := s.open(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		s.loop(ctx, sess)
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

func (s *rawSlot) open(ctx context.Context) (*session, error) {
	conn, err := dial(s.l.targetEndpoint, s.slow)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	sctx, err = withToken(sctx, conn, s.l.slotCreds(s.id))
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	stream, err := pb.NewWatchClient(conn).Watch(sctx)
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	sess := &session{slot: s, conn: conn, stream: stream, cancel: cancel, tracker: record.NewTracker(),
		byRec: map[int]*lwatch{}, sendq: make(chan sendItem, 4096), created: make(chan struct{}, 1),
		broken: make(chan struct{}), cancelled: map[int64]bool{}}
	sess.sr = s.l.rec.newStream(record.Raw, s.id, s.slow, s.l.targetName, s.l.slotCreds(s.id))
	s.mu.Lock()
	s.cur = sess
	for _, lw := range s.watches {
		switch lw.state {
		case wsWant:
			lw.queued = false // already decided where it starts
		case wsPending, wsOpen:
			lw.state, lw.nextStart, lw.nextKind, lw.queued = wsWant, lw.next(), "reconnect", false
		case wsCancelling:
			if lw.resumeOnCancel {
				lw.state, lw.nextStart, lw.nextKind, lw.queued = wsWant, lw.next(), "resume", false
			} else {
				lw.state = wsDropped
			}
		}
	}
	s.mu.Unlock()
	go sess.sender()
	go sess.recvLoop(s.rng.Uint64())
	return sess, nil
}

func (s *rawSlot) loop(ctx context.Context, sess *session) {
	defer func() {
		close(sess.sendq)
		sess.conn.Close()
	}()
	var queue []*lwatch
	enqueueWanted := func() {
		s.mu.Lock()
		for _, lw := range s.watches {
			if lw.state == wsWant && !lw.queued {
				lw.queued = true
				queue = append(queue, lw)
			}
		}
		s.mu.Unlock()
	}
	enqueueWanted()
	var inflight *lwatch
	progress := time.NewTimer(s.progressDelay())
	defer progress.Stop()
	for {
		if inflight == nil && len(queue) > 0 {
			lw := queue[0]
			queue = queue[1:]
			s.mu.Lock()
			ok := lw.state == wsWant
			lw.queued = false
			s.mu.Unlock()
			if ok {
				inflight = lw
				sess.sendCreate(lw)
			}
		}
		select {
		case <-ctx.Done():
			sess.close()
			return
		case <-sess.broken:
			return
		case <-sess.created:
			inflight = nil
		case f := <-s.actions:
			f(sess)
			enqueueWanted()
		case <-progress.C:
			if !s.l.draining.Load() {
				sess.sendProgress()
			}
			progress.Reset(s.progressDelay())
		}
	}
}

func (s *rawSlot) progressDelay() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(500+s.rng.IntN(5500)) * time.Millisecond
}

func (sess *session) close() {
	sess.closing.Store(true)
	sess.sr.mu.Lock()
	sess.sr.end(sess.slot.l.rec, "closed")
	sess.sr.mu.Unlock()
	sess.cancel()
}

func (sess *session) sender() {
	for it := range sess.sendq {
		sess.sr.mu.Lock()
		if it.lw != nil {
			sess.tracker.Create(it.snd.Watch)
			sess.byRec[it.snd.Watch] = it.lw
		}
		if it.snd.Kind == record.SendCancel {
			sess.tracker.Cancel(it.snd.WatchID)
		}
		sess.sr.send(sess.slot.l.rec, it.snd)
		sess.sr.mu.Unlock()
		_ = sess.stream.Send(it.req)
		if it.done != nil {
			close(it.done)
		}
	}
}

func (sess *session) push(it sendItem) {
	defer func() { _ = recover() }() // the queue is closed once the stream is gone
	sess.sendq <- it
}

// sendCreate opens a new record for lw and sends its create.
func (sess *session) sendCreate(lw *lwatch) {
	s := sess.slot
	l := s.l
	s.mu.Lock()
	resumeOf := -1
	if lw.rec != nil {
		resumeOf = lw.rec.ID
	}
	req := lw.req
	req.StartRevision = lw.nextStart
	kind := lw.nextKind
	lw.req, lw.createdRev, lw.state, lw.got = req, 0, wsPending, 0
	lw.countFrom = max(req.StartRevision-1, 0)
	s.mu.Unlock()
	rec := l.rec.newWatch(sess.sr.s.ID, req, lw.kind, kind, resumeOf)
	s.mu.Lock()
	lw.rec = rec
	s.mu.Unlock()
	var filters []pb.WatchCreateRequest_FilterType
	if req.NoPut {
		filters = append(filters, pb.WatchCreateRequest_NOPUT)
	}
	if req.NoDelete {
		filters = append(filters, pb.WatchCreateRequest_NODELETE)
	}
	cr := &pb.WatchCreateRequest{Key: []byte(req.Key), StartRevision: req.StartRevision, PrevKv: req.PrevKV,
		ProgressNotify: req.ProgressNotify, Filters: filters}
	if req.RangeEnd != "" {
		cr.RangeEnd = []byte(req.RangeEnd)
	}
	sess.push(sendItem{req: &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}},
		snd: record.Send{Kind: record.SendCreate, Watch: rec.ID, KnownRevision: l.rec.known.Load()}, lw: lw})
}

func (sess *session) sendCancel(id int64, reason string) {
	sess.push(sendItem{req: &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}},
		snd: record.Send{Kind: record.SendCancel, WatchID: id, Reason: reason}})
}

func (sess *session) sendProgress() {
	sess.push(sendItem{req: &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}},
		snd: record.Send{Kind: record.SendProgress}})
}

// cancelWatch is the load's own cancel (churn), with or without a resume from the next revision.
func (sess *session) cancelWatch(lw *lwatch, resume bool) bool {
	s := sess.slot
	s.mu.Lock()
	if lw.state != wsOpen {
		s.mu.Unlock()
		return false
	}
	lw.state, lw.resumeOnCancel = wsCancelling, resume
	id := lw.id
	s.mu.Unlock()
	sess.sendCancel(id, "client")
	return true
}

func (sess *session) recvLoop(seed uint64) {
	s := sess.slot
	l := s.l
	r := rand.New(rand.NewPCG(seed, 7))
	nextStall := time.Now().Add(time.Duration(3000+r.IntN(10000)) * time.Millisecond)
	for {
		resp, err := sess.stream.Recv()
		if err != nil {
			sess.sr.mu.Lock()
			if sess.closing.Load() || errors.Is(err, context.Canceled) && l.stopping.Load() {
				sess.sr.end(l.rec, "closed")
			} else {
				sess.sr.end(l.rec, "broken: "+err.Error())
			}
			sess.sr.mu.Unlock()
			close(sess.broken)
			return
		}
		sess.sr.mu.Lock()
		rr := sess.sr.recv(l.rec, resp)
		out := sess.tracker.Recv(rr)
		compactRev, watchID := rr.CompactRevision, rr.WatchID
		denied := strings.Contains(rr.CancelReason, errPermissionDenied)
		var lastEv int64
		if n := len(rr.Events); n > 0 {
			lastEv = rr.Events[n-1].Rev()
		}
		progress := rr.IsProgressNotify()
		rev := rr.Revision
		evRevs := make([]int64, len(rr.Events))
		for i := range rr.Events {
			evRevs[i] = rr.Events[i].Rev()
		}
		// byRec is written by the sender under sr.mu: read it here, not under s.mu.
		var lw *lwatch
		if out.Watch >= 0 {
			lw = sess.byRec[out.Watch]
		}
		var applies []*lwatch
		for _, w := range out.Applies {
			applies = append(applies, sess.byRec[w])
		}
		sess.sr.mu.Unlock()

		s.mu.Lock()
		signal := false
		var after func()
		switch out.Kind {
		case record.OutCreated:
			lw.id, lw.createdRev, lw.state = watchID, rev, wsOpen
			if lw.req.StartRevision == 0 {
				lw.countFrom = rev
			}
			signal = true
		case record.OutCreateRejected:
			signal = true
			if denied {
				lw.state = wsDropped // refused for good: not asked again
				break
			}
			after = s.closedByServer(lw, compactRev)
		case record.OutWatch:
			if lastEv > lw.lastEv {
				lw.lastEv = lastEv
			}
			lw.got += countAbove(evRevs, lw.countFrom)
			if progress && rev > lw.lastProg {
				lw.lastProg = rev
			}
		case record.OutStreamProgress:
			for _, x := range applies {
				if x != nil && rev > x.lastProg {
					x.lastProg = rev
				}
			}
			if rev > sess.streamProg.Load() {
				sess.streamProg.Store(rev)
			}
		case record.OutCancelAck:
			if lastEv > lw.lastEv {
				lw.lastEv = lastEv
			}
			if lw.resumeOnCancel {
				lw.state, lw.nextStart, lw.nextKind = wsWant, lw.next(), "resume"
			} else {
				lw.state = wsDropped
			}
		case record.OutServerCancel:
			if lastEv > lw.lastEv {
				lw.lastEv = lastEv
			}
			sess.cancelled[watchID] = true
			after = func() { sess.sendCancel(watchID, "after server cancel") } // as clientv3 does
			if lw.state == wsCancelling && !lw.resumeOnCancel {
				lw.state = wsDropped
				break
			}
			more := s.closedByServer(lw, compactRev)
			first := after
			after = func() { first(); more() }
		case record.OutUnknownID:
			if !sess.cancelled[watchID] {
				sess.cancelled[watchID] = true
				after = func() { sess.sendCancel(watchID, "unknown id") }
			}
		}
		s.mu.Unlock()
		if after != nil {
			after()
		}
		if signal {
			select {
			case sess.created <- struct{}{}:
			default:
			}
		}
		if out.Kind == record.OutCancelAck {
			s.do(func(*session) {})
		}

		if s.slow && !l.draining.Load() {
			time.Sleep(time.Duration(2+r.IntN(9)) * time.Millisecond)
			if time.Now().After(nextStall) {
				time.Sleep(time.Duration(1000+r.IntN(5000)) * time.Millisecond)
				nextStall = time.Now().Add(time.Duration(3000+r.IntN(12000)) * time.Millisecond)
			}
		}
	}
}

// closedByServer decides what follows a server-side cancel (call with s.mu held): after a
// compaction, a new watch from the compaction revision; otherwise a retry after a second.
func (s *rawSlot) closedByServer(lw *lwatch, compactRev int64) func() {
	if compactRev != 0 {
		lw.state, lw.nextStart, lw.nextKind = wsWant, compactRev, "after-compaction"
		return func() { s.do(func(*session) {}) }
	}
	lw.state = wsWaitRetry
	return func() {
		time.AfterFunc(time.Second, func() {
			s.mu.Lock()
			if lw.state == wsWaitRetry {
				lw.state, lw.nextStart, lw.nextKind = wsWant, lw.next(), "retry"
			}
			s.mu.Unlock()
			s.do(func(*session) {})
		})
	}
}

// settled says whether every watch of the slot is open and has received as many events as etcd
// wrote for it up to rev.
func (s *rawSlot) settled(rev int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return false
	}
	for _, lw := range s.watches {
		switch lw.state {
		case wsWant, wsPending, wsWaitRetry:
			return false
		case wsOpen:
			if lw.got < s.l.gt.countMatching(&lw.req, lw.countFrom, rev) {
				return false
			}
		}
	}
	return true
}

func countAbove(revs []int64, from int64) int {
	n := 0
	for _, r := range revs {
		if r > from {
			n++
		}
	}
	return n
}

// finish marks the open records at the end of the run and closes the stream.
func (s *rawSlot) finish(final int64) {
	s.mu.Lock()
	sess := s.cur
	for _, lw := range s.watches {
		if lw.state == wsOpen && lw.rec != nil && sess != nil {
			lw.rec.OpenAtEnd = true
			lw.rec.Drained = lw.got >= s.l.gt.countMatching(&lw.req, lw.countFrom, final)
		}
	}
	s.mu.Unlock()
}
