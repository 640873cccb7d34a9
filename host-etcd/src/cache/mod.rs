//! One task per cached prefix owns a core [`Cacher`]: it feeds it what the reflector reads from
//! etcd and what clients ask, passes the time in, and carries out what the core asks for.
//!
//! It knows nothing of gRPC, HTTP or protobuf. It serves two kinds of watchers:
//! - **etcd-style** watches of the watch sessions (`session/`): the lag policy (a slow watcher
//!   becomes a position in the ring), credit per watcher, and typed batches of whole revisions
//!   sent per session per wake-up ([`delivery`]);
//! - **core** watches with Kubernetes semantics ([`CoreItem`]s; the server's Kubernetes-style
//!   API uses them).
//!
//! and reads (etcd `Range`, Kubernetes list and get). Storage input arrives on a bounded
//! channel: a cache that falls behind slows its reflector, which stops reading etcd's stream
//! (HTTP/2 flow control then slows etcd's sending), so memory never grows without bound.
//!
//! Kubernetes counterpart: the goroutines around one `Cacher` in `cacher.go`
//! (`dispatchEvents`, `startCaching`, the watchers' `processInterval`), here one task with an
//! inbox.

pub mod delivery;

use std::sync::Arc;
use std::time::Duration;

use cacher_core::{
    Cacher, Change, CloseCause, Event, GetRequest, KeyRange, ListRequest, Object, Output,
    RangeOutcome, RangeRequest, ReadOutcome, ReadyState, RequestId, RvMatch, RvParam, Status,
    Timestamp, WatchEvent, WatchRequest, WatcherState,
};
use rustc_hash::FxHashMap as HashMap;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::config::CacheConfig;
use crate::keys::range_within_prefix;
use crate::metrics::{CacheSample, HostMetrics};
use crate::upstream::Upstream;
use delivery::{CacheMsg, EventRun, Picks, SessionId, SessionSink, WatchItems, WatchTag};

/// What a cache publishes for sessions and handlers to read without a round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStatus {
    /// The ready gate is open.
    pub ready: bool,
    /// The cache's revision (the last etcd revision it has applied).
    pub rv: u64,
    /// The oldest revision a watch can start after (exclusive), if any.
    pub oldest_servable: Option<u64>,
    /// etcd's compaction revision as far as the cache knows.
    pub compacted: u64,
    /// The oldest revision the cache would answer anything at (a read at a snapshot, or the
    /// start of a watch); 0 when none.
    pub oldest_served: u64,
    /// How many times the cache has been (re)initialised from a list.
    pub generation: u64,
    /// Objects in the store.
    pub store_len: usize,
    /// Open watchers.
    pub watchers: usize,
    /// Last storage error, if any.
    pub last_error: Option<String>,
}

impl CacheStatus {
    /// Whether a watch starting at `start_rev` (inclusive, > 0) can be served from the window
    /// as the cache is now (the cache task decides for good).
    pub fn can_serve_from(&self, start_rev: u64) -> bool {
        start_rev > 1
            && start_rev >= self.compacted
            && self.ready
            && self.oldest_servable.is_some_and(|o| start_rev >= o)
    }
}

/// An item of a core watch (Kubernetes semantics), in order.
#[derive(Debug)]
pub enum CoreItem {
    /// The watch is registered.
    Started,
    /// The request failed before starting.
    Rejected(Status),
    /// The core sends this watch to storage.
    Delegated(&'static str),
    /// Events (credit to return once written, with [`CacheHandle::credit`]).
    Events(Vec<WatchEvent>),
    /// An ERROR item.
    Error(Status),
    /// The watch ended.
    Closed(CloseCause),
}

/// An etcd-style watch a session asks the cache to serve.
#[derive(Debug)]
pub struct EtcdWatchStart {
    /// The session (its messages go to `sink`).
    pub session: SessionId,
    /// Where the session's messages go.
    pub sink: SessionSink,
    /// The session's name for this attempt.
    pub tag: WatchTag,
    /// The keys.
    pub range: KeyRange,
    /// Inclusive start revision; 0 = from the cache's revision on.
    pub start_rev: u64,
    /// How long to wait for the cache to be ready (relisting) before refusing.
    pub wait_ready: Duration,
}

/// Commands to a cache task.
pub(crate) enum Cmd {
    EtcdWatch(Box<EtcdWatchStart>),
    CoreWatch {
        req: WatchRequest,
        sink: mpsc::UnboundedSender<CoreItem>,
        reply: oneshot::Sender<Result<RequestId, Status>>,
    },
    Credit {
        id: RequestId,
        n: u64,
    },
    Cancel {
        id: RequestId,
    },
    Frontier(Box<FrontierQuery>),
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
    State {
        reply: oneshot::Sender<serde_json::Value>,
    },
    Metrics {
        reply: oneshot::Sender<CacheSample>,
    },
    /// The answer of a freshness check: etcd's current revision for every read waiting on it.
    CurrentRevision {
        waiters: Vec<Waiter>,
        rv: u64,
    },
    Compacted {
        rv: u64,
    },
    /// A compaction probe sent at `started` answered: etcd compacted at `compacted` (above
    /// what the cache knew), or not below the cache's oldest revision.
    CompactionChecked {
        started: Instant,
        /// The revision asked about.
        oldest: u64,
        compacted: Option<u64>,
    },
    RequestProgress,
    Objects {
        reply: oneshot::Sender<Option<(u64, Vec<Arc<Object>>)>>,
    },
    Relist {
        reason: String,
    },
    NoteCheck {
        result: serde_json::Value,
    },
    DropNextRevision,
}

/// What the reflector tells its cache.
#[derive(Debug)]
pub(crate) enum StorageMsg {
    /// A list at `rv`. `listed_at`: when its last page was asked for; etcd's answer then said
    /// it still had `rv` (the compaction gate counts it as a probe's).
    Replace {
        rv: u64,
        objects: Vec<Object>,
        listed_at: Instant,
    },
    /// A list at `rv` and etcd's history after it, applied at once: the cache opens with a
    /// window over that history.
    Backfill {
        rv: u64,
        objects: Vec<Object>,
        listed_at: Instant,
        revisions: Vec<(u64, Vec<Change>)>,
        seen: u64,
    },
    Revision {
        rv: u64,
        changes: Vec<Change>,
    },
    Progress {
        rv: u64,
    },
    Error {
        reason: String,
    },
    Compacted {
        rv: u64,
    },
}

/// What the cache asks of its reflector.
#[derive(Debug)]
pub(crate) enum ReflectorCtl {
    Progress,
    Relist(String),
    /// etcd's current revision, from the `created` answer of a watcher made (and cancelled
    /// at once) on the reflector's watch stream.
    Revision(oneshot::Sender<Result<u64, String>>),
}

/// A cheap handle to a cache task.
#[derive(Clone)]
pub struct CacheHandle {
    tx: mpsc::UnboundedSender<Cmd>,
    prefix: Arc<[u8]>,
    status: watch::Receiver<CacheStatus>,
    config: Arc<CacheConfig>,
}

impl std::fmt::Debug for CacheHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheHandle").field("prefix", &self.prefix_str()).finish()
    }
}

fn gone() -> Status {
    Status::stopped()
}

impl CacheHandle {
    /// The cached prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The prefix for display.
    pub fn prefix_str(&self) -> String {
        String::from_utf8_lossy(&self.prefix).into_owned()
    }

    /// The cache's configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
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

    /// Asks the cache to serve an etcd-style watch; the answer comes on the session's sink.
    pub fn start_etcd_watch(&self, start: EtcdWatchStart) -> Result<(), Status> {
        self.send(Cmd::EtcdWatch(Box::new(start)))
    }

    /// Asks which of a session's watches have been given every event up to the cache's
    /// revision; the answer comes on `sink`, after every event already given. With `fresh`,
    /// only once the cache has caught up with etcd's current revision (as etcd answers a
    /// progress request at its current revision).
    pub fn frontier(
        &self,
        token: u64,
        watches: Vec<(WatchTag, RequestId)>,
        sink: SessionSink,
        fresh: bool,
    ) -> Result<(), Status> {
        self.send(Cmd::Frontier(Box::new(FrontierQuery { token, watches, sink, fresh })))
    }

    /// Asks etcd for progress on the cache's own watch, so the cache's revision catches up with
    /// etcd's even when its prefix is idle.
    pub fn request_progress(&self) {
        let _ = self.send(Cmd::RequestProgress);
    }

    /// The cache's objects and revision, if it is ready (an O(1) snapshot, then a walk).
    pub async fn objects(&self) -> Option<(u64, Vec<Arc<Object>>)> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Objects { reply }).ok()?;
        rx.await.ok()?
    }

    /// Throws the cache's state away and lists again (watchers resume elsewhere).
    pub fn relist(&self, reason: String) {
        let _ = self.send(Cmd::Relist { reason });
    }

    /// Records the consistency checker's last result (shown in `/debug/state`).
    pub fn note_check(&self, result: serde_json::Value) {
        let _ = self.send(Cmd::NoteCheck { result });
    }

    /// Test hook: the cache will miss the next revision's changes, as if an event were lost
    /// (what the consistency checker exists to catch).
    #[doc(hidden)]
    pub fn drop_next_revision_for_test(&self) {
        let _ = self.send(Cmd::DropNextRevision);
    }

    /// etcd compacted at `rv` (learnt by a watch or a read that etcd refused).
    pub fn note_compacted(&self, rv: u64) {
        let _ = self.send(Cmd::Compacted { rv });
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

    /// A core watch (Kubernetes semantics): items arrive on the returned receiver; return
    /// credit with [`CacheHandle::credit`] as they are written, and cancel with
    /// [`CacheHandle::cancel`].
    pub async fn core_watch(
        &self,
        req: WatchRequest,
    ) -> Result<(RequestId, mpsc::UnboundedReceiver<CoreItem>), Status> {
        let (sink, items) = mpsc::unbounded_channel();
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::CoreWatch { req, sink, reply })?;
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

/// Where a core watch's outputs go.
enum Route {
    /// An etcd-style watch of a session, with the events gathered for it since the last
    /// send (indices into `Pending::events`).
    Etcd {
        session: SessionId,
        tag: WatchTag,
        sink: SessionSink,
        started: bool,
        picks: Option<Picks>,
    },
    /// A core watch.
    Core { sink: mpsc::UnboundedSender<CoreItem> },
}

enum ReadReply {
    Range(oneshot::Sender<Result<RangeOutcome, Status>>),
    Read(oneshot::Sender<Result<ReadOutcome, Status>>),
}

/// Deliveries gathered since the last send, flushed per session. The etcd-style watches'
/// picks live in their routes; the buffers here keep their capacity from send to send.
#[derive(Default)]
struct Pending {
    /// The events given to etcd-style watches, in order (one run per send).
    events: Vec<Arc<Event>>,
    /// The etcd-style watches with picks, in the order they got their first.
    etcd_order: Vec<RequestId>,
    core: HashMap<RequestId, Vec<WatchEvent>>,
    core_order: Vec<RequestId>,
    /// Scratch for a send: each session's message with the number of its items, and where it
    /// is in the list.
    per_session: Vec<(SessionSink, Vec<WatchItems>, usize)>,
    session_index: HashMap<SessionId, usize>,
    /// Scratch for a send: every watch's items with its session's place in `per_session`, so
    /// that each session's list is allocated once at its size (pushing onto it grew it by
    /// doubling, 3 % of the server's CPU at 1 000 watchers on 100 streams).
    staged: Vec<(usize, WatchItems)>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.etcd_order.is_empty() && self.core_order.is_empty()
    }
}

/// A frontier query (see [`CacheHandle::frontier`]).
pub(crate) struct FrontierQuery {
    token: u64,
    watches: Vec<(WatchTag, RequestId)>,
    sink: SessionSink,
    fresh: bool,
}

/// What waits for etcd's current revision.
pub(crate) enum Waiter {
    /// A consistent read in the core.
    Read(RequestId),
    /// A fresh frontier query.
    Frontier(Box<FrontierQuery>),
    /// An etcd watch from "now": it starts at etcd's current revision (or later).
    FromNow(Box<EtcdWatchStart>),
}

/// Waiters for etcd's current revision.
#[derive(Default)]
struct Freshness {
    /// A check is out.
    in_flight: bool,
    /// Waiters that arrived since: they wait for the next check.
    next: Vec<Waiter>,
}

/// What the cache knows of etcd's compaction: a request at a revision below the cache's own
/// is served from memory only if etcd said, less than `compaction_probe` ago, that it still
/// has the cache's oldest revision; otherwise it waits for one probe (shared by every such
/// request meanwhile). At rest, or serving only the current revision, it costs etcd nothing.
/// etcd's answer to the list a window starts from says as much as a probe's: after a restart
/// or relist, watchers resuming inside the new window wait for no probe.
#[derive(Default)]
struct CompactionGate {
    /// When etcd last said it still had a revision (a probe's or a list's request sent at that
    /// instant), and the revision: it covers the revisions from there on.
    checked: Option<(Instant, u64)>,
    in_flight: bool,
    held: Vec<Cmd>,
    /// Held requests being handled again: they pass.
    releasing: bool,
}

/// The task that owns one prefix's core.
pub(crate) struct CacheTask {
    prefix: Arc<[u8]>,
    cacher: Cacher,
    clock: Clock,
    config: Arc<CacheConfig>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    storage: mpsc::Receiver<StorageMsg>,
    self_tx: mpsc::WeakUnboundedSender<Cmd>,
    reflector: mpsc::UnboundedSender<ReflectorCtl>,
    upstream: Upstream,
    status: watch::Sender<CacheStatus>,
    metrics: Arc<HostMetrics>,
    routes: HashMap<RequestId, Route>,
    reads: HashMap<RequestId, ReadReply>,
    /// etcd-style watches waiting for the ready gate, with their deadlines.
    waiting_ready: Vec<(Instant, Box<EtcdWatchStart>)>,
    pending: Pending,
    freshness: Freshness,
    compaction: CompactionGate,
    /// Fresh frontier queries waiting for the cache to reach etcd's revision, with deadlines.
    frontiers_waiting: Vec<(u64, Instant, Box<FrontierQuery>)>,
    /// When the reflector is next asked for progress for them.
    next_nudge: Option<Instant>,
    /// The consistency checker's last result (for `/debug/state`).
    last_check: Option<serde_json::Value>,
    /// Test hook: the next revision from the reflector is not applied.
    drop_next_revision: bool,
    /// The newest revision handed to the core, applied or still held by it (after a relist
    /// with etcd's history, hundreds can wait): where a watch from "now" starts, since a client
    /// may already have seen any of them acknowledged.
    received_rv: u64,
    /// One copy of each watched range, so that the core checks a range once per event for all
    /// the watchers that share it.
    interned: HashMap<KeyRange, KeyRange>,
    /// When gathered deliveries go to the sessions, and when the ones held now go.
    pacer: SendPacer,
    flush_at: Option<Instant>,
}

/// When deliveries gathered by the cache go to the watch sessions
/// (`CacheConfig::delivery_coalesce`): at once after a quiet spell, otherwise `hold` after the
/// previous send. Under load each session is then woken once for several revisions instead of
/// once for each; a lone event waits for nothing.
#[derive(Debug)]
struct SendPacer {
    hold: Duration,
    last: Option<Instant>,
}

impl SendPacer {
    fn new(hold: Duration) -> SendPacer {
        SendPacer { hold, last: None }
    }

    /// When what is gathered at `now` goes: `None` at once, else at that time.
    fn due(&self, now: Instant) -> Option<Instant> {
        let last = self.last.filter(|_| !self.hold.is_zero())?;
        let at = last + self.hold;
        (now < at).then_some(at)
    }

    /// A send happened at `now`.
    fn sent(&mut self, now: Instant) {
        self.last = Some(now);
    }
}

/// What [`new_cache`] makes: the handle, the task to spawn, and the reflector's ends.
pub(crate) struct NewCache {
    pub handle: CacheHandle,
    pub task: CacheTask,
    pub storage_tx: mpsc::Sender<StorageMsg>,
    pub ctl_rx: mpsc::UnboundedReceiver<ReflectorCtl>,
}

/// Creates a cache task for `prefix` and its handle; the caller spawns [`CacheTask::run`] and
/// the reflector with the storage sender and the control receiver.
pub(crate) fn new_cache(
    prefix: &[u8],
    config: Arc<CacheConfig>,
    clock: Clock,
    upstream: Upstream,
    metrics: Arc<HostMetrics>,
) -> Result<NewCache, String> {
    config.validate()?;
    let cacher = Cacher::new(config.core.clone(), clock.now())
        .map_err(|e| format!("cache configuration: {}: {}", e.field, e.message))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (storage_tx, storage) = mpsc::channel(config.reflector.inbox_revisions.max(1));
    let (reflector, ctl_rx) = mpsc::unbounded_channel();
    let (status, status_rx) = watch::channel(CacheStatus::default());
    let prefix: Arc<[u8]> = Arc::from(prefix);
    let handle = CacheHandle {
        tx: tx.clone(),
        prefix: prefix.clone(),
        status: status_rx,
        config: config.clone(),
    };
    let pacer = SendPacer::new(config.delivery_coalesce);
    let task = CacheTask {
        prefix,
        cacher,
        clock,
        config,
        rx,
        storage,
        self_tx: tx.downgrade(),
        reflector,
        upstream,
        status,
        metrics,
        routes: HashMap::default(),
        reads: HashMap::default(),
        waiting_ready: Vec::new(),
        pending: Pending::default(),
        freshness: Freshness::default(),
        compaction: CompactionGate::default(),
        frontiers_waiting: Vec::new(),
        next_nudge: None,
        last_check: None,
        drop_next_revision: false,
        received_rv: 0,
        interned: HashMap::default(),
        pacer,
        flush_at: None,
    };
    Ok(NewCache { handle, task, storage_tx, ctl_rx })
}

impl CacheTask {
    /// Runs until every handle is dropped.
    pub(crate) async fn run(mut self) {
        let mut storage_open = true;
        loop {
            let core = self.cacher.poll_timeout().map(|(t, _)| self.clock.instant_of(t));
            let ready_wait = self
                .waiting_ready
                .iter()
                .map(|(d, _)| *d)
                .chain(self.frontiers_waiting.iter().map(|(_, d, _)| *d))
                .chain(self.next_nudge)
                .chain(self.flush_at)
                .min();
            let deadline = match (core, ready_wait) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                cmd = self.rx.recv() => {
                    let Some(cmd) = cmd else { break };
                    // Everything already queued is handled before the outputs are carried
                    // out, so that under load each session gets one batch per wake-up.
                    self.handle(cmd);
                    for _ in 0..256 {
                        match self.rx.try_recv() {
                            Ok(cmd) => self.handle(cmd),
                            Err(_) => break,
                        }
                    }
                }
                msg = self.storage.recv(), if storage_open => match msg {
                    Some(msg) => {
                        self.on_storage(msg);
                        for _ in 0..64 {
                            match self.storage.try_recv() {
                                Ok(msg) => self.on_storage(msg),
                                Err(_) => break,
                            }
                        }
                    }
                    None => storage_open = false,
                },
                _ = sleep_until(deadline) => {
                    let now = self.clock.now();
                    self.cacher.handle_timeout(now);
                    self.collect();
                    self.expire_ready_waits();
                    self.answer_caught_up_frontiers();
                    self.nudge_reflector();
                }
            }
            self.flush_or_hold();
            self.publish();
        }
        let now = self.clock.now();
        self.cacher.stop(now);
        self.collect();
        self.flush();
        debug!(prefix = %String::from_utf8_lossy(&self.prefix), "cache task ended");
    }

    fn publish(&mut self) {
        let c = &self.cacher;
        let s = CacheStatus {
            ready: c.ready_state() == ReadyState::Ready,
            rv: c.resource_version(),
            oldest_servable: c.window().oldest_servable,
            compacted: c.compacted_rv(),
            oldest_served: self.oldest_served(),
            generation: c.ready_generation(),
            store_len: c.store_len(),
            watchers: c.watcher_count(),
            last_error: c.last_error().map(str::to_owned),
        };
        self.status.send_if_modified(|old| {
            let changed = *old != s;
            if changed {
                *old = s;
            }
            changed
        });
    }

    /// The oldest revision the cache would answer anything at (a read at a snapshot, or the
    /// start of a watch); 0 when none.
    fn oldest_served(&self) -> u64 {
        let c = &self.cacher;
        let snapshot = c.snapshots().1;
        let watch = c.window().oldest_servable.map(|o| o.saturating_sub(1));
        snapshot.into_iter().chain(watch).filter(|r| *r > 0).min().unwrap_or(0)
    }

    /// Whether `cmd` asks for a revision below the cache's own that the cache would serve,
    /// while its knowledge of etcd's compaction is older than `compaction_probe`.
    fn needs_compaction_check(&self, cmd: &Cmd) -> bool {
        let period = self.config.reflector.compaction_probe;
        if period.is_zero()
            || self.compaction.releasing
            || self.cacher.ready_state() != ReadyState::Ready
        {
            return false;
        }
        let rv = self.cacher.resource_version();
        let past = match cmd {
            Cmd::EtcdWatch(s) => (s.start_rev != 0 && s.start_rev <= rv).then_some(s.start_rev),
            Cmd::Range { req, .. } => {
                (req.revision != 0 && req.revision < rv).then_some(req.revision)
            }
            Cmd::List { req, .. } => match (req.rv, req.rv_match) {
                _ if req.continue_token.is_some() => Some(rv.saturating_sub(1)),
                (RvParam::At(n), Some(RvMatch::Exact)) if n < rv => Some(n),
                _ => None,
            },
            Cmd::CoreWatch { req, .. } => match req.rv {
                RvParam::At(n) if n < rv => Some(n),
                _ => None,
            },
            _ => None,
        };
        let Some(at) = past else { return false };
        let oldest = self.oldest_served();
        // What etcd said covers the oldest revision served now (a relist since may have
        // moved the window back).
        let covered = |&(t, rev): &(Instant, u64)| {
            t.elapsed() < period && rev <= oldest.max(self.cacher.compacted_rv())
        };
        at + 1 >= oldest && !self.compaction.checked.as_ref().is_some_and(covered)
    }

    /// Holds `cmd` until a compaction probe answers (sending one if none is out).
    fn hold_for_compaction(&mut self, cmd: Cmd) {
        self.compaction.held.push(cmd);
        if self.compaction.in_flight {
            return;
        }
        let Some(tx) = self.self_tx.upgrade() else { return };
        self.compaction.in_flight = true;
        // The oldest revision still served: the cache's oldest, or etcd's compaction as far as
        // the cache knows (etcd reads at its compaction revision itself).
        let oldest = self.oldest_served().max(self.cacher.compacted_rv());
        let upstream = self.upstream.clone();
        let metrics = self.metrics.clone();
        let key = self.prefix.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let compacted = probe_compaction(&upstream, &metrics, &key, oldest).await;
            let _ = tx.send(Cmd::CompactionChecked { started, oldest, compacted });
        });
    }

    fn handle(&mut self, cmd: Cmd) {
        if self.needs_compaction_check(&cmd) {
            self.hold_for_compaction(cmd);
            return;
        }
        let now = self.clock.now();
        match cmd {
            Cmd::EtcdWatch(start) => self.etcd_watch(now, start),
            Cmd::CoreWatch { mut req, sink, reply } => {
                req.range = self.intern(req.range);
                req.consume = cacher_core::ConsumeMode::Manual;
                match self.cacher.start_watch(now, req) {
                    Ok(id) => {
                        // Credit comes with WatchStarted (a watch can be parked first).
                        self.routes.insert(id, Route::Core { sink });
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
                self.cacher.stop_watch(now, id);
            }
            Cmd::Frontier(q) if q.fresh => self.fresh_wait(Waiter::Frontier(q)),
            Cmd::Frontier(q) => self.answer_frontier(*q),
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
            Cmd::State { reply } => {
                let _ = reply.send(self.state_json());
            }
            Cmd::Metrics { reply } => {
                let c = &self.cacher;
                let watchers = c.watcher_summary();
                let _ = reply.send(CacheSample {
                    prefix: String::from_utf8_lossy(&self.prefix).into_owned(),
                    metrics: c.metrics().clone(),
                    capacity: c.window().capacity,
                    rv: c.resource_version(),
                    watchers: watchers.open,
                    lagging: watchers.lagging,
                    max_lag: watchers.max_lag,
                    store_len: c.store_len(),
                    ring_bytes: c.ring_bytes(),
                    ready: c.ready_state() == ReadyState::Ready,
                });
            }
            Cmd::CurrentRevision { waiters, rv } => {
                for w in waiters {
                    match w {
                        Waiter::Read(id) => self.cacher.handle_current_revision(now, id, rv),
                        Waiter::Frontier(q) => {
                            let deadline = Instant::now() + Duration::from_secs(3);
                            self.frontiers_waiting.push((rv, deadline, q));
                        }
                        Waiter::FromNow(start) if rv >= u64::MAX / 2 => {
                            refuse(&start, "etcd did not say its current revision")
                        }
                        Waiter::FromNow(start) => self.start_from_now(now, start, rv),
                    }
                }
                self.answer_caught_up_frontiers();
                self.nudge_reflector();
                self.freshness.in_flight = false;
                if !self.freshness.next.is_empty() {
                    let next = std::mem::take(&mut self.freshness.next);
                    self.check_freshness(next);
                }
            }
            Cmd::Compacted { rv } => self.cacher.handle_compaction(now, rv),
            Cmd::CompactionChecked { started, oldest, compacted } => {
                if let Some(rv) = compacted {
                    info!(prefix = %String::from_utf8_lossy(&self.prefix), compacted = rv, "etcd was compacted; nothing below is served from the cache any more");
                    self.cacher.handle_compaction(now, rv);
                }
                // Compacted: etcd still has its compaction revision, below which nothing is
                // served from memory any more.
                self.compaction.checked = Some((started, compacted.unwrap_or(oldest)));
                self.compaction.in_flight = false;
                let held = std::mem::take(&mut self.compaction.held);
                self.compaction.releasing = true;
                for cmd in held {
                    self.handle(cmd);
                }
                self.compaction.releasing = false;
            }
            Cmd::RequestProgress => {
                let _ = self.reflector.send(ReflectorCtl::Progress);
            }
            Cmd::Objects { reply } => {
                let ready = self.cacher.ready_state() == ReadyState::Ready;
                let _ = reply
                    .send(ready.then(|| (self.cacher.resource_version(), self.cacher.objects())));
            }
            Cmd::Relist { reason } => self.cacher.handle_storage_error(now, &reason),
            Cmd::NoteCheck { result } => self.last_check = Some(result),
            Cmd::DropNextRevision => self.drop_next_revision = true,
        }
        self.collect();
    }

    /// Serves an etcd-style watch from the cache if its start revision is in the window, or
    /// refuses it (the session goes to etcd); waits for the ready gate up to the start's limit.
    fn etcd_watch(&mut self, now: Timestamp, start: Box<EtcdWatchStart>) {
        if self.cacher.ready_state() != ReadyState::Ready {
            if self.cacher.ready_state() == ReadyState::Pending && !start.wait_ready.is_zero() {
                let deadline = Instant::now() + start.wait_ready;
                self.waiting_ready.push((deadline, start));
            } else {
                refuse(&start, "the cache is not ready");
            }
            return;
        }
        if start.start_rev == 0 {
            // "Now" is etcd's: a client may have seen any write up to etcd's current revision
            // acknowledged, and etcd would send none of them to a watch created after. One
            // quorum read, shared by every from-now watch (and consistent read) meanwhile.
            self.fresh_wait(Waiter::FromNow(start));
            return;
        }
        let (start_after, servable) = {
            let status = CacheStatus {
                ready: true,
                oldest_servable: self.cacher.window().oldest_servable,
                compacted: self.cacher.compacted_rv(),
                ..CacheStatus::default()
            };
            (start.start_rev - 1, status.can_serve_from(start.start_rev))
        };
        if !servable {
            refuse(&start, &format!("revision {} is outside the cache's window", start.start_rev));
            return;
        }
        self.register_etcd_watch(now, start, start_after);
    }

    /// A from-now watch once etcd said its current revision `etcd_rv`: it starts after it, or
    /// after the newest revision the cache received if that is later (events the core still
    /// holds happened before the create too).
    fn start_from_now(&mut self, now: Timestamp, start: Box<EtcdWatchStart>, etcd_rv: u64) {
        if self.cacher.ready_state() != ReadyState::Ready {
            refuse(&start, "the cache is not ready");
            return;
        }
        let after = etcd_rv.max(self.received_rv).max(self.cacher.resource_version());
        self.register_etcd_watch(now, start, after);
        self.collect();
    }

    /// Registers an etcd-style watch in the core: its events are those after `start_after`.
    fn register_etcd_watch(
        &mut self,
        now: Timestamp,
        start: Box<EtcdWatchStart>,
        start_after: u64,
    ) {
        let range = self.intern(start.range.clone());
        let mut req = WatchRequest::new(range, RvParam::At(start_after));
        req.consume = cacher_core::ConsumeMode::Manual;
        req.slow_policy = cacher_core::SlowPolicy::Lag;
        req.queue_capacity = Some(self.config.grpc_queue.max(1));
        match self.cacher.start_watch(now, req) {
            Ok(id) => {
                // Started (or refused) comes out of the outputs, with the first credit.
                let EtcdWatchStart { session, sink, tag, .. } = *start;
                self.routes
                    .insert(id, Route::Etcd { session, tag, sink, started: false, picks: None });
            }
            Err(s) => refuse(&start, &s.message),
        }
    }

    fn expire_ready_waits(&mut self) {
        if self.waiting_ready.is_empty() {
            return;
        }
        let ready = self.cacher.ready_state() == ReadyState::Ready;
        let now = Instant::now();
        let waiting = std::mem::take(&mut self.waiting_ready);
        for (deadline, start) in waiting {
            if ready {
                self.etcd_watch(self.clock.now(), start);
            } else if deadline <= now {
                refuse(&start, "the cache did not become ready in time");
            } else {
                self.waiting_ready.push((deadline, start));
            }
        }
        self.collect();
    }

    fn intern(&mut self, range: KeyRange) -> KeyRange {
        if self.interned.len() > 10_000 {
            // Only an optimisation: start over rather than track every watcher's range.
            self.interned.clear();
        }
        self.interned.entry(range.clone()).or_insert(range).clone()
    }

    fn on_storage(&mut self, msg: StorageMsg) {
        let now = self.clock.now();
        self.received_rv = match &msg {
            StorageMsg::Replace { rv, .. } => *rv,
            StorageMsg::Backfill { rv, revisions, seen, .. } => {
                (*rv).max(*seen).max(revisions.last().map_or(0, |(r, _)| *r))
            }
            StorageMsg::Revision { rv, .. } | StorageMsg::Progress { rv } => {
                self.received_rv.max(*rv)
            }
            _ => self.received_rv,
        };
        let result = match msg {
            StorageMsg::Replace { rv, objects, listed_at } => {
                self.compaction.checked = Some((listed_at, rv));
                let n = objects.len();
                let r = self.cacher.handle_replace(now, rv, objects);
                if r.is_ok() {
                    info!(prefix = %String::from_utf8_lossy(&self.prefix), revision = rv, objects = n, "cache initialised from a list");
                }
                r
            }
            StorageMsg::Backfill { rv, objects, listed_at, revisions, seen } => {
                self.compaction.checked = Some((listed_at, rv));
                let n = (objects.len(), revisions.len());
                // No client is served in between: the cache opens at the end of the history.
                let mut r = self.cacher.handle_replace(now, rv, objects);
                for (rev, changes) in revisions {
                    if r.is_err() {
                        break;
                    }
                    r = self.cacher.handle_revision(now, rev, changes);
                }
                // etcd's progress: nothing else happened to the prefix up to `seen`.
                if r.is_ok() && seen > self.cacher.resource_version() {
                    r = self.cacher.handle_progress(now, seen);
                }
                if r.is_ok() {
                    info!(prefix = %String::from_utf8_lossy(&self.prefix), list_revision = rv, objects = n.0, revisions = n.1, revision = self.cacher.resource_version(), "cache initialised from a list and etcd's recent history");
                }
                r
            }
            StorageMsg::Revision { rv, .. } if self.drop_next_revision => {
                // The test hook: the cache misses this revision's changes (as a lost event
                // would), though its revision moves on.
                self.drop_next_revision = false;
                warn!(prefix = %String::from_utf8_lossy(&self.prefix), revision = rv, "test hook: dropping a revision");
                self.cacher.handle_progress(now, rv)
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
        self.collect();
        if !self.waiting_ready.is_empty() && self.cacher.ready_state() == ReadyState::Ready {
            self.expire_ready_waits();
        }
        self.answer_caught_up_frontiers();
    }

    /// Carries out the core's outputs: replies at once, deliveries into the pending batches.
    fn collect(&mut self) {
        while let Some(out) = self.cacher.poll_output() {
            match out {
                Output::Fanout { event, targets } => {
                    let mut index = None;
                    for &cacher_core::Target { watch: id, kind } in targets.iter() {
                        match self.routes.get_mut(&id) {
                            Some(Route::Etcd { picks, .. }) => {
                                let i = *index.get_or_insert_with(|| {
                                    self.pending.events.push(event.clone());
                                    (self.pending.events.len() - 1) as u32
                                });
                                pick(&mut self.pending.etcd_order, picks, id, i);
                            }
                            Some(Route::Core { .. }) => core_item(
                                &mut self.pending,
                                id,
                                WatchEvent::Change(kind, event.clone()),
                            ),
                            None => {}
                        }
                    }
                }
                Output::Deliver { watch, events } => match self.routes.get_mut(&watch) {
                    Some(Route::Etcd { picks, .. }) => {
                        for e in events {
                            if let WatchEvent::Change(_, ev) = e {
                                self.pending.events.push(ev);
                                let i = (self.pending.events.len() - 1) as u32;
                                pick(&mut self.pending.etcd_order, picks, watch, i);
                            }
                        }
                    }
                    Some(Route::Core { .. }) => {
                        for e in events {
                            core_item(&mut self.pending, watch, e);
                        }
                    }
                    None => {}
                },
                Output::WatchStarted { watch, rv, .. } => {
                    let now = self.clock.now();
                    let cache_rv = self.cacher.resource_version();
                    match self.routes.get_mut(&watch) {
                        Some(Route::Etcd { tag, sink, started, .. }) => {
                            *started = true;
                            let msg =
                                CacheMsg::Started { tag: *tag, watch, after_rev: rv, cache_rv };
                            if sink.send(msg).is_err() {
                                self.routes.remove(&watch);
                                self.cacher.stop_watch(now, watch);
                            } else {
                                // The first credit lets the replay and live events flow.
                                self.cacher.grant_credit(now, watch, self.config.grpc_credit);
                            }
                        }
                        Some(Route::Core { sink }) => {
                            let _ = sink.send(CoreItem::Started);
                            self.cacher.grant_credit(now, watch, self.config.kube_credit);
                        }
                        None => {}
                    }
                }
                Output::WatchError { watch, status } => {
                    self.flush();
                    match self.routes.get(&watch) {
                        Some(Route::Etcd { started: false, .. }) => {
                            if let Some(Route::Etcd { tag, sink, .. }) = self.routes.remove(&watch)
                            {
                                let _ =
                                    sink.send(CacheMsg::Refused { tag, reason: status.message });
                            }
                        }
                        // The close follows and says it.
                        Some(Route::Etcd { .. }) | None => {}
                        Some(Route::Core { sink }) => {
                            let _ = sink.send(CoreItem::Error(status));
                        }
                    }
                }
                Output::WatchClosed { watch, cause, message, .. } => {
                    self.flush();
                    match self.routes.remove(&watch) {
                        Some(Route::Etcd { tag, sink, started: false, .. }) => {
                            let reason = message.unwrap_or_else(|| cause.as_str().to_owned());
                            let _ = sink.send(CacheMsg::Refused { tag, reason });
                        }
                        Some(Route::Etcd { tag, sink, .. }) => {
                            let _ = sink.send(CacheMsg::Closed { tag, cause, message });
                        }
                        Some(Route::Core { sink }) => {
                            let _ = sink.send(CoreItem::Closed(cause));
                        }
                        None => {}
                    }
                }
                Output::WatchDelegated { watch, reason } => match self.routes.remove(&watch) {
                    Some(Route::Etcd { tag, sink, .. }) => {
                        let _ = sink.send(CacheMsg::Refused { tag, reason: reason.to_owned() });
                    }
                    Some(Route::Core { sink }) => {
                        let _ = sink.send(CoreItem::Delegated(reason));
                    }
                    None => {}
                },
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
                    } else {
                        match self.routes.remove(&request) {
                            Some(Route::Etcd { tag, sink, .. }) => {
                                let _ =
                                    sink.send(CacheMsg::Refused { tag, reason: status.message });
                            }
                            Some(Route::Core { sink }) => {
                                let _ = sink.send(CoreItem::Rejected(status));
                            }
                            None => {}
                        }
                    }
                }
                Output::RequestProgress => {
                    let _ = self.reflector.send(ReflectorCtl::Progress);
                }
                Output::NeedCurrentRevision { request } => self.fresh_wait(Waiter::Read(request)),
                Output::Relist { reason } => {
                    let _ = self.reflector.send(ReflectorCtl::Relist(reason));
                }
            }
        }
    }

    /// Sends what was gathered now, or holds it for a while ([`SendPacer`]).
    fn flush_or_hold(&mut self) {
        if !self.pending.is_empty() {
            if let Some(at) = self.pacer.due(Instant::now()) {
                self.flush_at = Some(at);
                return;
            }
        }
        self.flush();
    }

    /// Sends what was gathered: one message per session (etcd-style watches), one item per
    /// core watch. Everything that must follow deliveries (a watch's end, a frontier answer)
    /// calls this first.
    fn flush(&mut self) {
        self.flush_at = None;
        if self.pending.is_empty() {
            self.pending.events.clear();
            return;
        }
        self.pacer.sent(Instant::now());
        let p = &mut self.pending;
        if !p.etcd_order.is_empty() {
            let run = Arc::new(
                EventRun::new(self.cacher.resource_version(), std::mem::take(&mut p.events))
                    .with_compacted(self.cacher.compacted_rv()),
            );
            for id in p.etcd_order.drain(..) {
                let Some(Route::Etcd { session, tag, sink, picks, .. }) = self.routes.get_mut(&id)
                else {
                    continue;
                };
                let Some(picks) = picks.take() else { continue };
                let i = *p.session_index.entry(*session).or_insert_with(|| {
                    p.per_session.push((sink.clone(), Vec::new(), 0));
                    p.per_session.len() - 1
                });
                p.per_session[i].2 += 1;
                p.staged.push((i, WatchItems { tag: *tag, picks }));
            }
            for (_, items, n) in p.per_session.iter_mut() {
                items.reserve_exact(*n);
            }
            for (i, item) in p.staged.drain(..) {
                p.per_session[i].1.push(item);
            }
            for (sink, items, _) in p.per_session.drain(..) {
                let _ = sink.send(CacheMsg::Events { run: run.clone(), items });
            }
            p.session_index.clear();
        }
        p.events.clear();
        for id in p.core_order.drain(..) {
            if let (Some(Route::Core { sink }), Some(events)) =
                (self.routes.get(&id), p.core.remove(&id))
            {
                let _ = sink.send(CoreItem::Events(events));
            }
        }
    }

    /// Waits for etcd's current revision. Waiters that arrive while a check is out wait for
    /// the next one (a check that started before them cannot vouch for them): etcd's ReadIndex
    /// batching, so concurrent consistent reads and progress requests cost etcd one read.
    fn fresh_wait(&mut self, w: Waiter) {
        if self.freshness.in_flight {
            self.freshness.next.push(w);
        } else {
            self.check_freshness(vec![w]);
        }
    }

    /// Answers a frontier query now: everything given out goes first, so the answer follows
    /// the events it vouches for.
    fn answer_frontier(&mut self, q: FrontierQuery) {
        self.collect();
        self.flush();
        let cache_rv = self.cacher.resource_version();
        let ready = self.cacher.ready_state() == ReadyState::Ready;
        let caught_up = q
            .watches
            .into_iter()
            .map(|(tag, id)| {
                let ok = ready
                    && self.cacher.watcher(id).is_some_and(|w| {
                        w.state == WatcherState::Active && w.queued == 0 && w.initial_pending == 0
                    });
                (tag, ok)
            })
            .collect();
        let _ = q.sink.send(CacheMsg::Frontier { token: q.token, cache_rv, caught_up });
    }

    /// Answers the fresh frontier queries whose revision the cache has reached (or that waited
    /// long enough: etcd unreachable; the session then asks again).
    fn answer_caught_up_frontiers(&mut self) {
        if self.frontiers_waiting.is_empty() {
            return;
        }
        let rv = self.cacher.resource_version();
        let now = Instant::now();
        let waiting = std::mem::take(&mut self.frontiers_waiting);
        for (need, deadline, q) in waiting {
            if rv >= need || deadline <= now {
                self.answer_frontier(*q);
            } else {
                self.frontiers_waiting.push((need, deadline, q));
            }
        }
    }

    /// While frontier queries wait for the cache to reach etcd's revision, the reflector asks
    /// etcd for progress every 100 ms (etcd drops the request while its watcher catches up).
    fn nudge_reflector(&mut self) {
        if self.frontiers_waiting.is_empty() {
            self.next_nudge = None;
            return;
        }
        let now = Instant::now();
        if self.next_nudge.is_none_or(|t| t <= now) {
            let _ = self.reflector.send(ReflectorCtl::Progress);
            self.next_nudge = Some(now + Duration::from_millis(100));
        }
    }

    /// One check of etcd's current revision for every waiter: a revision probe on the
    /// reflector's watch stream when etcd is one voting member (`Freshness::Auto`), else (or
    /// when the probe fails) a linearizable read of one key.
    fn check_freshness(&mut self, waiters: Vec<Waiter>) {
        let Some(tx) = self.self_tx.upgrade() else { return };
        self.freshness.in_flight = true;
        let upstream = self.upstream.clone();
        let prefix = self.prefix.clone();
        let metrics = self.metrics.clone();
        let probe = (self.config.freshness == crate::config::Freshness::Auto
            && upstream.single_member())
        .then(|| self.reflector.clone());
        tokio::spawn(async move {
            if let Some(reflector) = probe {
                let (reply, answer) = oneshot::channel();
                if reflector.send(ReflectorCtl::Revision(reply)).is_ok() {
                    match tokio::time::timeout(Duration::from_secs(1), answer).await {
                        Ok(Ok(Ok(rv))) => {
                            let _ = tx.send(Cmd::CurrentRevision { waiters, rv });
                            return;
                        }
                        Ok(Ok(Err(e))) => debug!(error = %e, "revision probe failed"),
                        _ => debug!(
                            "no revision probe answer (the reflector is relisting or etcd is slow)"
                        ),
                    }
                }
            }
            let mut delay = Duration::from_millis(50);
            for _ in 0..4 {
                metrics.count_upstream_request("quorum_read");
                match upstream.current_revision(&prefix).await {
                    Ok(rv) => {
                        let _ = tx.send(Cmd::CurrentRevision { waiters, rv });
                        return;
                    }
                    Err(e) => {
                        debug!(error = %e, "quorum read for the current revision failed");
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                }
            }
            // etcd cannot say: make the reads wait (and time out) rather than answer stale.
            let _ = tx.send(Cmd::CurrentRevision { waiters, rv: u64::MAX / 2 });
        });
    }

    fn state_json(&self) -> serde_json::Value {
        let c = &self.cacher;
        let w = c.window();
        let (snapshots, oldest_snapshot) = c.snapshots();
        let listed: Vec<serde_json::Value> = c
            .first_watchers(1000)
            .iter()
            .map(|w| {
                json!({
                    "id": w.id.0, "key": w.key, "rv": w.rv, "last_sent_rv": w.last_sent_rv,
                    "queued": w.queued, "queue_capacity": w.queue_capacity, "state": w.state.as_str(),
                    "lag": w.lag, "policy": w.policy.as_str(),
                    "kind": match self.routes.get(&w.id) { Some(Route::Etcd { .. }) => "etcd", Some(Route::Core { .. }) => "kube", None => "-" },
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
            "consistency_check": self.last_check,
            "last_error": c.last_error(),
            "window": {
                "oldest_rv": w.oldest_rv, "newest_rv": w.newest_rv, "oldest_servable": w.oldest_servable,
                "len": w.len, "capacity": w.capacity, "evicted_since_relist": w.evicted_since_relist,
                "bytes": c.ring_bytes(), "max_bytes": c.config().max_cache_bytes,
            },
            "store": {"objects": c.store_len(), "snapshots": snapshots, "oldest_snapshot": oldest_snapshot},
            "watchers": {"count": c.watcher_count(), "listed": listed, "parked": c.parked_count(), "waiting_ready": self.waiting_ready.len()},
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

/// Asks etcd whether it still has revision `oldest` (a read of one key there, which etcd
/// refuses once compacted); when not, learns the exact compaction revision (a watch from there,
/// which etcd cancels naming it). `None`: not compacted past `oldest`, or etcd did not answer
/// within a second (the cache then serves what it has, as it does while etcd is away).
async fn probe_compaction(
    upstream: &Upstream,
    metrics: &HostMetrics,
    key: &[u8],
    oldest: u64,
) -> Option<u64> {
    if oldest == 0 {
        return None;
    }
    metrics.count_upstream_request("compaction_probe");
    let limit = Duration::from_secs(1);
    match tokio::time::timeout(limit, upstream.has_revision(key, oldest)).await {
        Ok(Ok(true)) => None,
        Ok(Ok(false)) => {
            metrics.count_upstream_request("watch");
            match tokio::time::timeout(limit, upstream.compaction_revision(key, oldest)).await {
                Ok(Ok(rev)) => Some(rev),
                // Compacted past `oldest`, by how much unknown: at least one more.
                other => {
                    debug!(?other, "learning etcd's compaction revision failed");
                    Some(oldest + 1)
                }
            }
        }
        Ok(Err(e)) => {
            debug!(error = %e, "compaction probe failed");
            None
        }
        Err(_) => {
            debug!("compaction probe: etcd did not answer within a second");
            None
        }
    }
}

fn refuse(start: &EtcdWatchStart, reason: &str) {
    let _ = start.sink.send(CacheMsg::Refused { tag: start.tag, reason: reason.to_owned() });
}

/// Adds event `i` to watch `id`'s picks (`slot`, in its route).
fn pick(order: &mut Vec<RequestId>, slot: &mut Option<Picks>, id: RequestId, i: u32) {
    match slot {
        Some(p) => p.push(i),
        None => {
            *slot = Some(Picks::one(i));
            order.push(id);
        }
    }
}

fn core_item(pending: &mut Pending, id: RequestId, e: WatchEvent) {
    match pending.core.get_mut(&id) {
        Some(v) => v.push(e),
        None => {
            pending.core.insert(id, vec![e]);
            pending.core_order.push(id);
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_after_a_quiet_spell_goes_at_once_and_a_busy_one_waits_for_the_hold() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = SendPacer::new(ms(5));
        assert_eq!(p.due(t0), None, "the first send goes at once");
        p.sent(t0);
        assert_eq!(p.due(t0 + ms(2)), Some(t0 + ms(5)), "2 ms later: held until 5 ms after");
        assert_eq!(p.due(t0 + ms(5)), None, "the hold is over");
        p.sent(t0 + ms(5));
        assert_eq!(p.due(t0 + ms(60)), None, "after a quiet spell: at once");
    }

    #[test]
    fn no_hold_sends_every_time() {
        let t0 = Instant::now();
        let mut p = SendPacer::new(Duration::ZERO);
        p.sent(t0);
        assert_eq!(p.due(t0), None);
    }
}
