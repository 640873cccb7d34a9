package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// workload is a simulate() workload (cacher-core/src/simulate.rs) plus a "k8s" section for what
// only the real runs need; the section is removed before the file goes to `watchcache simulate`.
type workload struct {
	raw      map[string]json.RawMessage
	file     string
	Name     string  `json:"name"`
	Duration float64 `json:"duration_s"`
	Seed     int64   `json:"seed"`
	Writes   struct {
		Rate float64 `json:"rate_per_s"`
		Keys int     `json:"keys"`
	} `json:"writes"`
	Watchers struct {
		Count     int      `json:"count"`
		Bookmarks *bool    `json:"bookmarks"`
		Selector  *float64 `json:"selector_fraction"`
	} `json:"watchers"`
	Disconnects struct {
		Rate  float64         `json:"rate_per_watcher_per_h"`
		Delay json.RawMessage `json:"reconnect_delay_s"`
	} `json:"disconnects"`
	Etcd struct {
		Compaction *float64 `json:"compaction_interval_s"`
	} `json:"etcd"`
	Restarts []struct {
		At     float64 `json:"at_s"`
		Outage float64 `json:"outage_s"`
	} `json:"restarts"`
	K8s struct {
		// Share of the reflectors (every k-th) with client-go's WatchListClient on.
		WatchListShare float64 `json:"watchlist_share"`
		// Extra kube-apiserver flags.
		APIServerFlags []string `json:"apiserver_flags"`
		// Extra watchcache serve flags.
		WatchcacheFlags []string `json:"watchcache_flags"`
		What            string   `json:"what"`
	} `json:"k8s"`
}

func loadWorkload(path string) (*workload, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	w := &workload{file: path}
	if err := json.Unmarshal(b, &w.raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := json.Unmarshal(b, w); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if w.Name == "" {
		w.Name = strings.TrimSuffix(filepath.Base(path), ".json")
	}
	if w.Watchers.Count == 0 {
		w.Watchers.Count = 10
	}
	if w.Writes.Keys == 0 {
		w.Writes.Keys = 1000
	}
	return w, nil
}

func (w *workload) bookmarks() bool { return w.Watchers.Bookmarks == nil || *w.Watchers.Bookmarks }
func (w *workload) selector() float64 {
	if w.Watchers.Selector == nil {
		return 1
	}
	return *w.Watchers.Selector
}
func (w *workload) compaction() float64 {
	if w.Etcd.Compaction == nil {
		return 300
	}
	return *w.Etcd.Compaction
}

// delay draws a reconnect delay as simulate() does (const, exp, uniform, or a number).
func (w *workload) delay(r *rand.Rand) float64 {
	var n float64
	if json.Unmarshal(w.Disconnects.Delay, &n) == nil {
		return n
	}
	var d struct {
		Dist        string
		Value, Mean float64
		Min, Max    float64
	}
	if json.Unmarshal(w.Disconnects.Delay, &d) != nil {
		return 1
	}
	switch d.Dist {
	case "exp":
		return r.ExpFloat64() * d.Mean
	case "uniform":
		return d.Min + r.Float64()*(d.Max-d.Min)
	default:
		return d.Value
	}
}

// simFile writes the workload for `watchcache simulate` with the given seed.
func (w *workload) simFile(dir string, seed int64) (string, error) {
	m := map[string]json.RawMessage{}
	for k, v := range w.raw {
		if k != "k8s" {
			m[k] = v
		}
	}
	m["seed"], _ = json.Marshal(seed)
	m["series"], _ = json.Marshal(false)
	b, _ := json.Marshal(m)
	p := filepath.Join(dir, fmt.Sprintf("%s-%d.json", w.Name, seed))
	return p, os.WriteFile(p, b, 0o644)
}

type simSummary struct {
	Watch410          float64 `json:"watch_410"`
	Relists           float64 `json:"relists"`
	RelistsPending    float64 `json:"relists_pending"` // waiting for their backoff step at the end
	EtcdRangeRequests float64 `json:"etcd_range_requests"`
	EtcdListRefused   float64 `json:"etcd_list_410"`
	CacheLists        float64 `json:"cache_lists"`
	Deliveries        float64 `json:"deliveries"`
	Disconnects       float64 `json:"disconnects"`
	Bookmarks         float64 `json:"bookmarks_sent"`
	WatchesStarted    float64 `json:"watches_started"`
	PeakRing          float64 `json:"peak_ring_capacity"`
	Written           float64 `json:"events_written"`
	watchers          float64
}

func simulate(wc string, file string) (*simSummary, error) {
	out, err := exec.Command(wc, "simulate", file).Output()
	if err != nil {
		return nil, fmt.Errorf("watchcache simulate %s: %w", file, err)
	}
	var r struct{ Summary simSummary }
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, err
	}
	return &r.Summary, nil
}

// ----- client-go's WatchListClient gate, per reflector --------------------------------------

type gates struct {
	mu        sync.Mutex
	watchList bool
	base      clientfeatures.Gates
}

func (g *gates) Enabled(k clientfeatures.Feature) bool {
	if k == clientfeatures.WatchListClient {
		return g.watchList
	}
	return g.base.Enabled(k)
}

var featureGates = &gates{base: clientfeatures.FeatureGates()}

func init() { clientfeatures.ReplaceFeatureGates(featureGates) }

// ----- counters of what a client-go reflector did -------------------------------------------

type counters struct {
	Lists, ListsRV0, ListsRVLast, ListsRVEmpty, ListsLimited int64
	WatchLists, Relists                                      int64 // WatchList requests; successful lists or watch-lists after the first
	RelistsAfter410, RelistsOther, ListErrors                int64
	Watches, WatchRefused, Watch410, WatchErrors             int64
	Events, InitialEvents, Bookmarks                         int64
	Disconnects, Reconnects                                  int64
	ReconnectDelaySum, ReconnectExtraSum                     float64          // seconds: block to reconnect, unblock to reconnect
	ListRVs                                                  map[string]int64 `json:",omitempty"`
	Expired                                                  []expiry         `json:",omitempty"` // every 410
}

func (c *counters) add(o *counters) {
	c.Lists += o.Lists
	c.ListsRV0 += o.ListsRV0
	c.ListsRVLast += o.ListsRVLast
	c.ListsRVEmpty += o.ListsRVEmpty
	c.ListsLimited += o.ListsLimited
	c.WatchLists += o.WatchLists
	c.Relists += o.Relists
	c.RelistsAfter410 += o.RelistsAfter410
	c.RelistsOther += o.RelistsOther
	c.ListErrors += o.ListErrors
	c.Expired = append(c.Expired, o.Expired...)
	c.Watches += o.Watches
	c.WatchRefused += o.WatchRefused
	c.Watch410 += o.Watch410
	c.WatchErrors += o.WatchErrors
	c.Events += o.Events
	c.InitialEvents += o.InitialEvents
	c.Bookmarks += o.Bookmarks
	c.Disconnects += o.Disconnects
	c.Reconnects += o.Reconnects
	c.ReconnectDelaySum += o.ReconnectDelaySum
	c.ReconnectExtraSum += o.ReconnectExtraSum
}

// expiry is one 410: which reflector, seconds since its connection was last dropped, the
// resourceVersion its watch asked for.
type expiry struct {
	Reflector  int
	WatchList  bool
	SinceBlock float64
	RV, At     string
}

// sloReflector is one client-go Reflector on its own loopback proxy.
type sloReflector struct {
	idx       int
	watchList bool
	proxy     *tcpProxy
	mu        sync.Mutex
	c         counters
	synced    atomic.Bool
	started   bool // a first list (or watch-list) was made
	blockedAt time.Time
	unblocked time.Time
	waiting   bool
	// a 410 not yet followed by a relist
	pending410 bool
	lastBlock  time.Time
	// blocked by its own disconnect, by a kube-apiserver restart
	ownBlocked, restartBlocked bool
	stopCh                     chan struct{}
}

func (s *sloReflector) listerWatcher(cs kubernetes.Interface, ns, selector string, bookmarks bool) cache.ListerWatcher {
	return &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			s.mu.Lock()
			s.c.Lists++
			switch o.ResourceVersion {
			case "0":
				s.c.ListsRV0++
			case "":
				s.c.ListsRVEmpty++
			default:
				s.c.ListsRVLast++
			}
			if o.Limit > 0 {
				s.c.ListsLimited++
			}
			key := fmt.Sprintf("rv=%s limit=%d", map[bool]string{true: "N", false: o.ResourceVersion}[o.ResourceVersion != "" && o.ResourceVersion != "0"], o.Limit)
			if s.c.ListRVs == nil {
				s.c.ListRVs = map[string]int64{}
			}
			s.c.ListRVs[key]++
			s.mu.Unlock()
			l, err := cs.CoreV1().ConfigMaps(ns).List(context.Background(), o)
			if err == nil {
				s.reconnected()
				if o.Continue == "" {
					s.relisted()
				}
			} else {
				s.mu.Lock()
				s.c.ListErrors++
				s.mu.Unlock()
			}
			return l, err
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			initial := o.SendInitialEvents != nil && *o.SendInitialEvents
			if !bookmarks && !initial {
				o.AllowWatchBookmarks = false
			}
			s.mu.Lock()
			if initial {
				s.c.WatchLists++
			} else {
				s.c.Watches++
			}
			s.mu.Unlock()
			w, err := cs.CoreV1().ConfigMaps(ns).Watch(context.Background(), o)
			if err != nil {
				s.mu.Lock()
				s.c.WatchRefused++
				s.mu.Unlock()
				return nil, err
			}
			s.reconnected()
			if initial {
				s.relisted()
			}
			inInitial := initial
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				s.mu.Lock()
				defer s.mu.Unlock()
				switch e.Type {
				case watch.Error:
					if st, ok := e.Object.(*metav1.Status); ok && (st.Code == 410 || st.Reason == metav1.StatusReasonExpired || st.Reason == metav1.StatusReasonGone) {
						s.c.Watch410++
						s.pending410 = true
						s.c.Expired = append(s.c.Expired, expiry{Reflector: s.idx, WatchList: s.watchList,
							SinceBlock: time.Since(s.lastBlock).Seconds(), RV: o.ResourceVersion, At: time.Now().Format("15:04:05.000")})
					} else {
						s.c.WatchErrors++
					}
				case watch.Bookmark:
					s.c.Bookmarks++
					if m, err := metaAccessor(e.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
						inInitial = false
					}
				default:
					if inInitial {
						s.c.InitialEvents++
					} else {
						s.c.Events++
					}
				}
				return e, true
			}), nil
		},
	}
}

func metaAccessor(o runtime.Object) (metav1.Object, error) {
	if cm, ok := o.(*corev1.ConfigMap); ok {
		return cm, nil
	}
	return nil, fmt.Errorf("not a configmap")
}

func (s *sloReflector) reconnected() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting && !s.unblocked.IsZero() {
		now := time.Now()
		s.c.Reconnects++
		s.c.ReconnectDelaySum += now.Sub(s.blockedAt).Seconds()
		s.c.ReconnectExtraSum += now.Sub(s.unblocked).Seconds()
		s.waiting = false
	}
}

// relisted counts a successful list (or watch-list) after the first: after a 410, or for
// another reason (client-go relists after a watch that ended within a second without an
// event, and after a failed list).
func (s *sloReflector) relisted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		s.c.Relists++
		if s.pending410 {
			s.c.RelistsAfter410++
		} else {
			s.c.RelistsOther++
		}
	}
	s.started = true
	s.pending410 = false
}

func (s *sloReflector) disconnect() {
	s.mu.Lock()
	s.c.Disconnects++
	if !s.waiting {
		s.blockedAt = time.Now()
		s.unblocked = time.Time{}
		s.waiting = true
	}
	s.ownBlocked = true
	s.lastBlock = time.Now()
	s.mu.Unlock()
	s.proxy.block()
}

func (s *sloReflector) reconnect() {
	_ = s.proxy.unblock()
	s.mu.Lock()
	s.ownBlocked = false
	if !s.restartBlocked {
		s.unblocked = time.Now()
	}
	s.mu.Unlock()
}

// ----- one real run -------------------------------------------------------------------------

type realRun struct {
	Backend, Workload string
	Seed              int64
	C, WatchListC     counters // all reflectors; those with WatchListClient on
	Writes, WriteErrs int64
	EtcdRanges        float64 // every gRPC Range request etcd served during the run (background included)
	APIListsToStorage float64 // kube-apiserver's etcd_requests_total{operation="list",resource="configmaps"}
	WCUpstream        map[string]float64
	RingCapacity      float64
	Drain             float64 // seconds waited after the run for relists after 410s
	Err               string  `json:",omitempty"`
	Dur               float64
}

func runReal(b bins, w *workload, viaWatchcache bool, seed int64, keep bool) (res *realRun) {
	res = &realRun{Backend: map[bool]string{true: "watchcache", false: "etcd"}[viaWatchcache], Workload: w.Name, Seed: seed}
	start := time.Now()
	dir := mustMkdirTemp("kube-slo-")
	var e *etcdProc
	var wc *wcProc
	var a *apiserver
	var refl []*sloReflector
	defer func() {
		if p := recover(); p != nil {
			res.Err = fmt.Sprint("panic: ", p)
		}
		for _, s := range refl {
			select {
			case <-s.stopCh:
			default:
				close(s.stopCh)
			}
			s.proxy.close()
		}
		if a != nil && a.proc != nil {
			a.stop(15 * time.Second)
		}
		if wc != nil && wc.proc != nil {
			wc.stop(10 * time.Second)
		}
		if e != nil && e.proc != nil {
			e.stop(10 * time.Second)
		}
		res.Dur = time.Since(start).Seconds()
		if keep || res.Err != "" {
			logf("  [%s %s seed %d] logs in %s", w.Name, res.Backend, seed, dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	fail := func(err error) *realRun { res.Err = err.Error(); return res }
	pk := newPKI(dir)
	var err error
	if e, err = startEtcd(b, dir); err != nil {
		return fail(err)
	}
	storage := e.client
	if viaWatchcache {
		if wc, err = startWatchcache(b, dir, e.client, w.K8s.WatchcacheFlags...); err != nil {
			return fail(err)
		}
		storage = wc.grpc
	}
	args := append([]string{fmt.Sprintf("--etcd-compaction-interval=%ds", int(w.compaction())), "--etcd-count-metric-poll-period=0"}, w.K8s.APIServerFlags...)
	a = newAPIServer("a", dir, storage, pk, args...)
	if err := a.start(b); err != nil {
		return fail(err)
	}
	ctx := context.Background()
	ns := "slo"
	if _, err := a.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	groups, perWatcher := selectorGroups(w.selector())
	for i := 0; i < w.Writes.Keys; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("obj-%05d", i),
			Labels: map[string]string{"group": fmt.Sprint(i % groups)}}, Data: map[string]string{"v": "0"}}
		if _, err := a.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fail(err)
		}
	}
	// As simulate() has it, the objects exist before the cache starts: restart kube-apiserver
	// so that its watch cache lists them and its ring holds only the run's writes.
	a.stop(30 * time.Second)
	if err := a.start(b); err != nil {
		return fail(err)
	}
	// Reflectors, each on its own proxy with its own connection.
	wlEvery := 0
	if w.K8s.WatchListShare > 0 {
		wlEvery = int(math.Round(1 / w.K8s.WatchListShare))
	}
	for i := 0; i < w.Watchers.Count; i++ {
		p, err := newProxy(fmt.Sprintf("127.0.0.1:%d", a.port))
		if err != nil {
			return fail(err)
		}
		s := &sloReflector{idx: i, proxy: p, stopCh: make(chan struct{}), watchList: wlEvery > 0 && i%wlEvery == wlEvery-1}
		refl = append(refl, s)
		cfg := rest.CopyConfig(a.cfg)
		cfg.Host = "https://" + p.addr
		cfg.TLSClientConfig.ServerName = "127.0.0.1"
		cs := kubernetes.NewForConfigOrDie(cfg)
		sel := ""
		if groups > 1 {
			var gs []string
			for k := 0; k < perWatcher; k++ {
				gs = append(gs, fmt.Sprint((i*perWatcher+k)%groups))
			}
			sel = "group in (" + strings.Join(gs, ",") + ")"
		}
		featureGates.mu.Lock()
		featureGates.watchList = s.watchList
		r := cache.NewReflectorWithOptions(s.listerWatcher(cs, ns, sel, w.bookmarks()), &corev1.ConfigMap{},
			&syncStore{Store: cache.NewStore(cache.MetaNamespaceKeyFunc), s: s}, cache.ReflectorOptions{Name: fmt.Sprintf("slo-%d", i)})
		featureGates.mu.Unlock()
		go r.Run(s.stopCh)
	}
	if !waitFor(60*time.Second, func() bool {
		for _, s := range refl {
			if !s.synced.Load() {
				return false
			}
		}
		return true
	}) {
		return fail(fmt.Errorf("reflectors did not sync"))
	}
	// The writer, a Poisson process at the workload's rate, straight to kube-apiserver.
	runStart := time.Now()
	end := runStart.Add(time.Duration(w.Duration * float64(time.Second)))
	m0, w0 := e.metrics(), map[string]float64{}
	if wc != nil {
		w0 = wcUpstream(wc.metrics())
	}
	lists := 0.0
	apiLists := func(m metrics) float64 {
		return m.sum("etcd_requests_total", `operation="list"`, `resource="configmaps"`)
	}
	listBase := apiLists(a.metrics())
	var wg sync.WaitGroup
	var apiMu sync.RWMutex // held for writing while kube-apiserver restarts
	wg.Add(1)
	go func() {
		defer wg.Done()
		wr := rand.New(rand.NewSource(seed*7919 + 1))
		next := time.Now()
		for {
			next = next.Add(time.Duration(wr.ExpFloat64() / w.Writes.Rate * float64(time.Second)))
			if next.After(end) {
				return
			}
			time.Sleep(time.Until(next))
			key := fmt.Sprintf("obj-%05d", wr.Intn(w.Writes.Keys))
			patch := fmt.Sprintf(`{"data":{"v":"%d"}}`, wr.Int63())
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := a.client.CoreV1().ConfigMaps(ns).Patch(cctx, key, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			cancel()
			if err != nil {
				atomic.AddInt64(&res.WriteErrs, 1)
			} else {
				atomic.AddInt64(&res.Writes, 1)
			}
		}
	}()
	// Disconnects: each reflector, while connected, drops after an exponential time.
	for _, s := range refl {
		s := s
		dr := rand.New(rand.NewSource(seed*1000003 + int64(s.idx)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.Disconnects.Rate <= 0 {
				return
			}
			for {
				up := time.Duration(dr.ExpFloat64() * 3600 / w.Disconnects.Rate * float64(time.Second))
				if time.Now().Add(up).After(end) {
					return
				}
				time.Sleep(up)
				d := time.Duration(w.delay(dr) * float64(time.Second))
				s.disconnect()
				if time.Now().Add(d).After(end) {
					return // still away at the end, as in simulate()
				}
				time.Sleep(d)
				s.reconnect()
				// As simulate() has it, the next disconnect is drawn once the watcher is
				// connected again (client-go's backoff decides when that is).
				for {
					s.mu.Lock()
					back := !s.waiting
					s.mu.Unlock()
					if back || time.Now().After(end) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	// kube-apiserver restarts (the cache's restarts in simulate()).
	for _, rs := range w.Restarts {
		rs := rs
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := runStart.Add(time.Duration(rs.At * float64(time.Second)))
			if at.After(end) {
				return
			}
			time.Sleep(time.Until(at))
			for _, s := range refl {
				s.mu.Lock()
				if !s.waiting {
					s.blockedAt, s.unblocked, s.waiting = time.Now(), time.Time{}, true
				}
				s.restartBlocked = true
				s.lastBlock = time.Now()
				s.mu.Unlock()
				s.proxy.block()
			}
			apiMu.Lock()
			lists += apiLists(a.metrics()) - listBase
			a.stop(30 * time.Second)
			time.Sleep(time.Duration(rs.Outage * float64(time.Second)))
			if err := a.start(b); err != nil {
				res.Err = err.Error()
			}
			listBase = 0
			apiMu.Unlock()
			for _, s := range refl {
				_ = s.proxy.unblock()
				s.mu.Lock()
				s.restartBlocked = false
				if !s.ownBlocked {
					s.unblocked = time.Now()
				}
				s.mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Until(end))
	wg.Wait()
	// A 410 is followed by a relist only after one step of the reflector's backoff (30–60 s
	// after a long outage): wait for those (at most 65 s) so that every 410 of the run has
	// its relist counted. Nothing else happens meanwhile (no writes, no disconnects).
	// Counts are those at the end, plus these relists.
	snap := make([]counters, len(refl))
	pending := make([]bool, len(refl))
	for i, s := range refl {
		s.mu.Lock()
		snap[i] = s.c
		pending[i] = s.pending410 && !s.ownBlocked
		s.mu.Unlock()
	}
	drainStart := time.Now()
	waitFor(65*time.Second, func() bool {
		for i, s := range refl {
			s.mu.Lock()
			p := pending[i] && s.c.RelistsAfter410 == snap[i].RelistsAfter410
			s.mu.Unlock()
			if p {
				return false
			}
		}
		return true
	})
	res.Drain = time.Since(drainStart).Seconds()
	for i, s := range refl {
		s.mu.Lock()
		if pending[i] && s.c.RelistsAfter410 > snap[i].RelistsAfter410 {
			snap[i].RelistsAfter410++
			snap[i].Relists++
		}
		s.c = snap[i]
		s.mu.Unlock()
	}
	time.Sleep(2 * time.Second)
	m1 := e.metrics()
	apiMu.RLock()
	am := a.metrics()
	lists += apiLists(am) - listBase
	res.RingCapacity = am.sum("watch_cache_capacity", `resource="configmaps"`)
	if res.RingCapacity == 0 {
		res.RingCapacity = am.sum("apiserver_watch_cache_capacity", `resource="configmaps"`)
	}
	apiMu.RUnlock()
	res.APIListsToStorage = lists
	res.EtcdRanges = etcdRanges(m1) - etcdRanges(m0)
	if wc != nil {
		w1 := wcUpstream(wc.metrics())
		res.WCUpstream = map[string]float64{}
		for k, v := range w1 {
			res.WCUpstream[k] = v - w0[k]
		}
	}
	for _, s := range refl {
		s.mu.Lock()
		res.C.add(&s.c)
		if s.watchList {
			res.WatchListC.add(&s.c)
		}
		s.mu.Unlock()
	}
	return res
}

func wcUpstream(m metrics) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "watchcache_upstream_requests") || strings.HasPrefix(k, "watchcache_range_requests") {
			out[k] = v
		}
	}
	return out
}

// syncStore marks its reflector synced at the first Replace (the end of its first list).
type syncStore struct {
	cache.Store
	s *sloReflector
}

func (st *syncStore) Replace(list []interface{}, rv string) error {
	st.s.synced.Store(true)
	return st.Store.Replace(list, rv)
}

// selectorGroups mirrors simulate(): objects carry group = index mod G, each watcher selects m
// of the G groups, m/G the selector fraction (G ≤ 100 000; 1: no selector).
func selectorGroups(f float64) (int, int) {
	if f >= 1 || f <= 0 {
		return 1, 1
	}
	for g := 1; g <= 100000; g++ {
		m := int(math.Round(f * float64(g)))
		if m >= 1 && math.Abs(float64(m)/float64(g)-f) < 1e-9 {
			return g, m
		}
	}
	g := 100000
	return g, int(math.Max(1, math.Round(f*float64(g))))
}

// ----- the comparison -----------------------------------------------------------------------

func mainSLO(args []string) int {
	fs := flag.NewFlagSet("slo", flag.ExitOnError)
	b := binFlags(fs)
	runs := fs.Int("runs", 3, "real runs per workload and backend (run side by side)")
	simSeeds := fs.Int("sim-seeds", 20, "simulate() seeds per workload (besides the real runs' seeds)")
	keep := fs.Bool("keep", false, "keep the temporary directories")
	out := fs.String("out", "artifacts/slo-k8s.json", "where to write every count (JSON)")
	backends := fs.String("backends", "etcd,watchcache", "backends")
	_ = fs.Parse(args)
	files := fs.Args()
	if len(files) == 0 {
		files, _ = filepath.Glob("tools/kube/slo/*.json")
		sort.Strings(files)
	}
	if *out != "" {
		_ = os.MkdirAll(filepath.Dir(*out), 0o755)
		if f, err := os.Create(strings.TrimSuffix(*out, ".json") + "-client-go.log"); err == nil {
			klog.LogToStderr(false)
			klog.SetOutput(f)
			defer f.Close()
		}
	}
	start := time.Now()
	simDir := mustMkdirTemp("kube-slo-sim-")
	defer os.RemoveAll(simDir)
	type result struct {
		W       *workload `json:"-"`
		Name    string
		Sim     []*simSummary // seeds 1..runs (the real runs' seeds)
		SimMore []*simSummary // seeds 101..
		SimOld  []*simSummary // the real runs' seeds, the model before issue 15 (no backoff, relists from etcd)
		Real    []*realRun
		// mean seconds from the proxy listening again to the reconnect
		ExtraDelay float64
	}
	var all []*result
	for _, f := range files {
		w, err := loadWorkload(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		r := &result{W: w, Name: w.Name}
		for s := 1; s <= *runs; s++ {
			p, _ := w.simFile(simDir, w.Seed+int64(s))
			sm, err := simulate(b.watchcache, p)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			sm.watchers = float64(w.Watchers.Count)
			r.Sim = append(r.Sim, sm)
		}
		for s := 0; s < *simSeeds; s++ {
			p, _ := w.simFile(simDir, w.Seed+101+int64(s))
			sm, err := simulate(b.watchcache, p)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			sm.watchers = float64(w.Watchers.Count)
			r.SimMore = append(r.SimMore, sm)
		}
		logf("== %s: %d real runs × %s side by side (%.0f s each)", w.Name, *runs, *backends, w.Duration)
		var mu sync.Mutex
		var wg sync.WaitGroup
		i := 0
		for _, be := range strings.Split(*backends, ",") {
			for s := 1; s <= *runs; s++ {
				be, s := be, s
				wg.Add(1)
				delay := time.Duration(i) * 1500 * time.Millisecond // stagger the starts
				i++
				go func() {
					defer wg.Done()
					time.Sleep(delay)
					rr := runReal(*b, w, be == "watchcache", w.Seed+int64(s), *keep)
					mu.Lock()
					r.Real = append(r.Real, rr)
					mu.Unlock()
					logf("  %-10s seed %d: 410s %d relists %d lists→storage %.0f etcd Ranges %.0f events %d reconnects %d (mean %.1f s after the block, %.1f s after the unblock) writes %d/%d ring %.0f %s",
						rr.Backend, rr.Seed, rr.C.Watch410, rr.C.Relists, rr.APIListsToStorage, rr.EtcdRanges, rr.C.Events,
						rr.C.Reconnects, safeDiv(rr.C.ReconnectDelaySum, float64(rr.C.Reconnects)), safeDiv(rr.C.ReconnectExtraSum, float64(rr.C.Reconnects)),
						rr.Writes, rr.Writes+rr.WriteErrs, rr.RingCapacity, rr.Err)
				}()
			}
		}
		wg.Wait()
		var extra, n float64
		for _, rr := range r.Real {
			extra += rr.C.ReconnectExtraSum
			n += float64(rr.C.Reconnects)
		}
		r.ExtraDelay = safeDiv(extra, n)
		// simulate() again as the model was before issue 15 (re-watch exactly d after the
		// disconnect, relist at once after a 410 and charge it to etcd), on the same seeds: the
		// before/after of the model.
		{
			w2 := *w
			w2.raw = map[string]json.RawMessage{}
			for k, v := range w.raw {
				w2.raw[k] = v
			}
			var ws map[string]json.RawMessage
			_ = json.Unmarshal(w.raw["watchers"], &ws)
			if ws == nil {
				ws = map[string]json.RawMessage{}
			}
			ws["backoff"], _ = json.Marshal("none")
			ws["relist_from"], _ = json.Marshal("etcd")
			w2.raw["watchers"], _ = json.Marshal(ws)
			for s := 1; s <= *runs; s++ {
				p, _ := w2.simFile(simDir, w.Seed+int64(s))
				sm, err := simulate(b.watchcache, p)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
				sm.watchers = float64(w.Watchers.Count)
				r.SimOld = append(r.SimOld, sm)
			}
		}
		sort.Slice(r.Real, func(i, j int) bool {
			if r.Real[i].Backend != r.Real[j].Backend {
				return r.Real[i].Backend < r.Real[j].Backend
			}
			return r.Real[i].Seed < r.Real[j].Seed
		})
		all = append(all, r)
	}
	// The table.
	fmt.Println()
	fmt.Println("| workload | count | simulate (same seeds) | simulate, more seeds | simulate, old model (no backoff, relists charged to etcd) | kube-apiserver on etcd | Δ | kube-apiserver on watchcache | Δ |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	bad := 0
	for _, r := range all {
		pick := func(be string) []*realRun {
			var x []*realRun
			for _, rr := range r.Real {
				if rr.Backend == be {
					x = append(x, rr)
				}
				if rr.Err != "" {
					bad++
				}
			}
			return x
		}
		et, wc := pick("etcd"), pick("watchcache")
		rows := []struct {
			name string
			sim  func(*simSummary) float64
			real func(*realRun) float64
		}{
			{"410s", func(s *simSummary) float64 { return s.Watch410 }, func(r *realRun) float64 { return float64(r.C.Watch410) }},
			// The real runs wait (up to 65 s) after the end for the relists client-go's backoff
			// delays; simulate() counts the same ones as pending at the end.
			{"relists", func(s *simSummary) float64 { return s.Relists + s.RelistsPending }, func(r *realRun) float64 { return float64(r.C.Relists) }},
			{"  of which after a 410", func(s *simSummary) float64 { return s.Relists + s.RelistsPending }, func(r *realRun) float64 { return float64(r.C.RelistsAfter410) }},
			{"lists reaching etcd", func(s *simSummary) float64 { return s.EtcdRangeRequests - 1 }, func(r *realRun) float64 {
				if r.Backend == "etcd" {
					return r.APIListsToStorage
				}
				return r.WCUpstream[`watchcache_upstream_requests_total{kind="list"}`] + r.WCUpstream[`watchcache_upstream_requests_total{kind="range"}`]
			}},
			{"events", func(s *simSummary) float64 { return s.Deliveries }, func(r *realRun) float64 { return float64(r.C.Events) }},
			{"disconnects", func(s *simSummary) float64 { return s.Disconnects }, func(r *realRun) float64 { return float64(r.C.Disconnects) }},
			{"reconnects", simReconnects, func(r *realRun) float64 { return float64(r.C.Reconnects) }},
			{"410s per reconnect", func(s *simSummary) float64 { return safeDiv(s.Watch410, simReconnects(s)) }, func(r *realRun) float64 {
				return safeDiv(float64(r.C.Watch410), float64(r.C.Reconnects))
			}},
			{"mean reconnect delay (s)", func(s *simSummary) float64 { return math.NaN() }, func(r *realRun) float64 {
				return safeDiv(r.C.ReconnectDelaySum, float64(r.C.Reconnects))
			}},
		}
		for i, row := range rows {
			name := ""
			if i == 0 {
				name = "`" + r.Name + "`"
			}
			sm, smSD := meanSD(mapSim(r.Sim, row.sim))
			mm, mmSD := meanSD(mapSim(r.SimMore, row.sim))
			em, emSD := meanSD(mapReal(et, row.real))
			wm, wmSD := meanSD(mapReal(wc, row.real))
			dm, dmSD := meanSD(mapSim(r.SimOld, row.sim))
			fmt.Printf("| %s | %s | %s | %s | %s | %s (%s) | %s | %s (%s) | %s |\n", name, row.name,
				fmtMS(sm, smSD), fmtMS(mm, mmSD), fmtMS(dm, dmSD), fmtMS(em, emSD), list(mapReal(et, row.real)), pct(em, sm),
				fmtMS(wm, wmSD), list(mapReal(wc, row.real)), pct(wm, sm))
		}
	}
	if *out != "" {
		_ = os.MkdirAll(filepath.Dir(*out), 0o755)
		b, _ := json.MarshalIndent(all, "", " ")
		_ = os.WriteFile(*out, b, 0o644)
		fmt.Printf("\nevery count: %s\n", *out)
	}
	fmt.Printf("validate-slo-k8s: %s in all\n", time.Since(start).Round(time.Second))
	if bad > 0 {
		fmt.Printf("%d runs failed\n", bad)
		return 1
	}
	return 0
}

// simReconnects is simulate()'s count of re-watches after a disconnect or a restart
// (docs/slo.md: watches started, less the first watches and the relists' watches).
func simReconnects(s *simSummary) float64 {
	return s.WatchesStarted - s.watchers - s.Relists
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func mapSim(xs []*simSummary, f func(*simSummary) float64) []float64 {
	var out []float64
	for _, x := range xs {
		out = append(out, f(x))
	}
	return out
}

func mapReal(xs []*realRun, f func(*realRun) float64) []float64 {
	var out []float64
	for _, x := range xs {
		if x.Err == "" {
			out = append(out, f(x))
		}
	}
	return out
}

func meanSD(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return math.NaN(), 0
	}
	m := 0.0
	for _, x := range xs {
		m += x
	}
	m /= float64(len(xs))
	v := 0.0
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	if len(xs) > 1 {
		v /= float64(len(xs) - 1)
	}
	return m, math.Sqrt(v)
}

func fmtMS(m, sd float64) string {
	if math.IsNaN(m) {
		return "—"
	}
	if m != 0 && math.Abs(m) < 1 {
		return fmt.Sprintf("%.2f ± %.2f", m, sd)
	}
	return fmt.Sprintf("%.1f ± %.1f", m, sd)
}

func list(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(s, ", ")
}

func pct(real, sim float64) string {
	if math.IsNaN(real) || math.IsNaN(sim) {
		return "—"
	}
	if sim == 0 {
		if real == 0 {
			return "0 %"
		}
		return "n/a (sim 0)"
	}
	return fmt.Sprintf("%+.0f %%", 100*(real-sim)/sim)
}
