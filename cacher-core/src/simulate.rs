//! Workload simulation: hours of etcd writes, watchers, disconnects, compactions and cache
//! restarts, run in seconds against the real [`Cacher`].
//!
//! This module owns the world around the cacher, as a deterministic discrete-event simulation
//! with explicit time: etcd (a revision counter, keys, periodic compaction, paginated lists and
//! what they cost), the cacher's own reflector (`storage/cacher.go:<prefix>`: the list at start
//! and after an outage, progress notifies, compaction notices), and many client-go reflectors
//! watching through the cache (`tools/cache/reflector.go`: watch with bookmarks from the last
//! resourceVersion seen, re-watch from it after a disconnect, relist after a 410). Kubernetes
//! counterpart: a kube-apiserver cacher driven by client-go informers; there is no such file in
//! `pkg/storage/cacher/`, whose tests drive the cacher the same way with a fake clock.
//!
//! It is a driver, not a model: every event, bookmark, 410, termination and relist in the report
//! is what the real [`Cacher`] did, through its public API only (`handle_*`, `start_watch`,
//! `consume`, `stop_watch`, `list`, `poll_output`, `poll_timeout`/`handle_timeout`). It must
//! never reach into the cacher's internals, read a clock, or draw randomness other than its own
//! seeded generator (SplitMix64 from the workload's seed): the same workload gives the same
//! report, byte for byte, everywhere.
//!
//! What the simulation assumes (the model around the cacher, not the cacher):
//! - etcd holds `writes.keys` objects, created at revisions 1..=keys before time 0. A write
//!   picks a key uniformly; it updates it (or creates it again), or deletes it with probability
//!   `writes.delete_fraction`. Writes arrive as a Poisson process whose rate `bursts` override.
//!   The cache sees each write at once (no etcd→cache latency), except during an outage.
//! - Watchers watch the whole resource (`/registry/pods/`) with `allowWatchBookmarks` as
//!   asked, from the RV their initial list returned (a list at resourceVersion `0`, served by
//!   the cache, as client-go's first list is). A watcher selects a share of the objects with a
//!   real label selector on the `group` label each object carries (see [`Workload`]).
//! - A watcher that keeps up reads everything at once; one with `consume_rate_per_s` reads its
//!   queue every `consume_tick_ms` at that rate, so its events wait and it can be closed as
//!   unresponsive.
//! - When the server ends a watch (unresponsive, reinitialising, timeout) the watcher re-watches
//!   at once from the last RV it saw (an event or a bookmark: the cacher's `last_rv`); after a
//!   disconnect of its own it waits `reconnect_delay_s` first — exactly that long with
//!   `watchers.backoff: "none"`, or until the first try of client-go's backoff (0.8 s doubling
//!   to 30 s, jittered ×[1, 2), reset after 2 minutes: [`Backoff::ClientGo`]) at or after it.
//!   A rejected watch (429 while the cache initialises, v1.34) is retried after its
//!   Retry-After.
//! - After a 410 a watcher relists (at once, or one backoff wait later with client-go's
//!   backoff). With `watchers.relist_from: "etcd"` (the default) the relist is charged to etcd:
//!   `ceil(objects / objects_per_page)` range requests (at least one) for every live object
//!   (etcd does not filter by label), at etcd's current revision, then a watch from there; if
//!   etcd has compacted the watcher's last RV it first refuses the list at it (one more range
//!   request, counted in `etcd_list_410`). With `"cache"` it is what client-go really sends a
//!   kube-apiserver with its watch cache: a list at the watcher's last RV without a limit,
//!   which the cacher serves from memory; etcd sees it only when the cacher delegates it.
//! - etcd compacts every `compaction_interval_s` to the revision it had one interval earlier
//!   (kube-apiserver's compactor), and sends progress notifies every
//!   `progress_notify_interval_s`; the cacher's progress requests are answered at once.
//! - A restart of the cache closes its ready gate (`handle_storage_error`): every watch ends
//!   and every watcher reconnects at once (in v1.30 the watches wait for the gate; in v1.34 they
//!   get 429 and retry). After `outage_s` the cache lists etcd (`cache_objects_per_page`, 10 000
//!   as its reflector's pager) and opens the gate; writes made meanwhile are never events to
//!   the watchers, whose RVs are now older than the new window: each gets a 410 and relists.
//!
//! Delivery lag is the time from the write to the client reading the event, kept in a
//! fixed-size log-linear histogram (about 3 % resolution above 128 ms, exact below). A fan-out
//! to many watchers at once is counted, never looped over per watcher.
//!
//! ## The workload (JSON; every field optional, defaults shown)
//!
//! ```text
//! {"duration_s": 60, "seed": 0,
//!  "config": {...},                      // the core's config as scenarios spell it (v1.30);
//!                                        // its seed defaults to the workload's
//!  "writes": {"rate_per_s": 10, "keys": 1000, "delete_fraction": 0,
//!             "bursts": [{"at_s": .., "duration_s": .., "rate_per_s": ..}]},
//!  "watchers": {"count": 10, "bookmarks": true, "selector_fraction": 1,
//!               "consume_rate_per_s": null, "consume_tick_ms": 100,
//!               "slow_policy": "terminate", "timeout_s": null,
//!               "backoff": "none",             // or "client-go"
//!               "relist_from": "etcd"},        // or "cache"
//!  "disconnects": {"rate_per_watcher_per_h": 0,
//!                  "reconnect_delay_s": 1},  // or {"dist": "const", "value": s},
//!                                            // {"dist": "exp", "mean": s},
//!                                            // {"dist": "uniform", "min": s, "max": s}
//!  "etcd": {"compaction_interval_s": 300, "objects_per_page": 500,
//!           "cache_objects_per_page": 10000, "progress_notify_interval_s": 600},  // 0: never
//!  "restarts": [{"at_s": .., "outage_s": 10}],
//!  "series": true,
//!  "name": "", "description": ""}
//! ```
//!
//! The report: `summary` ([`Summary`]) and `series`, one [`Second`] per simulated second
//! (counts for that second, state at its end). A bad workload is a [`WorkloadError`] naming the
//! field (`writes.rate_per_s: must be a non-negative number, got -1`).
//!
//! ```
//! use cacher_core::simulate::{run, Restart, Workload};
//!
//! // Two minutes of 10 writes/s to 100 watchers; the cache restarts at 60 s for 5 s.
//! let mut w = Workload { duration_s: 120.0, ..Workload::default() };
//! w.watchers.count = 100;
//! w.restarts.push(Restart { at_s: 60.0, outage_s: 5.0 });
//! let report = run(&w).unwrap();
//! // Every watcher's last RV predates the window the cache relisted into: 410, relist.
//! assert_eq!((report.summary.watch_410, report.summary.relists), (100, 100));
//! assert_eq!(report.series.len(), 120);
//! assert!(!report.series[61].ready && report.series[66].ready);
//! ```

use crate::rng::Rng;
use alloc::boxed::Box;
use alloc::collections::{BinaryHeap, VecDeque};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cmp::Reverse;

// A client of the core: only its public API, as a host outside the crate would use it.
use crate::{
    Attrs, Cacher, CloseCause, Config, ConsumeMode, Key, KeyRange, ListRequest, Object, Output,
    ReadOutcome, ReadyState, RequestId, RvParam, Selector, SlowPolicy, Timestamp, WatchEvent,
    WatchRequest,
};

// ----- the workload ------------------------------------------------------------------------------

/// What to simulate. Every field has a default ([`Workload::default`]); the JSON form (see the
/// module documentation) spells the same names.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Simulated time, in seconds (60).
    pub duration_s: f64,
    /// Seeds every random draw of the simulation (0); also the core's `seed` unless the
    /// config sets one.
    pub seed: u64,
    /// The cacher's configuration (Kubernetes v1.30 defaults).
    pub config: Config,
    /// The write load on etcd.
    pub writes: Writes,
    /// The watching clients.
    pub watchers: Watchers,
    /// Client-side disconnects.
    pub disconnects: Disconnects,
    /// etcd's compaction, progress notifies and list cost model.
    pub etcd: Etcd,
    /// Restarts of the cache.
    pub restarts: Vec<Restart>,
    /// Whether the report carries the per-second series (true).
    pub series: bool,
}

/// The write load.
#[derive(Clone, Debug, PartialEq)]
pub struct Writes {
    /// Writes per second (10), a Poisson process.
    pub rate_per_s: f64,
    /// Distinct keys (1000), all present at the start.
    pub keys: u64,
    /// Share of writes to a present key that delete it (0).
    pub delete_fraction: f64,
    /// Periods with another rate (none); a later burst wins where they overlap.
    pub bursts: Vec<Burst>,
}

/// A period with another write rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Burst {
    /// Start, in seconds.
    pub at_s: f64,
    /// Length, in seconds.
    pub duration_s: f64,
    /// Writes per second meanwhile.
    pub rate_per_s: f64,
}

/// The watching clients (client-go reflectors).
#[derive(Clone, Debug, PartialEq)]
pub struct Watchers {
    /// How many (10).
    pub count: u32,
    /// `allowWatchBookmarks` (true, as every informer sets it).
    pub bookmarks: bool,
    /// Share of the objects each watcher's label selector matches (1: no selector). Objects
    /// carry `group=<key index mod G>`; each watcher selects m of the G groups (`group=`,
    /// `group in (...)` or `group notin (...)`), m/G this share with the smallest G ≤ 100 000,
    /// or within 1 % of it (the report gives m/G).
    pub selector_fraction: f64,
    /// Events per second a watcher's client reads (`None`: it keeps up).
    pub consume_rate_per_s: Option<f64>,
    /// How often a slow client reads, in ms (100).
    pub consume_tick_ms: u64,
    /// What the cacher does with a watcher whose queue is full (Kubernetes: terminate).
    pub slow_policy: SlowPolicy,
    /// Watch timeout: each watch asks for a random timeout in `[t, 2t)` seconds, as client-go
    /// does with 5 minutes (`None`: no timeout).
    pub timeout_s: Option<f64>,
    /// When a watcher comes back after a disconnect or a 410 ([`Backoff::None`]).
    pub backoff: Backoff,
    /// Where a relist after a 410 is served ([`RelistFrom::Etcd`]).
    pub relist_from: RelistFrom,
}

/// When a disconnected or expired watcher tries again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    /// `"none"`: it re-watches exactly `reconnect_delay_s` after a disconnect and relists at once
    /// after a 410.
    None,
    /// `"client-go"`: the reflector's backoff manager (`tools/cache/reflector.go`:
    /// `NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)`): a refused watch is tried again
    /// after 0.8 s, doubling to 30 s, each wait jittered ×[1, 2), starting again from 0.8 s when the
    /// last wait began more than 2 minutes earlier. After a disconnect of `d` seconds the watch
    /// resumes at the first try at or after `d` (the tries before it are refused); after a 410
    /// the relist follows one wait later (`wait.BackoffUntil` around `ListAndWatch`).
    ClientGo,
}

/// Where a watcher's relist after a 410 is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelistFrom {
    /// `"etcd"`: every relist is charged to etcd (`ceil(objects / objects_per_page)` ranges at
    /// etcd's head, one more refused range when the watcher's RV is compacted): kube-apiserver
    /// with `--watch-cache=false`, or a client that paginates.
    Etcd,
    /// `"cache"`: what client-go does against a kube-apiserver with its watch cache: a list at
    /// the watcher's last RV without a limit, served by the cacher from memory; etcd is charged
    /// only when the cacher delegates the list.
    Cache,
}

/// Client-side disconnects.
#[derive(Clone, Debug, PartialEq)]
pub struct Disconnects {
    /// Disconnects per connected watcher per hour (0), a Poisson process.
    pub rate_per_watcher_per_h: f64,
    /// How long a disconnected watcher waits before it re-watches (1 s).
    pub reconnect_delay_s: Delay,
}

/// A random delay, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Delay {
    /// Always this long.
    Const(f64),
    /// Exponentially distributed with this mean.
    Exp {
        /// The mean.
        mean: f64,
    },
    /// Uniform between the two.
    Uniform {
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
}

/// etcd.
#[derive(Clone, Debug, PartialEq)]
pub struct Etcd {
    /// Compaction period in seconds (300, kube-apiserver's `--etcd-compaction-interval`);
    /// `None`: never.
    pub compaction_interval_s: Option<f64>,
    /// Objects per page of a watcher's relist (500, client-go's pager).
    pub objects_per_page: u64,
    /// Objects per page of the cache's own list (10 000, the cacher's reflector).
    pub cache_objects_per_page: u64,
    /// Progress notify period on the cache's watch, in seconds (600, etcd's default);
    /// `None`: none.
    pub progress_notify_interval_s: Option<f64>,
}

/// A restart of the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Restart {
    /// When, in seconds.
    pub at_s: f64,
    /// How long the cache is down before it relists, in seconds.
    pub outage_s: f64,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            duration_s: 60.0,
            seed: 0,
            config: Config::default(),
            writes: Writes {
                rate_per_s: 10.0,
                keys: 1000,
                delete_fraction: 0.0,
                bursts: Vec::new(),
            },
            watchers: Watchers {
                count: 10,
                bookmarks: true,
                selector_fraction: 1.0,
                consume_rate_per_s: None,
                consume_tick_ms: 100,
                slow_policy: SlowPolicy::Terminate,
                timeout_s: None,
                backoff: Backoff::None,
                relist_from: RelistFrom::Etcd,
            },
            disconnects: Disconnects {
                rate_per_watcher_per_h: 0.0,
                reconnect_delay_s: Delay::Const(1.0),
            },
            etcd: Etcd {
                compaction_interval_s: Some(300.0),
                objects_per_page: 500,
                cache_objects_per_page: 10_000,
                progress_notify_interval_s: Some(600.0),
            },
            restarts: Vec::new(),
            series: true,
        }
    }
}

/// A bad workload: which field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadError {
    /// The field, as a JSON path (`writes.rate_per_s`, `restarts[1].outage_s`).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl WorkloadError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> WorkloadError {
        WorkloadError { path: path.into(), message: message.into() }
    }
}

impl core::fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl core::error::Error for WorkloadError {}

const MAX_DURATION_S: f64 = 30.0 * 24.0 * 3600.0;
const MAX_RATE: f64 = 1e6;
const MAX_KEYS: u64 = 10_000_000;
const MAX_WATCHERS: u32 = 100_000;
const MAX_BURSTS: usize = 1000;
const MAX_RESTARTS: usize = 10_000;

fn check_number(path: &str, x: f64, max: f64) -> Result<(), WorkloadError> {
    if !x.is_finite() || x < 0.0 {
        return Err(WorkloadError::new(path, format!("must be a non-negative number, got {x}")));
    }
    if x > max {
        return Err(WorkloadError::new(path, format!("must be at most {max}, got {x}")));
    }
    Ok(())
}

fn check_positive(path: &str, x: f64, max: f64) -> Result<(), WorkloadError> {
    check_number(path, x, max)?;
    if x == 0.0 {
        return Err(WorkloadError::new(path, "must be greater than 0 (or null)"));
    }
    Ok(())
}

fn check_fraction(path: &str, x: f64) -> Result<(), WorkloadError> {
    if !(0.0..=1.0).contains(&x) {
        return Err(WorkloadError::new(path, format!("must be between 0 and 1, got {x}")));
    }
    Ok(())
}

impl Workload {
    /// Checks every value; the error names the field as the JSON form spells it.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        check_number("duration_s", self.duration_s, MAX_DURATION_S)?;
        self.config
            .validate()
            .map_err(|e| WorkloadError::new(format!("config.{}", e.field), e.message))?;
        let w = &self.writes;
        check_number("writes.rate_per_s", w.rate_per_s, MAX_RATE)?;
        if w.keys == 0 || w.keys > MAX_KEYS {
            return Err(WorkloadError::new(
                "writes.keys",
                format!("must be between 1 and {MAX_KEYS}, got {}", w.keys),
            ));
        }
        check_fraction("writes.delete_fraction", w.delete_fraction)?;
        if w.bursts.len() > MAX_BURSTS {
            return Err(WorkloadError::new(
                "writes.bursts",
                format!("at most {MAX_BURSTS} bursts, got {}", w.bursts.len()),
            ));
        }
        for (i, b) in w.bursts.iter().enumerate() {
            check_number(&format!("writes.bursts[{i}].at_s"), b.at_s, MAX_DURATION_S)?;
            check_number(&format!("writes.bursts[{i}].duration_s"), b.duration_s, MAX_DURATION_S)?;
            check_number(&format!("writes.bursts[{i}].rate_per_s"), b.rate_per_s, MAX_RATE)?;
        }
        let c = &self.watchers;
        if c.count > MAX_WATCHERS {
            return Err(WorkloadError::new(
                "watchers.count",
                format!("must be at most {MAX_WATCHERS}, got {}", c.count),
            ));
        }
        check_fraction("watchers.selector_fraction", c.selector_fraction)?;
        if let Some(r) = c.consume_rate_per_s {
            check_number("watchers.consume_rate_per_s", r, 1e9)?;
        }
        if c.consume_tick_ms == 0 || c.consume_tick_ms > 60_000 {
            return Err(WorkloadError::new(
                "watchers.consume_tick_ms",
                format!("must be between 1 and 60000, got {}", c.consume_tick_ms),
            ));
        }
        if let Some(t) = c.timeout_s {
            check_positive("watchers.timeout_s", t, MAX_DURATION_S)?;
        }
        let d = &self.disconnects;
        check_number("disconnects.rate_per_watcher_per_h", d.rate_per_watcher_per_h, MAX_RATE)?;
        let path = "disconnects.reconnect_delay_s";
        match d.reconnect_delay_s {
            Delay::Const(s) => check_number(&format!("{path}.value"), s, MAX_DURATION_S)?,
            Delay::Exp { mean } => check_number(&format!("{path}.mean"), mean, MAX_DURATION_S)?,
            Delay::Uniform { min, max } => {
                check_number(&format!("{path}.min"), min, MAX_DURATION_S)?;
                check_number(&format!("{path}.max"), max, MAX_DURATION_S)?;
                if max < min {
                    return Err(WorkloadError::new(
                        format!("{path}.max"),
                        format!("must be at least min ({min}), got {max}"),
                    ));
                }
            }
        }
        let e = &self.etcd;
        if let Some(s) = e.compaction_interval_s {
            check_positive("etcd.compaction_interval_s", s, MAX_DURATION_S)?;
        }
        if let Some(s) = e.progress_notify_interval_s {
            check_positive("etcd.progress_notify_interval_s", s, MAX_DURATION_S)?;
        }
        for (name, v) in [
            ("objects_per_page", e.objects_per_page),
            ("cache_objects_per_page", e.cache_objects_per_page),
        ] {
            if v == 0 {
                return Err(WorkloadError::new(format!("etcd.{name}"), "must be at least 1"));
            }
        }
        if self.restarts.len() > MAX_RESTARTS {
            return Err(WorkloadError::new(
                "restarts",
                format!("at most {MAX_RESTARTS} restarts, got {}", self.restarts.len()),
            ));
        }
        for (i, r) in self.restarts.iter().enumerate() {
            check_number(&format!("restarts[{i}].at_s"), r.at_s, MAX_DURATION_S)?;
            check_number(&format!("restarts[{i}].outage_s"), r.outage_s, MAX_DURATION_S)?;
        }
        Ok(())
    }
}

// ----- the report --------------------------------------------------------------------------------

/// What happened.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Report {
    /// Totals over the whole run.
    pub summary: Summary,
    /// One record per simulated second (empty if the workload's `series` is false).
    pub series: Vec<Second>,
}

/// Totals over the whole run.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Summary {
    /// Simulated seconds.
    pub duration_s: f64,
    /// Writes committed to etcd.
    pub events_written: u64,
    /// Of those, the ones the cache received (not those made while it was down).
    pub events_cached: u64,
    /// ADDED/MODIFIED/DELETED events delivered to clients (bookmarks not included).
    pub deliveries: u64,
    /// Bookmarks delivered to clients.
    pub bookmarks_sent: u64,
    /// Watches that got 410 Expired (at start, or falling out of the window).
    pub watch_410: u64,
    /// Other ERROR events on watches.
    pub watch_errors: u64,
    /// Watchers' relists after a 410 (one per 410: from etcd, or through the cacher with
    /// `watchers.relist_from: "cache"`), counted when they are sent.
    pub relists: u64,
    /// Watchers still waiting at the end for the relist their 410 asked for (client-go's
    /// backoff puts a wait between the 410 and the relist; always 0 without it) that relist
    /// within 65 s of the end and are not away then: what a real run that waits 65 s after its
    /// end for those relists (`make validate-slo-k8s`) still counts.
    pub relists_pending: u64,
    /// The cache's own lists from etcd (the first one at time 0 included).
    pub cache_lists: u64,
    /// Range requests to etcd (relists' pages, the cache's lists, refused lists).
    pub etcd_range_requests: u64,
    /// Objects etcd returned for them.
    pub etcd_range_objects: u64,
    /// Lists etcd refused because their revision was compacted.
    pub etcd_list_410: u64,
    /// Compactions etcd made.
    pub compactions: u64,
    /// Watchers the cacher closed as unresponsive.
    pub watcher_terminations: u64,
    /// Client-side disconnects.
    pub disconnects: u64,
    /// Restarts of the cache.
    pub restarts: u64,
    /// Watch requests sent to the cache (first watches and every re-watch).
    pub watches_started: u64,
    /// Watch requests the cache refused (429 while it initialises).
    pub watches_rejected: u64,
    /// Median delivery lag in ms (`None` without deliveries).
    pub p50_delivery_lag_ms: Option<f64>,
    /// 99th percentile of the delivery lag in ms.
    pub p99_delivery_lag_ms: Option<f64>,
    /// Mean delivery lag in ms.
    pub mean_delivery_lag_ms: Option<f64>,
    /// Largest delivery lag in ms.
    pub max_delivery_lag_ms: Option<u64>,
    /// Largest ring-buffer capacity seen.
    pub peak_ring_capacity: u32,
    /// Ring-buffer capacity at the end.
    pub final_ring_capacity: u32,
    /// Times the ring grew.
    pub capacity_increases: u64,
    /// Times it shrank.
    pub capacity_decreases: u64,
    /// The share of objects each watcher's selector actually matches (m/G).
    pub selector_fraction: f64,
    /// etcd's revision at the end.
    pub final_etcd_rv: u64,
}

/// One simulated second (the counts are for that second; the rest is its state at the end).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Second {
    /// The end of the second.
    pub t_s: u32,
    /// etcd's revision.
    pub etcd_rv: u64,
    /// The cache's resourceVersion.
    pub cache_rv: u64,
    /// The ready gate is open.
    pub ready: bool,
    /// Revisions a watch can resume from: the cache RV minus the oldest servable RV, plus 1.
    pub window_rv: u64,
    /// Seconds since the cache reached the oldest RV a watch can resume from.
    pub window_s: f64,
    /// Events in the ring buffer.
    pub window_events: u32,
    /// Ring-buffer capacity.
    pub capacity: u32,
    /// Writes to etcd.
    pub writes: u64,
    /// Events delivered to clients.
    pub deliveries: u64,
    /// 410s.
    pub watch_410: u64,
    /// Watchers' relists.
    pub relists: u64,
    /// Range requests to etcd.
    pub etcd_range_requests: u64,
    /// Objects read from etcd.
    pub etcd_range_objects: u64,
    /// Watchers with an open watch.
    pub connected_watchers: u32,
}

/// Runs a workload against a fresh [`Cacher`].
pub fn run(workload: &Workload) -> Result<Report, WorkloadError> {
    workload.validate()?;
    let mut sim = Sim::new(workload)?;
    sim.start();
    sim.run_loop();
    Ok(sim.report())
}

// ----- the engine --------------------------------------------------------------------------------

const WATCH_PREFIX: &str = "/registry/pods/";
const VALUE: &[u8] = b"{\"kind\":\"Pod\",\"apiVersion\":\"v1\"}";
/// Backoff of a watcher whose watch ended the instant it started, or that failed otherwise.
const BACKOFF_MS: u64 = 1000;
/// client-go's reflector backoff (`tools/cache/reflector.go`, v0.34): 0.8 s initial wait, 30 s
/// cap, reset after 2 minutes.
const CLIENT_GO_BACKOFF_INITIAL_MS: f64 = 800.0;
const CLIENT_GO_BACKOFF_CAP_MS: f64 = 30_000.0;
const CLIENT_GO_BACKOFF_RESET_MS: u64 = 120_000;
/// How long after its end a real run still counts the relists that client-go's backoff
/// delayed (kube-harness slo), for [`Summary::relists_pending`].
const RELIST_GRACE_MS: u64 = 65_000;

/// A simulation event; the heap orders by time, samples first, then by sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Sample,
    Write,
    Compact,
    Progress,
    ConsumeTick,
    Restart(u32),
    CacheRelist,
    Disconnect { watcher: u32, gen: u32 },
    Reconnect { watcher: u32, gen: u32 },
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    writes: u64,
    cached: u64,
    deliveries: u64,
    bookmarks: u64,
    watch_410: u64,
    watch_errors: u64,
    relists: u64,
    cache_lists: u64,
    range_requests: u64,
    range_objects: u64,
    list_410: u64,
    compactions: u64,
    terminations: u64,
    disconnects: u64,
    restarts: u64,
    watches_started: u64,
    watches_rejected: u64,
}

struct SimWatcher {
    /// The open (or parked) watch.
    watch: Option<RequestId>,
    /// The initial list in flight.
    list: Option<RequestId>,
    /// `WatchStarted` seen for `watch`.
    connected: bool,
    /// The last RV seen: where the next watch starts.
    resume_rv: u64,
    /// Bumped at every watch start; scheduled disconnects and reconnects of older watches are
    /// stale.
    gen: u32,
    started_at: u64,
    relisted_at: Option<u64>,
    /// The watch got 410 / another error (its close follows).
    expired: bool,
    errored: bool,
    /// Events the slow client may still read.
    read_allowance: f64,
    selector: Selector,
    /// A 410 ended the watch: the next try is a relist, not a watch.
    pending_relist: bool,
    /// When that relist is tried, and until when the watcher is away before it (ms).
    relist_at: u64,
    away_until: u64,
    /// The list in flight is a relist through the cacher (not the first list).
    relisting: bool,
    /// client-go's backoff manager: the next wait before jitter, in ms, and when the last wait
    /// began.
    backoff_ms: f64,
    last_backoff_at: Option<u64>,
}

struct Sim<'w> {
    wl: &'w Workload,
    cacher: Cacher,
    now: u64,
    end: u64,
    /// (time, 0 for a sample else 1, sequence number, event).
    heap: BinaryHeap<Reverse<(u64, u8, u64, Ev)>>,
    seq: u64,
    rng_writes: Rng,
    rng_clients: Rng,
    // etcd
    etcd_rv: u64,
    compacted_rv: u64,
    compaction_mark: u64,
    key_rv: Vec<u64>,
    live: u64,
    keys: Vec<Box<[u8]>>,
    /// The `group` label of each group that holds objects (none without selectors).
    group_attrs: Vec<Arc<Attrs>>,
    groups: u32,
    /// Write arrivals: (start second, rate) segments and the clock, in seconds.
    segments: Vec<(f64, f64)>,
    segment: usize,
    write_clock: f64,
    // the cache
    cache_up: bool,
    down_until: u64,
    /// (RV, ms) at which the cache reached each RV still in (or just before) its window.
    reached: VecDeque<(u64, u64)>,
    // the watchers
    range: KeyRange,
    watchers: Vec<SimWatcher>,
    by_request: Vec<u32>,
    connected: u32,
    manual: bool,
    selector_fraction: f64,
    // results
    c: Counters,
    last: Counters,
    lag: LagHistogram,
    series: Vec<Second>,
    peak_capacity: u32,
}

impl<'w> Sim<'w> {
    fn new(wl: &'w Workload) -> Result<Sim<'w>, WorkloadError> {
        let cacher = Cacher::new(wl.config.clone(), Timestamp::ZERO)
            .map_err(|e| WorkloadError::new(format!("config.{}", e.field), e.message))?;
        let (groups, matched) = selector_plan(wl.watchers.selector_fraction);
        let labelled = matched != groups;
        // Key i is in group i mod G: only the first min(G, keys) groups hold objects.
        let used = u64::from(groups).min(wl.writes.keys) as u32;
        let group_attrs: Vec<Arc<Attrs>> = if labelled {
            (0..used)
                .map(|g| {
                    Arc::new(Attrs::new(
                        [("group", g.to_string())],
                        core::iter::empty::<(&str, &str)>(),
                    ))
                })
                .collect()
        } else {
            Vec::new()
        };
        let n_keys = wl.writes.keys as usize;
        let keys: Vec<Box<[u8]>> = (0..n_keys)
            .map(|i| format!("{WATCH_PREFIX}ns-{}/pod-{i:07}", i % 16).into_bytes().into())
            .collect();
        let watchers = (0..wl.watchers.count)
            .map(|i| SimWatcher {
                watch: None,
                list: None,
                connected: false,
                resume_rv: 0,
                gen: 0,
                started_at: 0,
                relisted_at: None,
                expired: false,
                errored: false,
                read_allowance: 0.0,
                selector: watcher_selector(i, groups, matched),
                pending_relist: false,
                relist_at: 0,
                away_until: 0,
                relisting: false,
                backoff_ms: CLIENT_GO_BACKOFF_INITIAL_MS,
                last_backoff_at: None,
            })
            .collect();
        let seed = wl.seed;
        Ok(Sim {
            wl,
            cacher,
            now: 0,
            end: ms(wl.duration_s),
            heap: BinaryHeap::new(),
            seq: 0,
            rng_writes: Rng::new(seed ^ 0x5772_6974_6573_0001),
            rng_clients: Rng::new(seed ^ 0x436c_6965_6e74_0002),
            etcd_rv: wl.writes.keys,
            compacted_rv: 0,
            compaction_mark: 0,
            key_rv: (1..=wl.writes.keys).collect(),
            live: wl.writes.keys,
            keys,
            group_attrs,
            groups,
            segments: write_segments(&wl.writes),
            segment: 0,
            write_clock: 0.0,
            cache_up: false,
            down_until: 0,
            reached: VecDeque::new(),
            range: KeyRange::Prefix(Key::from(WATCH_PREFIX)),
            watchers,
            by_request: Vec::new(),
            connected: 0,
            manual: wl.watchers.consume_rate_per_s.is_some(),
            selector_fraction: f64::from(matched) / f64::from(groups),
            c: Counters::default(),
            last: Counters::default(),
            lag: LagHistogram::new(),
            series: Vec::new(),
            peak_capacity: 0,
        })
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        let class = u8::from(ev != Ev::Sample);
        self.heap.push(Reverse((at, class, self.seq, ev)));
    }

    fn ts(&self) -> Timestamp {
        Timestamp::from_millis(self.now)
    }

    /// Time 0: the cache lists etcd, every watcher lists the cache, the clocks start.
    fn start(&mut self) {
        self.relist_cache();
        for i in 0..self.watchers.len() {
            self.initial_list(i);
        }
        self.drain();
        self.schedule_next_write();
        if self.end >= 1000 {
            self.schedule(1000, Ev::Sample);
        }
        if let Some(s) = self.wl.etcd.compaction_interval_s {
            self.schedule(ms(s).max(1), Ev::Compact);
        }
        if let Some(s) = self.wl.etcd.progress_notify_interval_s {
            self.schedule(ms(s).max(1), Ev::Progress);
        }
        if self.manual && !self.watchers.is_empty() {
            self.schedule(self.wl.watchers.consume_tick_ms, Ev::ConsumeTick);
        }
        for (i, r) in self.wl.restarts.iter().enumerate() {
            self.schedule(ms(r.at_s), Ev::Restart(i as u32));
        }
    }

    fn run_loop(&mut self) {
        loop {
            let next_sim = self.heap.peek().map(|Reverse((t, class, _, _))| (*t, *class));
            let next_core = self.cacher.poll_timeout().map(|(t, _)| t.as_millis());
            // Timers due by the time of the next simulation event fire first, except that a
            // second's sample comes before anything else at its end.
            let (t, core_first) = match (next_sim, next_core) {
                (None, None) => break,
                (Some((s, _)), None) => (s, false),
                (None, Some(c)) => (c, true),
                (Some((s, class)), Some(c)) => (s.min(c), c < s || (c == s && class != 0)),
            };
            if t > self.end {
                break;
            }
            self.now = self.now.max(t);
            if core_first {
                self.cacher.handle_timeout(self.ts());
                self.drain();
                continue;
            }
            let Some(Reverse((_, _, _, ev))) = self.heap.pop() else { break };
            self.handle(ev);
        }
        self.now = self.end;
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Sample => {
                self.sample();
                let next = self.now + 1000;
                if next <= self.end {
                    self.schedule(next, Ev::Sample);
                }
            }
            Ev::Write => {
                self.write();
                self.schedule_next_write();
            }
            Ev::Compact => {
                let rv = core::mem::replace(&mut self.compaction_mark, self.etcd_rv);
                if rv > self.compacted_rv {
                    self.compacted_rv = rv;
                    self.c.compactions += 1;
                    self.cacher.handle_compaction(self.ts(), rv);
                }
                if let Some(s) = self.wl.etcd.compaction_interval_s {
                    self.schedule(self.now + ms(s).max(1), Ev::Compact);
                }
            }
            Ev::Progress => {
                if self.cache_up {
                    let _ = self.cacher.handle_progress(self.ts(), self.etcd_rv);
                    self.drain();
                }
                if let Some(s) = self.wl.etcd.progress_notify_interval_s {
                    self.schedule(self.now + ms(s).max(1), Ev::Progress);
                }
            }
            Ev::ConsumeTick => {
                self.consume_tick();
                self.schedule(self.now + self.wl.watchers.consume_tick_ms, Ev::ConsumeTick);
            }
            Ev::Restart(i) => {
                let outage = self.wl.restarts.get(i as usize).map_or(0, |r| ms(r.outage_s));
                self.c.restarts += 1;
                if self.cache_up {
                    self.cache_up = false;
                    self.cacher.reinitialize(self.ts(), "watch cache restart");
                }
                self.down_until = self.down_until.max(self.now + outage);
                self.schedule(self.down_until, Ev::CacheRelist);
                self.drain();
            }
            Ev::CacheRelist => {
                if !self.cache_up && self.now >= self.down_until {
                    self.relist_cache();
                }
            }
            Ev::Disconnect { watcher, gen } => self.disconnect(watcher as usize, gen),
            Ev::Reconnect { watcher, gen } => {
                let w = &self.watchers[watcher as usize];
                if w.gen == gen && w.watch.is_none() && w.list.is_none() {
                    if w.pending_relist || w.resume_rv == 0 {
                        self.relist(watcher as usize);
                    } else {
                        self.start_watch(watcher as usize);
                    }
                    self.drain();
                }
            }
        }
    }

    // ----- etcd and the cache's reflector ----------------------------------------------------

    fn schedule_next_write(&mut self) {
        let duration = self.wl.duration_s;
        loop {
            while self.segment + 1 < self.segments.len()
                && self.segments[self.segment + 1].0 <= self.write_clock
            {
                self.segment += 1;
            }
            let rate = self.segments[self.segment].1;
            let until = self.segments.get(self.segment + 1).map_or(f64::INFINITY, |s| s.0);
            if rate > 0.0 {
                let t = self.write_clock + exp_draw(&mut self.rng_writes, 1.0 / rate);
                if t < until {
                    self.write_clock = t;
                    if t <= duration {
                        self.schedule(ms(t), Ev::Write);
                    }
                    return;
                }
            }
            if until > duration {
                return;
            }
            self.write_clock = until;
        }
    }

    fn write(&mut self) {
        let k = self.rng_writes.up_to(self.wl.writes.keys - 1) as usize;
        let present = self.key_rv[k] != 0;
        let delete = present
            && self.wl.writes.delete_fraction > 0.0
            && unit(&mut self.rng_writes) < self.wl.writes.delete_fraction;
        self.etcd_rv += 1;
        let rv = self.etcd_rv;
        self.c.writes += 1;
        if delete {
            self.key_rv[k] = 0;
            self.live -= 1;
        } else {
            if !present {
                self.live += 1;
            }
            self.key_rv[k] = rv;
        }
        if !self.cache_up {
            return;
        }
        let now = self.ts();
        let result = if delete {
            self.cacher.handle_delete(now, &self.keys[k], rv)
        } else {
            let object = self.object(k, rv);
            self.cacher.handle_put(now, object)
        };
        if result.is_ok() {
            self.c.cached += 1;
            self.reached.push_back((rv, self.now));
        }
        self.drain();
    }

    fn object(&self, k: usize, rv: u64) -> Object {
        // Groups past the number of keys hold no object, so k mod G indexes this table (and
        // there is none without selectors).
        let attrs = self.group_attrs.get(k % self.groups as usize).cloned();
        Object::new(&self.keys[k], Some(VALUE), rv).with_shared_attrs(attrs)
    }

    /// The cache's reflector lists etcd and hands the result over; the gate opens.
    fn relist_cache(&mut self) {
        let objects: Vec<Object> = (0..self.keys.len())
            .filter(|&k| self.key_rv[k] != 0)
            .map(|k| self.object(k, self.key_rv[k]))
            .collect();
        if self.cacher.handle_replace(self.ts(), self.etcd_rv, objects).is_err() {
            return;
        }
        self.cache_up = true;
        self.c.cache_lists += 1;
        self.c.range_requests += self.live.div_ceil(self.wl.etcd.cache_objects_per_page).max(1);
        self.c.range_objects += self.live;
        self.reached.clear();
        self.reached.push_back((self.etcd_rv, self.now));
        self.drain();
    }

    // ----- the watchers ----------------------------------------------------------------------

    fn bind(&mut self, id: RequestId, watcher: usize) {
        let i = id.0 as usize;
        if self.by_request.len() <= i {
            self.by_request.resize(i + 1, 0);
        }
        self.by_request[i] = watcher as u32 + 1;
    }

    fn lookup(&self, id: RequestId) -> Option<usize> {
        match self.by_request.get(id.0 as usize) {
            Some(&n) if n > 0 => Some(n as usize - 1),
            _ => None,
        }
    }

    fn unbind(&mut self, id: RequestId) -> Option<usize> {
        let found = self.lookup(id);
        if found.is_some() {
            self.by_request[id.0 as usize] = 0;
        }
        found
    }

    /// client-go's first list: resourceVersion "0", served by the cache.
    fn initial_list(&mut self, i: usize) {
        let mut req = ListRequest::new(self.range.clone(), RvParam::Zero);
        req.selector = self.watchers[i].selector.clone();
        match self.cacher.list(self.ts(), req) {
            Ok(id) => {
                self.bind(id, i);
                self.watchers[i].list = Some(id);
            }
            Err(_) => self.relist_and_watch(i),
        }
    }

    fn start_watch(&mut self, i: usize) {
        let now = self.now;
        let timeout = self.wl.watchers.timeout_s.map(|t| {
            let u = unit(&mut self.rng_clients);
            ms(t * (1.0 + u)).max(1)
        });
        let w = &mut self.watchers[i];
        w.gen = w.gen.wrapping_add(1);
        w.started_at = now;
        w.read_allowance = 0.0;
        let rv = if w.resume_rv == 0 { RvParam::Zero } else { RvParam::At(w.resume_rv) };
        let mut req = WatchRequest::new(self.range.clone(), rv);
        req.allow_bookmarks = self.wl.watchers.bookmarks;
        req.selector = w.selector.clone();
        req.consume = if self.manual { ConsumeMode::Manual } else { ConsumeMode::Auto };
        req.slow_policy = self.wl.watchers.slow_policy;
        req.timeout_ms = timeout;
        self.c.watches_started += 1;
        match self.cacher.start_watch(Timestamp::from_millis(now), req) {
            Ok(id) => {
                self.bind(id, i);
                self.watchers[i].watch = Some(id);
            }
            // A malformed request cannot happen here; count it and retry later.
            Err(_) => {
                self.c.watches_rejected += 1;
                self.reconnect_at(i, now + BACKOFF_MS);
            }
        }
    }

    /// After a 410: list again (from etcd or through the cacher, as the workload says), then
    /// watch from the list's revision.
    fn relist(&mut self, i: usize) {
        self.watchers[i].pending_relist = false;
        match self.wl.watchers.relist_from {
            RelistFrom::Etcd => self.relist_and_watch(i),
            RelistFrom::Cache => {
                // client-go: `relistResourceVersion()` is the last RV synced (a 410 on the watch
                // does not mark it unavailable), and a relist at an RV lists without a limit.
                self.c.relists += 1;
                let rv = self.watchers[i].resume_rv;
                let rv = if rv == 0 { RvParam::Zero } else { RvParam::At(rv) };
                let mut req = ListRequest::new(self.range.clone(), rv);
                req.selector = self.watchers[i].selector.clone();
                match self.cacher.list(self.ts(), req) {
                    Ok(id) => {
                        self.bind(id, i);
                        let w = &mut self.watchers[i];
                        w.list = Some(id);
                        w.relisting = true;
                    }
                    Err(_) => {
                        self.charge_etcd_list(i, 1);
                        self.watchers[i].resume_rv = self.etcd_rv;
                        self.start_watch(i);
                    }
                }
            }
        }
    }

    /// A list that reaches etcd in `pages` range requests (one more, refused, when the
    /// watcher's RV is compacted).
    fn charge_etcd_list(&mut self, i: usize, pages: u64) {
        let rv = self.watchers[i].resume_rv;
        if rv != 0 && rv < self.compacted_rv {
            self.c.range_requests += 1;
            self.c.list_410 += 1;
        }
        self.c.range_requests += pages;
        self.c.range_objects += self.live;
    }

    /// The next wait of client-go's backoff manager for a try at `at` (ms, with jitter).
    fn next_backoff(&mut self, i: usize, at: u64) -> u64 {
        let w = &mut self.watchers[i];
        if w.last_backoff_at.is_none_or(|t| at.saturating_sub(t) > CLIENT_GO_BACKOFF_RESET_MS) {
            w.backoff_ms = CLIENT_GO_BACKOFF_INITIAL_MS;
        }
        w.last_backoff_at = Some(at);
        let step = w.backoff_ms;
        w.backoff_ms = (w.backoff_ms * 2.0).min(CLIENT_GO_BACKOFF_CAP_MS);
        let jitter = unit(&mut self.rng_clients);
        (libm::round(step * (1.0 + jitter)) as u64).max(1)
    }

    /// When a watcher whose connection is away until `back` is connected again: at once with
    /// [`Backoff::None`]; with client-go's backoff, at its first try at or after `back` (the
    /// first try is at once, the next after each wait).
    fn return_time(&mut self, i: usize, back: u64) -> u64 {
        self.first_try_after(i, self.now, back)
    }

    /// The first try at or after `back` when the tries start at `first` (client-go's backoff
    /// between them; `back` itself without it).
    fn first_try_after(&mut self, i: usize, first: u64, back: u64) -> u64 {
        match self.wl.watchers.backoff {
            Backoff::None => back,
            Backoff::ClientGo => {
                let mut t = first;
                while t < back {
                    t += self.next_backoff(i, t);
                }
                t
            }
        }
    }

    /// After a 410: list etcd, then watch from the list's revision.
    fn relist_and_watch(&mut self, i: usize) {
        if self.watchers[i].relisted_at == Some(self.now) {
            // Relisted this very instant already: back off instead of spinning.
            self.watchers[i].resume_rv = 0;
            self.reconnect_at(i, self.now + BACKOFF_MS);
            return;
        }
        self.c.relists += 1;
        self.charge_etcd_list(i, self.live.div_ceil(self.wl.etcd.objects_per_page).max(1));
        let w = &mut self.watchers[i];
        w.relisted_at = Some(self.now);
        w.resume_rv = self.etcd_rv;
        self.start_watch(i);
    }

    fn reconnect_at(&mut self, i: usize, at: u64) {
        let gen = self.watchers[i].gen;
        self.schedule(at, Ev::Reconnect { watcher: i as u32, gen });
    }

    /// The server ended the watch: re-watch at once, unless it ended the instant it started.
    fn reconnect_soon(&mut self, i: usize) {
        let at =
            if self.watchers[i].started_at == self.now { self.now + BACKOFF_MS } else { self.now };
        self.reconnect_at(i, at);
    }

    fn disconnect(&mut self, i: usize, gen: u32) {
        let w = &self.watchers[i];
        if w.gen != gen || !w.connected {
            return;
        }
        let Some(id) = w.watch else { return };
        self.c.disconnects += 1;
        self.cacher.stop_watch(self.ts(), id);
        self.drain();
        let delay = self.draw_delay();
        let at = self.return_time(i, self.now + ms(delay));
        self.reconnect_at(i, at);
    }

    /// How long a disconnect keeps the watcher away, in seconds.
    fn draw_delay(&mut self) -> f64 {
        match self.wl.disconnects.reconnect_delay_s {
            Delay::Const(s) => s,
            Delay::Exp { mean } => exp_draw(&mut self.rng_clients, mean),
            Delay::Uniform { min, max } => min + (max - min) * unit(&mut self.rng_clients),
        }
    }

    fn consume_tick(&mut self) {
        let Some(rate) = self.wl.watchers.consume_rate_per_s else { return };
        let per_tick = rate * self.wl.watchers.consume_tick_ms as f64 / 1000.0;
        let cap = per_tick.max(1.0);
        let now = self.ts();
        for i in 0..self.watchers.len() {
            let Some(id) = self.watchers[i].watch else { continue };
            let allowance = self.watchers[i].read_allowance + per_tick;
            let n = libm::floor(allowance);
            let read = if n >= 1.0 { self.cacher.consume(now, id, Some(n as u64)) } else { 0 };
            // An idle client does not save up reading time beyond one tick.
            self.watchers[i].read_allowance = (allowance - read as f64).min(cap);
        }
        self.drain();
    }

    // ----- outputs ---------------------------------------------------------------------------

    fn drain(&mut self) {
        while let Some(out) = self.cacher.poll_output() {
            match out {
                Output::Fanout { event, targets } => {
                    let n = targets.len() as u64;
                    self.c.deliveries += n;
                    let lag = self.now.saturating_sub(event.record_time().as_millis());
                    self.lag.record(lag, n);
                }
                Output::Deliver { events, .. } => {
                    for e in &events {
                        match e {
                            WatchEvent::Bookmark { .. } => self.c.bookmarks += 1,
                            WatchEvent::Change(_, ev) => {
                                self.c.deliveries += 1;
                                let lag = self.now.saturating_sub(ev.record_time().as_millis());
                                self.lag.record(lag, 1);
                            }
                            // Not asked for (no sendInitialEvents), but counted if they come.
                            WatchEvent::Initial(_) => self.c.deliveries += 1,
                        }
                    }
                }
                Output::WatchStarted { watch, .. } => self.on_started(watch),
                Output::WatchError { watch, status } => {
                    if let Some(i) = self.lookup(watch) {
                        if status.code() == 410 {
                            self.c.watch_410 += 1;
                            self.watchers[i].expired = true;
                        } else {
                            self.c.watch_errors += 1;
                            self.watchers[i].errored = true;
                        }
                    }
                }
                Output::WatchClosed { watch, cause, last_rv, .. } => {
                    self.on_closed(watch, cause, last_rv)
                }
                Output::WatchDelegated { watch, .. } => {
                    // Only RV-less watches are delegated; these always carry an RV.
                    if let Some(i) = self.unbind(watch) {
                        self.watchers[i].watch = None;
                        self.c.watches_rejected += 1;
                        self.reconnect_at(i, self.now + BACKOFF_MS);
                    }
                }
                Output::List { request, outcome } => {
                    let Some(i) = self.unbind(request) else { continue };
                    self.watchers[i].list = None;
                    let relisting = core::mem::take(&mut self.watchers[i].relisting);
                    match outcome {
                        ReadOutcome::Cache(read) => {
                            self.watchers[i].resume_rv = read.rv;
                            self.start_watch(i);
                        }
                        // The cacher delegated the relist: one unpaginated list of etcd.
                        ReadOutcome::Storage { .. } if relisting => {
                            self.charge_etcd_list(i, 1);
                            self.watchers[i].resume_rv = self.etcd_rv;
                            self.start_watch(i);
                        }
                        ReadOutcome::Storage { .. } => self.relist_and_watch(i),
                    }
                }
                Output::Rejected { request, status } => {
                    let Some(i) = self.unbind(request) else { continue };
                    let w = &mut self.watchers[i];
                    if w.watch == Some(request) {
                        w.watch = None;
                        self.c.watches_rejected += 1;
                    }
                    if w.list == Some(request) {
                        w.list = None;
                        // A refused relist is tried again as a relist.
                        w.pending_relist |= core::mem::take(&mut w.relisting);
                    }
                    let after = u64::from(status.retry_after_s.unwrap_or(1)) * 1000;
                    self.reconnect_at(i, self.now + after.max(1));
                }
                Output::RequestProgress => {
                    if self.cache_up {
                        let _ = self.cacher.handle_progress(self.ts(), self.etcd_rv);
                    }
                }
                Output::NeedCurrentRevision { request } => {
                    self.cacher.handle_current_revision(self.ts(), request, self.etcd_rv)
                }
                // The restart schedule drives the cache's relist.
                Output::Relist { .. } | Output::Get { .. } | Output::Range { .. } => {}
            }
        }
    }

    fn on_started(&mut self, watch: RequestId) {
        let Some(i) = self.lookup(watch) else { return };
        if self.watchers[i].watch != Some(watch) || self.watchers[i].connected {
            return;
        }
        self.watchers[i].connected = true;
        self.connected += 1;
        let rate = self.wl.disconnects.rate_per_watcher_per_h;
        if rate > 0.0 {
            let after = exp_draw(&mut self.rng_clients, 3600.0 / rate);
            let gen = self.watchers[i].gen;
            self.schedule(self.now + ms(after), Ev::Disconnect { watcher: i as u32, gen });
        }
    }

    fn on_closed(&mut self, watch: RequestId, cause: CloseCause, last_rv: u64) {
        let Some(i) = self.unbind(watch) else { return };
        let w = &mut self.watchers[i];
        if w.watch != Some(watch) {
            return;
        }
        w.watch = None;
        if w.connected {
            w.connected = false;
            self.connected -= 1;
        }
        w.resume_rv = w.resume_rv.max(last_rv);
        let expired = core::mem::take(&mut w.expired);
        let errored = core::mem::take(&mut w.errored);
        if expired {
            match self.wl.watchers.backoff {
                Backoff::None => self.relist(i),
                // `wait.BackoffUntil` waits one step before `ListAndWatch` lists again.
                Backoff::ClientGo => {
                    self.watchers[i].pending_relist = true;
                    let mut at = self.now + self.next_backoff(i, self.now);
                    let mut away_until = self.now;
                    // The connection that brought the 410 is up while the reflector waits, and
                    // it can drop before the relist: the relist then waits for the outage too.
                    let rate = self.wl.disconnects.rate_per_watcher_per_h;
                    if rate > 0.0 {
                        let drop_at = self.now + ms(exp_draw(&mut self.rng_clients, 3600.0 / rate));
                        if drop_at < at {
                            self.c.disconnects += 1;
                            let back = drop_at + ms(self.draw_delay());
                            at = self.first_try_after(i, at, back);
                            away_until = back;
                        }
                    }
                    let w = &mut self.watchers[i];
                    (w.relist_at, w.away_until) = (at, away_until);
                    self.reconnect_at(i, at);
                }
            }
            return;
        }
        match cause {
            // The client went away itself; its reconnect is already scheduled.
            CloseCause::Stopped => {}
            CloseCause::Unresponsive => {
                self.c.terminations += 1;
                self.reconnect_soon(i);
            }
            CloseCause::Error if errored => self.reconnect_at(i, self.now + BACKOFF_MS),
            CloseCause::Reinitializing | CloseCause::Timeout | CloseCause::Error => {
                self.reconnect_soon(i)
            }
        }
    }

    // ----- results ---------------------------------------------------------------------------

    fn sample(&mut self) {
        let win = self.cacher.window();
        let capacity = u32::try_from(win.capacity).unwrap_or(u32::MAX);
        self.peak_capacity = self.peak_capacity.max(capacity);
        let cache_rv = self.cacher.resource_version();
        let ready = self.cacher.ready_state() == ReadyState::Ready;
        let (window_rv, window_s) = match win.oldest_servable {
            Some(oldest) if ready => {
                let base = oldest.saturating_sub(1);
                while self.reached.len() >= 2 && self.reached[1].0 <= base {
                    self.reached.pop_front();
                }
                let since = match self.reached.front() {
                    Some(&(rv, t)) if rv <= base => t,
                    _ => self.now,
                };
                (cache_rv.saturating_sub(base), (self.now - since) as f64 / 1000.0)
            }
            _ => (0, 0.0),
        };
        if !self.wl.series {
            return;
        }
        let (c, last) = (self.c, self.last);
        self.series.push(Second {
            t_s: (self.now / 1000) as u32,
            etcd_rv: self.etcd_rv,
            cache_rv,
            ready,
            window_rv,
            window_s,
            window_events: u32::try_from(win.len).unwrap_or(u32::MAX),
            capacity,
            writes: c.writes - last.writes,
            deliveries: c.deliveries - last.deliveries,
            watch_410: c.watch_410 - last.watch_410,
            relists: c.relists - last.relists,
            etcd_range_requests: c.range_requests - last.range_requests,
            etcd_range_objects: c.range_objects - last.range_objects,
            connected_watchers: self.connected,
        });
        self.last = c;
    }

    fn report(mut self) -> Report {
        let win = self.cacher.window();
        let final_capacity = u32::try_from(win.capacity).unwrap_or(u32::MAX);
        self.peak_capacity = self.peak_capacity.max(final_capacity);
        let m = self.cacher.metrics();
        let c = self.c;
        let summary = Summary {
            duration_s: self.end as f64 / 1000.0,
            events_written: c.writes,
            events_cached: c.cached,
            deliveries: c.deliveries,
            bookmarks_sent: c.bookmarks,
            watch_410: c.watch_410,
            watch_errors: c.watch_errors,
            relists: c.relists,
            relists_pending: self
                .watchers
                .iter()
                .filter(|w| {
                    w.pending_relist
                        && w.relist_at <= self.end + RELIST_GRACE_MS
                        && w.away_until <= self.end
                })
                .count() as u64,
            cache_lists: c.cache_lists,
            etcd_range_requests: c.range_requests,
            etcd_range_objects: c.range_objects,
            etcd_list_410: c.list_410,
            compactions: c.compactions,
            watcher_terminations: c.terminations,
            disconnects: c.disconnects,
            restarts: c.restarts,
            watches_started: c.watches_started,
            watches_rejected: c.watches_rejected,
            p50_delivery_lag_ms: self.lag.quantile(0.50),
            p99_delivery_lag_ms: self.lag.quantile(0.99),
            mean_delivery_lag_ms: self.lag.mean(),
            max_delivery_lag_ms: (self.lag.total > 0).then_some(self.lag.max),
            peak_ring_capacity: self.peak_capacity,
            final_ring_capacity: final_capacity,
            capacity_increases: m.capacity_increases,
            capacity_decreases: m.capacity_decreases,
            selector_fraction: self.selector_fraction,
            final_etcd_rv: self.etcd_rv,
        };
        Report { summary, series: self.series }
    }
}

// ----- helpers -----------------------------------------------------------------------------------

/// Seconds to whole milliseconds (inputs are validated finite and bounded).
fn ms(s: f64) -> u64 {
    libm::round(s * 1000.0) as u64
}

/// Uniform in [0, 1).
fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Exponentially distributed with this mean.
fn exp_draw(rng: &mut Rng, mean: f64) -> f64 {
    -libm::log(1.0 - unit(rng)) * mean
}

/// The write rate as (start second, rate) segments, the first starting at 0.
fn write_segments(w: &Writes) -> Vec<(f64, f64)> {
    let mut bounds: Vec<f64> = alloc::vec![0.0];
    for b in &w.bursts {
        bounds.push(b.at_s);
        bounds.push(b.at_s + b.duration_s);
    }
    bounds.sort_by(f64::total_cmp);
    bounds.dedup();
    bounds
        .into_iter()
        .map(|t| {
            let rate = w
                .bursts
                .iter()
                .rev()
                .find(|b| b.at_s <= t && t < b.at_s + b.duration_s)
                .map_or(w.rate_per_s, |b| b.rate_per_s);
            (t, rate)
        })
        .collect()
}

const MAX_GROUPS: u32 = 100_000;
/// Most values in a watcher's `in`/`notin` list (the selector is matched per event per watcher).
const MAX_SELECTOR_VALUES: u32 = 64;

/// The groups G objects are spread over and how many of them a watcher selects (m): the
/// smallest G (at most 100 000) with m/G equal to the fraction, else within 1 % of it, else the
/// closest; m ≥ 1 for any fraction above 0, and a selector of at most 64 values.
fn selector_plan(fraction: f64) -> (u32, u32) {
    if fraction >= 1.0 {
        return (1, 1);
    }
    if fraction <= 0.0 {
        return (1, 0);
    }
    let plan = |g: u32| {
        let m = (libm::round(fraction * f64::from(g)) as u32).clamp(1, g);
        let err = libm::fabs(f64::from(m) / f64::from(g) - fraction);
        (m, err, m.min(g - m) <= MAX_SELECTOR_VALUES)
    };
    // An exact fraction first (0.25 → 1/4, 0.0002 → 1/5000), then the first within 1 %.
    for tolerance in [1e-9, fraction * 0.01] {
        let fits = |&g: &u32| {
            let (_, err, small) = plan(g);
            small && err <= tolerance
        };
        if let Some(g) = (1..=MAX_GROUPS).find(fits) {
            return (g, plan(g).0);
        }
    }
    let mut best = (1u32, 1u32, f64::INFINITY);
    for g in 1..=MAX_GROUPS {
        let (m, err, small) = plan(g);
        if small && err < best.2 {
            best = (g, m, err);
        }
    }
    (best.0, best.1)
}

/// Watcher `i`'s label selector: m consecutive groups (mod G), starting where the previous
/// watcher's ended, so every group is watched as often.
fn watcher_selector(i: u32, groups: u32, matched: u32) -> Selector {
    let text = if matched == groups {
        String::new()
    } else if matched == 0 {
        String::from("!group")
    } else {
        let start = (u64::from(i) * u64::from(matched) % u64::from(groups)) as u32;
        let chosen: Vec<u32> = (0..matched).map(|j| (start + j) % groups).collect();
        if matched == 1 {
            format!("group={}", chosen[0])
        } else if matched * 2 <= groups {
            format!("group in ({})", join(chosen.iter().copied()))
        } else {
            let rest = (0..groups).filter(|g| !chosen.contains(g));
            format!("group notin ({})", join(rest))
        }
    };
    // The text is built from integers: it always parses; an empty selector otherwise.
    Selector::parse(&text, "").unwrap_or_default()
}

fn join(values: impl Iterator<Item = u32>) -> String {
    let mut s = String::new();
    for (n, v) in values.enumerate() {
        if n > 0 {
            s.push(',');
        }
        s.push_str(&v.to_string());
    }
    s
}

/// Delivery lags in ms: exact below 128, then 32 buckets per power of two (about 3 %).
struct LagHistogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

const EXACT: u64 = 128;
const SUB_BITS: u32 = 5;

impl LagHistogram {
    fn new() -> LagHistogram {
        let len = EXACT as usize + (64 - 7) * (1 << SUB_BITS);
        LagHistogram { counts: alloc::vec![0; len], total: 0, sum: 0, max: 0 }
    }

    fn index(v: u64) -> usize {
        if v < EXACT {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        let sub = (v >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        EXACT as usize + (e as usize - 7) * (1 << SUB_BITS) + sub as usize
    }

    /// The smallest and largest value of bucket `i`.
    fn bounds(i: usize) -> (u64, u64) {
        if (i as u64) < EXACT {
            return (i as u64, i as u64);
        }
        let j = i - EXACT as usize;
        let e = (j >> SUB_BITS) as u32 + 7;
        let sub = (j & ((1 << SUB_BITS) - 1)) as u64;
        let lo = ((1 << SUB_BITS) + sub) << (e - SUB_BITS);
        (lo, lo + ((1u64 << (e - SUB_BITS)) - 1))
    }

    fn record(&mut self, lag_ms: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.counts[Self::index(lag_ms)] += n;
        self.total += n;
        self.sum += u128::from(lag_ms) * u128::from(n);
        self.max = self.max.max(lag_ms);
    }

    /// The q-quantile (the middle of its bucket, at most the largest value seen).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = (libm::ceil(q * self.total as f64) as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (lo, hi) = Self::bounds(i);
                let mid = (lo as f64 + hi as f64) / 2.0;
                return Some(mid.min(self.max as f64));
            }
        }
        Some(self.max as f64)
    }

    fn mean(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum as f64 / self.total as f64)
    }
}

// ----- JSON --------------------------------------------------------------------------------------

#[cfg(feature = "serde")]
pub use self::json::{report_to_json, simulate, simulate_str, workload_from_json};

#[cfg(feature = "serde")]
mod json {
    use alloc::borrow::ToOwned;
    use alloc::format;
    use alloc::string::String;
    use alloc::vec::Vec;

    use serde_json::Value;

    use super::{
        Backoff, Burst, Delay, Disconnects, Etcd, RelistFrom, Report, Restart, Watchers, Workload,
        WorkloadError, Writes,
    };
    use crate::replay::json::{kind_of, Fields};
    use crate::replay::{parse_config, ScenarioError};
    use crate::SlowPolicy;

    impl From<ScenarioError> for WorkloadError {
        fn from(e: ScenarioError) -> WorkloadError {
            WorkloadError { path: e.path, message: e.message }
        }
    }

    /// Runs a workload given as JSON text.
    pub fn simulate_str(json: &str) -> Result<Report, WorkloadError> {
        let v: Value = serde_json::from_str(json)
            .map_err(|e| WorkloadError::new("", format!("invalid JSON: {e}")))?;
        simulate(&v)
    }

    /// Runs a workload given as a JSON value.
    pub fn simulate(workload: &Value) -> Result<Report, WorkloadError> {
        super::run(&workload_from_json(workload)?)
    }

    /// The report as JSON text: the summary, then the series with one second per line.
    pub fn report_to_json(report: &Report) -> String {
        // Serialising these plain records cannot fail.
        let summary = serde_json::to_string_pretty(&report.summary).unwrap_or_default();
        let mut out = String::from("{\n\"summary\": ");
        out.push_str(&summary);
        out.push_str(",\n\"series\": [");
        for (i, s) in report.series.iter().enumerate() {
            out.push_str(if i == 0 { "\n" } else { ",\n" });
            out.push_str(&serde_json::to_string(s).unwrap_or_default());
        }
        out.push_str(if report.series.is_empty() { "]\n}\n" } else { "\n]\n}\n" });
        out
    }

    /// A `watchers.<field>` string naming one of two values.
    fn one_of<T: Copy>(
        f: &mut Fields<'_>,
        field: &'static str,
        choices: [(&str, T); 2],
    ) -> Result<Option<T>, WorkloadError> {
        let Some(got) = f.opt_string(field)? else { return Ok(None) };
        match choices.iter().find(|(name, _)| *name == got) {
            Some((_, v)) => Ok(Some(*v)),
            None => Err(WorkloadError::new(
                format!("watchers.{field}"),
                format!("expected {:?} or {:?}, got {got:?}", choices[0].0, choices[1].0),
            )),
        }
    }

    fn non_negative(f: &mut Fields<'_>, field: &'static str) -> Result<Option<f64>, ScenarioError> {
        match f.raw(field) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(ScenarioError::new(
                f.at(field),
                format!("must be a non-negative number, got {}", kind_of(other)),
            )),
        }
    }

    fn array<'a>(f: &mut Fields<'a>, field: &'static str) -> Result<&'a [Value], ScenarioError> {
        match f.raw(field) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(other) => Err(ScenarioError::new(
                f.at(field),
                format!("expected an array, got {}", kind_of(other)),
            )),
        }
    }

    /// Parses (and checks) a workload.
    pub fn workload_from_json(v: &Value) -> Result<Workload, WorkloadError> {
        let mut w = Workload::default();
        let mut f = Fields::new(v, "")?;
        let _name = f.opt_string("name")?;
        let _description = f.opt_string("description")?;
        if let Some(d) = non_negative(&mut f, "duration_s")? {
            w.duration_s = d;
        }
        if let Some(s) = f.opt_u64("seed")? {
            w.seed = s;
        }
        let config = f.raw("config");
        if let Some(v) = f.raw("writes") {
            w.writes = writes(v, w.writes)?;
        }
        if let Some(v) = f.raw("watchers") {
            w.watchers = watchers(v, w.watchers)?;
        }
        if let Some(v) = f.raw("disconnects") {
            w.disconnects = disconnects(v, w.disconnects)?;
        }
        if let Some(v) = f.raw("etcd") {
            w.etcd = etcd(v, w.etcd)?;
        }
        let restarts = array(&mut f, "restarts")?;
        for (i, r) in restarts.iter().enumerate() {
            let mut g = Fields::new(r, &format!("restarts[{i}]"))?;
            let at_s = non_negative(&mut g, "at_s")?;
            let outage_s = non_negative(&mut g, "outage_s")?;
            g.finish()?;
            let Some(at_s) = at_s else {
                return Err(WorkloadError::new(
                    format!("restarts[{i}].at_s"),
                    "required field is missing",
                ));
            };
            w.restarts.push(Restart { at_s, outage_s: outage_s.unwrap_or(10.0) });
        }
        if let Some(b) = f.opt_bool("series")? {
            w.series = b;
        }
        f.finish()?;
        if let Some(c) = config {
            w.config = parse_config(c, "config")?;
            let seeded =
                matches!(c, Value::Object(m) if m.get("seed").is_some_and(|s| !s.is_null()));
            if !seeded {
                w.config.seed = w.seed;
            }
        } else {
            w.config.seed = w.seed;
        }
        w.validate()?;
        Ok(w)
    }

    fn writes(v: &Value, mut w: Writes) -> Result<Writes, WorkloadError> {
        let mut f = Fields::new(v, "writes")?;
        if let Some(r) = non_negative(&mut f, "rate_per_s")? {
            w.rate_per_s = r;
        }
        if let Some(k) = f.opt_u64("keys")? {
            w.keys = k;
        }
        if let Some(d) = non_negative(&mut f, "delete_fraction")? {
            w.delete_fraction = d;
        }
        let bursts = array(&mut f, "bursts")?;
        f.finish()?;
        w.bursts = Vec::with_capacity(bursts.len());
        for (i, b) in bursts.iter().enumerate() {
            let path = format!("writes.bursts[{i}]");
            let mut g = Fields::new(b, &path)?;
            let at_s = non_negative(&mut g, "at_s")?;
            let duration_s = non_negative(&mut g, "duration_s")?;
            let rate_per_s = non_negative(&mut g, "rate_per_s")?;
            g.finish()?;
            let missing = |field: &str| {
                WorkloadError::new(format!("{path}.{field}"), "required field is missing")
            };
            w.bursts.push(Burst {
                at_s: at_s.ok_or_else(|| missing("at_s"))?,
                duration_s: duration_s.ok_or_else(|| missing("duration_s"))?,
                rate_per_s: rate_per_s.ok_or_else(|| missing("rate_per_s"))?,
            });
        }
        Ok(w)
    }

    fn watchers(v: &Value, mut w: Watchers) -> Result<Watchers, WorkloadError> {
        let mut f = Fields::new(v, "watchers")?;
        if let Some(n) = f.opt_u64("count")? {
            w.count = u32::try_from(n).map_err(|_| {
                WorkloadError::new("watchers.count", format!("must be at most 100000, got {n}"))
            })?;
        }
        if let Some(b) = f.opt_bool("bookmarks")? {
            w.bookmarks = b;
        }
        if let Some(s) = non_negative(&mut f, "selector_fraction")? {
            w.selector_fraction = s;
        }
        w.consume_rate_per_s = non_negative(&mut f, "consume_rate_per_s")?;
        if let Some(t) = f.opt_u64("consume_tick_ms")? {
            w.consume_tick_ms = t;
        }
        if let Some(p) = one_of(
            &mut f,
            "slow_policy",
            [("terminate", SlowPolicy::Terminate), ("lag", SlowPolicy::Lag)],
        )? {
            w.slow_policy = p;
        }
        w.timeout_s = non_negative(&mut f, "timeout_s")?;
        if let Some(b) =
            one_of(&mut f, "backoff", [("none", Backoff::None), ("client-go", Backoff::ClientGo)])?
        {
            w.backoff = b;
        }
        if let Some(r) = one_of(
            &mut f,
            "relist_from",
            [("etcd", RelistFrom::Etcd), ("cache", RelistFrom::Cache)],
        )? {
            w.relist_from = r;
        }
        f.finish()?;
        Ok(w)
    }

    fn disconnects(v: &Value, mut d: Disconnects) -> Result<Disconnects, WorkloadError> {
        let mut f = Fields::new(v, "disconnects")?;
        if let Some(r) = non_negative(&mut f, "rate_per_watcher_per_h")? {
            d.rate_per_watcher_per_h = r;
        }
        if let Some(v) = f.raw("reconnect_delay_s") {
            d.reconnect_delay_s = delay(v, "disconnects.reconnect_delay_s")?;
        }
        f.finish()?;
        Ok(d)
    }

    /// A delay: a number (constant) or `{dist: "const"|"exp"|"uniform", ...}`.
    fn delay(v: &Value, path: &str) -> Result<Delay, WorkloadError> {
        if let Value::Number(n) = v {
            return Ok(Delay::Const(n.as_f64().unwrap_or(0.0)));
        }
        let mut f = Fields::new(v, path)?;
        let dist = f.opt_string("dist")?.unwrap_or_else(|| "const".to_owned());
        let need = |f: &mut Fields<'_>, field: &'static str| -> Result<f64, WorkloadError> {
            non_negative(f, field)?.ok_or_else(|| {
                WorkloadError::new(format!("{path}.{field}"), format!("required for dist {dist:?}"))
            })
        };
        let d = match dist.as_str() {
            "const" => Delay::Const(need(&mut f, "value")?),
            "exp" => Delay::Exp { mean: need(&mut f, "mean")? },
            "uniform" => Delay::Uniform { min: need(&mut f, "min")?, max: need(&mut f, "max")? },
            other => {
                return Err(WorkloadError::new(
                    format!("{path}.dist"),
                    format!("expected \"const\", \"exp\" or \"uniform\", got {other:?}"),
                ))
            }
        };
        f.finish()?;
        Ok(d)
    }

    fn etcd(v: &Value, mut e: Etcd) -> Result<Etcd, WorkloadError> {
        let mut f = Fields::new(v, "etcd")?;
        // null (or absent) keeps the default; 0 turns compaction or progress notifies off.
        if let Some(s) = non_negative(&mut f, "compaction_interval_s")? {
            e.compaction_interval_s = (s > 0.0).then_some(s);
        }
        if let Some(n) = f.opt_u64("objects_per_page")? {
            e.objects_per_page = n;
        }
        if let Some(n) = f.opt_u64("cache_objects_per_page")? {
            e.cache_objects_per_page = n;
        }
        if let Some(s) = non_negative(&mut f, "progress_notify_interval_s")? {
            e.progress_notify_interval_s = (s > 0.0).then_some(s);
        }
        f.finish()?;
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_cover_every_value_in_order() {
        let mut prev_hi = None;
        for i in 0..LagHistogram::new().counts.len() {
            let (lo, hi) = LagHistogram::bounds(i);
            assert!(lo <= hi);
            if let Some(p) = prev_hi {
                assert_eq!(lo, p + 1, "bucket {i} starts where {} ended", i - 1);
            }
            assert_eq!(LagHistogram::index(lo), i);
            assert_eq!(LagHistogram::index(hi), i);
            prev_hi = Some(hi);
        }
        assert_eq!(prev_hi, Some(u64::MAX));
        // About 3 % wide above the exact range.
        let (lo, hi) = LagHistogram::bounds(LagHistogram::index(10_000));
        assert!((hi - lo) as f64 / lo as f64 <= 1.0 / 32.0);
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = LagHistogram::new();
        assert_eq!(h.quantile(0.5), None);
        h.record(0, 98);
        h.record(50, 1);
        h.record(5000, 1);
        assert_eq!(h.quantile(0.5), Some(0.0));
        assert_eq!(h.quantile(0.99), Some(50.0));
        let top = h.quantile(1.0).unwrap();
        assert!((4900.0..=5000.0).contains(&top), "{top}");
        assert_eq!(h.max, 5000);
        assert_eq!(h.mean(), Some(50.5));
    }

    #[test]
    fn selector_plans() {
        assert_eq!(selector_plan(1.0), (1, 1));
        assert_eq!(selector_plan(0.0), (1, 0));
        assert_eq!(selector_plan(0.25), (4, 1));
        assert_eq!(selector_plan(0.75), (4, 3));
        assert_eq!(selector_plan(0.001), (1000, 1));
        assert_eq!(selector_plan(0.0002), (5000, 1));
        let (g, m) = selector_plan(0.3719);
        assert!(g <= 100 && (f64::from(m) / f64::from(g) - 0.3719).abs() < 0.004, "{m}/{g}");
        let (g, m) = selector_plan(1e-9);
        assert_eq!((g, m), (MAX_GROUPS, 1), "the smallest share there is");
    }

    #[test]
    fn selectors_select_m_of_g_groups() {
        let obj = |g: u32| {
            Object::new(b"/k", None, 1).with_attrs(Attrs::new(
                [("group", g.to_string())],
                core::iter::empty::<(&str, &str)>(),
            ))
        };
        for (g, m) in [(4, 1), (4, 3), (10, 3), (1, 0), (5000, 1)] {
            for w in 0..7 {
                let s = watcher_selector(w, g, m);
                let matched = (0..g).filter(|&x| s.matches(&obj(x))).count();
                assert_eq!(matched, m as usize, "watcher {w}, {m} of {g}");
            }
        }
        assert!(watcher_selector(3, 1, 1).is_empty());
    }

    #[test]
    fn write_segments_follow_bursts() {
        let w = Writes {
            rate_per_s: 10.0,
            keys: 1,
            delete_fraction: 0.0,
            bursts: alloc::vec![
                Burst { at_s: 5.0, duration_s: 10.0, rate_per_s: 100.0 },
                Burst { at_s: 8.0, duration_s: 2.0, rate_per_s: 0.0 },
            ],
        };
        assert_eq!(
            write_segments(&w),
            alloc::vec![(0.0, 10.0), (5.0, 100.0), (8.0, 0.0), (10.0, 100.0), (15.0, 10.0)]
        );
    }
}
