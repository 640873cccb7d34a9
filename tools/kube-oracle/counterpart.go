package main

// What a Kubernetes cacher cannot be asked. A scenario that uses such a feature has no
// counterpart (the reason is reported); a request that Kubernetes cannot even express (an empty
// key, an etcd byte range) is skipped on its own, and the diff accepts that only where
// watchcache rejected it without effect.

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// knownFields are the scenario fields the oracle understands, per op ("config" for the config).
// watchcache refuses unknown fields, so a field missing here is one added to the format since:
// the oracle refuses the scenario rather than ignore what it means.
var knownFields = map[string][]string{
	"config": {"profile", "capacity", "lower_bound_capacity", "upper_bound_capacity", "dynamic_capacity",
		"event_fresh_ms", "bookmark_frequency_ms", "dispatch_tick_ms", "dispatch_tick_jitter",
		"freshness_timeout_ms", "progress_request_interval_ms", "budget_refill_ms_per_s", "budget_max_ms",
		"watch_chan_size", "index_field", "interval_buffer_size", "request_timeout_ms", "seed",
		"watch_list", "consistent_list_from_cache", "resilient_initialization", "list_from_cache_snapshot",
		"watch_from_storage_without_rv", "storage_supports_progress", "consistent_list_skip_timeout_fallback",
		"relist_delay_ms", "resource_prefix", "non_blocking_dispatch", "max_cache_bytes"},
	"replace":       {"rv", "objects"},
	"put":           {"rv", "object"},
	"delete":        {"rv", "key"},
	"txn":           {"rv", "ops"},
	"progress":      {"rv"},
	"storage_error": {"reason"},
	"etcd_rv":       {"rv"},
	"compact":       {"rv"},
	"watch": {"id", "key", "recursive", "range_end", "rv", "send_initial_events", "allow_bookmarks",
		"label_selector", "field_selector", "timeout_ms", "consume", "slow_policy", "queue_capacity"},
	"consume":     {"id", "max"},
	"credit":      {"id", "n"},
	"stop_watch":  {"id"},
	"list":        {"id", "key", "recursive", "rv", "rv_match", "limit", "continue", "label_selector", "field_selector"},
	"get":         {"id", "key", "rv"},
	"range":       {"id", "key", "range_end", "revision", "linearizable", "limit"},
	"stop_cacher": {},
	"advance":     {},
}

// unknownFields reports the first op or field the oracle does not know.
func unknownFields(sc *scenario) error {
	check := func(where string, m map[string]json.RawMessage, known []string, extra ...string) error {
		ok := map[string]bool{}
		for _, k := range append(known, extra...) {
			ok[k] = true
		}
		for k := range m {
			if !ok[k] {
				return fmt.Errorf("%s: field %q is unknown to the oracle; teach tools/kube-oracle what it means in Kubernetes (counterpart.go)", where, k)
			}
		}
		return nil
	}
	if err := check("config", sc.Config, knownFields["config"]); err != nil {
		return err
	}
	for i, st := range sc.Steps {
		known, ok := knownFields[st.Op]
		if !ok {
			return fmt.Errorf("steps[%d]: op %q is unknown to the oracle; teach tools/kube-oracle whether Kubernetes has a counterpart (counterpart.go)", i, st.Op)
		}
		if err := check(fmt.Sprintf("steps[%d] (%s)", i, st.Op), st.Raw, known, "at", "op"); err != nil {
			return err
		}
	}
	return nil
}

// noCounterpart returns why the scenario as a whole has no Kubernetes counterpart ("" if it
// has one) and the requests the oracle skips, with their reasons.
func noCounterpart(sc *scenario, cfg config, have map[string]bool) (string, map[string]string) {
	var why []string
	add := func(format string, a ...any) { why = append(why, fmt.Sprintf(format, a...)) }
	switch cfg.Profile {
	case "v1.30", "v1.34", "v1.37":
	default:
		add("profile %q has no oracle", cfg.Profile)
	}
	if cfg.TickMs != 1000 {
		add("dispatch_tick_ms %d: the dispatch loop's tick is 1 s in cacher.go (wait.Jitter(time.Second, 0.25))", cfg.TickMs)
	}
	if cfg.TickJitter > 0.25 {
		add("dispatch_tick_jitter %g: Kubernetes' jitter factor is 0.25 (draws above it are impossible)", cfg.TickJitter)
	}
	if cfg.FreshnessTimeoutMs != 3000 {
		add("freshness_timeout_ms %d: blockTimeout is the constant 3 s (watch_cache.go)", cfg.FreshnessTimeoutMs)
	}
	if cfg.ProgressIntervalMs != 100 {
		add("progress_request_interval_ms %d: progressRequestPeriod is the constant 100 ms (watch_progress.go)", cfg.ProgressIntervalMs)
	}
	if cfg.IntervalBufferSize != 100 {
		add("interval_buffer_size %d: the interval's bufferSize is the constant 100 (watch_cache_interval.go)", cfg.IntervalBufferSize)
	}
	if cfg.WatchChanSize != nil {
		add("watch_chan_size %d: Kubernetes sizes watch channels itself (suggestedWatchChannelSize)", *cfg.WatchChanSize)
	}
	if cfg.Profile == "v1.30" && cfg.EventFreshMs != 75000 {
		add("event_fresh_ms %d: eventFreshDuration is the constant 75 s in v1.30 (watch_cache.go)", cfg.EventFreshMs)
	}
	if cfg.Profile != "v1.30" && cfg.EventFreshMs < 75000 {
		add("event_fresh_ms %d: EventsHistoryWindow below 75 s is refused by NewCacherFromConfig", cfg.EventFreshMs)
	}
	if cfg.MaxCacheBytes != nil {
		add("max_cache_bytes %d: watchcache's bound on the ring's bytes; Kubernetes bounds it by event count only (kubernetes#142066)", *cfg.MaxCacheBytes)
	}
	if cfg.NonBlockingDispatch {
		add("non_blocking_dispatch: watchcache's improvement; Kubernetes' one dispatcher waits for every blocked watcher (cacher.go dispatchEvent, cache_watcher.go add)")
	}
	if cfg.RelistDelayMs != 1000 {
		add("relist_delay_ms %d: the pause before a relist is wait.Until's constant 1 s period (cacher.go)", cfg.RelistDelayMs)
	}
	if cfg.ResourcePrefix == "" && cfg.Profile == "v1.37" {
		// v1.37 refuses keys outside the resource prefix (storage.PrepareKey); the core checks
		// them only against a resource_prefix it is given.
		for _, st := range sc.Steps {
			k, recursive := strOr(st.Raw, "key", ""), boolOr(st.Raw, "recursive", true)
			switch st.Op {
			case "get":
				recursive = false
			case "watch", "list":
			default:
				continue
			}
			if recursive && !strings.HasSuffix(k, "/") {
				k += "/"
			}
			if k != "" && k != "/" && !strings.HasPrefix(k, scenarioPrefix(sc)) {
				add("%s %s: key %q is outside the resource prefix the oracle assumes (%q) and v1.37 checks it; set resource_prefix", st.Op, st.id(), k, scenarioPrefix(sc))
			}
		}
	}
	if cfg.Capacity > math.MaxInt32 || cfg.UpperBound > math.MaxInt32 {
		add("capacity too large")
	}
	if !cfg.StorageSupportsProgress && cfg.Profile == "v1.30" {
		add("storage_supports_progress false: v1.30 never checks etcd's RequestWatchProgress support")
	}
	for _, g := range scenarioGates {
		if ok := have[g.field]; !ok {
			want := cfg.Gates[g.field]
			if implied, known := impliedGate(cfg.Profile, g.field); !known || implied != want {
				add("%s %v: the feature gate %s does not exist in %s", g.field, want, g.gate, cfg.Profile)
			}
		}
	}
	skips := map[string]string{}
	for _, st := range sc.Steps {
		switch st.Op {
		case "range":
			add("op range: an etcd Range request; the Kubernetes cacher serves Kubernetes lists only")
		case "credit":
			add("op credit: per-watcher flow-control credit of the etcd gRPC API")
		case "watch":
			w := st.watch()
			if w.SlowPolicy == "lag" {
				add("watch %s: slow_policy lag (the etcd API's policy; Kubernetes closes slow watchers)", w.ID)
			}
			if w.QueueCapacity != nil && *w.QueueCapacity != uint64(2*chanSize(cfg, w)+1) {
				add("watch %s: queue_capacity %d (Kubernetes' queue is input %d + result %d + 1 in flight = %d)",
					w.ID, *w.QueueCapacity, chanSize(cfg, w), chanSize(cfg, w), 2*chanSize(cfg, w)+1)
			}
			if w.RangeEnd != nil {
				skips[w.ID] = "range_end: an etcd byte range, not a Kubernetes key"
			} else if w.Key == "" {
				skips[w.ID] = "empty key: a Kubernetes request always names a resource path"
			}
			if w.TimeoutMs != nil && *w.TimeoutMs%1000 != 0 {
				add("watch %s: timeout_ms %d is not whole seconds (timeoutSeconds)", w.ID, *w.TimeoutMs)
			}
		case "list":
			if l := st.list(); l.Key == "" {
				skips[l.ID] = "empty key: a Kubernetes request always names a resource path"
			}
		case "get":
			if strOr(st.Raw, "key", "") == "" {
				skips[st.id()] = "empty key: a Kubernetes request always names a resource path"
			}
		}
	}
	return strings.Join(dedup(why), "; "), skips
}

// impliedGate is the behaviour of a version in which the gate does not exist: not there yet in
// v1.30, GA and removed by v1.37 (k8s.io/apiserver pkg/features/kube_features.go).
func impliedGate(profile, field string) (bool, bool) {
	switch profile {
	case "v1.30":
		switch field {
		case "resilient_initialization", "list_from_cache_snapshot", "consistent_list_skip_timeout_fallback":
			return false, true
		}
	case "v1.34":
		switch field {
		case "consistent_list_skip_timeout_fallback":
			return false, true
		}
	case "v1.37":
		switch field {
		case "consistent_list_from_cache", "resilient_initialization":
			return true, true
		case "watch_from_storage_without_rv":
			return false, true
		}
	}
	return false, false
}

// chanSize is suggestedWatchChannelSize for the configured initial capacity.
func chanSize(cfg config, w watchSpec) int {
	size := int(math.Ceil(float64(cfg.Capacity) / (float64(cfg.EventFreshMs) / 1000)))
	max := 100
	if cfg.IndexField != "" {
		max = 1000
		if strings.Contains(w.FieldSelector, cfg.IndexField+"=") && !strings.Contains(w.FieldSelector, cfg.IndexField+"!=") {
			max = 10
		}
	}
	if size < 10 {
		size = 10
	}
	if size > max {
		size = max
	}
	return size
}

func dedup(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
