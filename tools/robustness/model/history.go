// Package model is etcd's history as the ground-truth watch saw it (every event from revision 1,
// in etcd's order), replayed into a key-value model that answers "the state at revision R": the
// value of a key, a Range, the events a watch should get between two revisions.
//
// etcd counterpart: tests/robustness/model/replay.go (EtcdReplay: events per revision and the
// state at a revision) and model/deterministic.go (the KV state a Range is checked against).
package model

import (
	"fmt"
	"sort"

	"watchcache.local/tools/robustness/record"
)

type version struct {
	rev int64
	kv  *record.KV // nil: deleted at rev
}

type revKey struct {
	rev int64
	key string
}

// History is the ground truth.
type History struct {
	Events  []record.Event
	LastRev int64
	index   map[revKey]int
	keys    []string // every key ever written, sorted
	history map[string][]version
}

// New builds the model and checks that the ground truth is whole: revisions from 2 on without
// a hole (every etcd revision after 1 has at least one event), in order, each key at most once per
// revision, and each event's own prev_kv (when present) equal to the model's state before it.
// An error here is the harness's failure, not the target's.
func New(events []record.Event) (*History, error) {
	h := &History{Events: events, index: make(map[revKey]int, len(events)), history: map[string][]version{}, LastRev: 1}
	for i := range events {
		e := &events[i]
		rev := e.Rev()
		switch {
		case rev == h.LastRev:
			if i == 0 {
				return nil, fmt.Errorf("ground truth: first event at revision %d", rev)
			}
		case rev == h.LastRev+1:
			h.LastRev = rev
		default:
			return nil, fmt.Errorf("ground truth: event %d (%s) after revision %d: a hole or a step back", i, e.Short(), h.LastRev)
		}
		k := revKey{rev, e.KV.Key}
		if _, dup := h.index[k]; dup {
			return nil, fmt.Errorf("ground truth: two events for %s at %d", e.KV.Key, rev)
		}
		if e.PrevKV != nil {
			if want := h.StateAt(e.KV.Key, rev-1); !want.Equal(e.PrevKV) {
				return nil, fmt.Errorf("ground truth: %s has prev_kv %s, the model says %s", e.Short(), e.PrevKV, want)
			}
		}
		h.index[k] = i
		vs, seen := h.history[e.KV.Key]
		if !seen {
			h.keys = append(h.keys, e.KV.Key)
		}
		var kv *record.KV
		if e.Type == record.Put {
			c := e.KV
			kv = &c
		}
		h.history[e.KV.Key] = append(vs, version{rev, kv})
	}
	sort.Strings(h.keys)
	return h, nil
}

// Index finds the event for key at rev.
func (h *History) Index(rev int64, key string) (int, bool) {
	i, ok := h.index[revKey{rev, key}]
	return i, ok
}

// StateAt is the key's value at rev (nil: absent).
func (h *History) StateAt(key string, rev int64) *record.KV {
	vs := h.history[key]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].rev > rev })
	if i == 0 {
		return nil
	}
	return vs[i-1].kv
}

// Range is the state of [key, end) at rev, sorted by key (etcd's Range rules for end).
func (h *History) Range(key, end string, rev int64) []record.KV {
	var out []record.KV
	start := key
	if start == "" {
		start = "\x00"
	}
	i := sort.SearchStrings(h.keys, start)
	for ; i < len(h.keys); i++ {
		k := h.keys[i]
		if !record.InRange(key, end, k) {
			if end == "" || (end != "\x00" && k >= end) {
				break
			}
			continue
		}
		if kv := h.StateAt(k, rev); kv != nil {
			out = append(out, *kv)
		}
	}
	return out
}

// FirstAt is the index of the first event at revision >= rev (len(Events) if none).
func (h *History) FirstAt(rev int64) int {
	return sort.Search(len(h.Events), func(i int) bool { return h.Events[i].Rev() >= rev })
}

// Matching lists the indices of the events in [from, to] that the watch request matches, in
// etcd's order.
func (h *History) Matching(req *record.CreateRequest, from, to int64) []int {
	var out []int
	for i := h.FirstAt(from); i < len(h.Events) && h.Events[i].Rev() <= to; i++ {
		if req.Matches(&h.Events[i]) {
			out = append(out, i)
		}
	}
	return out
}
