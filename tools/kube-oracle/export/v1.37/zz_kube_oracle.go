// This file is not part of Kubernetes. The kube-oracle build (tools/kube-oracle/build.sh) adds it
// to a private copy of k8s.io/apiserver's pkg/storage/cacher, so that the oracle can set the
// unexported knobs that the package's own whitebox tests set (ring capacity, bookmark frequency,
// dispatch time budget) and observe what a client cannot (whether a watcher is a cacheWatcher
// and whether it was stopped).
// Nothing here changes the cacher's logic. Variant for k8s.io/apiserver v0.37.x (the ring buffer moved to watchCacheHistory).

package cacher

import (
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage/cacher/metrics"
	"k8s.io/utils/clock"
)

// KubeOracleKnobs are the settings the whitebox tests change; zero values keep Kubernetes' own.
type KubeOracleKnobs struct {
	Capacity, LowerBoundCapacity, UpperBoundCapacity int
	BookmarkFrequency                                time.Duration
	Budget                                           KubeOracleBudget
}

// KubeOracleBudget is the dispatch time budget (the cacher's timeBudget interface, exported).
type KubeOracleBudget interface {
	TakeAvailable() time.Duration
	ReturnUnused(time.Duration)
}

type kubeOracleBudgetAdapter struct{ b KubeOracleBudget }

func (a kubeOracleBudgetAdapter) takeAvailable() time.Duration { return a.b.TakeAvailable() }
func (a kubeOracleBudgetAdapter) returnUnused(d time.Duration) { a.b.ReturnUnused(d) }

type kubeOracleBudgetImpl struct{ t *timeBudgetImpl }

func (b kubeOracleBudgetImpl) TakeAvailable() time.Duration { return b.t.takeAvailable() }
func (b kubeOracleBudgetImpl) ReturnUnused(d time.Duration) { b.t.returnUnused(d) }

// KubeOracleTimeBudget is Kubernetes' own timeBudgetImpl with the given refill per second and
// cap (newTimeBudget always uses the constants).
func KubeOracleTimeBudget(c clock.Clock, refreshPerSecond, max time.Duration) KubeOracleBudget {
	t := &timeBudgetImpl{clock: c, budget: 0, refresh: refreshPerSecond, maxBudget: max}
	t.last = c.Now()
	return kubeOracleBudgetImpl{t}
}

// KubeOracleConfigure applies the knobs. Call it right after NewCacherFromConfig, before storage
// answers the reflector's first list.
func KubeOracleConfigure(c *Cacher, k KubeOracleKnobs) {
	w := c.watchCache
	w.Lock()
	h := w.history
	if k.LowerBoundCapacity > 0 {
		h.lowerBoundCapacity = k.LowerBoundCapacity
	}
	if k.UpperBoundCapacity > 0 {
		h.upperBoundCapacity = k.UpperBoundCapacity
	}
	if k.Capacity > 0 {
		h.capacity = k.Capacity
		h.cache = make([]*watchCacheEvent, k.Capacity)
		metrics.WatchCacheCapacity.WithLabelValues(w.config.groupResource.Group, w.config.groupResource.Resource).Set(float64(k.Capacity))
	}
	w.Unlock()
	c.Lock()
	if k.BookmarkFrequency > 0 {
		c.bookmarkWatchers = newTimeBucketWatchers(c.clock, k.BookmarkFrequency)
	}
	if k.Budget != nil {
		c.dispatchTimeoutBudget = kubeOracleBudgetAdapter{k.Budget}
	}
	c.Unlock()
}

// KubeOracleIsCacheWatcher says whether a watcher the cacher returned is a cacheWatcher (not
// an error watcher or an immediately-closed one).
func KubeOracleIsCacheWatcher(w watch.Interface) bool {
	_, ok := w.(*cacheWatcher)
	return ok
}

// KubeOracleWatcherStoppedLocked says whether the cacher has stopped a cacheWatcher. The caller
// must hold the Cacher's lock (it is called from a log line written under it).
func KubeOracleWatcherStoppedLocked(w watch.Interface) bool {
	cw, ok := w.(*cacheWatcher)
	return ok && cw.stopped
}
