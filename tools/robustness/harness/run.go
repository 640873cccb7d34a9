package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"watchcache.local/tools/robustness/record"
)

// Config is one run's settings.
type Config struct {
	Seed          int64
	Duration      time.Duration
	FlagSet       int
	Target        string // "watchcache" or "etcd"
	EtcdBin       string
	WatchcacheBin string
	Out           string // directory for logs and the recording ("" = a temporary one, removed)
	Save          bool   // write run.gob.gz into Out
	Log           func(format string, args ...any)
	Auth          bool // etcd with auth on (auth.go)

	// Load shape (defaults: issue 10's).
	WriteRate  float64
	RangeRate  float64
	Watches    int
	RawStreams int
	V3Streams  int
}

func (c *Config) defaults() {
	if c.WriteRate == 0 {
		c.WriteRate = 120
	}
	if c.RangeRate == 0 {
		c.RangeRate = 40
	}
	if c.Watches == 0 {
		c.Watches = 120
	}
	if c.RawStreams == 0 {
		c.RawStreams = 35
	}
	if c.V3Streams == 0 {
		c.V3Streams = 10
	}
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
}

// load is one run in progress.
type load struct {
	cfg            Config
	rec            *recorder
	rng            *rand.Rand
	targetEndpoint string
	targetName     string
	etcdEndpoint   string
	etcdCreds      *Creds // root on etcd directly, load through the target (nil: auth off)
	tgtCreds       *Creds
	gt             *groundTruth
	draining       atomic.Bool
	stopping       atomic.Bool
	compacted      atomic.Int64

	raw []*rawSlot
	v3  []*v3Slot
}

// Run plays one seeded run and returns its recording.
func Run(cfg Config) (*record.Run, error) {
	cfg.defaults()
	dir := cfg.Out
	if dir == "" {
		d, err := os.MkdirTemp("", "robustness-")
		if err != nil {
			return nil, err
		}
		dir = d
		defer os.RemoveAll(d)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := os.MkdirTemp("", "robustness-data-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(data)
	defer KillAll()

	l := &load{cfg: cfg, rec: newRecorder(), rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 1))}
	etcds, members, err := NewEtcd(cfg.EtcdBin, data, 1, 2*time.Second)
	if err != nil {
		return nil, err
	}
	etcd := etcds[0]
	etcd.LogPath = filepath.Join(dir, "etcd.log")
	if err := etcd.Start(30 * time.Second); err != nil {
		return nil, err
	}
	l.etcdEndpoint = members[0].Endpoint()
	var wcExtra []string
	if cfg.Auth {
		if err := enableAuth(l.etcdEndpoint); err != nil {
			return nil, err
		}
		l.etcdCreds, l.tgtCreds = rootCreds, loadCreds
		wcExtra = []string{"--etcd-user", rootCreds.User, "--etcd-password", rootCreds.Password}
	}
	var target *Proc
	run := &record.Run{Seed: cfg.Seed, FlagSet: cfg.FlagSet, Target: cfg.Target, Duration: cfg.Duration}
	if cfg.Auth {
		l.rec.note("etcd auth on: root on etcd directly, the users load and limited (a quarter of the watch streams; no secrets) through the target")
		run.Denied = []record.Denied{limitedDenied}
	}
	if cfg.Target == "watchcache" {
		p, t, err := NewWatchcache(cfg.WatchcacheBin, dir, "watchcache", []string{l.etcdEndpoint}, append(FlagSet(cfg.FlagSet), wcExtra...))
		if err != nil {
			return nil, err
		}
		if err := p.Start(60 * time.Second); err != nil {
			return nil, err
		}
		target, l.targetEndpoint, l.targetName = p, t.Endpoint(), "watchcache"
		run.Args = append([]string{p.Bin}, p.Args...)
	} else {
		l.targetEndpoint, l.targetName = l.etcdEndpoint, "etcd"
		run.Args = append([]string{etcd.Bin}, etcd.Args...)
	}
	cfg.Log("seed %d: etcd %s, target %s %v", cfg.Seed, l.etcdEndpoint, l.targetName, run.Args)

	gtCtx, gtStop := context.WithCancel(context.Background())
	defer gtStop()
	l.gt = newGroundTruth([]string{l.etcdEndpoint}, &l.rec.in)
	l.gt.creds = l.etcdCreds
	go l.gt.run(gtCtx)

	etcdCli, err := newClient([]string{l.etcdEndpoint}, false, l.etcdCreds)
	if err != nil {
		return nil, err
	}
	defer etcdCli.Close()
	tgtCli, err := newClient([]string{l.targetEndpoint}, false, l.tgtCreds)
	if err != nil {
		return nil, err
	}
	defer tgtCli.Close()

	loadCtx, loadStop := context.WithCancel(context.Background())
	defer loadStop()
	watchCtx, watchStop := context.WithCancel(context.Background())
	defer watchStop()

	// Watches: 120 over ~45 streams, a quarter of them slow readers.
	if err := l.startWatches(watchCtx); err != nil {
		return nil, err
	}
	w := &writer{rec: l.rec, etcd: etcdCli, tgt: tgtCli, targetName: l.targetName, leases: map[clientv3.LeaseID]bool{}, bigValues: true}
	writes := every(loadCtx, cfg.WriteRate, 24, uint64(cfg.Seed)<<8|1, w.one)
	rd := &reader{rec: l.rec, cli: tgtCli}
	reads := every(loadCtx, cfg.RangeRate, 16, uint64(cfg.Seed)<<8|2, rd.one)
	var bg sync.WaitGroup
	bg.Add(3)
	go func() { defer bg.Done(); l.churn(loadCtx, watchCtx) }()
	go func() { defer bg.Done(); l.compactions(loadCtx, etcdCli) }()
	go func() { defer bg.Done(); l.faults(loadCtx, etcd, target) }()

	timer := time.NewTimer(cfg.Duration)
	select {
	case <-timer.C:
	case <-interrupted():
		loadStop()
		return nil, fmt.Errorf("interrupted")
	}
	cfg.Log("seed %d: load done at +%.1fs; stopping", cfg.Seed, l.rec.now().Seconds())
	loadStop()
	bg.Wait()
	writes.Wait()
	reads.Wait()
	w.wg.Wait()
	if etcd.Exited() {
		return nil, fmt.Errorf("etcd exited unexpectedly (log %s)", etcd.LogPath)
	}
	if target != nil && target.Exited() {
		l.rec.note("watchcache had exited on its own at the end of the load; restarted for the drain")
		if err := target.Start(60 * time.Second); err != nil {
			return nil, err
		}
	}
	if err := w.revokeAll(context.Background()); err != nil {
		return nil, err
	}
	final, err := currentRevision(etcdCli)
	if err != nil {
		return nil, err
	}
	if err := l.gt.WaitFor(final, 60*time.Second); err != nil {
		return nil, err
	}
	// Drain: slow readers read at full speed; every stream is asked for progress until its
	// answer reaches the final revision (or 30 s pass).
	l.draining.Store(true)
	cfg.Log("seed %d: draining to revision %d", cfg.Seed, final)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		all := true
		for _, s := range l.raw {
			if !s.settled(final) {
				all = false
				s.do(func(sess *session) { sess.sendProgress() })
			}
		}
		for _, s := range l.v3 {
			if !s.settled(final) {
				all = false
				go s.requestProgress(watchCtx)
			}
		}
		if all {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if again, err := currentRevision(etcdCli); err != nil || again != final {
		return nil, fmt.Errorf("etcd's revision moved during the drain (%d -> %d, %v)", final, again, err)
	}
	for _, s := range l.raw {
		s.finish(final)
	}
	for _, s := range l.v3 {
		s.finish(final)
	}
	l.stopping.Store(true)
	watchStop()
	time.Sleep(300 * time.Millisecond)
	gtStop()
	if err := l.gt.Err(); err != nil {
		return nil, err
	}
	history := l.gt.History()
	if target != nil {
		target.Kill()
	}
	etcd.Kill()

	out := l.rec.run(history)
	out.Seed, out.FlagSet, out.Target, out.Duration, out.Args = run.Seed, run.FlagSet, run.Target, run.Duration, run.Args
	out.Denied = run.Denied
	out.FinalRevision = final
	if cfg.Save && cfg.Out != "" {
		if err := out.Save(filepath.Join(cfg.Out, "run.gob.gz")); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func currentRevision(cli *clientv3.Client) (int64, error) {
	var last error
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		resp, err := cli.Get(ctx, "/registry/", clientv3.WithCountOnly())
		cancel()
		if err == nil {
			return resp.Header.Revision, nil
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	return 0, fmt.Errorf("etcd's current revision: %w", last)
}

var interruptCh = make(chan struct{})
var interruptOnce sync.Once

// Interrupt makes a running load stop (from a signal handler).
func Interrupt() { interruptOnce.Do(func() { close(interruptCh) }) }

func interrupted() <-chan struct{} { return interruptCh }

// startWatches creates the initial watches: cfg.Watches over the raw and clientv3 slots.
func (l *load) startWatches(ctx context.Context) error {
	cfg := l.cfg
	nSlots := cfg.RawStreams + cfg.V3Streams
	slowEvery := 4 // a quarter of the streams read slowly
	for i := 0; i < cfg.RawStreams; i++ {
		s := &rawSlot{l: l, id: i, slow: i%slowEvery == 1, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(100+i))), actions: make(chan func(*session), 256)}
		l.raw = append(l.raw, s)
	}
	for i := 0; i < cfg.V3Streams; i++ {
		id := cfg.RawStreams + i
		slow := i%slowEvery == 2
		cli, err := newClient([]string{l.targetEndpoint}, slow, l.slotCreds(id))
		if err != nil {
			return err
		}
		s := &v3Slot{l: l, id: id, slow: slow, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(100+id))), cli: cli, w: clientv3.NewWatcher(cli)}
		go func() { <-ctx.Done(); s.w.Close(); cli.Close() }()
		l.v3 = append(l.v3, s)
	}
	// Every slot gets one watch, the rest go anywhere.
	assign := make([]int, cfg.Watches)
	for i := range assign {
		if i < nSlots {
			assign[i] = i
		} else {
			assign[i] = l.rng.IntN(nSlots)
		}
	}
	for _, slot := range assign {
		l.addWatch(ctx, slot, true)
	}
	for _, s := range l.raw {
		go s.serve(ctx)
	}
	return nil
}

// addWatch draws a new watch for a slot.
func (l *load) addWatch(ctx context.Context, slot int, initial bool) {
	sel := randSel(l.rng)
	req := watchReq(l.rng, sel)
	if slot < len(l.raw) {
		kind, start := startRev(l.rng, l.rec.known.Load(), l.compacted.Load(), true, initial)
		req.StartRevision = start
		s := l.raw[slot]
		s.add(&lwatch{req: req, kind: sel.kind, state: wsWant, nextStart: start, nextKind: kind})
		s.do(func(*session) {})
		return
	}
	kind, start := startRev(l.rng, l.rec.known.Load(), l.compacted.Load(), false, initial)
	req.StartRevision = start
	s := l.v3[slot-len(l.raw)]
	w := &v3watch{slot: s, req: req, kind: sel.kind}
	s.mu.Lock()
	s.watches = append(s.watches, w)
	s.mu.Unlock()
	s.start(ctx, w, start, kind)
}

// churn cancels watches (resuming them from the next revision, or replacing them by new
// ones) and asks clientv3 streams for progress, twice a second.
func (l *load) churn(ctx, watchCtx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	nSlots := len(l.raw) + len(l.v3)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		slot := l.rng.IntN(nSlots)
		resume := l.rng.IntN(100) < 60
		if slot < len(l.raw) {
			s := l.raw[slot]
			s.mu.Lock()
			var open []*lwatch
			for _, lw := range s.watches {
				if lw.state == wsOpen {
					open = append(open, lw)
				}
			}
			s.mu.Unlock()
			if len(open) > 0 {
				lw := pick(l.rng, open)
				s.do(func(sess *session) { sess.cancelWatch(lw, resume) })
			}
		} else {
			s := l.v3[slot-len(l.raw)]
			s.mu.Lock()
			var open []*v3watch
			for _, w := range s.watches {
				if w.open && !w.cancelled {
					open = append(open, w)
				}
			}
			s.mu.Unlock()
			if len(open) > 0 {
				s.cancelWatch(pick(l.rng, open), resume)
			}
			if l.rng.IntN(3) == 0 {
				go s.requestProgress(watchCtx)
			}
		}
		if !resume {
			l.addWatch(watchCtx, l.rng.IntN(nSlots), false)
		}
	}
}

// compactions compacts through etcd every 3–8 s, never past what the ground truth has seen.
func (l *load) compactions(ctx context.Context, cli *clientv3.Client) {
	rng := rand.New(rand.NewPCG(uint64(l.cfg.Seed), 2))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(3000+rng.IntN(5000)) * time.Millisecond):
		}
		seen := l.gt.Last()
		lo := l.compacted.Load() + 1
		if seen-lo < 20 {
			continue
		}
		rev := seen - int64(rng.IntN(int(min(300, seen-lo))))
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		at := l.rec.now()
		_, err := cli.Compact(octx, rev)
		cancel()
		c := record.Compaction{Revision: rev, At: at}
		if err != nil {
			c.Err = err.Error()
		} else {
			l.compacted.Store(rev)
		}
		l.rec.addCompaction(c)
	}
}

// faults: etcd SIGSTOP (x2), etcd SIGKILL + restart (x2), target SIGKILL + restart (x2),
// spread over the run at seeded times, one at a time.
func (l *load) faults(ctx context.Context, etcd, target *Proc) {
	rng := rand.New(rand.NewPCG(uint64(l.cfg.Seed), 3))
	type plan struct {
		at   float64
		kind string
	}
	plans := []plan{{0.12, "etcd-stop"}, {0.25, "etcd-kill"}, {0.50, "etcd-stop"}, {0.62, "etcd-kill"}}
	if target != nil {
		plans = append(plans, plan{0.38, "target-kill"}, plan{0.75, "target-kill"}, plan{0.88, "outage-restart"})
	}
	for i := range plans {
		plans[i].at += (rng.Float64() - 0.5) * 0.06
	}
	sort.Slice(plans, func(i, j int) bool { return plans[i].at < plans[j].at })
	for _, p := range plans {
		when := time.Duration(p.at * float64(l.cfg.Duration))
		if d := when - l.rec.now(); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		f := record.Fault{Kind: p.kind, At: l.rec.now()}
		switch p.kind {
		case "etcd-stop":
			d := time.Duration(500+rng.IntN(2500)) * time.Millisecond
			if err := etcd.Signal(syscall.SIGSTOP); err != nil {
				f.Note = err.Error()
				break
			}
			time.Sleep(d)
			if err := etcd.Signal(syscall.SIGCONT); err != nil {
				f.Note = err.Error()
			}
			f.Note = fmt.Sprintf("stopped %s", d)
		case "etcd-kill":
			etcd.Kill()
			down := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
			time.Sleep(down)
			f.Note = fmt.Sprintf("down %s before the restart", down)
			if err := etcd.Start(60 * time.Second); err != nil {
				f.Note = "restart failed: " + err.Error()
			}
		case "target-kill":
			target.Kill()
			if err := target.Start(60 * time.Second); err != nil {
				f.Note = "restart failed: " + err.Error()
			}
		case "outage-restart":
			// The target restarted during an etcd outage: it starts while etcd is down and
			// must come up with etcd, its watchers resuming on it.
			etcd.Kill()
			target.Kill()
			started := make(chan error, 1)
			go func() { started <- target.Start(90 * time.Second) }()
			down := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
			time.Sleep(down)
			f.Note = fmt.Sprintf("etcd down %s, the target started in it", down)
			if err := etcd.Start(60 * time.Second); err != nil {
				f.Note += "; etcd's restart failed: " + err.Error()
			}
			if err := <-started; err != nil {
				f.Note += "; the target's start failed: " + err.Error()
			}
		}
		f.Until = l.rec.now()
		l.rec.addFault(f)
		l.cfg.Log("seed %d: fault %s at +%.1fs (back at +%.1fs) %s", l.cfg.Seed, f.Kind, f.At.Seconds(), f.Until.Seconds(), f.Note)
	}
}
