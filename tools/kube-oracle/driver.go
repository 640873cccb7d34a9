package main

// The driver: replays a scenario's steps against a real k8s.io/apiserver cacher.
//
// Time is the fake clock's. Before a step at T, time is stepped through every pending deadline
// up to T in order (fake timers and tickers, the end of a blocked dispatch's time budget, watch
// and request deadlines), and after every change the driver waits for quiescence (quiesce.go),
// collects finished requests and lets `auto` clients read everything their result channel
// holds. So every record's `at` is the fake time at which the client saw it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	storeerr "k8s.io/apiserver/pkg/storage/errors"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
)

var podsResource = schema.GroupResource{Resource: "pods"}

type driver struct {
	cfg   config
	clock *fakeClock
	q     *quiescer
	fs    *fakeStorage
	kube  *kube // the version's cacher (compat_*.go)
	log   *klogCapture

	mu    sync.Mutex
	trace []record
	// requests handed to storage (their records end there)
	delegatedIDs map[string]bool

	clients []*client
	byID    map[string]*client
	results chan func()

	budget        *budgetBridge
	relists       int // fs.lists seen at the last check
	cacherStopped bool
	skips         map[string]string
	prefix        string
}

type client struct {
	id     string
	kind   string // watch, list, get
	ctx    *reqCtx
	manual bool

	pending bool // the request is still inside the cacher
	w       watch.Interface
	open    bool // readable by the client
	// why the watch ended, once known
	cause     string
	errorSeen bool
	stopNoted bool
	isCacheW  bool
	// dlActive: the client's deadline still matters (a watch pending or open, a read pending)
	dlActive bool
}

func (d *driver) now() uint64 { return uint64(d.clock.Now().Sub(epoch) / time.Millisecond) }

// emit appends a record at the current fake time (called from any goroutine).
func (d *driver) emit(r record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r.At = d.now()
	d.trace = append(d.trace, r)
}

// delegated records that the cacher handed a client's request to storage.
func (d *driver) delegated(id, kind string) {
	d.mu.Lock()
	first := !d.delegatedIDs[id]
	d.delegatedIDs[id] = true
	d.mu.Unlock()
	if first {
		d.emit(record{ID: ptr(id), Type: kind, Source: ptr("storage")})
	}
}

func (d *driver) isDelegated(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.delegatedIDs[id]
}

// --- contexts on the fake clock ------------------------------------------------------------

// reqCtx is a request's context: its deadline is in fake time and it is cancelled by the
// driver (deadline reached, client gone), never by a real timer.
type reqCtx struct {
	context.Context
	id       string
	deadline time.Time
	hasDL    bool
	done     chan struct{}
	mu       sync.Mutex
	err      error
}

func newReqCtx(id string) *reqCtx {
	return &reqCtx{Context: context.Background(), id: id, done: make(chan struct{})}
}

func (c *reqCtx) Deadline() (time.Time, bool) { return c.deadline, c.hasDL }
func (c *reqCtx) Done() <-chan struct{}       { return c.done }
func (c *reqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
func (c *reqCtx) Value(k any) any {
	if _, ok := k.(reqIDKey); ok {
		return c.id
	}
	return c.Context.Value(k)
}
func (c *reqCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// --- the dispatch time budget on the fake clock --------------------------------------------

// budgetBridge hands Kubernetes' own time budget (on the fake clock) to the dispatch loop. The
// loop arms a real time.Timer with what it gets; the bridge gives it an hour instead and
// remembers when the fake budget ends, and the driver fires that timer when the fake clock gets
// there (KubeOracleFireDispatchTimer). What the loop returns unused is recomputed in fake time.
type budgetBridge struct {
	inner    cacher.KubeOracleBudget
	clock    *fakeClock
	mu       sync.Mutex
	armed    bool
	start    time.Time
	timeout  time.Duration
	deadline time.Time
	fired    bool
}

const budgetStandIn = time.Hour

func (b *budgetBridge) TakeAvailable() time.Duration {
	t := b.inner.TakeAvailable()
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	b.armed, b.fired, b.start, b.timeout, b.deadline = true, false, now, t, now.Add(t)
	return budgetStandIn
}

func (b *budgetBridge) ReturnUnused(time.Duration) {
	b.mu.Lock()
	used := b.clock.Now().Sub(b.start)
	unused := b.timeout - used
	b.armed = false
	b.mu.Unlock()
	b.inner.ReturnUnused(unused)
}

// due returns the budget's end if a dispatch is blocked on it and it has not fired.
func (b *budgetBridge) due() (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.deadline, b.armed && !b.fired
}

// waitReturned waits (real time) until the blocked dispatch has returned its budget.
func (b *budgetBridge) waitReturned() {
	start := time.Now()
	for {
		b.mu.Lock()
		armed := b.armed
		b.mu.Unlock()
		if !armed {
			return
		}
		if time.Since(start) > time.Minute {
			fmt.Fprintln(os.Stderr, "kube-oracle: the dispatch loop did not return its budget after its timer fired")
			os.Exit(70)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func (b *budgetBridge) markFired() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fired = true
}

// --- klog: the cacher's own account of why it closed a watcher -----------------------------

type klogCapture struct {
	mu           sync.Mutex
	unresponsive int
	invalidated  int
	verbose      bool
	buf          bytes.Buffer
}

func (k *klogCapture) Write(p []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.buf.Write(p)
	for {
		line, err := k.buf.ReadString('\n')
		if err != nil {
			k.buf.Reset()
			k.buf.WriteString(line)
			break
		}
		if strings.Contains(line, "watcher close due to unresponsiveness") {
			k.unresponsive++
		}
		if strings.Contains(line, "couldn't retrieve watch event to serve") {
			k.invalidated++
		}
		if k.verbose {
			os.Stderr.WriteString(line)
		}
	}
	return len(p), nil
}

func (k *klogCapture) take() (unresponsive, invalidated int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	u, i := k.unresponsive, k.invalidated
	k.unresponsive, k.invalidated = 0, 0
	return u, i
}

// --- running ---------------------------------------------------------------------------------

// maxDeadlines bounds the timer expirations of one scenario (the core refuses more than 1e6).
const maxDeadlines = 2_000_000

func (d *driver) run(sc *scenario) error {
	steps := 0
	for i, st := range sc.Steps {
		target := epoch.Add(time.Duration(st.At) * time.Millisecond)
		for {
			d.settle()
			next, ok := d.nextDeadline()
			if !ok || next.After(target) {
				break
			}
			steps++
			if steps > maxDeadlines {
				return fmt.Errorf("steps[%d]: too many timer expirations before %d ms", i, st.At)
			}
			d.clock.setTime(next)
		}
		d.clock.setTime(target)
		d.settle()
		if err := d.apply(i, st); err != nil {
			return fmt.Errorf("steps[%d] (%s): %v", i, st.Op, err)
		}
		d.settle()
	}
	return nil
}

// nextDeadline is the earliest of the fake clock's waiters, the blocked dispatch's budget end and
// the clients' deadlines.
func (d *driver) nextDeadline() (time.Time, bool) {
	best, ok := d.clock.nextDeadline()
	consider := func(t time.Time) {
		if !ok || t.Before(best) {
			best, ok = t, true
		}
	}
	if t, armed := d.budget.due(); armed {
		consider(t)
	}
	for _, c := range d.clients {
		if c.dlActive && c.ctx.Err() == nil {
			consider(c.ctx.deadline)
		}
	}
	return best, ok
}

// settle waits until nothing moves any more: quiescence, finished requests, auto clients'
// reads, and whatever is due at the current instant (one kind at a time: fake timers, then the
// budget, then client deadlines).
func (d *driver) settle() {
	for {
		d.q.wait()
		progressed := false
	collect:
		for {
			select {
			case f := <-d.results:
				f()
				progressed = true
			default:
				break collect
			}
		}
		d.noteStops()
		for _, c := range d.clients {
			if c.open && !c.manual {
				if d.read(c, -1) > 0 {
					progressed = true
				}
			}
		}
		if progressed {
			continue
		}
		now := d.clock.Now()
		if n := d.clock.setTime(now); n > 0 {
			continue
		}
		if t, armed := d.budget.due(); armed && !t.After(now) {
			d.budget.markFired()
			d.kube.fireDispatchTimer()
			// The real timer fires asynchronously, and until it has, the dispatch goroutine
			// still looks parked: wait until the dispatch has given the budget back.
			d.budget.waitReturned()
			continue
		}
		if d.expireDeadlines(now) {
			continue
		}
		return
	}
}

func (d *driver) expireDeadlines(now time.Time) bool {
	fired := false
	for _, c := range d.clients {
		if !c.dlActive || c.ctx.Err() != nil || c.ctx.deadline.After(now) {
			continue
		}
		fired = true
		c.dlActive = false
		if c.kind == "watch" && c.open {
			// The watch server ends the stream at the request's timeout and stops the watcher.
			d.emit(record{ID: ptr(c.id), Type: "CLOSED", Cause: ptr("timeout")})
			c.open = false
			c.w.Stop()
		}
		c.ctx.cancel(context.DeadlineExceeded)
	}
	return fired
}

// read lets a client read up to max events (all if max < 0) from its result channel.
func (d *driver) read(c *client, max int) int {
	n := 0
	for c.open && (max < 0 || n < max) {
		select {
		case ev, ok := <-c.w.ResultChan():
			if !ok {
				c.open, c.dlActive = false, false
				if !d.isDelegated(c.id) {
					d.emit(record{ID: ptr(c.id), Type: "CLOSED", Cause: ptr(d.closeCause(c))})
				}
				return n
			}
			n++
			if !d.isDelegated(c.id) {
				d.emit(eventRecord(c, ev))
			}
		default:
			return n
		}
	}
	return n
}

func eventRecord(c *client, ev watch.Event) record {
	r := record{ID: ptr(c.id), Type: string(ev.Type)}
	switch ev.Type {
	case watch.Error:
		c.errorSeen = true
		if st, ok := ev.Object.(*metav1.Status); ok {
			r.Code, r.Reason, r.Message = ptr(st.Code), ptr(string(st.Reason)), ptr(st.Message)
		}
		return r
	case watch.Bookmark:
		_, rv, _, ann := describe(ev.Object)
		r.RV = &rv
		if len(ann) > 0 {
			r.Annotations = ann
		}
		return r
	}
	key, rv, value, _ := describe(ev.Object)
	r.Key, r.RV, r.Value = &key, &rv, value
	return r
}

// closeCause is why a watch ended, from what the driver saw (see noteStops).
func (d *driver) closeCause(c *client) string {
	switch {
	case c.cause != "":
		return c.cause
	case c.errorSeen:
		return "error"
	case !c.isCacheW:
		// newImmediateCloseWatcher: the cache was reinitialised while the watch was set up.
		return "reinitializing"
	}
	return "unknown"
}

// noteStops finds the cacheWatchers the cacher stopped since the last look and decides why,
// from the cacher's own log lines ("Forcing ... watcher close due to unresponsiveness",
// "couldn't retrieve watch event to serve"), a relist (storage was asked to list again) or
// Stop().
func (d *driver) noteStops() {
	unresponsive, invalidated := d.log.take()
	d.fs.mu.Lock()
	lists := d.fs.lists
	d.fs.mu.Unlock()
	relisted := lists > d.relists
	d.relists = lists
	for _, c := range d.clients {
		if c.kind != "watch" || c.w == nil || !c.isCacheW || c.stopNoted || c.cause != "" {
			continue
		}
		stopped, _ := d.kube.watcherStopped(c.w)
		if !stopped {
			continue
		}
		c.stopNoted = true
		switch {
		case d.cacherStopped:
			c.cause = "stopped"
		case unresponsive > 0:
			unresponsive--
			c.cause = "unresponsive"
		case invalidated > 0:
			invalidated--
			c.cause = "error"
		case relisted:
			c.cause = "reinitializing"
		}
	}
}

// --- steps -----------------------------------------------------------------------------------

func (d *driver) apply(i int, st step) error {
	switch st.Op {
	case "replace":
		objs, err := st.objects(st.rv())
		if err != nil {
			return err
		}
		if !d.fs.listPending() {
			// A relist the scenario did not announce: break the watch first.
			d.fs.fail("relist")
			d.settle()
		}
		return d.fs.replace(st.rv(), objs)
	case "put":
		raw := st.Raw["object"]
		o, err := parseObject(raw, st.rv())
		if err != nil {
			return err
		}
		return d.fs.change(st.rv(), []scObject{o}, nil, []bool{true})
	case "delete":
		return d.fs.change(st.rv(), nil, []string{strOr(st.Raw, "key", "")}, []bool{false})
	case "txn":
		var raws []map[string]json.RawMessage
		if err := json.Unmarshal(st.Raw["ops"], &raws); err != nil {
			return err
		}
		var puts []scObject
		var dels []string
		var order []bool
		for _, r := range raws {
			switch strOr(r, "op", "") {
			case "put":
				o, err := parseObject(r["object"], st.rv())
				if err != nil {
					return err
				}
				puts = append(puts, o)
				order = append(order, true)
			case "delete":
				dels = append(dels, strOr(r, "key", ""))
				order = append(order, false)
			}
		}
		return d.fs.change(st.rv(), puts, dels, order)
	case "progress":
		d.fs.progress(st.rv())
	case "storage_error":
		d.fs.fail(strOr(st.Raw, "reason", "watch failed"))
	case "etcd_rv":
		d.fs.setEtcdRV(st.rv())
	case "compact":
		d.fs.compact(st.rv())
	case "watch":
		d.startWatch(st.watch())
	case "list":
		d.startList(st.list())
	case "get":
		d.startGet(st.id(), strOr(st.Raw, "key", ""), strOr(st.Raw, "rv", ""))
	case "consume":
		c := d.byID[st.id()]
		if c == nil {
			return fmt.Errorf("no watch %q", st.id())
		}
		max := -1
		if m, _ := u64Field(st.Raw, "max"); m != nil {
			max = int(*m)
		}
		for max != 0 {
			d.settle()
			n := d.read(c, max)
			if n == 0 {
				break
			}
			if max > 0 {
				max -= n
			}
		}
	case "stop_watch":
		c := d.byID[st.id()]
		if c == nil {
			return fmt.Errorf("no request %q", st.id())
		}
		d.stopClient(c)
	case "stop_cacher":
		d.cacherStopped = true
		go d.kube.stop()
	case "advance":
	default:
		return fmt.Errorf("op %q is not supported by the oracle", st.Op)
	}
	return nil
}

func (d *driver) stopClient(c *client) {
	switch {
	case c.pending:
		// The client gives up on a request that is still waiting inside the cacher.
		c.ctx.cancel(context.Canceled)
	case c.open:
		c.open, c.dlActive = false, false
		c.cause = "stopped"
		if !d.isDelegated(c.id) {
			d.emit(record{ID: ptr(c.id), Type: "CLOSED", Cause: ptr("stopped")})
		}
		c.w.Stop()
		c.ctx.cancel(context.Canceled)
	}
}

func (d *driver) newClient(id, kind string) *client {
	c := &client{id: id, kind: kind, ctx: newReqCtx(id)}
	d.clients = append(d.clients, c)
	d.byID[id] = c
	return c
}

func (d *driver) reject(id string, err error) {
	st := responsewriters.ErrorToAPIStatus(err)
	r := record{ID: ptr(id), Type: "REJECTED", Code: ptr(st.Code), Reason: ptr(string(st.Reason)), Message: ptr(st.Message)}
	if st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		r.RetryAfterS = ptr(st.Details.RetryAfterSeconds)
	}
	d.emit(r)
}

// skipListDefaults (run -no-list-defaults) leaves out SetListOptionsDefaults, to see what the
// cacher alone does with a legacy watch when WatchList is on (for investigation only).
var skipListDefaults bool

func watchListEnabled() bool { return utilfeature.DefaultFeatureGate.Enabled(features.WatchList) }

// decodeListOptions is the request layer of endpoints/handlers/get.go (ListResource): query
// parameters through the ParameterCodec (400 on failure), defaults, ValidateListOptions (422).
func decodeListOptions(q url.Values) (*metainternalversion.ListOptions, error) {
	opts := metainternalversion.ListOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if !skipListDefaults {
		setListOptionsDefaults(&opts, watchListEnabled())
	}
	if errs := metainternalversionvalidation.ValidateListOptions(&opts, watchListEnabled()); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	return &opts, nil
}

// predicate is the pod strategy's selection predicate (registry/core/pod: MatchPod) on the
// scenario's attributes.
func (d *driver) predicate(opts *metainternalversion.ListOptions) storage.SelectionPredicate {
	l, f := labels.Everything(), fields.Everything()
	if opts.LabelSelector != nil {
		l = opts.LabelSelector
	}
	if opts.FieldSelector != nil {
		f = opts.FieldSelector
	}
	p := storage.SelectionPredicate{Label: l, Field: f, GetAttrs: objectAttrs}
	if d.cfg.IndexField != "" {
		p.IndexFields = []string{d.cfg.IndexField}
	}
	return p
}

func (d *driver) startWatch(w watchSpec) {
	c := d.newClient(w.ID, "watch")
	c.manual = w.Manual
	if why, skip := d.skips[w.ID]; skip {
		_ = why
		c.kind = "skipped"
		return
	}
	q := url.Values{"watch": {"true"}}
	if w.RV != "" {
		q.Set("resourceVersion", w.RV)
	}
	if w.AllowBookmarks {
		q.Set("allowWatchBookmarks", "true")
	}
	if w.SendInitialEvents != nil {
		// What client-go sends with sendInitialEvents (and the validation requires).
		q.Set("sendInitialEvents", strconv.FormatBool(*w.SendInitialEvents))
		q.Set("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan))
	}
	if w.LabelSelector != "" {
		q.Set("labelSelector", w.LabelSelector)
	}
	if w.FieldSelector != "" {
		q.Set("fieldSelector", w.FieldSelector)
	}
	if w.TimeoutMs != nil {
		q.Set("timeoutSeconds", strconv.FormatUint(*w.TimeoutMs/1000, 10))
	}
	opts, err := decodeListOptions(q)
	if err != nil {
		d.reject(w.ID, err)
		return
	}
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		c.ctx.deadline = d.clock.Now().Add(time.Duration(*opts.TimeoutSeconds) * time.Second)
		c.ctx.hasDL, c.dlActive = true, true
	}
	pred := d.predicate(opts)
	pred.AllowWatchBookmarks = opts.AllowWatchBookmarks
	sopts := storage.ListOptions{ResourceVersion: opts.ResourceVersion, Predicate: pred,
		Recursive: w.Recursive, SendInitialEvents: opts.SendInitialEvents}
	c.pending = true
	front := d.kube.front
	go func() {
		wi, err := front.Watch(c.ctx, w.Key, sopts)
		d.results <- func() {
			c.pending = false
			if d.isDelegated(c.id) {
				c.w, c.dlActive = wi, false
				return
			}
			if err != nil {
				c.dlActive = false
				d.reject(c.id, err)
				return
			}
			c.w, c.open = wi, true
			_, c.isCacheW = d.kube.watcherStopped(wi)
			if c.ctx.Err() != nil {
				// the client went away while the cacher set the watch up
				c.open = false
				wi.Stop()
			}
		}
	}()
}

func (d *driver) startList(l listSpec) {
	c := d.newClient(l.ID, "list")
	if _, skip := d.skips[l.ID]; skip {
		c.kind = "skipped"
		return
	}
	q := url.Values{}
	if l.RV != "" {
		q.Set("resourceVersion", l.RV)
	}
	if l.RVMatch != "" {
		q.Set("resourceVersionMatch", l.RVMatch)
	}
	if l.Limit > 0 {
		q.Set("limit", strconv.FormatInt(l.Limit, 10))
	}
	if l.Continue != "" {
		q.Set("continue", l.Continue)
	}
	if l.LabelSelector != "" {
		q.Set("labelSelector", l.LabelSelector)
	}
	if l.FieldSelector != "" {
		q.Set("fieldSelector", l.FieldSelector)
	}
	opts, err := decodeListOptions(q)
	if err != nil {
		d.reject(l.ID, err)
		return
	}
	d.withRequestTimeout(c)
	pred := d.predicate(opts)
	pred.Limit, pred.Continue = opts.Limit, opts.Continue
	sopts := storage.ListOptions{ResourceVersion: opts.ResourceVersion, ResourceVersionMatch: opts.ResourceVersionMatch,
		Predicate: pred, Recursive: l.Recursive}
	c.pending = true
	front := d.kube.front
	go func() {
		list := &example.PodList{}
		err := front.GetList(c.ctx, l.Key, sopts, list)
		err = storeerr.InterpretListError(err, podsResource)
		d.results <- func() {
			c.pending, c.dlActive = false, false
			if d.isDelegated(c.id) {
				return
			}
			if err != nil {
				d.reject(c.id, err)
				return
			}
			r := record{ID: ptr(c.id), Type: "LIST", Source: ptr("cache")}
			rv, _ := strconv.ParseUint(list.ResourceVersion, 10, 64)
			r.RV = &rv
			items := []item{}
			for i := range list.Items {
				key, irv, value, _ := describe(&list.Items[i])
				items = append(items, item{Key: key, RV: irv, Value: value})
			}
			r.Items = &items
			if list.Continue != "" {
				r.Continue = ptr(list.Continue)
			}
			r.Remaining = list.RemainingItemCount
			d.emit(r)
		}
	}()
}

func (d *driver) startGet(id, key, rv string) {
	c := d.newClient(id, "get")
	if _, skip := d.skips[id]; skip {
		c.kind = "skipped"
		return
	}
	// endpoints/handlers/get.go (GetResource): GetOptions through the ParameterCodec.
	var opts metav1.GetOptions
	q := url.Values{}
	if rv != "" {
		q.Set("resourceVersion", rv)
	}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts); err != nil {
		d.reject(id, apierrors.NewBadRequest(err.Error()))
		return
	}
	d.withRequestTimeout(c)
	name := key[strings.LastIndexByte(key, '/')+1:]
	c.pending = true
	front := d.kube.front
	go func() {
		pod := &example.Pod{}
		err := front.Get(c.ctx, key, storage.GetOptions{ResourceVersion: opts.ResourceVersion}, pod)
		if err != nil && err != errDelegated {
			err = storeerr.InterpretGetError(err, podsResource, name)
		}
		d.results <- func() {
			c.pending, c.dlActive = false, false
			if d.isDelegated(c.id) {
				return
			}
			if err != nil {
				d.reject(c.id, err)
				return
			}
			k, irv, value, _ := describe(pod)
			items := []item{{Key: k, RV: irv, Value: value}}
			d.emit(record{ID: ptr(c.id), Type: "GET", Source: ptr("cache"), Items: &items})
		}
	}()
}

// withRequestTimeout gives a list or get the apiserver's request timeout (--request-timeout,
// the core's request_timeout_ms) as its deadline.
func (d *driver) withRequestTimeout(c *client) {
	c.ctx.deadline = d.clock.Now().Add(time.Duration(d.cfg.RequestTimeoutMs) * time.Millisecond)
	c.ctx.hasDL, c.dlActive = true, true
}

// --- the result ------------------------------------------------------------------------------

// sortedTrace is the trace in a canonical order: by time, then by client in the order the
// scenario starts them (records without a client first), each client's records in the order it
// saw them. Within one instant the interleaving of different clients is goroutine scheduling in
// Kubernetes, so the order the driver happened to observe is not printed.
func (d *driver) sortedTrace() []record {
	d.mu.Lock()
	defer d.mu.Unlock()
	rank := map[string]int{}
	for i, c := range d.clients {
		if _, ok := rank[c.id]; !ok {
			rank[c.id] = i
		}
	}
	rankOf := func(r record) int {
		if r.ID == nil {
			return -1
		}
		return rank[*r.ID]
	}
	out := append([]record(nil), d.trace...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].At != out[j].At {
			return out[i].At < out[j].At
		}
		return rankOf(out[i]) < rankOf(out[j])
	})
	return out
}

var _ = meta.Accessor

func featureName(s string) featuregate.Feature { return featuregate.Feature(s) }

// resourcePrefix is the cacher's ResourcePrefix: the first path segment of the scenario's keys
// ("/pods" in every scenario so far); the cacher only uses it for the reflector's requests,
// which the fake storage answers whatever the key.
func resourcePrefix(d *driver) string { return d.prefix }

// extraGates are feature gates from KUBE_ORACLE_GATES ("Gate=true,Other=false"), for looking at
// options the scenario format has no field for (investigation only; never used by the diff).
func extraGates() map[string]bool {
	out := map[string]bool{}
	for _, kv := range strings.Split(os.Getenv("KUBE_ORACLE_GATES"), ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
			out[k] = v == "true"
		}
	}
	return out
}
