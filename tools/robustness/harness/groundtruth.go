package harness

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"watchcache.local/tools/robustness/record"
)

const maxMsg = 256 << 20

func dial(endpoint string, slow bool) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg)),
	}
	if slow {
		opts = append(opts, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	}
	return grpc.NewClient(endpoint, opts...)
}

// groundTruth is one watch on etcd itself over the whole keyspace from revision 1 with prev_kv,
// resumed from the last revision + 1 whenever its stream breaks (etcd restarts): etcd's history.
type groundTruth struct {
	endpoints []string
	creds     *Creds // nil: etcd's auth is off
	in        *interner
	mu        sync.RWMutex
	events    []record.Event
	indexed   bool // keep an index for Find (the slow-readers run)
	index     map[gtKey]int
	revFirst  []int32 // index of the first event of each revision (indexed only)
	last      atomic.Int64
	err       atomic.Value // a harness failure (the ground truth was cancelled)
	resumes   int
	timed     bool        // keep each response's arrival time (for the HA gaps)
	times     []time.Time // arrival of each event response (timed only)
}

// arrivals are the event responses' arrival times since start (timed only).
func (g *groundTruth) arrivals(start time.Time) []time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]time.Duration, len(g.times))
	for i, t := range g.times {
		out[i] = t.Sub(start)
	}
	return out
}

func newGroundTruth(endpoints []string, in *interner) *groundTruth {
	g := &groundTruth{endpoints: endpoints, in: in}
	g.last.Store(1)
	return g
}

func (g *groundTruth) Last() int64 { return g.last.Load() }

func (g *groundTruth) History() []record.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]record.Event(nil), g.events...)
}

func (g *groundTruth) Err() error {
	if e, ok := g.err.Load().(error); ok {
		return e
	}
	return nil
}

// WaitFor waits until the ground truth has seen rev.
func (g *groundTruth) WaitFor(rev int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for g.Last() < rev {
		if err := g.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ground truth at %d, etcd at %d after %s", g.Last(), rev, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func (g *groundTruth) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		ep := g.endpoints[i%len(g.endpoints)]
		if err := g.once(ctx, ep); err != nil && ctx.Err() == nil {
			if _, fatal := err.(fatalErr); fatal {
				g.err.Store(err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

type fatalErr struct{ error }

func (g *groundTruth) once(ctx context.Context, ep string) error {
	conn, err := dial(ep, false)
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sctx, err = withToken(sctx, conn, g.creds)
	if err != nil {
		return err
	}
	stream, err := pb.NewWatchClient(conn).Watch(sctx)
	if err != nil {
		return err
	}
	start := g.Last() + 1
	if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: start, PrevKv: true}}}); err != nil {
		return err
	}
	g.mu.Lock()
	g.resumes++
	g.mu.Unlock()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		if resp.Canceled {
			return fatalErr{fmt.Errorf("ground-truth watch from %d cancelled (compact_revision %d, %q): the history is incomplete", start, resp.CompactRevision, resp.CancelReason)}
		}
		if len(resp.Events) == 0 {
			continue
		}
		g.mu.Lock()
		for _, e := range resp.Events {
			if g.indexed {
				rev := e.Kv.ModRevision
				for int64(len(g.revFirst)) <= rev {
					g.revFirst = append(g.revFirst, int32(len(g.events)))
				}
				g.index[gtKey{rev, string(e.Kv.Key)}] = len(g.events)
			}
			g.events = append(g.events, g.in.event(e))
		}
		last := resp.Events[len(resp.Events)-1].Kv.ModRevision
		if g.timed {
			g.times = append(g.times, time.Now())
		}
		g.mu.Unlock()
		g.last.Store(last)
	}
}

type gtKey struct {
	rev int64
	key string
}

// The checker.Source of a live ground truth (indexed).

func (g *groundTruth) WaitRev(rev int64) bool { return g.WaitFor(rev, 30*time.Second) == nil }

func (g *groundTruth) Len() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.events)
}

func (g *groundTruth) Event(i int) *record.Event {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return &g.events[i]
}

func (g *groundTruth) Find(rev int64, key string) (int, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	i, ok := g.index[gtKey{rev, key}]
	return i, ok
}

func (g *groundTruth) FirstAt(rev int64) int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if rev < int64(len(g.revFirst)) {
		if rev < 0 {
			return 0
		}
		return int(g.revFirst[rev])
	}
	return len(g.events)
}

// countMatching is the number of events in (from, to] that req matches.
func (g *groundTruth) countMatching(req *record.CreateRequest, from, to int64) int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	i := sort.Search(len(g.events), func(i int) bool { return g.events[i].Rev() > from })
	n := 0
	for ; i < len(g.events) && g.events[i].Rev() <= to; i++ {
		if req.Matches(&g.events[i]) {
			n++
		}
	}
	return n
}
