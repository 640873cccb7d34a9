package main

// The scenario format (../shared/DESIGN.md "Scenario format", README "Scenarios",
// cacher-core/src/replay.rs): parsed leniently, since the core validates scenarios itself; the
// oracle only has to understand well-formed ones.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

type scenario struct {
	Name   string
	Config map[string]json.RawMessage
	Steps  []step
}

type step struct {
	At  uint64
	Op  string
	Raw map[string]json.RawMessage
}

type scObject struct {
	Key    string
	Value  *string
	RV     uint64
	Labels map[string]string
	Fields map[string]string
}

type watchSpec struct {
	ID                string
	Key               string
	Recursive         bool
	RangeEnd          *string
	RV                string
	SendInitialEvents *bool
	AllowBookmarks    bool
	LabelSelector     string
	FieldSelector     string
	TimeoutMs         *uint64
	Manual            bool
	SlowPolicy        string
	QueueCapacity     *uint64
}

type listSpec struct {
	ID            string
	Key           string
	Recursive     bool
	RV            string
	RVMatch       string
	Limit         int64
	Continue      string
	LabelSelector string
	FieldSelector string
}

func loadScenario(path string) (*scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var top struct {
		Name   string                     `json:"name"`
		Config map[string]json.RawMessage `json:"config"`
		Steps  []map[string]json.RawMessage
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	sc := &scenario{Name: top.Name, Config: top.Config}
	if sc.Config == nil {
		sc.Config = map[string]json.RawMessage{}
	}
	for i, raw := range top.Steps {
		at, err := u64Field(raw, "at")
		if err != nil || at == nil {
			return nil, fmt.Errorf("steps[%d].at: missing or not a number", i)
		}
		var op string
		if err := json.Unmarshal(raw["op"], &op); err != nil {
			return nil, fmt.Errorf("steps[%d].op: %v", i, err)
		}
		sc.Steps = append(sc.Steps, step{At: *at, Op: op, Raw: raw})
	}
	return sc, nil
}

func isNull(m json.RawMessage) bool { return len(m) == 0 || string(m) == "null" }

func u64Field(m map[string]json.RawMessage, k string) (*uint64, error) {
	raw, ok := m[k]
	if !ok || isNull(raw) {
		return nil, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		var s string
		if err2 := json.Unmarshal(raw, &s); err2 != nil {
			return nil, err
		}
		n = json.Number(s)
	}
	v, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func f64Field(m map[string]json.RawMessage, k string) *float64 {
	raw, ok := m[k]
	if !ok || isNull(raw) {
		return nil
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil {
		return nil
	}
	return &f
}

func strField(m map[string]json.RawMessage, k string) *string {
	raw, ok := m[k]
	if !ok || isNull(raw) {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return nil
	}
	return &s
}

func boolField(m map[string]json.RawMessage, k string) *bool {
	raw, ok := m[k]
	if !ok || isNull(raw) {
		return nil
	}
	var b bool
	if json.Unmarshal(raw, &b) != nil {
		return nil
	}
	return &b
}

func strOr(m map[string]json.RawMessage, k, def string) string {
	if s := strField(m, k); s != nil {
		return *s
	}
	return def
}

func boolOr(m map[string]json.RawMessage, k string, def bool) bool {
	if b := boolField(m, k); b != nil {
		return *b
	}
	return def
}

func stringMap(m map[string]json.RawMessage, k string) map[string]string {
	raw, ok := m[k]
	if !ok || isNull(raw) {
		return nil
	}
	var out map[string]string
	_ = json.Unmarshal(raw, &out)
	return out
}

func parseObject(raw json.RawMessage, defaultRV uint64) (scObject, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return scObject{}, err
	}
	o := scObject{Key: strOr(m, "key", ""), Value: strField(m, "value"), RV: defaultRV,
		Labels: stringMap(m, "labels"), Fields: stringMap(m, "fields")}
	if rv, err := u64Field(m, "rv"); err != nil {
		return o, err
	} else if rv != nil {
		o.RV = *rv
	}
	return o, nil
}

func (s step) objects(defaultRV uint64) ([]scObject, error) {
	var raws []json.RawMessage
	if r, ok := s.Raw["objects"]; ok && !isNull(r) {
		if err := json.Unmarshal(r, &raws); err != nil {
			return nil, err
		}
	}
	var out []scObject
	for _, r := range raws {
		o, err := parseObject(r, defaultRV)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func (s step) rv() uint64 {
	v, _ := u64Field(s.Raw, "rv")
	if v == nil {
		return 0
	}
	return *v
}

func (s step) id() string { return strOr(s.Raw, "id", "") }

func (s step) watch() watchSpec {
	w := watchSpec{
		ID:                s.id(),
		Key:               strOr(s.Raw, "key", ""),
		Recursive:         boolOr(s.Raw, "recursive", true),
		RangeEnd:          strField(s.Raw, "range_end"),
		RV:                strOr(s.Raw, "rv", ""),
		SendInitialEvents: boolField(s.Raw, "send_initial_events"),
		AllowBookmarks:    boolOr(s.Raw, "allow_bookmarks", false),
		LabelSelector:     strOr(s.Raw, "label_selector", ""),
		FieldSelector:     strOr(s.Raw, "field_selector", ""),
		Manual:            strOr(s.Raw, "consume", "auto") == "manual",
		SlowPolicy:        strOr(s.Raw, "slow_policy", "terminate"),
	}
	w.TimeoutMs, _ = u64Field(s.Raw, "timeout_ms")
	w.QueueCapacity, _ = u64Field(s.Raw, "queue_capacity")
	return w
}

func (s step) list() listSpec {
	l := listSpec{
		ID:            s.id(),
		Key:           strOr(s.Raw, "key", ""),
		Recursive:     boolOr(s.Raw, "recursive", true),
		RV:            strOr(s.Raw, "rv", ""),
		RVMatch:       strOr(s.Raw, "rv_match", ""),
		Continue:      strOr(s.Raw, "continue", ""),
		LabelSelector: strOr(s.Raw, "label_selector", ""),
		FieldSelector: strOr(s.Raw, "field_selector", ""),
	}
	if n, _ := u64Field(s.Raw, "limit"); n != nil && *n <= math.MaxInt64 {
		l.Limit = int64(*n)
	}
	return l
}

// config is the scenario's config with the profile's defaults filled in (cacher-core's
// Config::for_profile), as the knobs the oracle can set on a Kubernetes cacher.
type config struct {
	Profile                 string
	Capacity                int
	LowerBound, UpperBound  int
	Dynamic                 bool
	EventFreshMs            uint64
	BookmarkFrequencyMs     uint64
	TickMs                  uint64
	TickJitter              float64
	FreshnessTimeoutMs      uint64
	ProgressIntervalMs      uint64
	BudgetRefillMsPerS      uint64
	BudgetMaxMs             uint64
	WatchChanSize           *uint64
	IndexField              string
	IntervalBufferSize      uint64
	RequestTimeoutMs        uint64
	Seed                    uint64
	Gates                   map[string]bool // scenario gate name -> value
	StorageSupportsProgress bool
	RelistDelayMs           uint64
	NonBlockingDispatch     bool
	MaxCacheBytes           *uint64
	ResourcePrefix          string // "": the scenario's first path segment (scenarioPrefix)
}

// scenarioGates are the config's feature-gate switches, with the Kubernetes gate each presets.
var scenarioGates = []struct{ field, gate string }{
	{"watch_list", "WatchList"},
	{"consistent_list_from_cache", "ConsistentListFromCache"},
	{"resilient_initialization", "ResilientWatchCacheInitialization"},
	{"list_from_cache_snapshot", "ListFromCacheSnapshot"},
	{"watch_from_storage_without_rv", "WatchFromStorageWithoutResourceVersion"},
	{"consistent_list_skip_timeout_fallback", "ConsistentListFromCacheSkipTimeoutFallback"},
}

func parseConfig(c map[string]json.RawMessage, profileOverride string) (config, error) {
	cfg := config{Profile: strOr(c, "profile", "v1.30")}
	if !strings.HasPrefix(cfg.Profile, "v") {
		cfg.Profile = "v" + cfg.Profile
	}
	if profileOverride != "" {
		cfg.Profile = profileOverride
	}
	later := cfg.Profile != "v1.30"
	cfg.Capacity, cfg.LowerBound, cfg.UpperBound, cfg.Dynamic = 100, 100, 100*1024, true
	cfg.EventFreshMs, cfg.BookmarkFrequencyMs, cfg.TickMs, cfg.TickJitter = 75000, 60000, 1000, 0.25
	cfg.FreshnessTimeoutMs, cfg.ProgressIntervalMs = 3000, 100
	cfg.BudgetRefillMsPerS, cfg.BudgetMaxMs = 50, 100
	cfg.IntervalBufferSize, cfg.RequestTimeoutMs = 100, 60000
	cfg.StorageSupportsProgress = true
	cfg.Gates = map[string]bool{
		"watch_list": later, "consistent_list_from_cache": later, "resilient_initialization": later,
		"list_from_cache_snapshot": later, "watch_from_storage_without_rv": false,
		"consistent_list_skip_timeout_fallback": false,
	}
	cfg.RelistDelayMs = 1000
	num := func(k string, dst *uint64) error {
		v, err := u64Field(c, k)
		if err != nil {
			return fmt.Errorf("config.%s: %v", k, err)
		}
		if v != nil {
			*dst = *v
		}
		return nil
	}
	var capacity, lower, upper uint64 = 100, 100, 100 * 1024
	for k, dst := range map[string]*uint64{
		"capacity": &capacity, "lower_bound_capacity": &lower, "upper_bound_capacity": &upper,
		"event_fresh_ms": &cfg.EventFreshMs, "bookmark_frequency_ms": &cfg.BookmarkFrequencyMs,
		"dispatch_tick_ms": &cfg.TickMs, "freshness_timeout_ms": &cfg.FreshnessTimeoutMs,
		"progress_request_interval_ms": &cfg.ProgressIntervalMs,
		"budget_refill_ms_per_s":       &cfg.BudgetRefillMsPerS, "budget_max_ms": &cfg.BudgetMaxMs,
		"interval_buffer_size": &cfg.IntervalBufferSize, "request_timeout_ms": &cfg.RequestTimeoutMs,
		"seed": &cfg.Seed, "relist_delay_ms": &cfg.RelistDelayMs,
	} {
		if err := num(k, dst); err != nil {
			return cfg, err
		}
	}
	cfg.Capacity, cfg.LowerBound, cfg.UpperBound = int(capacity), int(lower), int(upper)
	cfg.Dynamic = boolOr(c, "dynamic_capacity", true)
	if j := f64Field(c, "dispatch_tick_jitter"); j != nil {
		cfg.TickJitter = *j
	}
	cfg.WatchChanSize, _ = u64Field(c, "watch_chan_size")
	cfg.IndexField = strOr(c, "index_field", "")
	for _, g := range scenarioGates {
		if b := boolField(c, g.field); b != nil {
			cfg.Gates[g.field] = *b
		}
	}
	cfg.StorageSupportsProgress = boolOr(c, "storage_supports_progress", true)
	cfg.ResourcePrefix = strOr(c, "resource_prefix", "")
	cfg.NonBlockingDispatch = boolOr(c, "non_blocking_dispatch", false)
	cfg.MaxCacheBytes, _ = u64Field(c, "max_cache_bytes")
	return cfg, nil
}

// splitmix64 is cacher-core's Rng (rng.rs): the draws of the dispatch tick's jitter.
type splitmix64 struct{ s uint64 }

func (r *splitmix64) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// upTo is a uniform integer in 0..=max, as Rng::up_to.
func (r *splitmix64) upTo(max uint64) uint64 {
	if max == math.MaxUint64 {
		return r.next()
	}
	return r.next() % (max + 1)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// scenarioPrefix is "/" + the first segment of the first key the scenario names.
func scenarioPrefix(sc *scenario) string {
	for _, st := range sc.Steps {
		keys := []string{strOr(st.Raw, "key", "")}
		if objs, err := st.objects(0); err == nil {
			for _, o := range objs {
				keys = append(keys, o.Key)
			}
		}
		if raw, ok := st.Raw["object"]; ok {
			if o, err := parseObject(raw, 0); err == nil {
				keys = append(keys, o.Key)
			}
		}
		for _, k := range keys {
			if seg := strings.SplitN(strings.TrimPrefix(k, "/"), "/", 2)[0]; seg != "" {
				return "/" + seg
			}
		}
	}
	return "/pods"
}
