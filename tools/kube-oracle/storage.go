package main

// The fake storage.Interface under the cacher: "etcd" as the scenario describes it.
//
// - The reflector's LIST blocks until the scenario's next `replace` step answers it (a LIST after
//   the first one is the relist the core reports as RELIST; a `replace` that comes while the
//   reflector still waits out its pause before relisting answers that list when it is asked);
//   from v1.37 the reflector streams its list instead (a watch with sendInitialEvents), which
//   `replace` answers with ADDED events and the initial-events-end bookmark.
// - The reflector's WATCH streams the scenario's put/delete/txn events after its start RV, and
//   `progress` steps as BOOKMARK events (etcd's progress notifications); `storage_error` ends it
//   with a 410 Expired error event, which makes the reflector relist.
// - Requests the cacher hands to storage on a client's behalf (the context carries the client's
//   request id) are recorded as `source: storage` and end there, as in the core's trace.
// - The current-revision probe (storage.GetCurrentResourceVersionFromStorage in 1.30,
//   GetCurrentResourceVersion later) is recorded as NEED_CURRENT_RV and answered like the core's
//   replayer: the highest of the last `etcd_rv` and every RV stored so far.
// - RequestWatchProgress is recorded as REQUEST_PROGRESS; scenarios answer with `progress`.

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

type reqIDKey struct{}

func requestID(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(reqIDKey{}).(string)
	return id, ok
}

type listAnswer struct {
	rv   uint64
	objs []*example.Pod
	err  error
}

type loggedEvent struct {
	rv uint64
	ev watch.Event
}

type fakeStorage struct {
	d *driver
	// stamp wraps an event's object with the time storage decoded it (v1.37's cacher asks for
	// that with ListOptions.RecordTimestamps; nil where the version has no such option).
	stamp func(obj runtime.Object, at time.Time) runtime.Object

	mu         sync.Mutex
	objs       map[string]*example.Pod // the state at `rev`
	rev        uint64                  // highest RV stored so far
	etcdRV     uint64
	compactRev int64
	log        []loggedEvent // events since the last replace, in RV order
	lists      int           // reflector lists (and watch-lists) so far
	listWaiter chan listAnswer
	// relistDue: the reflector's watch was broken and it will list again (after wait.Until's
	// one-second pause); a `replace` that comes first is its answer, given when it asks.
	relistDue bool
	answer    *listAnswer
	watch     *fakeWatch // the reflector's watch
	// initial is the reflector's watch-list stream waiting for its initial events (v1.37).
	initial *fakeWatch
}

func newFakeStorage(d *driver) *fakeStorage {
	return &fakeStorage{d: d, objs: map[string]*example.Pod{}}
}

type fakeWatch struct {
	ch   chan watch.Event
	stop chan struct{}
	once sync.Once
	// stampWith, when set, wraps changes (not initial events, bookmarks or errors) with the
	// fake time they are sent at: etcd3's watcher records the decode time the same way.
	stampWith func(runtime.Object) runtime.Object
}

func newFakeWatch() *fakeWatch {
	return &fakeWatch{ch: make(chan watch.Event, 1<<16), stop: make(chan struct{})}
}

func (w *fakeWatch) ResultChan() <-chan watch.Event { return w.ch }
func (w *fakeWatch) Stop()                          { w.once.Do(func() { close(w.stop) }) }
func (w *fakeWatch) isStopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}
func (w *fakeWatch) send(ev watch.Event) {
	if w.isStopped() {
		return
	}
	if w.stampWith != nil && (ev.Type == watch.Added || ev.Type == watch.Modified || ev.Type == watch.Deleted) {
		ev.Object = w.stampWith(ev.Object)
	}
	select {
	case w.ch <- ev:
	default:
		panic("kube-oracle: fake watch buffer overflow")
	}
}

// calledFrom reports whether a function whose name contains part is on the caller's stack.
func calledFrom(part string) bool {
	pcs := make([]uintptr, 64)
	n := goruntime.Callers(2, pcs)
	frames := goruntime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, part) {
			return true
		}
		if !more {
			return false
		}
	}
}

var errDelegated = errors.New("kube-oracle: served by storage")

// debugf prints the fake storage's calls when KUBE_ORACLE_DEBUG is set.
func debugf(format string, a ...any) {
	if os.Getenv("KUBE_ORACLE_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "kube-oracle storage: "+format+"\n", a...)
	}
}

func (s *fakeStorage) Versioner() storage.Versioner { return storage.APIObjectVersioner{} }

func (s *fakeStorage) Create(context.Context, string, runtime.Object, runtime.Object, uint64) error {
	return fmt.Errorf("kube-oracle: Create is not used")
}

func (s *fakeStorage) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	return s.watchWith(ctx, key, opts, false)
}

func (s *fakeStorage) watchWith(ctx context.Context, key string, opts storage.ListOptions, stamp bool) (watch.Interface, error) {
	if id, ok := requestID(ctx); ok {
		s.d.delegated(id, "WATCH")
		return newFakeWatch(), nil
	}
	debugf("reflector watch from %q sendInitialEvents=%v recordTimestamps=%v", opts.ResourceVersion, opts.SendInitialEvents != nil && *opts.SendInitialEvents, stamp)
	w := newFakeWatch()
	if stamp && s.stamp != nil {
		w.stampWith = func(o runtime.Object) runtime.Object { return s.stamp(o, time.Now()) }
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watch != nil {
		s.watch.Stop()
	}
	s.watch = w
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		// The reflector's watch-list: its initial events are the next `replace`.
		s.lists++
		if s.lists > 1 {
			s.d.emit(record{Type: "RELIST"})
		}
		s.relistDue = false
		s.initial = w
		if a := s.answer; a != nil {
			s.answer = nil
			s.streamInitialLocked(a.rv, a.objs)
		}
		return w, nil
	}
	from, err := storage.APIObjectVersioner{}.ParseResourceVersion(opts.ResourceVersion)
	if err != nil {
		return nil, err
	}
	for _, e := range s.log {
		if e.rv > from {
			w.send(e.ev)
		}
	}
	return w, nil
}

func (s *fakeStorage) Get(ctx context.Context, key string, opts storage.GetOptions, out runtime.Object) error {
	if id, ok := requestID(ctx); ok {
		s.d.delegated(id, "GET")
	}
	return errDelegated
}

func (s *fakeStorage) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if calledFrom("GetCurrentResourceVersionFromStorage") {
		rv := s.currentRV(ctx)
		listObj.(*example.PodList).ResourceVersion = strconv.FormatUint(rv, 10)
		return nil
	}
	if id, ok := requestID(ctx); ok {
		s.d.delegated(id, "LIST")
		s.mu.Lock()
		listObj.(*example.PodList).ResourceVersion = strconv.FormatUint(s.rev, 10)
		s.mu.Unlock()
		return nil
	}
	if calledFrom("consistencyChecker") || calledFrom("consistency.") {
		// The consistency checker (5 minutes of real time apart) reads the current state.
		s.mu.Lock()
		defer s.mu.Unlock()
		l := listObj.(*example.PodList)
		l.ResourceVersion = strconv.FormatUint(s.rev, 10)
		for _, p := range s.objs {
			l.Items = append(l.Items, *p.DeepCopy())
		}
		return nil
	}
	// The reflector's list: wait for the scenario's `replace`.
	debugf("reflector list at %q", opts.ResourceVersion)
	ch := make(chan listAnswer, 1)
	s.mu.Lock()
	s.lists++
	if s.lists > 1 {
		s.d.emit(record{Type: "RELIST"})
	}
	s.relistDue = false
	if a := s.answer; a != nil {
		s.answer = nil
		ch <- *a
	} else {
		s.listWaiter = ch
	}
	s.mu.Unlock()
	select {
	case a := <-ch:
		if a.err != nil {
			return a.err
		}
		l := listObj.(*example.PodList)
		l.ResourceVersion = strconv.FormatUint(a.rv, 10)
		for _, p := range a.objs {
			l.Items = append(l.Items, *p)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *fakeStorage) RequestWatchProgress(ctx context.Context) error {
	s.d.emit(record{Type: "REQUEST_PROGRESS"})
	return nil
}

// currentRV answers a quorum read of the current revision.
func (s *fakeStorage) currentRV(ctx context.Context) uint64 {
	r := record{Type: "NEED_CURRENT_RV"}
	if id, ok := requestID(ctx); ok {
		r.ID = ptr(id)
	}
	s.d.emit(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcdRV > s.rev {
		return s.etcdRV
	}
	return s.rev
}

// --- what the scenario's storage steps do --------------------------------------------------

func (s *fakeStorage) replace(rv uint64, objs []scObject) error {
	pods := make([]*example.Pod, 0, len(objs))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs = map[string]*example.Pod{}
	for _, o := range objs {
		p := o.pod()
		s.objs[o.Key] = p
		pods = append(pods, p.DeepCopy())
	}
	if rv > s.rev {
		s.rev = rv
	}
	s.log = nil
	switch {
	case s.listWaiter != nil:
		s.listWaiter <- listAnswer{rv: rv, objs: pods}
		s.listWaiter = nil
	case s.initial != nil && !s.initial.isStopped():
		s.streamInitialLocked(rv, pods)
	case s.relistDue:
		s.answer = &listAnswer{rv: rv, objs: pods}
	default:
		return fmt.Errorf("replace while the cacher's reflector is watching: in Kubernetes a relist follows a broken watch (a storage_error step)")
	}
	return nil
}

// streamInitialLocked answers a watch-list: ADDED events, then the initial-events-end bookmark.
func (s *fakeStorage) streamInitialLocked(rv uint64, pods []*example.Pod) {
	stamp := s.initial.stampWith
	s.initial.stampWith = nil // etcd3 does not stamp initial events
	for _, p := range pods {
		s.initial.send(watch.Event{Type: watch.Added, Object: p})
	}
	end := &example.Pod{}
	end.ResourceVersion = strconv.FormatUint(rv, 10)
	end.Annotations = map[string]string{annEnd: "true"}
	s.initial.send(watch.Event{Type: watch.Bookmark, Object: end})
	s.initial.stampWith = stamp
	s.initial = nil
}

// change applies put/delete changes at one revision and streams them.
func (s *fakeStorage) change(rv uint64, puts []scObject, deletes []string, order []bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	pi, di := 0, 0
	for _, isPut := range order {
		var ev watch.Event
		if isPut {
			o := puts[pi]
			pi++
			o.RV = rv
			p := o.pod()
			typ := watch.Added
			if _, ok := s.objs[o.Key]; ok {
				typ = watch.Modified
			}
			s.objs[o.Key] = p
			ev = watch.Event{Type: typ, Object: p.DeepCopy()}
		} else {
			key := deletes[di]
			di++
			prev, ok := s.objs[key]
			if !ok {
				return fmt.Errorf("delete of a key that does not exist: %s", key)
			}
			delete(s.objs, key)
			gone := prev.DeepCopy()
			gone.ResourceVersion = strconv.FormatUint(rv, 10)
			ev = watch.Event{Type: watch.Deleted, Object: gone}
		}
		s.log = append(s.log, loggedEvent{rv: rv, ev: ev})
		if s.watch != nil && s.initial != s.watch {
			s.watch.send(ev)
		}
	}
	if rv > s.rev {
		s.rev = rv
	}
	return nil
}

func (s *fakeStorage) progress(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv > s.rev {
		s.rev = rv
	}
	if s.watch != nil && s.initial != s.watch {
		b := &example.Pod{}
		b.ResourceVersion = strconv.FormatUint(rv, 10)
		s.watch.send(watch.Event{Type: watch.Bookmark, Object: b})
	}
}

// fail breaks the reflector's watch (or list) with 410 Expired, which makes it relist.
func (s *fakeStorage) fail(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	status := apierrors.NewResourceExpired(reason).Status()
	s.answer = nil
	switch {
	case s.listWaiter != nil:
		s.listWaiter <- listAnswer{err: apierrors.NewResourceExpired(reason)}
		s.listWaiter = nil
		s.relistDue = true
	case s.watch != nil:
		s.watch.send(watch.Event{Type: watch.Error, Object: &status})
		if s.initial == s.watch {
			s.initial = nil
		}
		s.watch = nil
		s.relistDue = true
	}
}

func (s *fakeStorage) setEtcdRV(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.etcdRV = rv
}

func (s *fakeStorage) compact(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int64(rv) > s.compactRev {
		s.compactRev = int64(rv)
	}
}

func (s *fakeStorage) compactRevision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.compactRev
}

var _ = metav1.Now
