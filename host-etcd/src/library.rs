//! The cache as a library: an in-process etcd watch cache for Rust programs (controllers,
//! service registries, config watchers), the way Go programs use etcd's `cache` package —
//! without a separate server. It sits on the cache task (`cache/`) and the watch session
//! (`session/`); the `watchcache` server is one more user of the same pieces, and of
//! [`range_from_cache`], the one place a Range is answered from memory.
//!
//! etcd counterpart: `go.etcd.io/etcd/cache` (`cache.go`: `New`, `Watch`, `Get`, `WaitReady`,
//! `RequestProgress`, `Close`); Kubernetes counterpart: the cacher in front of the etcd3 store.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cacher_core::{KeyRange, RangeOutcome, RangeRequest};
use etcd_client::proto::{PbRangeResponse, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::cache::{new_cache, CacheHandle, CacheStatus};
use crate::clock::Clock;
use crate::config::CacheConfig;
use crate::convert::{pb_event, range_response, FILTER_NODELETE, FILTER_NOPUT};
use crate::keys::Keys;
use crate::metrics::{CacheSample, HostMetrics};
use crate::session::driver::{SessionDriver, SessionEnv};
use crate::session::{Response, SessionConfig};
use crate::upstream::Upstream;

/// Options of [`Cache::watch`].
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    start_revision: i64,
    prev_kv: bool,
    progress_notify: bool,
    no_put: bool,
    no_delete: bool,
}

impl WatchOptions {
    /// Defaults: from now, no previous values, no progress notifications, no filters.
    pub fn new() -> WatchOptions {
        WatchOptions::default()
    }

    /// Events from this revision on (inclusive; 0 = from now). Revisions older than the cache's
    /// window are served by etcd, transparently; compacted ones end the stream with
    /// [`Error::Compacted`].
    pub fn with_start_revision(mut self, rev: i64) -> WatchOptions {
        self.start_revision = rev;
        self
    }

    /// Each event carries the key's previous value.
    pub fn with_prev_kv(mut self) -> WatchOptions {
        self.prev_kv = true;
        self
    }

    /// Idle watches get a progress notification now and then (see
    /// [`CacheConfig::progress_notify_interval`]).
    pub fn with_progress_notify(mut self) -> WatchOptions {
        self.progress_notify = true;
        self
    }

    /// Leave out puts.
    pub fn with_no_put(mut self) -> WatchOptions {
        self.no_put = true;
        self
    }

    /// Leave out deletes.
    pub fn with_no_delete(mut self) -> WatchOptions {
        self.no_delete = true;
        self
    }
}

/// Options of [`Cache::get`].
#[derive(Clone, Debug, Default)]
pub struct GetOptions {
    revision: i64,
    serializable: bool,
    limit: i64,
    keys_only: bool,
    count_only: bool,
}

impl GetOptions {
    /// Defaults, as etcd's: the latest state, consistent (linearizable), no limit.
    pub fn new() -> GetOptions {
        GetOptions::default()
    }

    /// The state at this revision (0 = latest): from the cache's snapshots while it holds
    /// them, else from etcd.
    pub fn with_revision(mut self, rev: i64) -> GetOptions {
        self.revision = rev;
        self
    }

    /// Whatever the cache holds now, without asking etcd how current that is.
    pub fn with_serializable(mut self) -> GetOptions {
        self.serializable = true;
        self
    }

    /// At most this many keys (`more` says whether there are others).
    pub fn with_limit(mut self, limit: i64) -> GetOptions {
        self.limit = limit;
        self
    }

    /// Keys without values.
    pub fn with_keys_only(mut self) -> GetOptions {
        self.keys_only = true;
        self
    }

    /// Only the count.
    pub fn with_count_only(mut self) -> GetOptions {
        self.count_only = true;
        self
    }
}

/// Errors of the library.
#[derive(Debug)]
pub enum Error {
    /// The keys are not under the cache's prefix.
    OutsidePrefix {
        /// The keys asked for, for display.
        keys: String,
        /// The cache's prefix, for display.
        prefix: String,
    },
    /// A malformed request (an empty range, a negative revision, ...).
    InvalidRequest(String),
    /// The watch's revision has been compacted by etcd (the stream ends).
    Compacted {
        /// etcd's compaction revision.
        compact_revision: i64,
    },
    /// etcd ended the watch for another reason (the stream ends).
    Canceled(String),
    /// etcd answered with an error.
    Etcd(etcd_client::Error),
    /// The cache or etcd cannot be reached (closed, shutting down, etcd down).
    Unavailable(String),
    /// The cache did not become ready in time.
    NotReady(Duration),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutsidePrefix { keys, prefix } => {
                write!(f, "{keys} is outside the cache's prefix {prefix:?}")
            }
            Error::InvalidRequest(m) => write!(f, "invalid request: {m}"),
            Error::Compacted { compact_revision } => {
                write!(
                    f,
                    "the watch's revision has been compacted (compact revision {compact_revision})"
                )
            }
            Error::Canceled(m) => write!(f, "etcd canceled the watch: {m}"),
            Error::Etcd(e) => write!(f, "etcd: {e}"),
            Error::Unavailable(m) => write!(f, "unavailable: {m}"),
            Error::NotReady(d) => write!(f, "the cache was not ready within {d:?}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Etcd(e) => Some(e),
            _ => None,
        }
    }
}

/// A Range the cache may answer: the keys, the revision (0 = latest), consistency, and what to
/// leave out.
#[derive(Clone, Debug)]
pub struct RangeQuery {
    /// The keys.
    pub range: KeyRange,
    /// The revision to read at (0 = the latest).
    pub revision: u64,
    /// Whatever the cache holds (no freshness check).
    pub serializable: bool,
    /// At most this many keys (0 = all).
    pub limit: u64,
    /// Keys without values.
    pub keys_only: bool,
    /// Only the count.
    pub count_only: bool,
}

/// etcd's `Range` answered from the cache, when the cache can give exactly etcd's answer: the
/// cache is ready, the revision is not compacted, and the core can serve it (a serializable
/// read, a read at a revision still in its snapshots, or a consistent read once it has caught
/// up with etcd's current revision). `None`: ask etcd. Used by [`Cache::get`] and by the
/// server's `KV.Range`.
pub async fn range_from_cache(
    cache: &CacheHandle,
    upstream: &Upstream,
    q: &RangeQuery,
) -> Option<PbRangeResponse> {
    let status = cache.status();
    // etcd refuses a revision below its compaction; the cache must not answer it either.
    if !status.ready || (q.revision > 0 && q.revision < status.compacted) {
        return None;
    }
    // A linearizable read at a past revision: the data at that revision never changes, but
    // etcd's header is its current revision, so the cache first catches up with etcd (the same
    // freshness check as a read of the latest state) and answers with that header.
    let mut fresh = 0;
    if !q.serializable && q.revision > 0 {
        let probe =
            RangeRequest { range: q.range.clone(), revision: 0, linearizable: true, limit: 1 };
        match cache.range(probe).await {
            Ok(RangeOutcome::Cache(read)) => fresh = read.header_rv,
            Ok(RangeOutcome::Storage { .. }) | Err(_) => return None,
        }
    }
    let req = RangeRequest {
        range: q.range.clone(),
        revision: q.revision,
        linearizable: !q.serializable && q.revision == 0,
        limit: q.limit,
    };
    match cache.range(req).await {
        Ok(RangeOutcome::Cache(read)) => Some(range_response(
            &read,
            upstream.header(read.header_rv.max(fresh) as i64),
            q.keys_only,
            q.count_only,
        )),
        Ok(RangeOutcome::Storage { .. }) | Err(_) => None,
    }
}

/// One prefix's cache task and reflector, started together.
pub(crate) struct Spawned {
    pub handle: CacheHandle,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Starts a cache task and its reflector for `prefix`.
pub(crate) fn spawn_cache(
    prefix: &[u8],
    config: Arc<CacheConfig>,
    clock: Clock,
    upstream: &Upstream,
    metrics: &Arc<HostMetrics>,
    shutdown: watch::Receiver<bool>,
) -> Result<Spawned, String> {
    let made = new_cache(prefix, config.clone(), clock, upstream.clone(), metrics.clone())?;
    // Load no more history than the ring can hold.
    let mut reflector = config.reflector.clone();
    let ring = if config.core.dynamic_capacity {
        config.core.upper_bound_capacity
    } else {
        config.core.capacity
    };
    reflector.backfill_revisions = reflector.backfill_revisions.min(ring as u64);
    let checker = crate::consistency::check_periodically(
        made.handle.clone(),
        upstream.clone(),
        metrics.clone(),
        reflector.consistency_check_interval,
        shutdown.clone(),
    );
    let membership = crate::consistency::follow_membership(
        upstream.clone(),
        reflector.membership_check,
        shutdown.clone(),
    );
    let tasks = vec![
        tokio::spawn(membership),
        tokio::spawn(checker),
        tokio::spawn(made.task.run()),
        tokio::spawn(crate::reflector::run(
            Arc::from(prefix),
            upstream.clone(),
            made.storage_tx,
            made.ctl_rx,
            metrics.clone(),
            reflector,
            shutdown,
        )),
    ];
    Ok(Spawned { handle: made.handle, tasks })
}

/// The watch sessions' settings for caches configured with `config`.
pub(crate) fn session_config(config: &CacheConfig, check_permissions: bool) -> SessionConfig {
    SessionConfig {
        progress_notify_interval_ms: config.progress_notify_interval.as_millis() as u64,
        rejoin_interval_ms: (config.rejoin_interval.as_millis() as u64).max(10),
        create_wait_ms: config.create_wait.as_millis() as u64,
        credit_batch: (config.grpc_credit / 4).max(1),
        fragment_bytes: config
            .max_request_bytes
            .saturating_add(crate::config::ETCD_GRPC_OVERHEAD_BYTES),
        relay_pause_ms: (config.relay_pause_after.as_millis() as u64).max(1),
        check_permissions,
        ..SessionConfig::default()
    }
}

/// An in-process etcd watch cache of one key prefix.
///
/// It lists the prefix once, watches it with one etcd watch, and serves watches and reads from
/// memory with etcd's semantics; what it cannot serve it asks etcd for, transparently. Dropping
/// it (or [`Cache::close`]) stops it; open watch streams then end.
pub struct Cache {
    env: Arc<SessionEnv>,
    prefix: Vec<u8>,
    streams: std::sync::Mutex<Vec<mpsc::WeakUnboundedSender<Result<PbWatchRequest, Status>>>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache").field("prefix", &String::from_utf8_lossy(&self.prefix)).finish()
    }
}

impl Cache {
    /// A cache of `prefix` fed through `client`, with the default configuration (Kubernetes
    /// v1.34 profile). Returns at once; see [`Cache::wait_ready`]. The cache's own watch, and
    /// the watches etcd serves for it, share `client`'s connection: a watch of your own on that
    /// client that you stop reading holds them up once its responses fill the connection's
    /// window, as it would your other calls. [`Cache::connect`] gives the cache a connection
    /// of its own.
    pub async fn new(
        client: etcd_client::Client,
        prefix: impl Into<Vec<u8>>,
    ) -> Result<Cache, Error> {
        Cache::with_config(client, prefix, CacheConfig::default()).await
    }

    /// A cache of `prefix` with the given configuration.
    pub async fn with_config(
        client: etcd_client::Client,
        prefix: impl Into<Vec<u8>>,
        config: CacheConfig,
    ) -> Result<Cache, Error> {
        let upstream = Upstream::from_client(client).await.map_err(Error::Unavailable)?;
        Cache::start(upstream, prefix.into(), config).await
    }

    /// Connects to etcd at `endpoints` and caches `prefix`.
    pub async fn connect<E: AsRef<str>>(
        endpoints: &[E],
        options: Option<etcd_client::ConnectOptions>,
        prefix: impl Into<Vec<u8>>,
    ) -> Result<Cache, Error> {
        let client = etcd_client::Client::connect(endpoints, options).await.map_err(Error::Etcd)?;
        Cache::new(client, prefix).await
    }

    async fn start(
        upstream: Upstream,
        prefix: Vec<u8>,
        config: CacheConfig,
    ) -> Result<Cache, Error> {
        config.validate().map_err(Error::InvalidRequest)?;
        let metrics = Arc::new(HostMetrics::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let clock = Clock::new();
        let sessions = session_config(&config, false);
        let spawned =
            spawn_cache(&prefix, Arc::new(config), clock, &upstream, &metrics, shutdown_rx.clone())
                .map_err(Error::InvalidRequest)?;
        let env = Arc::new(SessionEnv {
            caches: vec![spawned.handle],
            upstream,
            metrics,
            permissions: None,
            clock,
            config: sessions,
            shutdown: shutdown_rx,
        });
        Ok(Cache {
            env,
            prefix,
            streams: std::sync::Mutex::new(Vec::new()),
            shutdown,
            tasks: spawned.tasks,
        })
    }

    fn handle(&self) -> &CacheHandle {
        &self.env.caches[0]
    }

    /// The cached prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Whether the cache has listed the prefix and serves from memory.
    pub fn ready(&self) -> bool {
        self.handle().status().ready
    }

    /// Waits until the cache is ready, at most `limit`.
    pub async fn wait_ready(&self, limit: Duration) -> Result<(), Error> {
        if self.handle().wait_ready(limit).await {
            Ok(())
        } else {
            Err(Error::NotReady(limit))
        }
    }

    /// Revision, window, store size, watchers: what the cache is now.
    pub fn status(&self) -> CacheStatus {
        self.handle().status()
    }

    /// The core's metrics (the Kubernetes watch-cache counters) and the watchers' lag.
    pub async fn metrics(&self) -> Option<CacheSample> {
        self.handle().sample().await
    }

    /// The whole state as JSON (window, store, snapshots, each watcher and its lag).
    pub async fn debug_state(&self) -> serde_json::Value {
        self.handle().debug_state().await
    }

    /// Watches open on etcd right now: the cache's own, plus any watch that etcd serves
    /// because it started before the cache's window.
    pub fn upstream_watches(&self) -> i64 {
        self.env.metrics.upstream_watches()
    }

    /// Requests sent to etcd so far, by kind (`list`, `watch`, `quorum_read`, `range`, ...).
    pub fn upstream_requests(&self, kind: &str) -> u64 {
        self.env.metrics.upstream_requests(kind)
    }

    fn check_prefix(&self, keys: &Keys) -> Result<KeyRange, Error> {
        let range = keys.key_range().map_err(Error::InvalidRequest)?;
        if !self.handle().covers(&range) {
            return Err(Error::OutsidePrefix {
                keys: format!("{keys:?}"),
                prefix: String::from_utf8_lossy(&self.prefix).into_owned(),
            });
        }
        Ok(range)
    }

    /// Watches `keys` with etcd's semantics: the stream yields etcd's `WatchResponse`s
    /// (whole revisions per response, `prev_kv` when asked, progress notifications when asked
    /// and after [`WatchStream::request_progress`]); a compacted start revision ends it with
    /// [`Error::Compacted`]. A watch from before the cache's window is served by etcd over the
    /// client's connection; a stream left unread for [`CacheConfig::relay_pause_after`] (1 s)
    /// while etcd has more for it ends that etcd watch, and takes it up again after its last
    /// revision delivered when it is read again, so that it holds up neither the client's other
    /// calls nor the cache.
    pub async fn watch(&self, keys: Keys, options: WatchOptions) -> Result<WatchStream, Error> {
        self.check_prefix(&keys)?;
        let (key, range_end) = keys.etcd();
        let mut create = PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
        };
        if let Some(PbWatchRequestUnion::CreateRequest(c)) = create.request_union.as_mut() {
            c.key = key;
            c.range_end = range_end;
            c.start_revision = options.start_revision;
            c.prev_kv = options.prev_kv;
            c.progress_notify = options.progress_notify;
            if options.no_put {
                c.filters.push(FILTER_NOPUT);
            }
            if options.no_delete {
                c.filters.push(FILTER_NODELETE);
            }
        }
        // Unbounded: the session reads its requests only while the stream is polled, and a
        // caller that asks for progress must not wait for that.
        let (req_tx, req_rx) = mpsc::unbounded_channel::<Result<PbWatchRequest, Status>>();
        let driver = SessionDriver::new(
            self.env.clone(),
            MetadataMap::new(),
            tokio_stream::wrappers::UnboundedReceiverStream::new(req_rx),
        );
        req_tx.send(Ok(create)).map_err(|_| Error::Unavailable("the cache is closed".into()))?;
        let mut stream = WatchStream { req_tx, driver: Box::new(driver), watch_id: 0, done: false };
        let created = match futures::StreamExt::next(&mut stream).await {
            Some(Ok(r)) => r,
            Some(Err(e)) => return Err(e),
            None => return Err(Error::Unavailable("the cache is closed".into())),
        };
        stream.watch_id = created.watch_id();
        if let Ok(mut v) = self.streams.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(stream.req_tx.downgrade());
        }
        Ok(stream)
    }

    /// Reads `keys` as etcd's `Range` would: from the cache when it can answer exactly (a
    /// serializable read, a read at a revision it still holds, or a consistent read once it
    /// has caught up with etcd's current revision); otherwise from etcd.
    pub async fn get(
        &self,
        keys: Keys,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, Error> {
        let range = self.check_prefix(&keys)?;
        if options.revision >= 0 && options.limit >= 0 {
            let q = RangeQuery {
                range,
                revision: options.revision as u64,
                serializable: options.serializable,
                limit: options.limit as u64,
                keys_only: options.keys_only,
                count_only: options.count_only,
            };
            if let Some(resp) = range_from_cache(self.handle(), &self.env.upstream, &q).await {
                self.env.metrics.count_range(true);
                return Ok(etcd_client::GetResponse(resp));
            }
        }
        self.get_from_etcd(&keys, &options).await
    }

    async fn get_from_etcd(
        &self,
        keys: &Keys,
        o: &GetOptions,
    ) -> Result<etcd_client::GetResponse, Error> {
        self.env.metrics.count_range(false);
        self.env.metrics.count_upstream_request("range");
        let (key, end) = keys.etcd();
        let mut g = etcd_client::GetOptions::new().with_revision(o.revision).with_limit(o.limit);
        if !end.is_empty() {
            g = g.with_range(end);
        }
        if o.serializable {
            g = g.with_serializable();
        }
        if o.keys_only {
            g = g.with_keys_only();
        }
        if o.count_only {
            g = g.with_count_only();
        }
        self.env.upstream.kv().get(key, Some(g)).await.map_err(Error::Etcd)
    }

    /// Asks every open watch stream for a progress notification (see
    /// [`WatchStream::request_progress`]).
    pub async fn request_progress(&self) {
        let senders: Vec<_> = self
            .streams
            .lock()
            .map(|v| v.iter().filter_map(|w| w.upgrade()).collect())
            .unwrap_or_default();
        for tx in senders {
            let req = PbWatchRequest {
                request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
            };
            let _ = tx.send(Ok(req));
        }
    }

    /// Stops the cache: the reflector's watch on etcd ends (awaited), open watch streams end,
    /// and the cache's task ends once the last handle to it is gone.
    pub async fn close(mut self) {
        let _ = self.shutdown.send(true);
        let tasks = std::mem::take(&mut self.tasks);
        drop(self);
        // The reflector and the checks stop on the signal; the cache task when its inbox
        // closes, which the sessions' ends, the checks' ends and this drop bring about.
        for t in tasks.into_iter().rev() {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

fn cancel_error(r: &PbWatchResponse) -> Error {
    if r.compact_revision > 0 {
        Error::Compacted { compact_revision: r.compact_revision }
    } else {
        Error::Canceled(r.cancel_reason.clone())
    }
}

/// A library watch's session, reading its requests from the stream's channel.
type WatchDriver =
    SessionDriver<tokio_stream::wrappers::UnboundedReceiverStream<Result<PbWatchRequest, Status>>>;

/// A watch: a `futures::Stream` of etcd's `WatchResponse`s. Dropping it cancels the watch.
/// Its session runs as the stream is polled.
pub struct WatchStream {
    req_tx: mpsc::UnboundedSender<Result<PbWatchRequest, Status>>,
    driver: Box<WatchDriver>,
    watch_id: i64,
    done: bool,
}

impl fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchStream")
            .field("watch_id", &self.watch_id)
            .field("done", &self.done)
            .finish()
    }
}

impl WatchStream {
    /// The watch's id (as etcd would number it on a fresh stream).
    pub fn watch_id(&self) -> i64 {
        self.watch_id
    }

    /// Asks for a progress notification: a response with no events whose header revision
    /// says that every event up to it has been delivered (watch id -1, as etcd sends it). It
    /// comes once everything before it has been delivered.
    pub async fn request_progress(&self) -> Result<(), Error> {
        let req = PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
        };
        self.req_tx.send(Ok(req)).map_err(|_| Error::Unavailable("the watch has ended".into()))
    }

    /// The next response (`None` when the watch has ended).
    pub async fn message(&mut self) -> Option<Result<etcd_client::WatchResponse, Error>> {
        futures::StreamExt::next(self).await
    }
}

/// A session's response as etcd's message (cached events converted, never encoded and
/// decoded).
fn watch_response(r: Response) -> PbWatchResponse {
    match r {
        Response::Message(m) => m,
        Response::Events(e) => PbWatchResponse {
            header: Some(e.header),
            watch_id: e.watch_id,
            fragment: e.fragment,
            events: e
                .picks
                .iter()
                .filter_map(|i| e.run.event(i).map(|ev| pb_event(ev, e.run.prev_kv(i, e.prev_kv))))
                .collect(),
            ..Default::default()
        },
    }
}

impl futures::Stream for WatchStream {
    type Item = Result<etcd_client::WatchResponse, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        // One response per poll: the rest wait in the session's driver (their credit goes back
        // to the caches as each is taken).
        let mut one = None;
        let next = match self.driver.poll_responses(cx, 1, |r, _| one = Some(r)) {
            Poll::Ready(Ok(())) => Poll::Ready(one.map(Ok)),
            Poll::Ready(Err(s)) => Poll::Ready(Some(Err(s))),
            Poll::Pending => Poll::Pending,
        };
        match next {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(Error::Unavailable("the cache is closed".into()))))
            }
            Poll::Ready(Some(Err(s))) => {
                self.done = true;
                Poll::Ready(Some(Err(Error::Unavailable(s.message().to_owned()))))
            }
            Poll::Ready(Some(Ok(r))) => {
                let r = watch_response(r);
                if r.canceled {
                    self.done = true;
                    Poll::Ready(Some(Err(cancel_error(&r))))
                } else {
                    Poll::Ready(Some(Ok(etcd_client::WatchResponse(r))))
                }
            }
        }
    }
}
