//! How one prefix's cache is set up: the core's configuration, the flow of events to each kind
//! of watcher, the reflector, and the etcd watch sessions on top. One struct, used as is by the
//! library ([`crate::Cache`]) and inside the server's [`crate::ServeConfig`].
//!
//! Kubernetes counterpart: `storage/cacher/cacher.go`'s `Config` (plus what the apiserver's
//! flags set on it); etcd counterpart: the options of `go.etcd.io/etcd/cache` (`cache.go`).

use std::time::Duration;

/// The largest response watchcache takes from etcd: clientv3's default receive limit
/// (`MaxCallRecvMsgSize`, `math.MaxInt32`), which is also etcd's gRPC send limit. etcd sends a
/// watcher that catches up up to 1 000 revisions in one response, however large, and a Range
/// of any size; tonic's 4 MiB default would refuse them (a relayed watch could then never
/// catch up).
pub const MAX_RECEIVE_BYTES: usize = i32::MAX as usize;

/// Everything one cache is configured with.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// The core's configuration (profile, ring capacity, bookmarks, budgets, ...).
    pub core: cacher_core::Config,
    /// Events an etcd-style watcher may have in flight to its session before the core queues
    /// for it. Whole revisions are never cut: a revision larger than this is sent whole.
    pub grpc_credit: u64,
    /// Events queued per etcd-style watcher in the core before it falls behind and is replayed
    /// from the ring buffer (a position, not a copy).
    pub grpc_queue: usize,
    /// Events a Kubernetes-style watcher may have in flight (its result channel).
    pub kube_credit: u64,
    /// The reflector's list and watch settings.
    pub reflector: ReflectorOptions,
    /// How often idle watches that asked for it get a progress notification (etcd: 10 min).
    pub progress_notify_interval: Duration,
    /// How often a watch served by etcd checks whether it can move back onto the cache.
    pub rejoin_interval: Duration,
    /// How long a new watch waits for a cache that is (re)initialising before going to etcd.
    pub create_wait: Duration,
    /// How a linearizable read, or a watch from "now", learns etcd's current revision.
    pub freshness: Freshness,
    /// The shortest time between two sends of deliveries to the watch sessions: events that
    /// come sooner after a send are gathered and go together at the end of it (at most this
    /// much later). 0 sends after every wake-up of the cache.
    pub delivery_coalesce: Duration,
    /// etcd's `--max-request-bytes` (1.5 MiB by default): set it to the etcd cluster's own, so
    /// that watches created with `fragment` are cut where etcd cuts them (at this plus etcd's
    /// 512 KiB gRPC allowance) and RangeStream chunks are as large as etcd's.
    pub max_request_bytes: usize,
    /// A library cache relays watches from before its window over its user's client: how long
    /// such a relay waits for its reader before it ends its etcd watch, so that etcd's unread
    /// responses do not hold up the client's other calls (the watch is taken up again, after
    /// its last revision delivered, when it is read). The server's relays have a connection
    /// of their own and never pause.
    pub relay_pause_after: Duration,
}

/// Where the current revision of a linearizable read comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Freshness {
    /// When etcd is one voting member: the revision of a `created` answer on the cache's own
    /// upstream watch stream (a watcher made and cancelled there; no Range, no raft round).
    /// Otherwise a quorum read, as [`Freshness::Quorum`].
    #[default]
    Auto,
    /// Always a linearizable read of one key (a quorum read; Kubernetes'
    /// `GetCurrentResourceVersionFromStorage`).
    Quorum,
}

impl Freshness {
    /// Parses `auto` or `quorum`.
    pub fn parse(s: &str) -> Result<Freshness, String> {
        match s {
            "auto" => Ok(Freshness::Auto),
            "quorum" => Ok(Freshness::Quorum),
            other => Err(format!("--freshness: {other:?} is not one of auto, quorum")),
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            core: host_core_config(cacher_core::Profile::V1_34),
            grpc_credit: 256,
            grpc_queue: 256,
            kube_credit: 100,
            reflector: ReflectorOptions::default(),
            progress_notify_interval: Duration::from_secs(600),
            rejoin_interval: Duration::from_secs(1),
            create_wait: Duration::from_secs(5),
            freshness: Freshness::Auto,
            delivery_coalesce: Duration::from_millis(5),
            max_request_bytes: ETCD_MAX_REQUEST_BYTES,
            relay_pause_after: Duration::from_secs(1),
        }
    }
}

/// etcd's default `--max-request-bytes` (`embed.DefaultMaxRequestBytes`, 1.5 MiB).
pub const ETCD_MAX_REQUEST_BYTES: usize = 1536 << 10;

/// What etcd allows on top of `--max-request-bytes` for gRPC's own framing
/// (`grpcOverheadBytes`): etcd's watch server fragments at the sum
/// (`MaxRequestBytesWithOverhead`).
pub const ETCD_GRPC_OVERHEAD_BYTES: usize = 512 << 10;

/// The core's configuration for `profile` as the host runs it: Kubernetes' mechanisms, with two
/// of the core's switches set for an etcd cache — a watcher whose queue is full does not stall
/// the others (`non_blocking_dispatch`; Kubernetes' single dispatcher waits for it,
/// kubernetes#141450), and a broken upstream watch relists at once (`relist_delay_ms` 0: the
/// reflector relists by itself; Kubernetes' `wait.Until` waits 1 s first).
pub fn host_core_config(profile: cacher_core::Profile) -> cacher_core::Config {
    let mut c = cacher_core::Config::for_profile(profile);
    c.non_blocking_dispatch = true;
    c.relist_delay_ms = 0;
    c
}

impl CacheConfig {
    /// Checks the settings (the core's rules, and the host's: credits and queues of at least 1).
    pub fn validate(&self) -> Result<(), String> {
        self.core
            .validate()
            .map_err(|e| format!("--{}: {}", e.field.replace('_', "-"), e.message))?;
        if self.grpc_credit == 0 || self.grpc_queue == 0 || self.kube_credit == 0 {
            return Err(
                "--grpc-credit, --grpc-queue and the Kubernetes credit must be at least 1".into()
            );
        }
        if self.max_request_bytes == 0 {
            return Err("--max-request-bytes: at least 1 (etcd's own must be above 0)".into());
        }
        if self.progress_notify_interval < Duration::from_millis(100) {
            return Err("--progress-notify-interval: at least 100ms (etcd's minimum)".into());
        }
        Ok(())
    }
}

/// Reflector settings.
#[derive(Clone, Debug)]
pub struct ReflectorOptions {
    /// Objects per list page (Kubernetes' `storageWatchListPageSize`, 10 000).
    pub page_size: i64,
    /// First retry delay after a failure.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Largest etcd response accepted (list pages and watch batches); clientv3's limit.
    pub max_message_bytes: usize,
    /// Revisions on their way from the reflector to the cache before the reflector stops
    /// reading etcd's watch stream (so a slow cache slows its own upstream watch, never
    /// memory without bound).
    pub inbox_revisions: usize,
    /// On each (re)list, how many revisions of etcd's history to load into the window before
    /// serving (so watchers resuming from them after a restart or relist are served from
    /// memory). 0 lists at the current revision only, as Kubernetes' reflector does. At most
    /// what the ring can hold is loaded.
    pub backfill_revisions: u64,
    /// How old the cache's knowledge of etcd's compaction may be when it serves a past
    /// revision: a read or watch at a revision below the cache's first asks etcd (one read of
    /// one key) when the last answer is older than this (0: never ask; the cache then learns
    /// a compaction only from watches and reads etcd refuses).
    pub compaction_probe: Duration,
    /// How often to re-read etcd's member list (for [`Freshness::Auto`]).
    pub membership_check: Duration,
    /// How often to compare the cache with etcd (Kubernetes' consistency checker; 0: never).
    pub consistency_check_interval: Duration,
}

impl Default for ReflectorOptions {
    fn default() -> Self {
        ReflectorOptions {
            page_size: 10_000,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            max_message_bytes: MAX_RECEIVE_BYTES,
            inbox_revisions: 1024,
            backfill_revisions: 10_000,
            compaction_probe: Duration::from_secs(1),
            membership_check: Duration::from_secs(5),
            consistency_check_interval: Duration::from_secs(300),
        }
    }
}
