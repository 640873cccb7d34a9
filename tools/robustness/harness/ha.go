package harness

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"watchcache.local/tools/robustness/record"
)

// HAConfig is the HA run's settings.
type HAConfig struct {
	Seed          int64
	Duration      time.Duration
	Watches       int
	WriteRate     float64
	FlagSet       int
	EtcdBin       string
	WatchcacheBin string
	Out           string
	Log           func(format string, args ...any)
}

// Failover is one fault of the HA run and how long the watches went without an event.
type Failover struct {
	What     string
	At       time.Duration
	Replica  string // the replica the client used before, and after
	After    string
	GapsMS   []float64 // per prefix watch: the longest time without an event around the fault
	EtcdGaps float64   // the same for the ground truth on etcd (writes pause while etcd elects)
}

// HAResult is what the HA run measured.
type HAResult struct {
	Run       *record.Run
	Failovers []Failover
}

// metricValue reads one unlabelled gauge from a watchcache's /metrics.
func metricValue(httpPort int, name string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, fmt.Errorf("%s not in /metrics", name)
}

// RunHA: a 3-member etcd cluster, two watchcache replicas in front of it (each given every
// member), a clientv3 client given both replicas with ~20 watches under a write load; SIGKILL
// the replica it uses, later SIGKILL the etcd leader, restart both; the watches must continue
// through the other replica with nothing lost or duplicated.
func RunHA(cfg HAConfig) (*HAResult, error) {
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if cfg.Watches == 0 {
		cfg.Watches = 20
	}
	if cfg.WriteRate == 0 {
		cfg.WriteRate = 100
	}
	dir := cfg.Out
	if dir == "" {
		d, err := os.MkdirTemp("", "robustness-ha-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := os.MkdirTemp("", "robustness-ha-data-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(data)
	defer KillAll()
	etcds, members, err := NewEtcd(cfg.EtcdBin, data, 3, 2*time.Second)
	if err != nil {
		return nil, err
	}
	var eps []string
	for i, p := range etcds {
		p.LogPath = filepath.Join(dir, fmt.Sprintf("etcd-m%d.log", i))
		eps = append(eps, members[i].Endpoint())
	}
	// The members need each other for a leader: start all, then wait for each.
	errs := make(chan error, 3)
	for _, p := range etcds {
		go func() { errs <- p.Start(60 * time.Second) }()
	}
	for range etcds {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	var reps []*Proc
	var tgts []Target
	for i := 0; i < 2; i++ {
		p, t, err := NewWatchcache(cfg.WatchcacheBin, dir, fmt.Sprintf("watchcache-%c", 'a'+i), eps, FlagSet(cfg.FlagSet))
		if err != nil {
			return nil, err
		}
		if err := p.Start(60 * time.Second); err != nil {
			return nil, err
		}
		reps, tgts = append(reps, p), append(tgts, t)
	}
	cfg.Log("ha: etcd %v, replicas %s %s", eps, tgts[0].Endpoint(), tgts[1].Endpoint())

	rec := newRecorder()
	gt := newGroundTruth(eps, &rec.in)
	gt.timed = true
	gtCtx, gtStop := context.WithCancel(context.Background())
	defer gtStop()
	go gt.run(gtCtx)
	etcdCli, err := newClient(eps, false, nil)
	if err != nil {
		return nil, err
	}
	defer etcdCli.Close()
	client, err := newClient([]string{tgts[0].Endpoint(), tgts[1].Endpoint()}, false, nil)
	if err != nil {
		return nil, err
	}
	defer client.Close()

	l := &load{cfg: Config{Seed: cfg.Seed}, rec: rec, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 5)), targetName: "watchcache-ha", gt: gt}
	loadCtx, loadStop := context.WithCancel(context.Background())
	defer loadStop()
	w := &writer{rec: rec, etcd: etcdCli, tgt: etcdCli, targetName: "etcd", leases: map[clientv3.LeaseID]bool{}}
	writes := every(loadCtx, cfg.WriteRate, 16, uint64(cfg.Seed)<<8|7, w.one)
	time.Sleep(time.Second)

	// The watches: prefix, key, range, prev_kv; on one clientv3 Watcher (one stream).
	watchCtx, watchStop := context.WithCancel(context.Background())
	defer watchStop()
	slot := &v3Slot{l: l, id: 0, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 6)), cli: client, w: clientv3.NewWatcher(client)}
	l.v3 = []*v3Slot{slot}
	sels := []keySel{{"prefix", "/registry/", prefixEnd("/registry/")}, {"sub-prefix", "/registry/pods/", prefixEnd("/registry/pods/")}}
	var prefixWatches []*v3watch
	for i := 0; i < cfg.Watches; i++ {
		var sel keySel
		switch {
		case i < 6:
			sel = sels[i%2]
		case i < 12:
			sel = keySel{"key", pick(l.rng, innerKeys), ""}
		default:
			a, b := pick(l.rng, innerKeys), pick(l.rng, innerKeys)
			if a > b {
				a, b = b, a
			}
			if a == b {
				b = prefixEnd(a)
			}
			sel = keySel{"range", a, b}
		}
		req := record.CreateRequest{Key: sel.key, RangeEnd: sel.end, PrevKV: i%2 == 0, ProgressNotify: i%3 == 0}
		vw := &v3watch{slot: slot, req: req, kind: sel.kind}
		slot.mu.Lock()
		slot.watches = append(slot.watches, vw)
		slot.mu.Unlock()
		slot.start(watchCtx, vw, rec.known.Load()+1, "recent")
		if sel.kind == "prefix" || sel.kind == "sub-prefix" {
			prefixWatches = append(prefixWatches, vw)
		}
	}
	inUse := func() int {
		for attempt := 0; attempt < 50; attempt++ {
			var counts [2]float64
			for i, t := range tgts {
				v, err := metricValue(t.HTTP, "watchcache_grpc_watchers")
				if err == nil {
					counts[i] = v
				}
			}
			if counts[0] > 0 && counts[1] == 0 {
				return 0
			}
			if counts[1] > 0 && counts[0] == 0 {
				return 1
			}
			time.Sleep(200 * time.Millisecond)
		}
		return -1
	}
	res := &HAResult{}
	// The interruption a fault caused: the longest time between two event responses of a
	// watch in the window from 1 s before the fault to 8 s after it.
	measure := func(at time.Duration, f *Failover) {
		time.Sleep(8 * time.Second)
		lo, hi := at-time.Second, at+8*time.Second
		for _, vw := range prefixWatches {
			slot.mu.Lock()
			sr := vw.sr
			slot.mu.Unlock()
			var times []time.Duration
			sr.mu.Lock()
			for _, r := range sr.s.Recvs {
				if len(r.Events) > 0 && r.At >= lo && r.At <= hi {
					times = append(times, r.At)
				}
			}
			sr.mu.Unlock()
			f.GapsMS = append(f.GapsMS, maxGap(times, lo, hi))
		}
		f.EtcdGaps = maxGap(gt.arrivals(rec.start), lo, hi)
	}

	phase := cfg.Duration / 6
	time.Sleep(phase)
	used := inUse()
	if used < 0 {
		return nil, fmt.Errorf("cannot tell which replica the client uses (watchcache_grpc_watchers)")
	}
	f1 := Failover{What: "SIGKILL of the replica in use", At: rec.now(), Replica: reps[used].Name}
	cfg.Log("ha: killing %s (in use) at +%.1fs", reps[used].Name, f1.At.Seconds())
	reps[used].Kill()
	rec.addFault(record.Fault{Kind: "replica-kill", At: f1.At, Until: rec.now(), Note: reps[used].Name})
	measure(f1.At, &f1)
	if other := inUse(); other >= 0 {
		f1.After = reps[other].Name
	}
	if err := reps[used].Start(60 * time.Second); err != nil {
		return nil, err
	}
	res.Failovers = append(res.Failovers, f1)
	time.Sleep(phase)

	leader := -1
	for i, m := range members {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := etcdCli.Status(ctx, m.Endpoint())
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		return nil, fmt.Errorf("no etcd leader found")
	}
	f2 := Failover{What: "SIGKILL of the etcd leader", At: rec.now(), Replica: members[leader].Name}
	cfg.Log("ha: killing etcd leader %s at +%.1fs", members[leader].Name, f2.At.Seconds())
	etcds[leader].Kill()
	rec.addFault(record.Fault{Kind: "etcd-leader-kill", At: f2.At, Until: rec.now(), Note: members[leader].Name})
	measure(f2.At, &f2)
	if u := inUse(); u >= 0 {
		f2.After = reps[u].Name
	}
	if err := etcds[leader].Start(60 * time.Second); err != nil {
		return nil, err
	}
	res.Failovers = append(res.Failovers, f2)
	if rest := cfg.Duration - rec.now(); rest > 0 {
		time.Sleep(rest)
	}

	loadStop()
	writes.Wait()
	w.wg.Wait()
	if err := w.revokeAll(context.Background()); err != nil {
		return nil, err
	}
	final, err := currentRevision(etcdCli)
	if err != nil {
		return nil, err
	}
	if err := gt.WaitFor(final, 60*time.Second); err != nil {
		return nil, err
	}
	l.draining.Store(true)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !slot.settled(final) {
		go slot.requestProgress(watchCtx)
		time.Sleep(300 * time.Millisecond)
	}
	slot.finish(final)
	l.stopping.Store(true)
	watchStop()
	slot.w.Close()
	time.Sleep(300 * time.Millisecond)
	gtStop()
	if err := gt.Err(); err != nil {
		return nil, err
	}
	out := rec.run(gt.History())
	out.Target, out.Duration, out.FinalRevision, out.Seed = "watchcache-ha", cfg.Duration, final, cfg.Seed
	for _, p := range reps {
		out.Args = append(out.Args, strings.Join(append([]string{p.Bin}, p.Args...), " "))
	}
	res.Run = out
	if cfg.Out != "" {
		_ = out.Save(filepath.Join(cfg.Out, "run.gob.gz"))
	}
	return res, nil
}

// Median of a list.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// Max of a list.
func Max(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// maxGap is the longest interval without an arrival in [lo, hi], in ms.
func maxGap(times []time.Duration, lo, hi time.Duration) float64 {
	prev := lo
	var m time.Duration
	for _, t := range times {
		if t < lo || t > hi {
			continue
		}
		m = max(m, t-prev)
		prev = t
	}
	m = max(m, hi-prev)
	return float64(m) / 1e6
}
