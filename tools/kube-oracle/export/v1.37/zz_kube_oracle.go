// This file is not part of Kubernetes. The kube-oracle build (tools/kube-oracle/build.sh) adds it
// to a private copy of k8s.io/apiserver's pkg/storage/cacher, so that the oracle can set the
// unexported knobs that the package's own whitebox tests set (ring capacity, bookmark frequency,
// dispatch time budget) and observe what a client cannot (a cacheWatcher's stopped flag).
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

// KubeOracleTimeBudget is Kubernetes' own timeBudgetImpl on the given clock (the package's
// newTimeBudget always uses the real clock), with the given refill per second and cap.
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

// KubeOracleFireDispatchTimer fires the (real-time) timer a blocked dispatch waits on; the oracle
// calls it when the fake clock reaches the end of the budget it handed out.
func KubeOracleFireDispatchTimer(c *Cacher) { c.timer.Reset(0) }

// KubeOracleListResourceVersion is the RV of the cache's last list (0 before the first).
func KubeOracleListResourceVersion(c *Cacher) uint64 {
	return c.watchCache.getListResourceVersion()
}

// KubeOracleWatcherStopped says whether the cacher has stopped a watcher it returned (ok is false
// for the error and immediately-closed watchers, which are not cacheWatchers).
func KubeOracleWatcherStopped(c *Cacher, w watch.Interface) (stopped, ok bool) {
	cw, ok := w.(*cacheWatcher)
	if !ok {
		return false, false
	}
	c.Lock()
	defer c.Unlock()
	return cw.stopped, true
}
