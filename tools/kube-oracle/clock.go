package main

// The clock. The whole cacher runs inside a testing/synctest bubble (oracle_test.go), whose
// fake clock is what the time package itself returns: time.Now, timers, tickers, time.Sleep,
// context deadlines. So Kubernetes' own real-time code (the dispatch loop's budget timer,
// wait.Until's one-second pause before a relist, the reflector) runs on scenario time
// unchanged, and the cacher's clock.Clock is the real clock, wrapped only to pick the random
// draw of the dispatch loop's jittered tick.

import (
	"runtime"
	"strings"
	"time"

	"k8s.io/utils/clock"
)

// jitterClock is clock.RealClock, except that a timer the cacher's dispatch loop arms with
// wait.Jitter(1s, 0.25) gets the duration tickDraw returns: Kubernetes draws it from math/rand,
// the oracle from the scenario's seed exactly as the core does (rng.rs), so both tick at the
// same instants.
type jitterClock struct {
	clock.RealClock
	tickDraw func() time.Duration
}

func (c *jitterClock) NewTimer(d time.Duration) clock.Timer {
	return &jitterTimer{c.RealClock.NewTimer(c.hook(d)), c}
}

type jitterTimer struct {
	clock.Timer
	c *jitterClock
}

func (t *jitterTimer) Reset(d time.Duration) bool { return t.Timer.Reset(t.c.hook(d)) }

// hook recognises the dispatch loop's tick by its range and its caller.
func (c *jitterClock) hook(d time.Duration) time.Duration {
	if c.tickDraw == nil || d < time.Second || d > 1250*time.Millisecond {
		return d
	}
	pcs := make([]uintptr, 8)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*Cacher).dispatchEvents") {
			return c.tickDraw()
		}
		if !more {
			return d
		}
	}
}

var (
	_ clock.WithTicker           = (*jitterClock)(nil)
	_ clock.WithDelayedExecution = (*jitterClock)(nil)
)
