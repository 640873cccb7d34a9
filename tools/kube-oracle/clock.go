package main

// The fake clock the cacher runs on. It implements k8s.io/utils/clock's Clock, WithTicker and
// WithDelayedExecution like k8s.io/utils/clock/testing's FakeClock, plus what the driver needs:
// the earliest pending deadline (so time is stepped through every timer in order, as the core's
// replayer does), and a hook that picks the random draw of the dispatch loop's jittered tick.

import (
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// epoch is scenario time 0. It lies in the past, so real-time code comparing a fake deadline with
// time.Now() sees it as expired rather than as far away (no such comparison is on the paths the
// oracle drives; this only makes a mistake loud).
var epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	seq     int
	waiters []*fakeWaiter
	// tickDraw, when set, replaces the duration of a timer armed by the cacher's dispatch loop
	// with wait.Jitter(1s, 0.25): Kubernetes draws it from math/rand, the oracle from the
	// scenario's seed exactly as the core does, so both tick at the same instants.
	tickDraw func() time.Duration
}

type fakeWaiter struct {
	c      *fakeClock
	target time.Time
	period time.Duration // tickers
	ch     chan time.Time
	fn     func() // AfterFunc
	seq    int
	active bool
	inList bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: epoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *fakeClock) add(d time.Duration, period time.Duration, fn func()) *fakeWaiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	w := &fakeWaiter{c: c, target: c.now.Add(d), period: period, fn: fn, seq: c.seq, active: true, inList: true}
	if fn == nil {
		w.ch = make(chan time.Time, 1)
	}
	c.waiters = append(c.waiters, w)
	return w
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time { return c.add(d, 0, nil).ch }

func (c *fakeClock) NewTimer(d time.Duration) clock.Timer {
	return &fakeTimer{c.add(c.jitterHook(d), 0, nil)}
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return &fakeTimer{c.add(d, 0, f)}
}

func (c *fakeClock) Tick(d time.Duration) <-chan time.Time { return c.add(d, d, nil).ch }

func (c *fakeClock) NewTicker(d time.Duration) clock.Ticker { return &fakeTicker{c.add(d, d, nil)} }

// Sleep blocks until the fake time has passed d (the goroutine then looks blocked, as it is).
func (c *fakeClock) Sleep(d time.Duration) { <-c.After(d) }

// jitterHook recognises the dispatch loop's jittered tick by its caller and its range.
func (c *fakeClock) jitterHook(d time.Duration) time.Duration {
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

// nextDeadline is the earliest target of an active waiter.
func (c *fakeClock) nextDeadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	found := false
	for _, w := range c.waiters {
		if w.active && (!found || w.target.Before(best)) {
			best, found = w.target, true
		}
	}
	return best, found
}

// setTime moves the clock to t (never backwards) and fires every waiter due by then, in
// (target, creation) order; a ticker fires once per call, its channel holding one tick like
// time.Ticker's. It returns how many waiters fired.
func (c *fakeClock) setTime(t time.Time) int {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	var due []*fakeWaiter
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.active {
			w.inList = false
			continue
		}
		if !w.target.After(c.now) {
			due = append(due, w)
		}
		kept = append(kept, w)
	}
	c.waiters = kept
	sort.SliceStable(due, func(i, j int) bool {
		if !due[i].target.Equal(due[j].target) {
			return due[i].target.Before(due[j].target)
		}
		return due[i].seq < due[j].seq
	})
	now := c.now
	var fns []func()
	for _, w := range due {
		if w.period > 0 {
			for !w.target.After(now) {
				w.target = w.target.Add(w.period)
			}
		} else {
			w.active = false
		}
		if w.fn != nil {
			fns = append(fns, w.fn)
			continue
		}
		select {
		case w.ch <- now:
		default: // a tick nobody took yet: dropped, as time.Ticker does
		}
	}
	c.mu.Unlock()
	for _, f := range fns {
		go f()
	}
	return len(due)
}

type fakeTimer struct{ w *fakeWaiter }

func (t *fakeTimer) C() <-chan time.Time { return t.w.ch }

func (t *fakeTimer) Stop() bool {
	c := t.w.c
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.w.active
	t.w.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	c := t.w.c
	d = c.jitterHook(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.w.active
	c.seq++
	t.w.seq = c.seq
	t.w.target = c.now.Add(d)
	t.w.active = true
	if !t.w.inList {
		t.w.inList = true
		c.waiters = append(c.waiters, t.w)
	}
	return was
}

type fakeTicker struct{ w *fakeWaiter }

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }

func (t *fakeTicker) Stop() {
	c := t.w.c
	c.mu.Lock()
	defer c.mu.Unlock()
	t.w.active = false
}

var (
	_ clock.WithTicker           = (*fakeClock)(nil)
	_ clock.WithDelayedExecution = (*fakeClock)(nil)
)
