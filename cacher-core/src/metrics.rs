//! Counters and gauges, named after Kubernetes' watch-cache metrics.
//!
//! Kubernetes counterpart: `metrics/metrics.go`. The core only counts; hosts export (the etcd
//! host as Prometheus text with the Kubernetes names).

use alloc::collections::BTreeMap;
use alloc::string::String;

/// Buckets of `apiserver_watch_cache_read_wait_seconds`, in milliseconds.
pub const READ_WAIT_BUCKETS_MS: [u64; 13] =
    [5, 25, 50, 100, 200, 400, 600, 800, 1000, 1250, 1500, 2000, 3000];

/// The core's metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// `apiserver_watch_cache_events_received_total`.
    pub events_received: u64,
    /// `apiserver_watch_cache_events_dispatched_total` (storage progress notifies included).
    pub events_dispatched: u64,
    /// `apiserver_init_events_total`.
    pub init_events: u64,
    /// `apiserver_terminated_watchers_total`.
    pub terminated_watchers: u64,
    /// `watch_cache_capacity_increase_total`.
    pub capacity_increases: u64,
    /// `watch_cache_capacity_decrease_total`.
    pub capacity_decreases: u64,
    /// `apiserver_watch_cache_initializations_total`.
    pub initializations: u64,
    /// `apiserver_cache_list_total` by index label (`""` = none).
    pub cache_lists: BTreeMap<String, u64>,
    /// `apiserver_cache_list_fetched_objects_total` by index label.
    pub cache_list_fetched: BTreeMap<String, u64>,
    /// `apiserver_cache_list_returned_objects_total`.
    pub cache_list_returned: u64,
    /// `apiserver_watch_cache_read_wait_seconds`: counts per bucket of
    /// [`READ_WAIT_BUCKETS_MS`] (cumulative, Prometheus style), then +Inf.
    pub read_wait_buckets: [u64; 14],
    /// Sum of read waits, in milliseconds.
    pub read_wait_sum_ms: u64,
    /// `apiserver_watch_cache_consistent_read_total{success="true",fallback="false"}`.
    pub consistent_reads_ok: u64,
    /// `…{success="true",fallback="true"}`: consistent reads that timed out and went to storage.
    pub consistent_reads_fallback: u64,
    /// Lists the cache sent to storage.
    pub lists_delegated: u64,
    /// Gets the cache sent to storage.
    pub gets_delegated: u64,
    /// Watches the cache sent to storage.
    pub watches_delegated: u64,
    /// Watches started.
    pub watches_started: u64,
    /// Progress requests asked of storage.
    pub progress_requests: u64,
    /// Events delivered to watchers (bookmarks and initial events included).
    pub deliveries: u64,
    /// Bookmarks delivered to watchers.
    pub bookmarks_sent: u64,
    /// Watches that got 410 (at start, or falling out of the window).
    pub watch_expired: u64,
    /// Events dropped from the ring because it held more than `max_cache_bytes`.
    pub byte_evictions: u64,
}

impl Metrics {
    pub(crate) fn observe_read_wait(&mut self, ms: u64) {
        self.read_wait_sum_ms = self.read_wait_sum_ms.saturating_add(ms);
        for (i, b) in READ_WAIT_BUCKETS_MS.iter().enumerate() {
            if ms <= *b {
                self.read_wait_buckets[i] += 1;
            }
        }
        self.read_wait_buckets[13] += 1;
    }

    pub(crate) fn count_cache_list(&mut self, index: &str, fetched: usize, returned: usize) {
        *self.cache_lists.entry(String::from(index)).or_default() += 1;
        *self.cache_list_fetched.entry(String::from(index)).or_default() += fetched as u64;
        self.cache_list_returned += returned as u64;
    }
}
