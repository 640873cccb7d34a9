package main

// The driver: replays a scenario's steps against a real k8s.io/apiserver cacher.
//
// Everything runs in one testing/synctest bubble (oracle_test.go): the bubble's clock is
// scenario time, and it only moves when every goroutine of the bubble is durably blocked. Before
// a step at T the driver sleeps until T (every timer due by then fires, in order, and what it
// wakes runs to completion) and synctest.Wait()s, so the step finds the cacher quiescent, as
// the core's replayer does; after the step it waits again. Clients record what they see at the
// bubble time they see it: an `auto` client's goroutine reads its result channel as events
// arrive; a `manual` one is read by the driver on `consume`.

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
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	storeerr "k8s.io/apiserver/pkg/storage/errors"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
)

var podsResource = schema.GroupResource{Resource: "pods"}

type driver struct {
	cfg    config
	clock  *jitterClock
	fs     *fakeStorage
	kube   *kube // the version's cacher (compat/<profile>/compat.go)
	log    *klogCapture
	skips  map[string]string
	prefix string
	start  time.Time

	// mu guards the trace and the clients' state. Never call into the cacher while holding it:
	// the cacher logs (klogCapture takes mu) while it holds its own locks.
	mu            sync.Mutex
	trace         []record
	delegatedIDs  map[string]bool // requests handed to storage: their records end there
	clients       []*client
	byID          map[string]*client
	cacherStopped bool
	// the cacher's account of watchers it closed, not yet matched to a closed stream
	unresponsive map[string]int // by watcher identifier (cache_watcher.go's)
	invalidated  int
}

type client struct {
	id, kind   string
	ctx        *reqCtx
	manual     bool
	identifier string // as the cacher logs it: key, labels, fields

	pending   bool // the request is still inside the cacher
	w         watch.Interface
	isCacheW  bool
	open      bool // the client still reads its stream
	cause     string
	errorSeen bool
}

func (d *driver) now() uint64 { return uint64(time.Since(d.start) / time.Millisecond) }

// emit appends a record at the current time.
func (d *driver) emit(r record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.emitLocked(r)
}

func (d *driver) emitLocked(r record) {
	r.At = d.now()
	d.trace = append(d.trace, r)
}

// delegated records that the cacher handed a client's request to storage.
func (d *driver) delegated(id, kind string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.delegatedIDs[id] {
		d.delegatedIDs[id] = true
		d.emitLocked(record{ID: ptr(id), Type: kind, Source: ptr("storage")})
	}
}

// --- contexts -----------------------------------------------------------------------------

// reqCtx is a request's context: it carries the request id (so that storage knows on whose
// behalf the cacher calls it) and is cancelled by the client going away.
type reqCtx struct {
	context.Context
	id     string
	cancel context.CancelFunc
}

func (d *driver) newCtx(id string, timeout time.Duration) *reqCtx {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	return &reqCtx{Context: ctx, id: id, cancel: cancel}
}

func (c *reqCtx) Value(k any) any {
	if _, ok := k.(reqIDKey); ok {
		return c.id
	}
	return c.Context.Value(k)
}

// --- klog: the cacher's own account of why it closed a watcher -----------------------------

type klogCapture struct {
	d       *driver
	mu      sync.Mutex
	verbose bool
	buf     bytes.Buffer
}

// Write runs in the goroutine that logs, synchronously: when the cacher terminates all
// watchers (before every relist, and when it stops) it logs first, holding its lock.
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
		k.d.noteLog(line)
		if k.verbose {
			os.Stderr.WriteString(line)
		}
	}
	return len(p), nil
}

func (d *driver) noteLog(line string) {
	switch {
	case strings.Contains(line, "watcher close due to unresponsiveness: "):
		id := line[strings.Index(line, "unresponsiveness: ")+len("unresponsiveness: "):]
		if i := strings.Index(id, ". len(c.input)"); i >= 0 {
			id = id[:i]
		}
		d.mu.Lock()
		d.unresponsive[normalizeIdentifier(id)]++
		d.mu.Unlock()
	case strings.Contains(line, "couldn't retrieve watch event to serve"):
		d.mu.Lock()
		d.invalidated++
		d.mu.Unlock()
	case strings.Contains(line, "Terminating all watchers from cacher"):
		// terminateAllWatchers holds the cacher's lock while it logs this, so the watchers'
		// stopped flags can be read here.
		d.mu.Lock()
		for _, c := range d.clients {
			if c.open && c.isCacheW && c.cause == "" && !d.kube.watcherStoppedLocked(c.w) {
				c.cause = "reinitializing"
				if d.cacherStopped {
					c.cause = "stopped"
				}
			}
		}
		d.mu.Unlock()
	}
}

// --- running ---------------------------------------------------------------------------------

func (d *driver) run(sc *scenario) error {
	for i, st := range sc.Steps {
		target := d.start.Add(time.Duration(st.At) * time.Millisecond)
		if dt := time.Until(target); dt > 0 {
			time.Sleep(dt)
		}
		synctest.Wait()
		if err := d.apply(st); err != nil {
			return fmt.Errorf("steps[%d] (%s): %v", i, st.Op, err)
		}
		synctest.Wait()
	}
	return nil
}

// follow is a client reading its watch: an auto client reads every event as it comes; both end
// the stream at the request's deadline, as the watch server does (it stops the watcher).
func (d *driver) follow(c *client) {
	if c.manual {
		<-c.ctx.Done()
		d.endAtDeadline(c)
		return
	}
	for {
		select {
		case <-c.ctx.Done():
			d.endAtDeadline(c)
			return
		default:
		}
		select {
		case ev, ok := <-c.w.ResultChan():
			d.mu.Lock()
			if !ok {
				d.closedLocked(c)
				d.mu.Unlock()
				return
			}
			d.deliverLocked(c, ev)
			d.mu.Unlock()
		case <-c.ctx.Done():
			d.endAtDeadline(c)
			return
		}
	}
}

func (d *driver) endAtDeadline(c *client) {
	d.mu.Lock()
	timedOut := c.open && c.ctx.Err() == context.DeadlineExceeded
	if timedOut {
		c.open = false
		if !d.delegatedIDs[c.id] {
			d.emitLocked(record{ID: ptr(c.id), Type: "CLOSED", Cause: ptr("timeout")})
		}
	}
	d.mu.Unlock()
	if timedOut {
		c.w.Stop()
	}
}

func (d *driver) deliverLocked(c *client, ev watch.Event) {
	if !c.open || d.delegatedIDs[c.id] {
		return
	}
	d.emitLocked(eventRecord(c, ev))
}

func (d *driver) closedLocked(c *client) {
	if !c.open {
		return
	}
	c.open = false
	if !d.delegatedIDs[c.id] {
		d.emitLocked(record{ID: ptr(c.id), Type: "CLOSED", Cause: ptr(d.closeCauseLocked(c))})
	}
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

// closeCauseLocked is why a stream ended, from what the driver and the cacher's log say.
func (d *driver) closeCauseLocked(c *client) string {
	switch {
	case c.cause != "":
		return c.cause
	case c.errorSeen:
		return "error"
	case !c.isCacheW:
		// newImmediateCloseWatcher: the cache was reinitialised while the watch was set up.
		return "reinitializing"
	case d.unresponsive[c.identifier] > 0:
		d.unresponsive[c.identifier]--
		return "unresponsive"
	case d.invalidated > 0:
		// processInterval gave up: the interval was invalidated (a Kubernetes client just
		// sees the stream end).
		d.invalidated--
		return "error"
	case d.cacherStopped:
		return "stopped"
	}
	return "unknown"
}

// --- steps -----------------------------------------------------------------------------------

func (d *driver) apply(st step) error {
	switch st.Op {
	case "replace":
		objs, err := st.objects(st.rv())
		if err != nil {
			return err
		}
		return d.fs.replace(st.rv(), objs)
	case "put":
		o, err := parseObject(st.Raw["object"], st.rv())
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
		d.consume(c, max)
	case "stop_watch":
		c := d.byID[st.id()]
		if c == nil {
			return fmt.Errorf("no request %q", st.id())
		}
		d.stopClient(c)
	case "stop_cacher":
		d.mu.Lock()
		d.cacherStopped = true
		d.mu.Unlock()
		go d.kube.stop()
	case "advance":
	default:
		return fmt.Errorf("op %q is not supported by the oracle", st.Op)
	}
	return nil
}

// consume is a manual client reading up to max events (all if max < 0); between two reads the
// cacher may refill the result channel.
func (d *driver) consume(c *client, max int) {
	for n := 0; max < 0 || n < max; {
		synctest.Wait()
		d.mu.Lock()
		if !c.open {
			d.mu.Unlock()
			return
		}
		select {
		case ev, ok := <-c.w.ResultChan():
			if !ok {
				d.closedLocked(c)
				d.mu.Unlock()
				return
			}
			d.deliverLocked(c, ev)
			n++
			d.mu.Unlock()
		default:
			d.mu.Unlock()
			return
		}
	}
}

func (d *driver) stopClient(c *client) {
	d.mu.Lock()
	pending, open := c.pending, c.open
	if open {
		c.open = false
		c.cause = "stopped"
		if !d.delegatedIDs[c.id] {
			d.emitLocked(record{ID: ptr(c.id), Type: "CLOSED", Cause: ptr("stopped")})
		}
	}
	d.mu.Unlock()
	switch {
	case pending:
		// The client gives up on a request that is still waiting inside the cacher.
		c.ctx.cancel()
	case open:
		c.w.Stop()
		c.ctx.cancel()
	}
}

func (d *driver) newClient(id, kind string, timeout time.Duration) *client {
	c := &client{id: id, kind: kind, ctx: d.newCtx(id, timeout)}
	d.mu.Lock()
	d.clients = append(d.clients, c)
	d.byID[id] = c
	d.mu.Unlock()
	return c
}

func rejection(id string, err error) record {
	st := responsewriters.ErrorToAPIStatus(err)
	r := record{ID: ptr(id), Type: "REJECTED", Code: ptr(st.Code), Reason: ptr(string(st.Reason)), Message: ptr(st.Message)}
	if st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		r.RetryAfterS = ptr(st.Details.RetryAfterSeconds)
	}
	return r
}

func watchListEnabled() bool { return utilfeature.DefaultFeatureGate.Enabled(features.WatchList) }

// skipListDefaults (run -no-list-defaults) leaves out SetListOptionsDefaults, to see what the
// cacher alone does with a legacy watch when WatchList is on (for investigation only).
var skipListDefaults bool

// decodeListOptions is the request layer of endpoints/handlers/get.go (ListResource): query
// parameters through the ParameterCodec (400 on failure), defaults, ValidateListOptions (422).
func decodeListOptions(q url.Values) (*metainternalversion.ListOptions, error) {
	opts := metainternalversion.ListOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if !skipListDefaults {
		metainternalversion.SetListOptionsDefaults(&opts, watchListEnabled())
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
	if _, skip := d.skips[w.ID]; skip {
		d.newClient(w.ID, "skipped", 0)
		return
	}
	opts, err := decodeListOptions(q)
	var timeout time.Duration
	if err == nil && opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	c := d.newClient(w.ID, "watch", timeout)
	c.manual = w.Manual
	if err != nil {
		d.emit(rejection(w.ID, err))
		return
	}
	pred := d.predicate(opts)
	pred.AllowWatchBookmarks = opts.AllowWatchBookmarks
	sopts := storage.ListOptions{ResourceVersion: opts.ResourceVersion, Predicate: pred,
		Recursive: w.Recursive, SendInitialEvents: opts.SendInitialEvents}
	c.identifier = normalizeIdentifier(fmt.Sprintf("key: %q, labels: %q, fields: %q", w.Key, pred.Label, pred.Field))
	c.pending = true
	front := d.kube.front
	go func() {
		wi, err := front.Watch(c.ctx, w.Key, sopts)
		isCacheW := err == nil && d.kube.isCacheWatcher(wi)
		var rej record
		if err != nil {
			rej = rejection(c.id, err) // (may log: never under d.mu)
		}
		d.mu.Lock()
		c.pending = false
		switch {
		case d.delegatedIDs[c.id]:
			d.mu.Unlock()
			return
		case err != nil:
			d.emitLocked(rej)
			d.mu.Unlock()
			return
		}
		c.w, c.isCacheW = wi, isCacheW
		gone := c.ctx.Err() != nil // the client went away while the cacher set the watch up
		c.open = !gone
		d.mu.Unlock()
		if gone {
			wi.Stop()
			return
		}
		d.follow(c)
	}()
}

func (d *driver) startList(l listSpec) {
	if _, skip := d.skips[l.ID]; skip {
		d.newClient(l.ID, "skipped", 0)
		return
	}
	c := d.newClient(l.ID, "list", time.Duration(d.cfg.RequestTimeoutMs)*time.Millisecond)
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
		d.emit(rejection(l.ID, err))
		return
	}
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
		var rej record
		if err != nil {
			rej = rejection(c.id, err) // (may log: never under d.mu)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		c.pending = false
		if d.delegatedIDs[c.id] {
			return
		}
		if err != nil {
			d.emitLocked(rej)
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
		d.emitLocked(r)
	}()
}

func (d *driver) startGet(id, key, rv string) {
	if _, skip := d.skips[id]; skip {
		d.newClient(id, "skipped", 0)
		return
	}
	c := d.newClient(id, "get", time.Duration(d.cfg.RequestTimeoutMs)*time.Millisecond)
	// endpoints/handlers/get.go (GetResource): GetOptions through the ParameterCodec.
	var opts metav1.GetOptions
	q := url.Values{}
	if rv != "" {
		q.Set("resourceVersion", rv)
	}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts); err != nil {
		d.emit(rejection(id, apierrors.NewBadRequest(err.Error())))
		return
	}
	name := key[strings.LastIndexByte(key, '/')+1:]
	c.pending = true
	front := d.kube.front
	go func() {
		pod := &example.Pod{}
		err := front.Get(c.ctx, key, storage.GetOptions{ResourceVersion: opts.ResourceVersion}, pod)
		if err != nil && err != errDelegated {
			err = storeerr.InterpretGetError(err, podsResource, name)
		}
		var rej record
		if err != nil && err != errDelegated {
			rej = rejection(c.id, err) // (may log: never under d.mu)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		c.pending = false
		if d.delegatedIDs[c.id] {
			return
		}
		if err != nil {
			d.emitLocked(rej)
			return
		}
		k, irv, value, _ := describe(pod)
		items := []item{{Key: k, RV: irv, Value: value}}
		d.emitLocked(record{ID: ptr(c.id), Type: "GET", Source: ptr("cache"), Items: &items})
	}()
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

func featureName(s string) featuregate.Feature { return featuregate.Feature(s) }

// resourcePrefix is the cacher's ResourcePrefix: the first path segment of the scenario's keys
// ("/pods" in every scenario so far); the cacher uses it for the reflector's requests (which the
// fake storage answers whatever the key) and, from v1.37, to refuse keys outside it.
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

// normalizeIdentifier drops a trailing "/" of the key in a watcher identifier (v1.31+ add one to
// recursive keys before they build it).
func normalizeIdentifier(id string) string {
	return strings.Replace(strings.TrimSpace(id), `/", labels: `, `", labels: `, 1)
}
