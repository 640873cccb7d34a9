package harness

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"watchcache.local/tools/robustness/checker"
	"watchcache.local/tools/robustness/record"
)

// SlowConfig is the slow-readers run's settings (defaults: issue 10's).
type SlowConfig struct {
	Streams, PerStream int           // 100 × 10 watchers on the prefix
	Rate               float64       // events/s (txns of 10 puts)
	Warmup             time.Duration // reading normally before the stall
	Stall              time.Duration // no reading at all
	Recover            time.Duration // writes go on this long after reading resumes
	CatchUp            time.Duration // the longest the watchers may take to catch up
	FlagSet            int
	Extra              []string // more watchcache flags
	EtcdBin            string
	WatchcacheBin      string
	Out                string
	Log                func(format string, args ...any)
}

func (c *SlowConfig) defaults() {
	if c.Streams == 0 {
		c.Streams = 100
	}
	if c.PerStream == 0 {
		c.PerStream = 10
	}
	if c.Rate == 0 {
		c.Rate = 1000
	}
	if c.Warmup == 0 {
		c.Warmup = 10 * time.Second
	}
	if c.Stall == 0 {
		c.Stall = 60 * time.Second
	}
	if c.Recover == 0 {
		c.Recover = 10 * time.Second
	}
	if c.CatchUp == 0 {
		c.CatchUp = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
}

// SlowResult is what the run measured.
type SlowResult struct {
	Args                []string
	Watchers            int
	Writes, Events      int64 // txns written, events in etcd's history during the run
	FinalRevision       int64
	RSSKB               []int64 // watchcache's VmRSS, once a second
	BaselineKB, PeakKB  int64
	CatchUpSeconds      float64 // from reading again until every watcher had everything up to then
	CompleteSeconds     float64 // ... until every watcher had everything up to the final revision
	CaughtUp            bool
	EventsDelivered     int64
	Counts              map[string]int // violations per property, over all watchers
	Examples            []string
	WatchersWithProblem int
}

func vmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// RunSlowReaders: 1 000 watchers on the prefix stop reading for 60 s under 1 000 events/s and
// then read again; watchcache's RSS is sampled every second, and every watcher must get every
// event exactly once (checked online against the ground truth).
func RunSlowReaders(cfg SlowConfig) (*SlowResult, error) {
	cfg.defaults()
	dir := cfg.Out
	if dir == "" {
		d, err := os.MkdirTemp("", "robustness-slow-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := os.MkdirTemp("", "robustness-slow-data-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(data)
	defer KillAll()
	etcds, members, err := NewEtcd(cfg.EtcdBin, data, 1, 2*time.Second)
	if err != nil {
		return nil, err
	}
	etcd := etcds[0]
	etcd.LogPath = dir + "/etcd.log"
	if err := etcd.Start(30 * time.Second); err != nil {
		return nil, err
	}
	wc, tgt, err := NewWatchcache(cfg.WatchcacheBin, dir, "watchcache", []string{members[0].Endpoint()}, append(FlagSet(cfg.FlagSet), cfg.Extra...))
	if err != nil {
		return nil, err
	}
	if err := wc.Start(60 * time.Second); err != nil {
		return nil, err
	}
	res := &SlowResult{Args: append([]string{wc.Bin}, wc.Args...), Watchers: cfg.Streams * cfg.PerStream, Counts: map[string]int{}}
	cfg.Log("slow-readers: %d streams × %d watches, %.0f events/s, stall %s; %v", cfg.Streams, cfg.PerStream, cfg.Rate, cfg.Stall, res.Args)

	in := &interner{m: map[string]string{}}
	gt := newGroundTruth([]string{members[0].Endpoint()}, in)
	gt.indexed, gt.index = true, map[gtKey]int{}
	gtCtx, gtStop := context.WithCancel(context.Background())
	defer gtStop()
	go gt.run(gtCtx)
	cli, err := newClient([]string{members[0].Endpoint()}, false, nil)
	if err != nil {
		return nil, err
	}
	defer cli.Close()

	// RSS once a second.
	var rssMu sync.Mutex
	rssCtx, rssStop := context.WithCancel(context.Background())
	defer rssStop()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-rssCtx.Done():
				return
			case <-t.C:
			}
			if kb, err := vmRSS(wc.Pid()); err == nil {
				rssMu.Lock()
				res.RSSKB = append(res.RSSKB, kb)
				rssMu.Unlock()
			}
		}
	}()

	// Writes: txns of 10 puts on distinct keys under the prefix.
	var writes atomic.Int64
	var ackRev atomic.Int64
	loadCtx, loadStop := context.WithCancel(context.Background())
	defer loadStop()
	txn := func(ctx context.Context, r *rand.Rand, seq int) {
		seen := map[string]bool{}
		var ops []clientv3.Op
		for len(ops) < 10 {
			k := pick(r, innerKeys)
			if seen[k] {
				continue
			}
			seen[k] = true
			ops = append(ops, clientv3.OpPut(k, fmt.Sprintf("v%d-%x", seq, r.Uint32())))
		}
		octx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if resp, err := cli.Txn(octx).Then(ops...).Commit(); err == nil {
			writes.Add(1)
			for {
				k := ackRev.Load()
				if resp.Header.Revision <= k || ackRev.CompareAndSwap(k, resp.Header.Revision) {
					break
				}
			}
		}
	}
	wg := every(loadCtx, cfg.Rate/10, 16, 99, txn)
	time.Sleep(time.Second)

	// The watchers: raw streams with 64 KiB windows, each watch from the current revision.
	var paused atomic.Bool
	resume := make(chan struct{})
	var delivered atomic.Int64
	var followers []*checker.Follower
	var fmu sync.Mutex
	watchCtx, watchStop := context.WithCancel(context.Background())
	defer watchStop()
	var ready sync.WaitGroup
	errc := make(chan error, cfg.Streams)
	for s := 0; s < cfg.Streams; s++ {
		ready.Add(1)
		go func() {
			conn, err := dial(tgt.Endpoint(), true)
			if err != nil {
				errc <- err
				ready.Done()
				return
			}
			defer conn.Close()
			stream, err := pb.NewWatchClient(conn).Watch(watchCtx)
			if err != nil {
				errc <- err
				ready.Done()
				return
			}
			byID := map[int64]*checker.Follower{}
			req := record.CreateRequest{Key: "/registry/", RangeEnd: prefixEnd("/registry/")}
			for w := 0; w < cfg.PerStream; w++ {
				from := ackRev.Load() + 1
				r := req
				r.StartRevision = from
				if err := stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
					Key: []byte(r.Key), RangeEnd: []byte(r.RangeEnd), StartRevision: from}}}); err != nil {
					errc <- err
					ready.Done()
					return
				}
				f := checker.NewFollower(fmt.Sprintf("stream %d watch %d (from %d)", s, w, from), r, from, gt)
				fmu.Lock()
				followers = append(followers, f)
				fmu.Unlock()
				for {
					resp, err := stream.Recv()
					if err != nil {
						errc <- err
						ready.Done()
						return
					}
					if resp.Created {
						if resp.Canceled {
							f.Response(&record.Response{Canceled: true, CancelReason: resp.CancelReason})
						}
						byID[resp.WatchId] = f
						break
					}
					rr := in.response(resp, 0, 0)
					if g := byID[resp.WatchId]; g != nil {
						delivered.Add(int64(len(rr.Events)))
						g.Response(&rr)
					}
				}
			}
			ready.Done()
			for {
				if paused.Load() {
					select {
					case <-resume:
					case <-watchCtx.Done():
						return
					}
				}
				resp, err := stream.Recv()
				if err != nil {
					if watchCtx.Err() == nil {
						fmu.Lock()
						res.Counts["stream broken"]++
						if len(res.Examples) < 10 {
							res.Examples = append(res.Examples, fmt.Sprintf("stream %d broken: %v", s, err))
						}
						fmu.Unlock()
					}
					return
				}
				rr := in.response(resp, 0, 0)
				if g := byID[resp.WatchId]; g != nil {
					delivered.Add(int64(len(rr.Events)))
					g.Response(&rr)
				} else if resp.WatchId != -1 {
					fmu.Lock()
					res.Counts[checker.WatchID]++
					fmu.Unlock()
				}
			}
		}()
	}
	ready.Wait()
	select {
	case err := <-errc:
		return nil, fmt.Errorf("creating the watchers: %w", err)
	default:
	}
	cfg.Log("slow-readers: %d watchers created; warming up %s", len(followers), cfg.Warmup)
	time.Sleep(cfg.Warmup)
	rssMu.Lock()
	if n := len(res.RSSKB); n > 0 {
		var sum int64
		k := min(n, 3)
		for _, v := range res.RSSKB[n-k:] {
			sum += v
		}
		res.BaselineKB = sum / int64(k)
	}
	rssMu.Unlock()
	cfg.Log("slow-readers: baseline RSS %d kB; every watcher stops reading for %s", res.BaselineKB, cfg.Stall)
	paused.Store(true)
	time.Sleep(cfg.Stall)
	resumedAt := time.Now()
	atResume := ackRev.Load()
	paused.Store(false)
	close(resume)
	cfg.Log("slow-readers: reading again (etcd at %d)", atResume)
	// Catch-up: until every watcher has everything up to etcd's revision when reading resumed.
	for res.CatchUpSeconds == 0 && time.Since(resumedAt) < cfg.CatchUp {
		all := true
		fmu.Lock()
		for _, f := range followers {
			if f.Behind(atResume) > 0 {
				all = false
				break
			}
		}
		fmu.Unlock()
		if all {
			res.CatchUpSeconds = time.Since(resumedAt).Seconds()
			cfg.Log("slow-readers: every watcher has revision %d after %.1fs", atResume, res.CatchUpSeconds)
			break
		}
		if time.Since(resumedAt) >= cfg.Recover && writes.Load() > 0 {
			loadStop() // keep writing only as long as asked
		}
		time.Sleep(250 * time.Millisecond)
	}
	if rest := cfg.Recover - time.Since(resumedAt); rest > 0 {
		time.Sleep(rest)
	}
	loadStop()
	wg.Wait()
	final, err := currentRevision(cli)
	if err != nil {
		return nil, err
	}
	if err := gt.WaitFor(final, 60*time.Second); err != nil {
		return nil, err
	}
	res.FinalRevision = final
	deadline := resumedAt.Add(cfg.CatchUp)
	for {
		behind, worst := 0, 0
		fmu.Lock()
		for _, f := range followers {
			if b := f.Behind(final); b > 0 {
				behind++
				worst = max(worst, b)
			}
		}
		fmu.Unlock()
		if behind == 0 {
			res.CaughtUp = true
			res.CompleteSeconds = time.Since(resumedAt).Seconds()
			break
		}
		if time.Now().After(deadline) {
			res.CompleteSeconds = time.Since(resumedAt).Seconds()
			break
		}
		cfg.Log("slow-readers: %d watchers still behind (at most %d events)", behind, worst)
		time.Sleep(2 * time.Second)
	}
	watchStop()
	time.Sleep(200 * time.Millisecond)
	rssStop()
	fmu.Lock()
	for _, f := range followers {
		f.Finish(final)
		bad := false
		for p, n := range f.Counts {
			res.Counts[p] += n
			bad = true
		}
		if bad {
			res.WatchersWithProblem++
			for _, e := range f.Examples {
				if len(res.Examples) < 20 {
					res.Examples = append(res.Examples, e)
				}
			}
		}
	}
	fmu.Unlock()
	rssMu.Lock()
	for _, v := range res.RSSKB {
		res.PeakKB = max(res.PeakKB, v)
	}
	rssMu.Unlock()
	res.Writes = writes.Load()
	res.Events = int64(gt.Len())
	res.EventsDelivered = delivered.Load()
	return res, nil
}
