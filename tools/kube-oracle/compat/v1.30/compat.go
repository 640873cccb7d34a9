package main

// k8s.io/apiserver v0.30.x: the Cacher is the storage the registry uses (no CacheDelegator yet).

import (
	"context"
	"fmt"
	"time"
	_ "unsafe" // go:linkname

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"
)

const (
	profileName = "v1.30"
	kubeVersion = "k8s.io/apiserver v0.30.3"
)

type kube struct {
	front storage.Interface
	c     *cacher.Cacher
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
	}
	if f := d.cfg.IndexField; f != "" {
		cfg.IndexerFuncs = storage.IndexerFuncs{f: func(obj runtime.Object) string { return objectField(obj, f) }}
	}
	return cfg
}

func newKube(d *driver) (*kube, error) {
	c, err := cacher.NewCacherFromConfig(baseConfig(d))
	if err != nil {
		return nil, err
	}
	configure(d, c)
	return &kube{front: c, c: c}, nil
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
func (k *kube) stop() { k.c.Stop() }

// kubeStorage adds the methods of this version's storage.Interface that the oracle never uses.
type kubeStorage struct{ *fakeStorage }

func (kubeStorage) Delete(context.Context, string, runtime.Object, *storage.Preconditions, storage.ValidateObjectFunc, runtime.Object) error {
	return fmt.Errorf("kube-oracle: Delete is not used")
}

func (kubeStorage) GuaranteedUpdate(context.Context, string, runtime.Object, bool, *storage.Preconditions, storage.UpdateFunc, runtime.Object) error {
	return fmt.Errorf("kube-oracle: GuaranteedUpdate is not used")
}

func (kubeStorage) Count(string) (int64, error) {
	return 0, fmt.Errorf("kube-oracle: Count is not used")
}

// neverExitWatch is client-go's "no resync" channel (tools/cache/reflector.go). It is created at
// package initialisation, outside the synctest bubble, so a reflector goroutine waiting on it
// would never count as durably blocked; prepareBubble replaces it with nil, which never fires
// either (what client-go itself returns from v0.37 on).
//
//go:linkname neverExitWatch k8s.io/client-go/tools/cache.neverExitWatch
var neverExitWatch <-chan time.Time

func prepareBubble() {
	neverExitWatch = nil
	dropErrorBackoff()
}

// dropErrorBackoff keeps only the logging of utilruntime.HandleError: its other handler, a 1 ms
// throttle, started its clock at package initialisation in real time (2026), so in the bubble
// (2000) it would sleep for decades; in scenario time a 1 ms real-time throttle is nothing.
func dropErrorBackoff() { utilruntime.ErrorHandlers = utilruntime.ErrorHandlers[:1] }
