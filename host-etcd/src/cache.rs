//! One task per cached prefix owns a core [`Cacher`]: it feeds it what the reflector reads from
//! etcd and what clients ask, passes the time in, and carries out what the core asks for
//! (deliveries, read results, progress requests, quorum reads, relists).
//!
//! Kubernetes counterpart: the goroutines around one `Cacher` in `cacher.go` (`dispatchEvents`,
//! `startCaching`, the watchers' `processInterval`), here one task with a command inbox.
//! Deliveries are batched per watcher per wake-up; the events of one revision are encoded once
//! per option set and framed per watcher (`proto.rs`).

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cacher_core::{
    Cacher, Change, CloseCause, Config, GetRequest, KeyRange, ListRequest, Object, Output,
    RangeOutcome, RangeRequest, ReadOutcome, ReadyState, RequestId, Status, Timestamp, WatchEvent,
    WatchRequest,
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::metrics::{CacheSample, HostMetrics};
use crate::proto::{encode_event_field, EncodedEvent, FILTER_NODELETE, FILTER_NOPUT};
use crate::upstream::Upstream;

/// What a cache publishes for sessions and HTTP handlers to read without a round trip.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CacheStatus {
    /// The ready gate is open.
    pub ready: bool,
    /// The cache's revision (the last etcd revision it has applied).
    pub rv: u64,
    /// The oldest revision a watch can start after (exclusive), if any.
    pub oldest_servable: Option<u64>,
    /// How many times the cache has been (re)initialised from a list.
    pub generation: u64,
    /// Objects in the store.
    pub store_len: usize,
    /// Open watchers.
    pub watchers: usize,
    /// Last storage error, if any.
    pub last_error: Option<String>,
}

/// How the host configures one prefix's cache.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// The core's configuration.
    pub core: Config,
    /// Events a gRPC watcher may have in flight to its client before the core queues for it.
    pub grpc_credit: u64,
    /// Queue length of a gRPC watcher in the core before it falls behind and is replayed from
    /// the ring buffer.
    pub grpc_queue: usize,
    /// Events a Kubernetes-style HTTP watcher may have in flight (its result channel).
    pub kube_credit: u64,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            core: Config::default(),
            grpc_credit: 1024,
            grpc_queue: 1024,
            kube_credit: 100,
        }
    }
}

/// Where events for one session's watch go.
pub(crate) type SessionSink = mpsc::UnboundedSender<SessionEvent>;

/// What a cache (or an upstream relay, or a timer) tells a gRPC watch session.
#[derive(Debug)]
pub(crate) enum SessionEvent {
    /// Events for a watch, whole revisions, already encoded.
    Events { tag: u64, header_rev: u64, events: Arc<[EncodedEvent]>, credit: u64 },
    /// Credit to return for events the host filtered out entirely (nothing to send).
    /// The cache already returned it; this only lets the session account the revision.
    Skipped { tag: u64, last_rev: u64 },
    /// The cached watch ended.
    Closed { tag: u64, cause: CloseCause, last_rv: u64, message: Option<String> },
    /// Answer to [`Cmd::Frontier`]: per watch, the revision up to which everything has been
    /// delivered (if it is caught up with the cache).
    Frontier { token: u64, results: Vec<(u64, Option<u64>)>, cache_rv: u64 },
    /// A response from a pass-through watch's own etcd stream (`None`: the stream ended).
    Upstream {
        tag: u64,
        generation: u64,
        resp: Option<Result<etcd_client::proto::PbWatchResponse, tonic::Status>>,
    },
    /// Try again to start a watch (after waiting for the cache).
    Retry { tag: u64 },
    /// Time to answer pending progress requests again.
    ProgressRetry,
}

/// An etcd-style watch registered in a cache.
#[derive(Debug)]
pub(crate) struct EtcdWatchSpec {
    pub range: KeyRange,
    /// The core watch starts after this revision.
    pub start_after: u64,
    /// Events below this revision are not sent (a start revision ahead of the cache).
    pub min_rev: u64,
    pub prev_kv: bool,
    pub filters: Vec<i32>,
    pub tag: u64,
    pub sink: SessionSink,
}

/// The outcome of registering an etcd-style watch.
#[derive(Debug)]
pub(crate) enum WatchStartReply {
    /// Served from the cache; changes after `rv` follow.
    Started { id: RequestId },
    /// The cache cannot serve it (too old, not ready, ...): go to etcd.
    Miss { reason: String },
}

/// An item of a Kubernetes-style watch.
#[derive(Debug)]
pub enum KubeItem {
    /// The watch is registered.
    Started,
    /// The request failed before starting (HTTP error).
    Rejected(Status),
    /// The core sends this watch to storage.
    Delegated(&'static str),
    /// Events (credit to return once written).
    Events(Vec<WatchEvent>),
    /// An ERROR item.
    Error(Status),
    /// The watch ended.
    Closed(CloseCause),
}

/// Commands to a cache task.
pub(crate) enum Cmd {
    EtcdWatch {
        spec: EtcdWatchSpec,
        reply: oneshot::Sender<WatchStartReply>,
    },
    KubeWatch {
        req: WatchRequest,
        sink: mpsc::UnboundedSender<KubeItem>,
        reply: oneshot::Sender<Result<RequestId, Status>>,
    },
    Credit {
        id: RequestId,
        n: u64,
    },
    Cancel {
        id: RequestId,
    },
    Range {
        req: RangeRequest,
        reply: oneshot::Sender<Result<RangeOutcome, Status>>,
    },
    List {
        req: ListRequest,
        reply: oneshot::Sender<Result<ReadOutcome, Status>>,
    },
    Get {
        req: GetRequest,
        reply: oneshot::Sender<Result<ReadOutcome, Status>>,
    },
    Frontier {
        watches: Vec<(u64, RequestId)>,
        sink: SessionSink,
        token: u64,
    },
    State {
        reply: oneshot::Sender<serde_json::Value>,
    },
    Metrics {
        reply: oneshot::Sender<CacheSample>,
    },
    Storage(StorageMsg),
    CurrentRevision {
        id: RequestId,
        rv: u64,
    },
}

/// What the reflector tells its cache.
#[derive(Debug)]
pub(crate) enum StorageMsg {
    Replace { rv: u64, objects: Vec<Object> },
    Revision { rv: u64, changes: Vec<Change> },
    Progress { rv: u64 },
    Error { reason: String },
    Compacted { rv: u64 },
}

/// What a cache asks of its reflector.
#[derive(Debug)]
pub(crate) enum ReflectorCtl {
    Progress,
    Relist(String),
}

/// A handle to one prefix's cache task.
#[derive(Clone)]
pub struct CacheHandle {
    pub(crate) tx: mpsc::UnboundedSender<Cmd>,
    prefix: Arc<[u8]>,
    status: watch::Receiver<CacheStatus>,
    pub(crate) options: Arc<CacheOptions>,
}

impl std::fmt::Debug for CacheHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheHandle")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish()
    }
}

fn gone() -> Status {
    Status::new(cacher_core::Reason::ServiceUnavailable, "the cache is shutting down")
}

impl CacheHandle {
    /// The cached key prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The prefix for display.
    pub fn prefix_str(&self) -> String {
        String::from_utf8_lossy(&self.prefix).into_owned()
    }

    /// Whether every key of `range` is under this cache's prefix.
    pub fn covers(&self, range: &KeyRange) -> bool {
        range_within_prefix(range, &self.prefix)
    }

    /// The latest published status.
    pub fn status(&self) -> CacheStatus {
        self.status.borrow().clone()
    }

    /// A receiver that changes whenever the status does.
    pub fn subscribe(&self) -> watch::Receiver<CacheStatus> {
        self.status.clone()
    }

    /// Waits until the cache is ready (at most `limit`); returns whether it is.
    pub async fn wait_ready(&self, limit: Duration) -> bool {
        let mut rx = self.status.clone();
        let fut = async {
            loop {
                if rx.borrow_and_update().ready {
                    return true;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(limit, fut).await.unwrap_or(false)
    }

    pub(crate) fn send(&self, cmd: Cmd) -> Result<(), Status> {
        self.tx.send(cmd).map_err(|_| gone())
    }

    /// An etcd `Range` from the cache, or the decision to ask etcd.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeOutcome, Status> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Range { req, reply })?;
        rx.await.map_err(|_| gone())?
    }

    /// A Kubernetes-style list.
    pub async fn list(&self, req: ListRequest) -> Result<ReadOutcome, Status> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::List { req, reply })?;
        rx.await.map_err(|_| gone())?
    }

    /// A Kubernetes-style get.
    pub async fn get(&self, req: GetRequest) -> Result<ReadOutcome, Status> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Get { req, reply })?;
        rx.await.map_err(|_| gone())?
    }

    /// A Kubernetes-style watch: items arrive on the returned receiver; return credit with
    /// [`CacheHandle::credit`] as they are written, and cancel with [`CacheHandle::cancel`].
    pub async fn kube_watch(
        &self,
        req: WatchRequest,
    ) -> Result<(RequestId, mpsc::UnboundedReceiver<KubeItem>), Status> {
        let (sink, items) = mpsc::unbounded_channel();
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::KubeWatch { req, sink, reply })?;
        let id = rx.await.map_err(|_| gone())??;
        Ok((id, items))
    }

    /// Gives a watcher room for `n` more events.
    pub fn credit(&self, id: RequestId, n: u64) {
        let _ = self.send(Cmd::Credit { id, n });
    }

    /// Ends a watch.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.send(Cmd::Cancel { id });
    }

    /// The core's metrics now (for `/metrics`).
    pub async fn sample(&self) -> Option<CacheSample> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Metrics { reply }).ok()?;
        rx.await.ok()
    }

    /// The cache's state as JSON (for `/debug/state`).
    pub async fn debug_state(&self) -> serde_json::Value {
        let (reply, rx) = oneshot::channel();
        if self.send(Cmd::State { reply }).is_err() {
            return json!({"prefix": self.prefix_str(), "error": "stopped"});
        }
        rx.await.unwrap_or_else(|_| json!({"prefix": self.prefix_str(), "error": "stopped"}))
    }
}

/// Whether every key of `range` starts with `prefix`.
pub fn range_within_prefix(range: &KeyRange, prefix: &[u8]) -> bool {
    if prefix.is_empty() {
        return true;
    }
    match range {
        KeyRange::Exact(k) | KeyRange::Prefix(k) => k.as_bytes().starts_with(prefix),
        KeyRange::Range { start, end } => {
            let Some(end) = end else { return false };
            let Some(pend) = cacher_core::prefix_end(prefix) else {
                return start.as_bytes().starts_with(prefix);
            };
            start.as_bytes() >= prefix && end.as_bytes() <= pend.as_slice()
        }
    }
}

enum Route {
    Etcd { tag: u64, sink: SessionSink, prev_kv: bool, no_put: bool, no_delete: bool, min_rev: u64 },
    Kube { sink: mpsc::UnboundedSender<KubeItem> },
}

enum Pending {
    Etcd(oneshot::Sender<WatchStartReply>),
}

enum ReadReply {
    Range(oneshot::Sender<Result<RangeOutcome, Status>>),
    Read(oneshot::Sender<Result<ReadOutcome, Status>>),
}

/// The task that owns one prefix's core.
pub(crate) struct CacheTask {
    prefix: Arc<[u8]>,
    cacher: Cacher,
    clock: Clock,
    options: Arc<CacheOptions>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    self_tx: mpsc::WeakUnboundedSender<Cmd>,
    reflector: mpsc::UnboundedSender<ReflectorCtl>,
    upstream: Upstream,
    status: watch::Sender<CacheStatus>,
    metrics: Arc<HostMetrics>,
    routes: HashMap<RequestId, Route>,
    pending: HashMap<RequestId, Pending>,
    reads: HashMap<RequestId, ReadReply>,
    batches: HashMap<RequestId, Vec<WatchEvent>>,
    batch_order: Vec<RequestId>,
    encoded: HashMap<(usize, bool), Bytes>,
    /// Batches without filtering, encoded once and shared by every watcher that gets the same
    /// events with the same options: (first event, last event, count, prev_kv).
    /// The events' addresses are kept to tell apart batches with the same ends.
    shared: HashMap<SharedKey, (Vec<usize>, Arc<[EncodedEvent]>)>,

    /// One copy of each watched range, so that the core checks a range once per event for all
    /// the watchers that share it.
    interned: HashMap<KeyRange, KeyRange>,
}

/// A batch's identity for sharing its encoding: its first and last events' addresses, its
/// length, `prev_kv`.
type SharedKey = (usize, usize, usize, bool);

/// Creates a cache task for `prefix` and its handle; the caller spawns [`CacheTask::run`] and
/// the reflector with the returned control receiver.
pub(crate) fn new_cache(
    prefix: &[u8],
    options: CacheOptions,
    clock: Clock,
    upstream: Upstream,
    metrics: Arc<HostMetrics>,
) -> Result<(CacheHandle, CacheTask, mpsc::UnboundedReceiver<ReflectorCtl>), String> {
    let cacher = Cacher::new(options.core.clone(), clock.now())
        .map_err(|e| format!("cache configuration: {}: {}", e.field, e.message))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (reflector, ctl_rx) = mpsc::unbounded_channel();
    let (status, status_rx) = watch::channel(CacheStatus::default());
    let prefix: Arc<[u8]> = Arc::from(prefix);
    let options = Arc::new(options);
    let handle = CacheHandle {
        tx: tx.clone(),
        prefix: prefix.clone(),
        status: status_rx,
        options: options.clone(),
    };
    let task = CacheTask {
        prefix,
        cacher,
        clock,
        options,
        rx,
        self_tx: tx.downgrade(),
        reflector,
        upstream,
        status,
        metrics,
        routes: HashMap::default(),
        pending: HashMap::default(),
        reads: HashMap::default(),
        batches: HashMap::default(),
        batch_order: Vec::new(),
        encoded: HashMap::default(),
        shared: HashMap::default(),
        interned: HashMap::default(),
    };
    Ok((handle, task, ctl_rx))
}

impl CacheTask {
    /// Runs until every handle is dropped.
    pub(crate) async fn run(mut self) {
        loop {
            let deadline = self.cacher.poll_timeout().map(|(t, _)| self.clock.instant_of(t));
            tokio::select! {
                cmd = self.rx.recv() => {
                    let Some(cmd) = cmd else { break };
                    // Everything already queued is handled before the outputs are carried out,
                    // so that under load each watcher gets one batch of whole revisions per
                    // wake-up rather than one message per revision.
                    self.handle(cmd);
                    let mut n = 0;
                    while n < 256 {
                        match self.rx.try_recv() {
                            Ok(cmd) => self.handle(cmd),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                    self.drain();
                }
                _ = sleep_until(deadline) => {
                    let now = self.clock.now();
                    self.cacher.handle_timeout(now);
                    self.drain();
                }
            }
            self.publish();
        }
        let now = self.clock.now();
        self.cacher.stop(now);
        self.drain();
        debug!(prefix = %String::from_utf8_lossy(&self.prefix), "cache task ended");
    }

    fn publish(&mut self) {
        let c = &self.cacher;
        let s = CacheStatus {
            ready: c.ready_state() == ReadyState::Ready,
            rv: c.resource_version(),
            oldest_servable: c.window().oldest_servable,
            generation: c.ready_generation(),
            store_len: c.store_len(),
            watchers: c.watcher_count(),
            last_error: c.last_error().map(str::to_owned),
        };
        self.status.send_if_modified(|old| {
            let changed = old.ready != s.ready
                || old.rv != s.rv
                || old.oldest_servable != s.oldest_servable
                || old.generation != s.generation
                || old.store_len != s.store_len
                || old.watchers != s.watchers
                || old.last_error != s.last_error;
            if changed {
                *old = s;
            }
            changed
        });
    }

    fn handle(&mut self, cmd: Cmd) {
        let now = self.clock.now();
        match cmd {
            Cmd::EtcdWatch { spec, reply } => self.etcd_watch(now, spec, reply),
            Cmd::KubeWatch { req, sink, reply } => {
                let (req, sink) = (req, sink);
                let mut req = req;
                req.range = self.intern(req.range);
                req.consume = cacher_core::ConsumeMode::Manual;
                match self.cacher.start_watch(now, req) {
                    Ok(id) => {
                        // Credit comes with WatchStarted (a watch can be parked first).
                        self.routes.insert(id, Route::Kube { sink });
                        let _ = reply.send(Ok(id));
                    }
                    Err(status) => {
                        let _ = reply.send(Err(status));
                    }
                }
            }
            Cmd::Credit { id, n } => {
                self.cacher.grant_credit(now, id, n);
            }
            Cmd::Cancel { id } => {
                // The client is gone: nothing more is sent to it.
                self.routes.remove(&id);
                self.pending.remove(&id);
                self.batches.remove(&id);
                self.cacher.stop_watch(now, id);
            }
            Cmd::Range { req, reply } => match self.cacher.range(now, req) {
                Ok(id) => {
                    self.reads.insert(id, ReadReply::Range(reply));
                }
                Err(s) => {
                    let _ = reply.send(Err(s));
                }
            },
            Cmd::List { req, reply } => match self.cacher.list(now, req) {
                Ok(id) => {
                    self.reads.insert(id, ReadReply::Read(reply));
                }
                Err(s) => {
                    let _ = reply.send(Err(s));
                }
            },
            Cmd::Get { req, reply } => match self.cacher.get(now, req) {
                Ok(id) => {
                    self.reads.insert(id, ReadReply::Read(reply));
                }
                Err(s) => {
                    let _ = reply.send(Err(s));
                }
            },
            Cmd::Frontier { watches, sink, token } => {
                // Everything produced so far is already in the session's queue (drained after
                // every command), so the answer follows the events it vouches for.
                self.drain();
                let cache_rv = self.cacher.resource_version();
                let ready = self.cacher.ready_state() == ReadyState::Ready;
                let results = watches
                    .into_iter()
                    .map(|(tag, id)| {
                        let caught_up = ready
                            && self.cacher.watcher(id).is_some_and(|w| {
                                w.state == "active" && w.queued == 0 && w.initial_pending == 0
                            });
                        (tag, caught_up.then_some(cache_rv))
                    })
                    .collect();
                let _ = sink.send(SessionEvent::Frontier { token, results, cache_rv });
            }
            Cmd::State { reply } => {
                let _ = reply.send(self.state_json());
            }
            Cmd::Metrics { reply } => {
                let c = &self.cacher;
                let watchers = c.watchers();
                let _ = reply.send(CacheSample {
                    prefix: String::from_utf8_lossy(&self.prefix).into_owned(),
                    metrics: c.metrics().clone(),
                    capacity: c.window().capacity,
                    rv: c.resource_version(),
                    watchers: watchers.len(),
                    lagging: watchers.iter().filter(|w| w.state == "lagging").count(),
                    max_lag: watchers.iter().map(|w| w.lag).max().unwrap_or(0),
                    store_len: c.store_len(),
                    ready: c.ready_state() == ReadyState::Ready,
                });
            }
            Cmd::Storage(msg) => self.storage(now, msg),
            Cmd::CurrentRevision { id, rv } => self.cacher.handle_current_revision(now, id, rv),
        }
        // Outputs are collected into per-watcher batches; the run loop carries them out once
        // the queued commands are handled. (Commands whose answer must follow earlier
        // deliveries, like Frontier, drain first themselves.)
        self.collect();
    }

    fn etcd_watch(
        &mut self,
        now: Timestamp,
        spec: EtcdWatchSpec,
        reply: oneshot::Sender<WatchStartReply>,
    ) {
        if self.cacher.ready_state() != ReadyState::Ready {
            let _ = reply.send(WatchStartReply::Miss { reason: "the cache is not ready".into() });
            return;
        }
        // Kubernetes reads RV 0 as "any"; for etcd it is "from the beginning of history",
        // which only etcd has. Anything older than the window goes to etcd too.
        let servable =
            self.cacher.window().oldest_servable.is_some_and(|o| spec.start_after + 1 >= o);
        if spec.start_after == 0 || !servable {
            let _ = reply.send(WatchStartReply::Miss {
                reason: format!("revision {} is outside the cache's window", spec.start_after + 1),
            });
            return;
        }
        let range = self.intern(spec.range);
        let mut req = WatchRequest::new(range, cacher_core::RvParam::At(spec.start_after));
        req.consume = cacher_core::ConsumeMode::Manual;
        req.slow_policy = cacher_core::SlowPolicy::Lag;
        req.queue_capacity = Some(self.options.grpc_queue.max(1));
        match self.cacher.start_watch(now, req) {
            Ok(id) => {
                self.routes.insert(
                    id,
                    Route::Etcd {
                        tag: spec.tag,
                        sink: spec.sink,
                        prev_kv: spec.prev_kv,
                        no_put: spec.filters.contains(&FILTER_NOPUT),
                        no_delete: spec.filters.contains(&FILTER_NODELETE),
                        min_rev: spec.min_rev,
                    },
                );
                // Started (or refused) comes out of the drain, with the first credit.
                self.pending.insert(id, Pending::Etcd(reply));
            }
            Err(s) => {
                let _ = reply.send(WatchStartReply::Miss { reason: s.message });
            }
        }
    }

    fn intern(&mut self, range: KeyRange) -> KeyRange {
        if self.interned.len() > 10_000 {
            // Only an optimisation: start over rather than track every watcher's range.
            self.interned.clear();
        }
        self.interned.entry(range.clone()).or_insert(range).clone()
    }

    fn storage(&mut self, now: Timestamp, msg: StorageMsg) {
        let result = match msg {
            StorageMsg::Replace { rv, objects } => {
                let n = objects.len();
                let r = self.cacher.handle_replace(now, rv, objects);
                if r.is_ok() {
                    info!(prefix = %String::from_utf8_lossy(&self.prefix), revision = rv, objects = n, "cache initialised from a list");
                }
                r
            }
            StorageMsg::Revision { rv, changes } => self.cacher.handle_revision(now, rv, changes),
            StorageMsg::Progress { rv } => self.cacher.handle_progress(now, rv),
            StorageMsg::Error { reason } => {
                warn!(prefix = %String::from_utf8_lossy(&self.prefix), %reason, "upstream watch failed; relisting");
                self.cacher.handle_storage_error(now, &reason);
                Ok(())
            }
            StorageMsg::Compacted { rv } => {
                self.cacher.handle_compaction(now, rv);
                Ok(())
            }
        };
        if let Err(e) = result {
            // Storage said something inconsistent with what the cache holds: start over.
            warn!(prefix = %String::from_utf8_lossy(&self.prefix), error = %e, "inconsistent storage input; relisting");
            let reason = format!("inconsistent storage input: {e}");
            self.cacher.handle_storage_error(now, &reason);
        }
    }

    /// Carries out everything the core asked for, then flushes the per-watcher batches.
    fn drain(&mut self) {
        self.collect();
        self.flush();
    }

    /// Carries out the core's outputs: replies at once, deliveries into per-watcher batches.
    fn collect(&mut self) {
        while let Some(out) = self.cacher.poll_output() {
            match out {
                Output::Fanout { event, targets } => {
                    for &(id, kind) in targets.iter() {
                        self.batch(id, WatchEvent::Change(kind, event.clone()));
                    }
                }
                Output::Deliver { watch, events } => {
                    for e in events {
                        self.batch(watch, e);
                    }
                }
                Output::WatchStarted { watch, .. } => {
                    let now = self.clock.now();
                    match self.pending.remove(&watch) {
                        Some(Pending::Etcd(reply)) => {
                            if reply.send(WatchStartReply::Started { id: watch }).is_err() {
                                self.routes.remove(&watch);
                                self.cacher.stop_watch(now, watch);
                            } else {
                                // The first credit lets the replay and live events flow.
                                self.cacher.grant_credit(now, watch, self.options.grpc_credit);
                            }
                        }
                        None => {
                            if let Some(Route::Kube { sink }) = self.routes.get(&watch) {
                                let _ = sink.send(KubeItem::Started);
                                self.cacher.grant_credit(now, watch, self.options.kube_credit);
                            }
                        }
                    }
                }
                Output::WatchError { watch, status } => {
                    self.flush_one(watch);
                    if let Some(Pending::Etcd(reply)) = self.pending.remove(&watch) {
                        let _ =
                            reply.send(WatchStartReply::Miss { reason: status.message.clone() });
                        self.routes.remove(&watch);
                    } else if let Some(Route::Kube { sink }) = self.routes.get(&watch) {
                        let _ = sink.send(KubeItem::Error(status));
                    }
                }
                Output::WatchClosed { watch, cause, last_rv, message } => {
                    self.flush_one(watch);
                    if let Some(Pending::Etcd(reply)) = self.pending.remove(&watch) {
                        let _ = reply.send(WatchStartReply::Miss {
                            reason: message.unwrap_or_else(|| cause.as_str().to_owned()),
                        });
                        self.routes.remove(&watch);
                        continue;
                    }
                    match self.routes.remove(&watch) {
                        Some(Route::Etcd { tag, sink, .. }) => {
                            let _ =
                                sink.send(SessionEvent::Closed { tag, cause, last_rv, message });
                        }
                        Some(Route::Kube { sink }) => {
                            let _ = sink.send(KubeItem::Closed(cause));
                        }
                        None => {}
                    }
                }
                Output::WatchDelegated { watch, reason } => {
                    if let Some(Pending::Etcd(reply)) = self.pending.remove(&watch) {
                        let _ = reply.send(WatchStartReply::Miss { reason: reason.to_owned() });
                        self.routes.remove(&watch);
                    } else if let Some(Route::Kube { sink }) = self.routes.remove(&watch) {
                        let _ = sink.send(KubeItem::Delegated(reason));
                    }
                }
                Output::List { request, outcome } | Output::Get { request, outcome } => {
                    if let Some(ReadReply::Read(r)) = self.reads.remove(&request) {
                        let _ = r.send(Ok(outcome));
                    }
                }
                Output::Range { request, outcome } => {
                    if let Some(ReadReply::Range(r)) = self.reads.remove(&request) {
                        let _ = r.send(Ok(outcome));
                    }
                }
                Output::Rejected { request, status } => {
                    if let Some(reply) = self.reads.remove(&request) {
                        match reply {
                            ReadReply::Range(r) => {
                                let _ = r.send(Err(status));
                            }
                            ReadReply::Read(r) => {
                                let _ = r.send(Err(status));
                            }
                        }
                    } else if let Some(Pending::Etcd(reply)) = self.pending.remove(&request) {
                        let _ = reply.send(WatchStartReply::Miss { reason: status.message });
                        self.routes.remove(&request);
                    } else if let Some(Route::Kube { sink }) = self.routes.remove(&request) {
                        let _ = sink.send(KubeItem::Rejected(status));
                    }
                }
                Output::RequestProgress => {
                    let _ = self.reflector.send(ReflectorCtl::Progress);
                }
                Output::NeedCurrentRevision { request } => self.quorum_read(request),
                Output::Relist { reason } => {
                    let _ = self.reflector.send(ReflectorCtl::Relist(reason));
                }
            }
        }
    }

    fn batch(&mut self, id: RequestId, ev: WatchEvent) {
        match self.batches.get_mut(&id) {
            Some(v) => v.push(ev),
            None => {
                if !self.routes.contains_key(&id) {
                    // Not ours to send (cancelled in the meantime): give the credit back so
                    // the core does not hold events for it.
                    return;
                }
                self.batches.insert(id, vec![ev]);
                self.batch_order.push(id);
            }
        }
    }

    fn flush(&mut self) {
        if self.batch_order.is_empty() {
            return;
        }
        let order = std::mem::take(&mut self.batch_order);
        for id in &order {
            self.flush_one(*id);
        }
        self.batch_order = order;
        self.batch_order.clear();
        self.encoded.clear();
        self.shared.clear();
    }

    fn flush_one(&mut self, id: RequestId) {
        let Some(events) = self.batches.remove(&id) else { return };
        let header_rev = self.cacher.resource_version();
        let n = events.len() as u64;
        match self.routes.get(&id) {
            Some(Route::Etcd { tag, sink, prev_kv, no_put, no_delete, min_rev }) => {
                // The common case: every event passes the filters; the batch's encoding is
                // shared by every watcher that gets the same events with the same options (no
                // per-watcher copy).
                let passes = |e: &WatchEvent| match e {
                    WatchEvent::Change(_, ev) => {
                        let filtered = if ev.is_delete() { *no_delete } else { *no_put };
                        ev.rv() >= *min_rev && !filtered
                    }
                    _ => false,
                };
                if let (Some(WatchEvent::Change(_, first)), Some(WatchEvent::Change(_, last))) =
                    (events.first(), events.last())
                {
                    if events.iter().all(passes) {
                        let key = (
                            Arc::as_ptr(first) as usize,
                            Arc::as_ptr(last) as usize,
                            events.len(),
                            *prev_kv,
                        );
                        let ptrs = || {
                            events.iter().filter_map(|e| match e {
                                WatchEvent::Change(_, ev) => Some(Arc::as_ptr(ev) as usize),
                                _ => None,
                            })
                        };
                        let encoded = &mut self.encoded;
                        let (seen, shared) = self.shared.entry(key).or_insert_with(|| {
                            let list = events
                                .iter()
                                .filter_map(|e| match e {
                                    WatchEvent::Change(_, ev) => Some(EncodedEvent {
                                        rev: ev.rv(),
                                        bytes: encoded
                                            .entry((Arc::as_ptr(ev) as usize, *prev_kv))
                                            .or_insert_with(|| encode_event_field(ev, *prev_kv))
                                            .clone(),
                                    }),
                                    _ => None,
                                })
                                .collect::<Vec<_>>();
                            (ptrs().collect(), list.into())
                        });
                        if seen.iter().copied().eq(ptrs()) {
                            let shared = shared.clone();
                            self.metrics.add_delivered(n);
                            let _ = sink.send(SessionEvent::Events {
                                tag: *tag,
                                header_rev,
                                events: shared,
                                credit: n,
                            });
                            return;
                        }
                    }
                }
                let mut out: Vec<EncodedEvent> = Vec::with_capacity(events.len());
                let mut last_rev = 0;
                for e in &events {
                    let WatchEvent::Change(_, ev) = e else { continue };
                    last_rev = ev.rv();
                    if ev.rv() < *min_rev
                        || (ev.is_delete() && *no_delete)
                        || (!ev.is_delete() && *no_put)
                    {
                        continue;
                    }
                    let key = (Arc::as_ptr(ev) as usize, *prev_kv);
                    let bytes = self
                        .encoded
                        .entry(key)
                        .or_insert_with(|| encode_event_field(ev, *prev_kv))
                        .clone();
                    out.push(EncodedEvent { rev: ev.rv(), bytes });
                }
                if out.is_empty() {
                    // Nothing for the client: the credit comes straight back.
                    let _ = sink.send(SessionEvent::Skipped { tag: *tag, last_rev });
                    let now = self.clock.now();
                    self.cacher.grant_credit(now, id, n);
                    // grant_credit can produce more deliveries; they are drained next round.
                    if let Some(tx) = self.self_tx.upgrade() {
                        let _ = tx.send(Cmd::Credit { id, n: 0 });
                    }
                } else {
                    self.metrics.add_delivered(out.len() as u64);
                    let _ = sink.send(SessionEvent::Events {
                        tag: *tag,
                        header_rev,
                        events: Arc::from(out),
                        credit: n,
                    });
                }
            }
            Some(Route::Kube { sink }) => {
                let _ = sink.send(KubeItem::Events(events));
            }
            None => {}
        }
    }

    fn quorum_read(&mut self, id: RequestId) {
        let Some(tx) = self.self_tx.upgrade() else { return };
        let upstream = self.upstream.clone();
        let prefix = self.prefix.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(50);
            for _ in 0..4 {
                metrics.count_upstream_request("quorum_read");
                match upstream.current_revision(&prefix).await {
                    Ok(rv) => {
                        let _ = tx.send(Cmd::CurrentRevision { id, rv });
                        return;
                    }
                    Err(e) => {
                        debug!(error = %e, "quorum read for the current revision failed");
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                }
            }
            // etcd cannot say: make the read wait (and time out) rather than answer stale.
            let _ = tx.send(Cmd::CurrentRevision { id, rv: u64::MAX / 2 });
        });
    }

    fn state_json(&self) -> serde_json::Value {
        let c = &self.cacher;
        let w = c.window();
        let (snapshots, oldest_snapshot) = c.snapshots();
        let watchers = c.watchers();
        let listed: Vec<serde_json::Value> = watchers
            .iter()
            .take(1000)
            .map(|w| {
                json!({
                    "id": w.id.0, "key": w.key, "rv": w.rv, "last_sent_rv": w.last_sent_rv,
                    "queued": w.queued, "queue_capacity": w.queue_capacity, "state": w.state,
                    "lag": w.lag, "policy": w.policy,
                    "kind": match self.routes.get(&w.id) { Some(Route::Etcd { .. }) => "etcd", Some(Route::Kube { .. }) => "kube", None => "-" },
                })
            })
            .collect();
        let m = c.metrics();
        json!({
            "prefix": String::from_utf8_lossy(&self.prefix),
            "profile": c.config().profile.as_str(),
            "ready": c.ready_state() == ReadyState::Ready,
            "ready_state": format!("{:?}", c.ready_state()).to_lowercase(),
            "generation": c.ready_generation(),
            "resource_version": c.resource_version(),
            "list_resource_version": c.list_resource_version(),
            "compacted_revision": c.compacted_rv(),
            "last_error": c.last_error(),
            "window": {
                "oldest_rv": w.oldest_rv, "newest_rv": w.newest_rv, "oldest_servable": w.oldest_servable,
                "len": w.len, "capacity": w.capacity, "evicted_since_relist": w.evicted_since_relist,
            },
            "store": {"objects": c.store_len(), "snapshots": snapshots, "oldest_snapshot": oldest_snapshot},
            "watchers": {"count": watchers.len(), "listed": listed, "parked": c.parked_count()},
            "metrics": {
                "events_received": m.events_received, "events_dispatched": m.events_dispatched,
                "deliveries": m.deliveries, "initializations": m.initializations,
                "terminated_watchers": m.terminated_watchers, "watch_expired": m.watch_expired,
                "progress_requests": m.progress_requests,
                "capacity_increases": m.capacity_increases, "capacity_decreases": m.capacity_decreases,
            },
        })
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cacher_core::Key;

    #[test]
    fn ranges_within_prefix() {
        let p = b"/reg/";
        assert!(range_within_prefix(&KeyRange::Exact(Key::from("/reg/a")), p));
        assert!(!range_within_prefix(&KeyRange::Exact(Key::from("/other")), p));
        assert!(range_within_prefix(
            &KeyRange::Range { start: Key::from("/reg/"), end: Some(Key::from("/reg0")) },
            p
        ));
        assert!(!range_within_prefix(
            &KeyRange::Range { start: Key::from("/reg/"), end: Some(Key::from("/reh")) },
            p
        ));
        assert!(!range_within_prefix(&KeyRange::Range { start: Key::from("/reg/"), end: None }, p));
        assert!(range_within_prefix(&KeyRange::Range { start: Key::from("a"), end: None }, b""));
        assert!(range_within_prefix(
            &KeyRange::Range { start: Key::from("/a"), end: Some(Key::from("0")) },
            b"/"
        ));
    }
}
