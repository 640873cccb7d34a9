//! `/metrics`: the Kubernetes watch-cache metrics (spec section 8) per cached prefix, read
//! from each core at scrape time, and the host's own counters (requests that went to etcd,
//! upstream watches, watchers, lag), as Prometheus/OpenMetrics text via `prometheus-client`.
//!
//! Kubernetes counterpart: `k8s.io/apiserver/pkg/storage/cacher/metrics/metrics.go`; the label
//! `resource` is the cached prefix here, and every series also has `prefix`.

use std::collections::BTreeMap;

use cacher_core::{Metrics, READ_WAIT_BUCKETS_MS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::metrics::{CacheSample, HostMetrics, HostView};

/// One scrape: owned copies of the caches' samples and the host counters (a registered
/// collector must be `'static`).
#[derive(Debug)]
struct Scrape {
    caches: Vec<CacheSample>,
    host: HostView,
}

type Labels = Vec<(&'static str, String)>;

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, u64)],
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, i64)],
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.write(&mut encoder)
    }
}

impl Scrape {
    fn write(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let per = |f: &dyn Fn(&CacheSample) -> u64| -> Vec<(Labels, u64)> {
            self.caches
                .iter()
                .map(|c| (vec![("resource", c.prefix.clone()), ("prefix", c.prefix.clone())], f(c)))
                .collect()
        };
        let per_g = |f: &dyn Fn(&CacheSample) -> i64| -> Vec<(Labels, i64)> {
            self.caches
                .iter()
                .map(|c| (vec![("resource", c.prefix.clone()), ("prefix", c.prefix.clone())], f(c)))
                .collect()
        };
        let by_index = |f: &dyn Fn(&Metrics) -> &BTreeMap<String, u64>| -> Vec<(Labels, u64)> {
            let mut rows = Vec::new();
            for c in &self.caches {
                let map = f(&c.metrics);
                if map.is_empty() {
                    rows.push((
                        vec![
                            ("resource_prefix", c.prefix.clone()),
                            ("index", String::new()),
                            ("prefix", c.prefix.clone()),
                        ],
                        0,
                    ));
                }
                for (index, v) in map {
                    rows.push((
                        vec![
                            ("resource_prefix", c.prefix.clone()),
                            ("index", index.clone()),
                            ("prefix", c.prefix.clone()),
                        ],
                        *v,
                    ));
                }
            }
            rows
        };
        counter(
            enc,
            "apiserver_cache_list",
            "Number of LIST requests served from watch cache",
            &by_index(&|m| &m.cache_lists),
        )?;
        counter(
            enc,
            "apiserver_cache_list_fetched_objects",
            "Number of objects read from watch cache in the course of serving a LIST request",
            &by_index(&|m| &m.cache_list_fetched),
        )?;
        counter(
            enc,
            "apiserver_cache_list_returned_objects",
            "Number of objects returned for a LIST request from watch cache",
            &self
                .caches
                .iter()
                .map(|c| {
                    (
                        vec![("resource_prefix", c.prefix.clone()), ("prefix", c.prefix.clone())],
                        c.metrics.cache_list_returned,
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        counter(
            enc,
            "apiserver_init_events",
            "Counter of init events processed in watch cache broken by resource type",
            &per(&|c| c.metrics.init_events),
        )?;
        counter(
            enc,
            "apiserver_watch_cache_events_received",
            "Counter of events received in watch cache broken by resource type",
            &per(&|c| c.metrics.events_received),
        )?;
        counter(
            enc,
            "apiserver_watch_cache_events_dispatched",
            "Counter of events dispatched in watch cache broken by resource type",
            &per(&|c| c.metrics.events_dispatched),
        )?;
        counter(
            enc,
            "apiserver_terminated_watchers",
            "Counter of watchers closed due to unresponsiveness broken by resource type",
            &per(&|c| c.metrics.terminated_watchers),
        )?;
        counter(
            enc,
            "watch_cache_capacity_increase",
            "Total number of watch cache capacity increase events broken by resource type",
            &per(&|c| c.metrics.capacity_increases),
        )?;
        counter(
            enc,
            "watch_cache_capacity_decrease",
            "Total number of watch cache capacity decrease events broken by resource type",
            &per(&|c| c.metrics.capacity_decreases),
        )?;
        gauge(
            enc,
            "watch_cache_capacity",
            "Total capacity of watch cache broken by resource type",
            &per_g(&|c| c.capacity as i64),
        )?;
        counter(
            enc,
            "apiserver_watch_cache_initializations",
            "Counter of watch cache initializations broken by resource type",
            &per(&|c| c.metrics.initializations),
        )?;
        gauge(
            enc,
            "apiserver_watch_cache_resource_version",
            "Current resource version of watch cache broken by resource type",
            &per_g(&|c| c.rv as i64),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "apiserver_watch_cache_read_wait_seconds",
                "Histogram of time spent waiting for a watch cache to become fresh",
                None,
                MetricType::Histogram,
            )?;
            for c in &self.caches {
                let labels: Labels =
                    vec![("resource", c.prefix.clone()), ("prefix", c.prefix.clone())];
                let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(14);
                let mut prev = 0;
                for (i, ms) in READ_WAIT_BUCKETS_MS.iter().enumerate() {
                    let cum = c.metrics.read_wait_buckets[i];
                    buckets.push((*ms as f64 / 1000.0, cum.saturating_sub(prev)));
                    prev = cum;
                }
                let total = c.metrics.read_wait_buckets[13];
                buckets.push((f64::INFINITY, total.saturating_sub(prev)));
                m.encode_family(&labels)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                        c.metrics.read_wait_sum_ms as f64 / 1000.0,
                        total,
                        &buckets,
                        None,
                    )?;
            }
        }
        {
            let mut rows = Vec::new();
            for c in &self.caches {
                for (success, fallback, v) in [
                    ("true", "false", c.metrics.consistent_reads_ok),
                    ("true", "true", c.metrics.consistent_reads_fallback),
                ] {
                    rows.push((
                        vec![
                            ("resource", c.prefix.clone()),
                            ("success", success.to_owned()),
                            ("fallback", fallback.to_owned()),
                            ("prefix", c.prefix.clone()),
                        ],
                        v,
                    ));
                }
            }
            counter(
                enc,
                "apiserver_watch_cache_consistent_read",
                "Counter for consistent reads from cache",
                &rows,
            )?;
        }
        // The host's own series.
        gauge(
            enc,
            "watchcache_ready",
            "1 when the prefix's cache is ready (the ready gate is open)",
            &per_g(&|c| i64::from(c.ready)),
        )?;
        gauge(
            enc,
            "watchcache_store_objects",
            "Objects in the prefix's store",
            &per_g(&|c| c.store_len as i64),
        )?;
        gauge(
            enc,
            "watchcache_watchers",
            "Open watchers of the prefix's cache (gRPC and HTTP)",
            &per_g(&|c| c.watchers as i64),
        )?;
        gauge(
            enc,
            "watchcache_lagging_watchers",
            "Watchers that fell behind and are replayed from the ring buffer",
            &per_g(&|c| c.lagging as i64),
        )?;
        gauge(
            enc,
            "watchcache_watcher_max_lag_events",
            "The largest lag of a watcher behind the newest buffered event",
            &per_g(&|c| c.max_lag as i64),
        )?;
        counter(
            enc,
            "watchcache_watch_deliveries",
            "Events and bookmarks delivered to watchers by the core",
            &per(&|c| c.metrics.deliveries),
        )?;
        gauge(
            enc,
            "watchcache_ring_bytes",
            "Bytes of the events in the ring (as --max-cache-bytes counts them)",
            &per_g(&|c| c.ring_bytes as i64),
        )?;
        counter(
            enc,
            "watchcache_ring_byte_evictions",
            "Events dropped from the ring because it held more than --max-cache-bytes",
            &per(&|c| c.metrics.byte_evictions),
        )?;
        counter(
            enc,
            "watchcache_watch_expired",
            "Watches that got 410 (at start or falling out of the window)",
            &per(&|c| c.metrics.watch_expired),
        )?;
        let h = &self.host;
        let upstream: Vec<(Labels, u64)> =
            h.upstream.iter().map(|(k, v)| (vec![("kind", k.clone())], *v)).collect();
        counter(enc, "watchcache_upstream_requests", "Requests sent to etcd, by kind (pass-through calls, lists, quorum reads, permission checks)", &upstream)?;
        let src = |a: u64, b: u64, x: &str, y: &str| {
            vec![(vec![("source", x.to_owned())], a), (vec![("source", y.to_owned())], b)]
        };
        counter(
            enc,
            "watchcache_range_requests",
            "Range requests by where they were answered",
            &src(h.ranges.0, h.ranges.1, "cache", "etcd"),
        )?;
        counter(
            enc,
            "watchcache_watch_requests",
            "Watch creations by where they were served",
            &src(h.watches.0, h.watches.1, "cache", "etcd"),
        )?;
        gauge(
            enc,
            "watchcache_upstream_watches",
            "Open watch streams to etcd (reflectors and pass-through watches)",
            &[(vec![], h.upstream_watches)],
        )?;
        gauge(
            enc,
            "watchcache_grpc_watchers",
            "Open client watches on the etcd gRPC API",
            &[(vec![], h.grpc_watchers)],
        )?;
        gauge(
            enc,
            "watchcache_grpc_watch_streams",
            "Open client Watch streams on the etcd gRPC API",
            &[(vec![], h.grpc_streams)],
        )?;
        counter(
            enc,
            "watchcache_grpc_events_sent",
            "Events sent to gRPC watch clients from the cache",
            &[(vec![], h.delivered)],
        )?;
        counter(
            enc,
            "watchcache_passthrough_rejoins",
            "Pass-through watches that caught up and moved back onto the cache",
            &[(vec![], h.rejoined)],
        )?;
        counter(
            enc,
            "watchcache_auth_checks",
            "Permission checks for cached reads, by where the decision came from",
            &src(h.auth.0, h.auth.1, "etcd", "cache"),
        )?;
        let checks: Vec<(Labels, u64)> =
            h.consistency.iter().map(|(s, n)| (vec![("status", s.clone())], *n)).collect();
        counter(
            enc,
            "apiserver_storage_consistency_checks",
            "Consistency checks of the cache against etcd, by outcome (match, mismatch, error)",
            &checks,
        )?;
        Ok(())
    }
}

/// Renders a scrape in the OpenMetrics text format (which Prometheus reads).
pub fn render(caches: Vec<CacheSample>, host: &HostMetrics) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { caches, host: HostView::from(host) }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out = "# encoding failed\n".to_owned();
    }
    out
}
