//! Configuration: every Kubernetes constant as a field with its Kubernetes default, and the
//! behaviour profiles (v1.30, v1.34, v1.37) as presets of the feature gates.
//!
//! Kubernetes counterparts: the constants of `watch_cache.go`, `cacher.go`, `time_budget.go`,
//! `watch_progress.go`, `watch_cache_interval.go`, and the feature gates of
//! `apiserver/pkg/features/kube_features.go` that change the cacher between versions.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;

/// Which Kubernetes version's behaviour to follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Kubernetes v1.30.3 (the reference version).
    #[default]
    V1_30,
    /// Kubernetes v1.34 (k8s.io/apiserver v0.34): resilient initialisation (429 +
    /// Retry-After), consistent lists from the cache, limit/continue from the cache, Exact reads
    /// from snapshots, the initial-events-end bookmark right after the initial events.
    V1_34,
    /// Kubernetes v1.37 (k8s.io/apiserver v0.37): as v1.34, with keys checked against the
    /// resource prefix (`storage.PrepareKey`), the gates that went GA gone
    /// (`ConsistentListFromCache`, `ResilientWatchCacheInitialization` always on,
    /// `WatchFromStorageWithoutResourceVersion` gone: watches are never handed to storage),
    /// the new `ConsistentListFromCacheSkipTimeoutFallback` option, and events dated when
    /// storage decoded them.
    V1_37,
}

impl Profile {
    /// Every profile, oldest first.
    pub const ALL: [Profile; 3] = [Profile::V1_30, Profile::V1_34, Profile::V1_37];

    /// `"v1.30"`, `"v1.34"` or `"v1.37"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Profile::V1_30 => "v1.30",
            Profile::V1_34 => "v1.34",
            Profile::V1_37 => "v1.37",
        }
    }

    /// Parses `"v1.30"`/`"1.30"`, `"v1.34"`/`"1.34"` or `"v1.37"`/`"1.37"`.
    pub fn parse(s: &str) -> Result<Profile, ConfigError> {
        match s.trim_start_matches('v') {
            "1.30" => Ok(Profile::V1_30),
            "1.34" => Ok(Profile::V1_34),
            "1.37" => Ok(Profile::V1_37),
            _ => Err(ConfigError::new(
                "profile",
                format!("unknown profile {s:?}; expected \"v1.30\", \"v1.34\" or \"v1.37\""),
            )),
        }
    }

    /// True for behaviour introduced after 1.30 (the 1.31–1.34 changes that are not gated),
    /// which every later profile keeps.
    pub(crate) const fn is_v1_34(self) -> bool {
        matches!(self, Profile::V1_34 | Profile::V1_37)
    }

    /// True for behaviour introduced after 1.34.
    pub(crate) const fn is_v1_37(self) -> bool {
        matches!(self, Profile::V1_37)
    }
}

/// The cacher's configuration. Build it with [`Config::for_profile`] and change fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The behaviour profile the gates below were preset from.
    pub profile: Profile,
    /// Initial ring-buffer capacity (`defaultLowerBoundCapacity`, 100).
    pub capacity: usize,
    /// Lower bound for dynamic resizing (100).
    pub lower_bound_capacity: usize,
    /// Upper bound for dynamic resizing (`defaultUpperBoundCapacity`, 102400).
    pub upper_bound_capacity: usize,
    /// Resize the ring buffer with load (always on in Kubernetes).
    pub dynamic_capacity: bool,
    /// `eventFreshDuration` (75 s).
    pub event_fresh_ms: u64,
    /// `defaultBookmarkFrequency` (1 min).
    pub bookmark_frequency_ms: u64,
    /// The dispatch loop's bookmark tick (1 s).
    pub dispatch_tick_ms: u64,
    /// Jitter factor of the tick (`wait.Jitter(1s, 0.25)`: 1.0–1.25 s), drawn from `seed`.
    pub dispatch_tick_jitter: f64,
    /// `blockTimeout` of freshness waits (3 s).
    pub freshness_timeout_ms: u64,
    /// `progressRequestPeriod` while readers wait for freshness (100 ms).
    pub progress_request_interval_ms: u64,
    /// `refreshPerSecond` of the dispatch time budget (50 ms per second).
    pub budget_refill_ms_per_s: u64,
    /// `maxBudget` (100 ms).
    pub budget_max_ms: u64,
    /// Per-watcher channel size; `None` = `suggestedWatchChannelSize`.
    pub watch_chan_size: Option<usize>,
    /// The trigger index field, e.g. `spec.nodeName` (`IndexerFuncs`).
    pub index_field: Option<Box<str>>,
    /// `watchCacheInterval` buffer size (100).
    pub interval_buffer_size: usize,
    /// How long a parked list or get waits for the cache to become ready before 503
    /// (the apiserver's default `--request-timeout`, 60 s).
    pub request_timeout_ms: u64,
    /// Seed of the only randomness, the tick jitter.
    pub seed: u64,
    /// Gate `WatchList` (sendInitialEvents honoured). v1.30: off; v1.34: on.
    pub watch_list: bool,
    /// Gate `ConsistentListFromCache`. v1.30: off; v1.34: on.
    pub consistent_list_from_cache: bool,
    /// Gate `ResilientWatchCacheInitialization` (429 instead of blocking). v1.30: off; v1.34: on.
    pub resilient_initialization: bool,
    /// Gate `ListFromCacheSnapshot` (Exact and continue reads from snapshots). v1.30: off;
    /// v1.34: on.
    pub list_from_cache_snapshot: bool,
    /// Gate `WatchFromStorageWithoutResourceVersion` (off in both).
    pub watch_from_storage_without_rv: bool,
    /// Whether storage supports `RequestWatchProgress` (etcd ≥ 3.4.31 / 3.5.13).
    pub storage_supports_progress: bool,
    /// Gate `ConsistentListFromCacheSkipTimeoutFallback` (v1.37, alpha, off): a consistent
    /// read that times out waiting for the cache is answered 429 "Timeout: Too large resource
    /// version" with Retry-After 1 instead of being sent to storage.
    pub consistent_list_skip_timeout_fallback: bool,
    /// An improvement over Kubernetes, off in every profile: a watcher whose queue is full does
    /// not stall the dispatch of later events to every other watcher. In Kubernetes
    /// (`cacher.go` `dispatchEvent`, `cache_watcher.go` `add`) the one dispatch goroutine waits
    /// for a blocked watcher, up to the time budget, before it dispatches anything else
    /// (kubernetes#141450); with this on, the event waits for that watcher alone, within the
    /// same budget, and later events go on to the others at once.
    pub non_blocking_dispatch: bool,
    /// How long the cacher waits after its storage watch broke before it ends every watch and
    /// relists (`wait.Until(startCaching, 1s)` in `cacher.go`: 1 s in every profile). Until
    /// then the gate is closed and the old watches stay open.
    pub relist_delay_ms: u64,
    /// Most bytes of events the ring holds (an extension, not Kubernetes; cf.
    /// kubernetes#142066): beyond it the window shrinks from the front, whatever the event
    /// capacity, and watches from revisions it no longer holds get 410. An event counts its key,
    /// its new and previous values and a fixed overhead; the store's snapshots share those
    /// objects, so this bounds them too. `None`: only the capacity bounds the ring.
    pub max_cache_bytes: Option<u64>,
    /// The cacher's resource prefix (`Config.ResourcePrefix`, e.g. `/pods`): v1.37 refuses keys
    /// outside it (`storage.PrepareKey`), and a 404 names the resource after its last segment.
    /// `None`: no prefix check; a 404 names the key's first segment.
    pub resource_prefix: Option<Box<str>>,
}

impl Default for Config {
    fn default() -> Config {
        Config::for_profile(Profile::V1_30)
    }
}

impl Config {
    /// The Kubernetes defaults of a version.
    pub fn for_profile(profile: Profile) -> Config {
        let later = profile.is_v1_34();
        Config {
            profile,
            capacity: 100,
            lower_bound_capacity: 100,
            upper_bound_capacity: 100 * 1024,
            dynamic_capacity: true,
            event_fresh_ms: 75_000,
            bookmark_frequency_ms: 60_000,
            dispatch_tick_ms: 1000,
            dispatch_tick_jitter: 0.25,
            freshness_timeout_ms: 3000,
            progress_request_interval_ms: 100,
            budget_refill_ms_per_s: 50,
            budget_max_ms: 100,
            watch_chan_size: None,
            index_field: None,
            interval_buffer_size: 100,
            request_timeout_ms: 60_000,
            seed: 0,
            watch_list: later,
            consistent_list_from_cache: later,
            resilient_initialization: later,
            list_from_cache_snapshot: later,
            watch_from_storage_without_rv: false,
            storage_supports_progress: true,
            consistent_list_skip_timeout_fallback: false,
            non_blocking_dispatch: false,
            relist_delay_ms: 1000,
            resource_prefix: None,
            max_cache_bytes: None,
        }
    }

    /// Checks the fields; the error names the offending one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::new("capacity", "must be at least 1"));
        }
        if self.lower_bound_capacity == 0 {
            return Err(ConfigError::new("lower_bound_capacity", "must be at least 1"));
        }
        if self.upper_bound_capacity < self.lower_bound_capacity {
            return Err(ConfigError::new(
                "upper_bound_capacity",
                format!(
                    "must be at least lower_bound_capacity ({}), got {}",
                    self.lower_bound_capacity, self.upper_bound_capacity
                ),
            ));
        }
        const MAX_CAPACITY: usize = 1 << 26;
        for (name, v) in
            [("capacity", self.capacity), ("upper_bound_capacity", self.upper_bound_capacity)]
        {
            if v > MAX_CAPACITY {
                return Err(ConfigError::new(
                    name,
                    format!("must be at most {MAX_CAPACITY}, got {v}"),
                ));
            }
        }
        if self.dispatch_tick_ms == 0 {
            return Err(ConfigError::new("dispatch_tick_ms", "must be at least 1"));
        }
        if !(0.0..=10.0).contains(&self.dispatch_tick_jitter) || self.dispatch_tick_jitter.is_nan()
        {
            return Err(ConfigError::new("dispatch_tick_jitter", "must be between 0 and 10"));
        }
        if self.progress_request_interval_ms == 0 {
            return Err(ConfigError::new("progress_request_interval_ms", "must be at least 1"));
        }
        if self.bookmark_frequency_ms == 0 {
            return Err(ConfigError::new("bookmark_frequency_ms", "must be at least 1"));
        }
        if self.relist_delay_ms > 3_600_000 {
            return Err(ConfigError::new("relist_delay_ms", "must be at most 3600000 (1 h)"));
        }
        if self.interval_buffer_size == 0 {
            return Err(ConfigError::new("interval_buffer_size", "must be at least 1"));
        }
        if self.watch_chan_size == Some(0) {
            return Err(ConfigError::new("watch_chan_size", "must be at least 1 (or null)"));
        }
        if let Some(f) = &self.index_field {
            if f.is_empty() {
                return Err(ConfigError::new("index_field", "must not be empty (or null)"));
            }
        }
        if let Some(p) = &self.resource_prefix {
            // NewCacherFromConfig's checks.
            if !p.starts_with('/') || &**p == "/" {
                return Err(ConfigError::new(
                    "resource_prefix",
                    "must start with '/' and not be \"/\" (or be null)",
                ));
            }
        }
        if self.profile.is_v1_37() {
            // The gates that went GA are gone in v1.37: their behaviour is fixed.
            for (field, on, gate) in [
                ("consistent_list_from_cache", self.consistent_list_from_cache, true),
                ("resilient_initialization", self.resilient_initialization, true),
                ("watch_from_storage_without_rv", self.watch_from_storage_without_rv, false),
            ] {
                if on != gate {
                    return Err(ConfigError::new(
                        field,
                        format!(
                            "v1.37 has no such switch: the feature gate is gone and its behaviour is always {}",
                            if gate { "on" } else { "off" }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `suggestedWatchChannelSize`: ceil(capacity/75) clamped to [10, max], with max 10 for a
    /// watch that uses the trigger, 1000 for one that does not, 100 without a trigger.
    pub fn watch_chan_size_for(&self, capacity: usize, uses_trigger: bool) -> usize {
        if let Some(n) = self.watch_chan_size {
            return n;
        }
        let max = match (self.index_field.is_some(), uses_trigger) {
            (true, true) => 10,
            (true, false) => 1000,
            (false, _) => 100,
        };
        capacity.div_ceil(75).clamp(10, max)
    }
}

/// A configuration field with a bad value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field's name, as in the scenario format.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError { field: String::from(field), message: message.into() }
    }
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "config.{}: {}", self.field, self.message)
    }
}

impl core::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggested_watch_channel_size_table() {
        // TestSuggestedWatchChannelSize: (capacity, with trigger used, trigger unused, no trigger).
        let with_index = Config { index_field: Some("spec.nodeName".into()), ..Config::default() };
        let without = Config::default();
        for (cap, used, unused, none) in [
            (100, 10, 10, 10),
            (750, 10, 10, 10),
            (7500, 10, 100, 100),
            (75000, 10, 1000, 100),
            (750000, 10, 1000, 100),
        ] {
            assert_eq!(with_index.watch_chan_size_for(cap, true), used, "{cap}");
            assert_eq!(with_index.watch_chan_size_for(cap, false), unused, "{cap}");
            assert_eq!(without.watch_chan_size_for(cap, false), none, "{cap}");
        }
    }

    #[test]
    fn profiles_preset_gates() {
        let a = Config::for_profile(Profile::V1_30);
        assert!(!a.watch_list && !a.consistent_list_from_cache && !a.resilient_initialization);
        let b = Config::for_profile(Profile::V1_34);
        assert!(b.watch_list && b.consistent_list_from_cache && b.resilient_initialization);
        assert!(b.list_from_cache_snapshot);
        assert_eq!(Profile::parse("v1.34").unwrap(), Profile::V1_34);
        assert_eq!(Profile::parse("1.31").unwrap_err().field, "profile");
        let c = Config::for_profile(Profile::V1_37);
        assert!(c.watch_list && c.consistent_list_from_cache && c.resilient_initialization);
        assert!(!c.watch_from_storage_without_rv && !c.consistent_list_skip_timeout_fallback);
        assert_eq!(Profile::parse("v1.37").unwrap(), Profile::V1_37);
        for p in Profile::ALL {
            let c = Config::for_profile(p);
            assert!(!c.non_blocking_dispatch && c.relist_delay_ms == 1000, "{p:?}");
            assert_eq!(Profile::parse(p.as_str()).unwrap(), p);
        }
    }

    #[test]
    fn v1_37_has_no_switch_for_the_gates_that_went_ga() {
        let c = Config { resilient_initialization: false, ..Config::for_profile(Profile::V1_37) };
        assert_eq!(c.validate().unwrap_err().field, "resilient_initialization");
        let c =
            Config { watch_from_storage_without_rv: true, ..Config::for_profile(Profile::V1_37) };
        assert_eq!(c.validate().unwrap_err().field, "watch_from_storage_without_rv");
        let c = Config { resource_prefix: Some("pods".into()), ..Config::default() };
        assert_eq!(c.validate().unwrap_err().field, "resource_prefix");
    }

    #[test]
    fn validation_names_the_field() {
        let c = Config { capacity: 0, ..Config::default() };
        assert_eq!(c.validate().unwrap_err().field, "capacity");
        let c = Config { upper_bound_capacity: 5, ..Config::default() };
        assert_eq!(c.validate().unwrap_err().field, "upper_bound_capacity");
    }
}
