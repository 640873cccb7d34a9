//! The host's counters and gauges (requests that went to etcd, upstream watches, watchers,
//! deliveries), updated from any task, and one prefix's core metrics at a moment
//! ([`CacheSample`]). The server renders them as Prometheus text (`server/prometheus.rs`).
//!
//! Kubernetes counterpart: `k8s.io/apiserver/pkg/storage/cacher/metrics/metrics.go` (the
//! series themselves); the gauges here are derived from owned state so they always come back
//! down (a relay task's guard, a session's watch count).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use cacher_core::Metrics;

/// Counters and gauges of the host, updated from any task.
#[derive(Debug, Default)]
pub struct HostMetrics {
    /// Requests to etcd on a client's behalf or for the cache, by kind.
    upstream: Mutex<BTreeMap<String, u64>>,
    /// Range requests by where they were answered.
    ranges_cache: AtomicU64,
    ranges_etcd: AtomicU64,
    /// Watches by where they were served.
    watches_cache: AtomicU64,
    watches_etcd: AtomicU64,
    /// Open upstream watch streams: the reflectors' and the pass-through watches'.
    upstream_watches: AtomicI64,
    /// Open client watches on the gRPC API.
    grpc_watchers: AtomicI64,
    /// Open client watch streams on the gRPC API.
    grpc_streams: AtomicI64,
    /// Events sent to gRPC watch clients.
    delivered: AtomicU64,
    /// Pass-through watches that rejoined the cache.
    rejoined: AtomicU64,
    /// Permission checks sent to etcd (auth on) and answered from the decision cache.
    auth_checks: AtomicU64,
    auth_cached: AtomicU64,
    /// Consistency checks by outcome (`match`, `mismatch`, `error`).
    consistency: Mutex<BTreeMap<String, u64>>,
}

impl HostMetrics {
    /// Counts one request sent to etcd, by kind (`range`, `txn`, `watch`, `quorum_read`, ...).
    pub fn count_upstream_request(&self, kind: &str) {
        if let Ok(mut m) = self.upstream.lock() {
            *m.entry(kind.to_owned()).or_default() += 1;
        }
    }

    /// Requests sent to etcd of one kind so far.
    pub fn upstream_requests(&self, kind: &str) -> u64 {
        self.upstream.lock().map(|m| m.get(kind).copied().unwrap_or(0)).unwrap_or(0)
    }

    /// A Range answered from the cache (`true`) or by etcd.
    pub fn count_range(&self, cached: bool) {
        if cached { &self.ranges_cache } else { &self.ranges_etcd }.fetch_add(1, Ordering::Relaxed);
    }

    /// A watch served from the cache (`true`) or passed through.
    pub fn count_watch(&self, cached: bool) {
        if cached { &self.watches_cache } else { &self.watches_etcd }
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Upstream watch streams opened (+1) or closed (-1).
    pub fn upstream_watch(&self, delta: i64) {
        self.upstream_watches.fetch_add(delta, Ordering::Relaxed);
    }

    /// Client watches opened (+1) or closed (-1).
    pub fn grpc_watcher(&self, delta: i64) {
        self.grpc_watchers.fetch_add(delta, Ordering::Relaxed);
    }

    /// Client streams opened (+1) or closed (-1).
    pub fn grpc_stream(&self, delta: i64) {
        self.grpc_streams.fetch_add(delta, Ordering::Relaxed);
    }

    /// Events sent to gRPC clients.
    pub fn add_delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }

    /// A pass-through watch moved back onto the cache.
    pub fn count_rejoin(&self) {
        self.rejoined.fetch_add(1, Ordering::Relaxed);
    }

    /// A permission check: sent to etcd, or answered from the decision cache.
    pub fn count_auth_check(&self, cached: bool) {
        if cached { &self.auth_cached } else { &self.auth_checks }.fetch_add(1, Ordering::Relaxed);
    }

    /// A consistency check's outcome (`match`, `mismatch`, `error`).
    pub fn count_consistency_check(&self, status: &str) {
        if let Ok(mut m) = self.consistency.lock() {
            *m.entry(status.to_owned()).or_default() += 1;
        }
    }

    /// Consistency checks of one outcome so far.
    pub fn consistency_checks(&self, status: &str) -> u64 {
        self.consistency.lock().map(|m| m.get(status).copied().unwrap_or(0)).unwrap_or(0)
    }

    /// Open upstream watch streams.
    pub fn upstream_watches(&self) -> i64 {
        self.upstream_watches.load(Ordering::Relaxed)
    }

    /// Open client watches.
    pub fn grpc_watchers(&self) -> i64 {
        self.grpc_watchers.load(Ordering::Relaxed)
    }

    /// Watches served from the cache and from etcd.
    pub fn watches(&self) -> (u64, u64) {
        (self.watches_cache.load(Ordering::Relaxed), self.watches_etcd.load(Ordering::Relaxed))
    }

    /// Ranges served from the cache and from etcd.
    pub fn ranges(&self) -> (u64, u64) {
        (self.ranges_cache.load(Ordering::Relaxed), self.ranges_etcd.load(Ordering::Relaxed))
    }
}

/// One prefix's core metrics at scrape time.
#[derive(Clone, Debug)]
pub struct CacheSample {
    /// The prefix.
    pub prefix: String,
    /// The core's counters.
    pub metrics: Metrics,
    /// Ring capacity.
    pub capacity: usize,
    /// The cache's revision.
    pub rv: u64,
    /// Open watchers.
    pub watchers: usize,
    /// Watchers that fell behind and replay from the ring.
    pub lagging: usize,
    /// The largest lag in events.
    pub max_lag: u64,
    /// Objects in the store.
    pub store_len: usize,
    /// Bytes of the events in the ring.
    pub ring_bytes: u64,
    /// Ready gate open.
    pub ready: bool,
}

/// The host counters at one moment (for a scrape).
#[derive(Clone, Debug, Default)]
#[allow(missing_docs)]
pub struct HostView {
    pub upstream: BTreeMap<String, u64>,
    pub ranges: (u64, u64),
    pub watches: (u64, u64),
    pub delivered: u64,
    pub rejoined: u64,
    pub auth: (u64, u64),
    pub upstream_watches: i64,
    pub grpc_watchers: i64,
    pub grpc_streams: i64,
    pub consistency: BTreeMap<String, u64>,
}

impl From<&HostMetrics> for HostView {
    fn from(h: &HostMetrics) -> Self {
        HostView {
            upstream: h.upstream.lock().map(|m| m.clone()).unwrap_or_default(),
            ranges: h.ranges(),
            watches: h.watches(),
            delivered: h.delivered.load(Ordering::Relaxed),
            rejoined: h.rejoined.load(Ordering::Relaxed),
            auth: (h.auth_checks.load(Ordering::Relaxed), h.auth_cached.load(Ordering::Relaxed)),
            upstream_watches: h.upstream_watches(),
            grpc_watchers: h.grpc_watchers(),
            grpc_streams: h.grpc_streams.load(Ordering::Relaxed),
            consistency: h.consistency.lock().map(|m| m.clone()).unwrap_or_default(),
        }
    }
}
