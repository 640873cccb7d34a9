package main

// k8s.io/apiserver v0.37.x: as v0.34 (CacheDelegator, the global etcd feature checker); the
// cacher's reflector streams its initial list (WatchList), which the fake storage serves.

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"
)

const (
	profileName = "v1.37"
	kubeVersion = "k8s.io/apiserver v0.37.2"
)

type kube struct {
	front storage.Interface
	c     *cacher.Cacher
	del   *cacher.CacheDelegator
}

// progressSupport answers whether etcd supports RequestWatchProgress (the scenario's
// storage_supports_progress) instead of asking etcd endpoints.
type progressSupport struct {
	etcdfeature.FeatureSupportChecker
	progress bool
}

func (p progressSupport) Supports(f storage.Feature) bool {
	if f == storage.RequestWatchProgress {
		return p.progress
	}
	return p.FeatureSupportChecker.Supports(f)
}

// gatesOf lists the scenario gate switches whose Kubernetes gate exists in this version.
func gatesOf() map[string]bool {
	known := utilfeature.DefaultMutableFeatureGate.GetAll()
	out := map[string]bool{}
	for _, g := range scenarioGates {
		if _, ok := known[featureName(g.gate)]; ok {
			out[g.field] = true
		}
	}
	return out
}

// gateProblem sets the gates and says why that is impossible, if it is.
func gateProblem(cfg config) string {
	set := map[string]bool{}
	have := gatesOf()
	for _, g := range scenarioGates {
		if have[g.field] {
			set[g.gate] = cfg.Gates[g.field]
		}
	}
	for k, v := range extraGates() {
		set[k] = v
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(set); err != nil {
		return fmt.Sprintf("feature gates: %v", err)
	}
	return ""
}

func setListOptionsDefaults(opts *metainternalversion.ListOptions, watchList bool) {
	metainternalversion.SetListOptionsDefaults(opts, watchList)
}

func baseConfig(d *driver) cacher.Config {
	cfg := cacher.Config{
		Storage:        kubeStorage{d.fs},
		Versioner:      storage.APIObjectVersioner{},
		GroupResource:  podsResource,
		ResourcePrefix: resourcePrefix(d),
		KeyFunc:        objectKey,
		GetAttrsFunc:   objectAttrs,
		NewFunc:        func() runtime.Object { return &example.Pod{} },
		NewListFunc:    func() runtime.Object { return &example.PodList{} },
		Codec:          codecs.LegacyCodec(examplev1.SchemeGroupVersion),
		Clock:          d.clock,
		// The core's event_fresh_ms is the history window (NewCacherFromConfig refuses < 75 s).
		EventsHistoryWindow: time.Duration(d.cfg.EventFreshMs) * time.Millisecond,
	}
	if f := d.cfg.IndexField; f != "" {
		cfg.IndexerFuncs = storage.IndexerFuncs{f: func(obj runtime.Object) string { return objectField(obj, f) }}
	}
	return cfg
}

func newKube(d *driver) (*kube, error) {
	etcdfeature.DefaultFeatureSupportChecker = progressSupport{etcdfeature.DefaultFeatureSupportChecker, d.cfg.StorageSupportsProgress}
	d.fs.stamp = stampEvent
	c, err := cacher.NewCacherFromConfig(baseConfig(d))
	if err != nil {
		return nil, err
	}
	configure(d, c)
	del := cacher.NewCacheDelegator(c, kubeStorage{d.fs})
	return &kube{front: del, c: c, del: del}, nil
}

// configure sets the knobs of the whitebox tests (fixed capacity is lower = upper = capacity).
func configure(d *driver, c *cacher.Cacher) {
	k := cacher.KubeOracleKnobs{
		Capacity:           d.cfg.Capacity,
		LowerBoundCapacity: d.cfg.LowerBound,
		UpperBoundCapacity: d.cfg.UpperBound,
		BookmarkFrequency:  time.Duration(d.cfg.BookmarkFrequencyMs) * time.Millisecond,
	}
	if !d.cfg.Dynamic {
		k.LowerBoundCapacity, k.UpperBoundCapacity = d.cfg.Capacity, d.cfg.Capacity
	}
	if d.cfg.BudgetRefillMsPerS != 50 || d.cfg.BudgetMaxMs != 100 {
		k.Budget = cacher.KubeOracleTimeBudget(clock.RealClock{},
			time.Duration(d.cfg.BudgetRefillMsPerS)*time.Millisecond, time.Duration(d.cfg.BudgetMaxMs)*time.Millisecond)
	}
	cacher.KubeOracleConfigure(c, k)
}

func (k *kube) isCacheWatcher(w watch.Interface) bool { return cacher.KubeOracleIsCacheWatcher(w) }
func (k *kube) watcherStoppedLocked(w watch.Interface) bool {
	return cacher.KubeOracleWatcherStoppedLocked(w)
}
func (k *kube) stop() { k.c.Stop(); k.del.Stop() }

// kubeStorage adds the methods of this version's storage.Interface that the oracle never uses.
type kubeStorage struct{ *fakeStorage }

func (kubeStorage) Delete(context.Context, string, runtime.Object, *storage.Preconditions, storage.ValidateObjectFunc, runtime.Object, storage.DeleteOptions) error {
	return fmt.Errorf("kube-oracle: Delete is not used")
}

func (kubeStorage) GuaranteedUpdate(context.Context, string, runtime.Object, bool, *storage.Preconditions, storage.UpdateFunc, runtime.Object) error {
	return fmt.Errorf("kube-oracle: GuaranteedUpdate is not used")
}

func (kubeStorage) Stats(context.Context) (storage.Stats, error) {
	return storage.Stats{}, fmt.Errorf("kube-oracle: Stats is not used")
}
func (kubeStorage) ReadinessCheck() error                               { return nil }
func (kubeStorage) EnableResourceSizeEstimation(storage.KeysFunc) error { return nil }
func (s kubeStorage) GetCurrentResourceVersion(ctx context.Context) (uint64, error) {
	return s.currentRV(ctx), nil
}
func (s kubeStorage) CompactRevision() int64 { return s.compactRevision() }

// Watch passes on v1.37's ListOptions.RecordTimestamps (the cacher's reflector sets it).
func (s kubeStorage) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	return s.watchWith(ctx, key, opts, opts.RecordTimestamps)
}

// timedEvent is what etcd3's watcher sends when asked for record timestamps
// (storage.WatchEventWithRecordTime): the object and when storage decoded it.
type timedEvent struct {
	runtime.Object
	at time.Time
}

func (t *timedEvent) GetObjectMeta() metav1.Object {
	m, _ := meta.Accessor(t.Object)
	return m
}
func (t *timedEvent) DeepCopyObject() runtime.Object {
	return &timedEvent{Object: t.Object.DeepCopyObject(), at: t.at}
}
func (t *timedEvent) RecordTime() time.Time  { return t.at }
func (t *timedEvent) Unwrap() runtime.Object { return t.Object }

var _ storage.WatchEventWithRecordTime = &timedEvent{}

func stampEvent(obj runtime.Object, at time.Time) runtime.Object {
	return &timedEvent{Object: obj, at: at}
}

// prepareBubble: nothing in this version's client-go waits on channels made outside the bubble.
func prepareBubble() { dropErrorBackoff() }

// dropErrorBackoff keeps only the logging of utilruntime.HandleError: its other handler, a 1 ms
// throttle, started its clock at package initialisation in real time (2026), so in the bubble
// (2000) it would sleep for decades; in scenario time a 1 ms real-time throttle is nothing.
func dropErrorBackoff() { utilruntime.ErrorHandlers = utilruntime.ErrorHandlers[:1] }
