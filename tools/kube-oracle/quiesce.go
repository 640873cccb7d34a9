package main

// Waiting until the cacher has done everything it can do without the driver.
//
// The cacher is a set of goroutines (the reflector, the dispatch loop, one per watcher, the
// progress requester, requests in flight). The fake clock may only move when every one of them
// is blocked on something only the driver can provide: a fake timer, storage (an event, a list
// answer), a client reading its result channel. The driver checks that by reading the states of
// all goroutines (runtime.Stack): "running", "runnable", "syscall" and "sleep" mean busy; a
// goroutine parked in a channel operation, select, mutex or condition variable is idle, except
// where it waits on a real-time timer that will wake it by itself. In the code the oracle drives
// those are all in k8s.io/apimachinery/pkg/util/wait (wait.Until's one-second pause between two
// ListAndWatch calls, 1.31+'s 10 ms poll for the first list in dispatchEvents): a goroutine whose
// innermost non-runtime frame is in that package counts as busy, unless it is the dispatch loop's
// poll while the cache has not been listed yet (only a `replace` step can end that wait). Two
// consecutive idle snapshots are required.

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

type quiescer struct {
	buf []byte
	// listed reports whether the cacher has completed its first list (the dispatch loop's
	// 10 ms poll is idle until then).
	listed func() bool
	// Timeout for one wait (real time).
	limit time.Duration
}

func newQuiescer(listed func() bool) *quiescer {
	return &quiescer{buf: make([]byte, 1<<20), listed: listed, limit: 60 * time.Second}
}

// wait returns once the process is quiescent.
func (q *quiescer) wait() {
	start := time.Now()
	idleRuns := 0
	pause := 20 * time.Microsecond
	for {
		runtime.Gosched()
		busy, why := q.busy()
		if !busy {
			idleRuns++
			if idleRuns >= 2 {
				return
			}
			continue
		}
		idleRuns = 0
		if time.Since(start) > q.limit {
			fmt.Fprintf(os.Stderr, "kube-oracle: no quiescence after %v (%s); goroutines:\n%s\n", q.limit, why, q.stacks())
			os.Exit(70)
		}
		time.Sleep(pause)
		if pause < time.Millisecond {
			pause *= 2
		}
	}
}

func (q *quiescer) stacks() []byte {
	for {
		n := runtime.Stack(q.buf, true)
		if n < len(q.buf) {
			return q.buf[:n]
		}
		q.buf = make([]byte, 2*len(q.buf))
	}
}

// busy reports whether some goroutine other than the caller can still make progress by itself.
func (q *quiescer) busy() (bool, string) {
	all := q.stacks()
	blocks := bytes.Split(all, []byte("\n\n"))
	for i, b := range blocks {
		if i == 0 {
			continue // the calling goroutine (runtime.Stack lists it first)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) == 0 || !strings.HasPrefix(lines[0], "goroutine ") {
			continue
		}
		state := lines[0]
		if j := strings.IndexByte(state, '['); j >= 0 {
			state = state[j+1:]
			if k := strings.IndexAny(state, ",]"); k >= 0 {
				state = state[:k]
			}
		}
		switch state {
		case "running", "runnable", "syscall", "sleep", "preempted", "copystack", "GC assist marking", "GC assist wait":
			return true, lines[0] + " " + firstFunc(lines)
		}
		fn := innermost(lines)
		if strings.HasPrefix(fn, "k8s.io/apimachinery/pkg/util/wait.") && !strings.Contains(fn, "ContextForChannel") {
			if strings.Contains(string(b), ".(*Cacher).dispatchEvents") && !q.listed() {
				continue
			}
			return true, "real-time wait in " + fn
		}
	}
	return false, ""
}

func firstFunc(lines []string) string {
	if len(lines) > 1 {
		return lines[1]
	}
	return ""
}

// innermost is the innermost frame outside the runtime, sync and time packages.
func innermost(lines []string) string {
	for i := 1; i < len(lines); i += 2 {
		fn := lines[i]
		if strings.HasPrefix(fn, "created by ") {
			return ""
		}
		if j := strings.LastIndexByte(fn, '('); j > 0 {
			fn = fn[:j]
		}
		switch {
		case strings.HasPrefix(fn, "runtime."), strings.HasPrefix(fn, "sync."),
			strings.HasPrefix(fn, "time."), strings.HasPrefix(fn, "internal/"):
			continue
		}
		return fn
	}
	return ""
}
