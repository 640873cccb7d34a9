//! The cacher: one state machine tying the ring buffer, store, ready gate, watchers, dispatch,
//! bookmarks, progress requests and read decisions together.
//!
//! Kubernetes counterparts: `cacher.go` (`Cacher`, `startCaching`, `terminateAllWatchers`,
//! `Stop`) and the event intake of `watch_cache.go` (`processEvent`, `Replace`,
//! `UpdateResourceVersion`). Watch, list and get live in `watch.rs` and `reads.rs`, the fan-out
//! and the bookmark tick in `dispatch.rs`.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::bookmarks::{Slot, TimeBuckets};
use crate::budget::TimeBudget;
use crate::config::{Config, ConfigError};
use crate::event::Event;
use crate::hash::HashMap;
use crate::key::{display_key, Key};
use crate::metrics::Metrics;
use crate::object::Object;
use crate::output::{CloseCause, Output, RequestId};
use crate::ready::{ReadyGate, ReadyState};
use crate::request::{GetRequest, ListRequest, WatchRequest};
use crate::ring::{Ring, RingConfig};
use crate::rng::Rng;
use crate::status::Status;
use crate::store::Store;
use crate::time::Timestamp;
use crate::watcher::{Flow, Placement, Watcher};

/// `compactorPollPeriod` (`compactor.go`, 1.33+).
const COMPACTOR_POLL_MS: u64 = 15_000;

/// The capacity of the dispatcher's `incoming` channel (`cacher.go`).
const INCOMING_CAPACITY: usize = 100;

/// How often the 1.31+ dispatch loop polls for the first list before it starts.
const DISPATCHER_START_POLL_MS: u64 = 10;

/// An item of the dispatcher's `incoming` channel.
#[derive(Clone, Debug)]
pub(crate) enum Incoming {
    /// A storage event the watch cache took, and its index in the ring.
    Event(Arc<Event>, u64),
    /// A progress notify (a BOOKMARK the dispatcher does not fan out).
    Progress(u64),
}

/// Storage input the reflector has not handed to the cache yet.
#[derive(Clone, Debug)]
pub(crate) enum Held {
    /// A revision, and when it arrived (storage's decode time).
    Revision { rv: u64, changes: Vec<Change>, at: Timestamp },
    /// A progress notify.
    Progress(u64),
    /// The end of the storage watch.
    Error(String),
}

/// The reflector's input not yet given to the cache, with what it will make of the cache, so
/// that new input is checked against the cache as it will be.
#[derive(Debug, Default)]
pub(crate) struct Reflector {
    held: VecDeque<Held>,
    /// The RV the cache will have once it has taken everything held.
    held_rv: Option<u64>,
    /// Keys the held revisions create (true) or delete (false), with how many held revisions
    /// touch each.
    keys: BTreeMap<Key, (bool, usize)>,
    /// A storage error is held: nothing more comes from this watch.
    pub(crate) broken: bool,
}

impl Reflector {
    fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    fn rv(&self) -> Option<u64> {
        self.held_rv
    }

    fn exists(&self, key: &[u8], store: &Store) -> bool {
        match self.keys.get(key) {
            Some((exists, _)) => *exists,
            None => store.get(key).is_some(),
        }
    }

    fn hold(&mut self, h: Held) {
        match &h {
            Held::Revision { rv, changes, .. } => {
                self.held_rv = Some(*rv);
                for c in changes {
                    let e = self.keys.entry(Key::new(c.key())).or_insert((false, 0));
                    *e = (matches!(c, Change::Put(_)), e.1 + 1);
                }
            }
            Held::Progress(rv) => self.held_rv = Some(*rv),
            Held::Error(_) => self.broken = true,
        }
        self.held.push_back(h);
    }

    fn next(&mut self) -> Option<Held> {
        let h = self.held.pop_front()?;
        if let Held::Revision { changes, .. } = &h {
            for c in changes {
                if let Some(e) = self.keys.get_mut(c.key()) {
                    e.1 -= 1;
                    if e.1 == 0 {
                        self.keys.remove(c.key());
                    }
                }
            }
        }
        if self.held.is_empty() {
            self.held_rv = None;
            self.broken = false;
        }
        Some(h)
    }

    fn clear(&mut self) {
        *self = Reflector::default();
    }
}

/// One change of a storage revision.
#[derive(Clone, Debug)]
pub enum Change {
    /// Create or update.
    Put(Object),
    /// Delete of a key.
    Delete(Key),
}

impl Change {
    /// The key it changes.
    pub fn key(&self) -> &[u8] {
        match self {
            Change::Put(o) => o.key(),
            Change::Delete(k) => k.as_bytes(),
        }
    }
}

/// Why the next timeout is due (see [`Cacher::poll_timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerReason {
    /// The dispatch loop's tick: periodic bookmarks.
    DispatchTick,
    /// Ask storage for progress while readers wait for freshness.
    ProgressRequest,
    /// A reader's 3 s freshness wait ends.
    FreshnessWait,
    /// A watch's timeout.
    WatchDeadline,
    /// Dispatch stops waiting for blocked watchers (time budget spent).
    SlowWatcherBudget,
    /// A request parked until the cache is ready gives up.
    RequestTimeout,
    /// The pause before a relist after the storage watch broke (`wait.Until`'s period).
    Relist,
    /// The compactor reads storage's compaction revision (every 15 s, with snapshots).
    CompactorPoll,
    /// 1.31+: the dispatch loop's 10 ms poll for the first list finds it and starts.
    DispatcherStart,
}

impl TimerReason {
    /// Snake-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TimerReason::DispatchTick => "dispatch_tick",
            TimerReason::ProgressRequest => "progress_request",
            TimerReason::FreshnessWait => "freshness_wait",
            TimerReason::WatchDeadline => "watch_deadline",
            TimerReason::SlowWatcherBudget => "slow_watcher_budget",
            TimerReason::RequestTimeout => "request_timeout",
            TimerReason::Relist => "relist",
            TimerReason::CompactorPoll => "compactor_poll",
            TimerReason::DispatcherStart => "dispatcher_start",
        }
    }
}

/// Bad input from storage: the event is rejected and the state is unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageError {
    /// The cache has not been initialised by a list yet (or is relisting).
    NotInitialized,
    /// The cacher is stopped.
    Stopped,
    /// An event or progress notify below the cache's resourceVersion.
    RvWentBack {
        /// The offending RV.
        rv: u64,
        /// The cache's RV.
        current: u64,
    },
    /// A put whose object carries another RV than the event.
    RvMismatch {
        /// The event RV.
        event_rv: u64,
        /// The object's RV.
        object_rv: u64,
    },
    /// A delete of a key the cache does not hold.
    UnknownKey(String),
    /// A relist or a revision with the same key twice.
    DuplicateKey(String),
    /// A revision with no changes.
    EmptyRevision(u64),
    /// A relisted object newer than the list.
    ObjectNewerThanList {
        /// The key.
        key: String,
        /// The object's RV.
        rv: u64,
        /// The list's RV.
        list_rv: u64,
    },
}

impl core::fmt::Display for StorageError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StorageError::NotInitialized => {
                f.write_str("storage event before the cache was initialised by a list")
            }
            StorageError::Stopped => f.write_str("the cacher is stopped"),
            StorageError::RvWentBack { rv, current } => {
                write!(f, "storage resourceVersion went back: {rv} after {current}")
            }
            StorageError::RvMismatch { event_rv, object_rv } => {
                write!(f, "object resourceVersion {object_rv} differs from the event's {event_rv}")
            }
            StorageError::UnknownKey(k) => write!(f, "delete of unknown key {k:?}"),
            StorageError::DuplicateKey(k) => write!(f, "duplicate key {k:?}"),
            StorageError::EmptyRevision(rv) => write!(f, "revision {rv} has no changes"),
            StorageError::ObjectNewerThanList { key, rv, list_rv } => {
                write!(
                    f,
                    "object {key:?} at resourceVersion {rv} is newer than the list at {list_rv}"
                )
            }
        }
    }
}

impl core::error::Error for StorageError {}

/// The window of events the cache can serve watches from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// RV of the oldest buffered event.
    pub oldest_rv: Option<u64>,
    /// RV of the newest buffered event.
    pub newest_rv: Option<u64>,
    /// The oldest RV a watch can start from (exclusive start: a watch from RV X needs
    /// X ≥ oldest_servable − 1); `None` when the cache cannot serve watches from an RV.
    pub oldest_servable: Option<u64>,
    /// Buffered events.
    pub len: usize,
    /// Ring capacity.
    pub capacity: usize,
    /// Monotonic index of the oldest event.
    pub start_index: u64,
    /// Monotonic index one past the newest event.
    pub end_index: u64,
    /// An event was evicted since the last relist.
    pub evicted_since_relist: bool,
}

/// How events get to a watcher (`WatcherInfo::state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatcherState {
    /// Takes events as they are dispatched (queued while its client has no credit).
    Active,
    /// Still being sent its initial events (from the store or the ring).
    Replaying,
    /// Its queue is full and dispatch waits for room, within the time budget (terminate policy).
    Blocked,
    /// Its queue was full (lag policy): it is a position in the ring, replayed as it reads.
    Lagging,
    /// Closed for input; its client reads what is still on its way.
    Draining,
}

impl WatcherState {
    /// `active`, `replaying`, `blocked`, `lagging` or `draining`.
    pub const fn as_str(self) -> &'static str {
        match self {
            WatcherState::Active => "active",
            WatcherState::Replaying => "replaying",
            WatcherState::Blocked => "blocked",
            WatcherState::Lagging => "lagging",
            WatcherState::Draining => "draining",
        }
    }
}

/// A watcher as the host and the UI see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatcherInfo {
    /// Its id.
    pub id: RequestId,
    /// The key or range it watches (display form).
    pub key: String,
    /// Its resourceVersion after the initial events.
    pub rv: u64,
    /// The last RV the client was given.
    pub last_sent_rv: u64,
    /// Events waiting in its queue.
    pub queued: usize,
    /// Queue capacity.
    pub queue_capacity: usize,
    /// Initial events not yet read.
    pub initial_pending: usize,
    /// How events get to it now.
    pub state: WatcherState,
    /// Events behind the newest buffered event (for lagging watchers).
    pub lag: u64,
    /// Reads everything at once.
    pub auto: bool,
    /// What happens when it reads too slowly.
    pub policy: crate::request::SlowPolicy,
    /// Bookmarks allowed.
    pub allow_bookmarks: bool,
}

/// Counts over the open watches ([`Cacher::watcher_summary`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatcherSummary {
    /// Open watches.
    pub open: usize,
    /// Watches reading from the ring behind the newest event.
    pub lagging: usize,
    /// The largest [`WatcherInfo::lag`].
    pub max_lag: u64,
}

/// The watchers of one trigger value: usually one (a kubelet per node), kept inline.
#[derive(Clone, Debug)]
pub(crate) enum Slots {
    One(Slot),
    Many(Vec<Slot>),
}

impl Slots {
    pub(crate) fn as_slice(&self) -> &[Slot] {
        match self {
            Slots::One(s) => core::slice::from_ref(s),
            Slots::Many(v) => v,
        }
    }

    pub(crate) fn push(&mut self, slot: Slot) {
        match self {
            Slots::One(s) => *self = Slots::Many(alloc::vec![*s, slot]),
            Slots::Many(v) => v.push(slot),
        }
    }

    /// Removes `slot`, keeping the order; returns true when nothing is left.
    pub(crate) fn remove(&mut self, slot: Slot) -> bool {
        let remaining = match self {
            Slots::One(s) => return *s == slot,
            Slots::Many(v) => {
                v.retain(|s| *s != slot);
                match v.as_slice() {
                    [] => return true,
                    [only] => *only,
                    _ => return false,
                }
            }
        };
        *self = Slots::One(remaining);
        false
    }
}

pub(crate) struct Batch {
    pub deadline: Timestamp,
    pub members: Vec<(Slot, RequestId)>,
}

pub(crate) enum Phase {
    /// Waiting for the ready gate.
    Ready,
    /// Waiting for the host's answer to `NeedCurrentRevision`.
    CurrentRv,
    /// Waiting until the cache reaches `rv`, at most until `deadline`.
    Fresh { rv: u64, deadline: Timestamp, progress: bool, started: Timestamp },
}

pub(crate) enum Parked {
    Watch {
        req: Box<WatchRequest>,
        sie: Option<bool>,
        phase: Phase,
        generation: u64,
        required_rv: u64,
        deadline: Option<Timestamp>,
    },
    List {
        req: Box<ListRequest>,
        plan: crate::reads::ListPlan,
        phase: Phase,
        deadline: Timestamp,
    },
    Get {
        req: GetRequest,
        phase: Phase,
        deadline: Timestamp,
    },
}

impl Parked {
    pub(crate) fn phase(&self) -> &Phase {
        match self {
            Parked::Watch { phase, .. }
            | Parked::List { phase, .. }
            | Parked::Get { phase, .. } => phase,
        }
    }
}

/// The Kubernetes watch cache as a sans-IO state machine.
///
/// Its methods come in four kinds (the `quinn-proto` shape):
/// - **getters** (`&self`): [`window`](Cacher::window), [`resource_version`](Cacher::resource_version),
///   [`ready_state`](Cacher::ready_state), [`watchers`](Cacher::watchers), [`metrics`](Cacher::metrics), …;
/// - **storage inputs** `handle_*`: what etcd said — [`handle_replace`](Cacher::handle_replace) (a
///   list), [`handle_put`](Cacher::handle_put), [`handle_delete`](Cacher::handle_delete),
///   [`handle_progress`](Cacher::handle_progress), [`handle_storage_error`](Cacher::handle_storage_error),
///   [`handle_current_revision`](Cacher::handle_current_revision), [`handle_compaction`](Cacher::handle_compaction);
/// - **client commands**, returning an id at once or a 400 for malformed input:
///   [`start_watch`](Cacher::start_watch), [`stop_watch`](Cacher::stop_watch),
///   [`consume`](Cacher::consume), [`grant_credit`](Cacher::grant_credit),
///   [`list`](Cacher::list), [`get`](Cacher::get), and [`stop`](Cacher::stop) for the cacher itself;
/// - **polls**: [`poll_output`](Cacher::poll_output), drained after every call above;
///   [`poll_timeout`](Cacher::poll_timeout), the next deadline and why; and
///   [`handle_timeout`](Cacher::handle_timeout), harmless when called early.
///
/// Every mutating call takes `now`; the core never reads a clock.
pub struct Cacher {
    pub(crate) cfg: Config,
    pub(crate) created: Timestamp,
    pub(crate) now: Timestamp,
    pub(crate) ready: ReadyGate,
    pub(crate) ring: Ring,
    pub(crate) store: Store,
    /// `watchCache.resourceVersion`.
    pub(crate) rv: u64,
    pub(crate) list_rv: u64,
    /// The dispatcher's `lastProcessedResourceVersion`.
    pub(crate) last_processed_rv: u64,
    /// Storage's compaction revision as the host last reported it.
    pub(crate) compacted_rv: u64,
    /// The compaction revision the cacher's compactor has read and acted on.
    pub(crate) compactor_rv: u64,
    pub(crate) budget: TimeBudget,
    pub(crate) buckets: TimeBuckets,
    pub(crate) rng: Rng,
    pub(crate) slots: Vec<Option<Watcher>>,
    pub(crate) free_slots: Vec<Slot>,
    pub(crate) slot_of: HashMap<u64, Slot>,
    /// `allWatchers`: namespace → name → watchers ("" = any).
    pub(crate) by_scope: HashMap<Box<str>, HashMap<Box<str>, Vec<Slot>>>,
    /// `valueWatchers`: trigger value → watchers.
    pub(crate) by_value: HashMap<Box<str>, Slots>,
    /// The last watch range registered: identical ranges share one allocation.
    pub(crate) last_range: Option<crate::key::KeyRange>,
    pub(crate) batches: BTreeMap<u64, Batch>,
    pub(crate) parked: BTreeMap<RequestId, Parked>,
    pub(crate) fresh_waiters: BTreeSet<(u64, RequestId)>,
    pub(crate) progress_waiters: usize,
    pub(crate) timers: BTreeSet<(Timestamp, TimerReason, u64)>,
    pub(crate) tick_at: Timestamp,
    /// The progress requester's armed timer.
    pub(crate) progress_at: Option<Timestamp>,
    /// The requester's loop is awake (it had a waiter when it last looked).
    pub(crate) progress_active: bool,
    /// 1.30: when its ticker was last read; 1.33+: when its timer fires (fired, if past).
    pub(crate) progress_mark: Timestamp,
    pub(crate) next_id: u64,
    pub(crate) next_batch: u64,
    pub(crate) scratch_slots: Vec<Slot>,
    pub(crate) outputs: VecDeque<Output>,
    pub(crate) metrics: Metrics,
    /// A relist due after the storage watch broke: when, and why.
    pub(crate) relist_due: Option<(Timestamp, String)>,
    /// The dispatcher's `incoming` channel: events (and progress RVs) the watch cache took
    /// and dispatch has not reached yet.
    pub(crate) incoming: VecDeque<Incoming>,
    /// Storage input the reflector holds while `incoming` is full.
    pub(crate) reflector: Reflector,
    /// The dispatcher waits inside `dispatchEvent` for a blocked watcher.
    pub(crate) stall: Option<crate::dispatch::Stall>,
    /// A dispatch tick came while the dispatcher was busy: it runs when it is free.
    pub(crate) tick_pending: bool,
    /// The dispatch loop runs (1.31+: only from the first 10 ms poll after the first list).
    pub(crate) dispatcher_started: bool,
    pub(crate) dispatcher_start_at: Option<Timestamp>,
    /// Guards [`Cacher::pump`] against running inside itself.
    pub(crate) pumping: bool,
    /// The RV of the last event dispatched (its revision may still have events in `incoming`).
    pub(crate) last_dispatched_rv: Option<u64>,
    /// The ring index after the last event dispatched: a lagging watcher replays up to it.
    pub(crate) dispatched_end: u64,
}

impl Cacher {
    /// A new, not yet initialised cacher (the gate is Pending until the first
    /// [`handle_replace`](Cacher::handle_replace)).
    pub fn new(cfg: Config, now: Timestamp) -> Result<Cacher, ConfigError> {
        cfg.validate()?;
        let ring = Ring::new(RingConfig {
            capacity: cfg.capacity,
            lower_bound: cfg.lower_bound_capacity,
            upper_bound: cfg.upper_bound_capacity,
            dynamic: cfg.dynamic_capacity,
            event_fresh_ms: cfg.event_fresh_ms,
            max_bytes: cfg.max_cache_bytes,
        });
        let store = Store::new(cfg.index_field.clone(), cfg.list_from_cache_snapshot);
        let (cfg_v134, progress_period) =
            (cfg.profile.is_v1_34(), cfg.progress_request_interval_ms);
        let mut c = Cacher {
            budget: TimeBudget::new(now, cfg.budget_refill_ms_per_s, cfg.budget_max_ms),
            buckets: TimeBuckets::new(now),
            rng: Rng::new(cfg.seed),
            cfg,
            created: now,
            now,
            ready: ReadyGate::new(now),
            ring,
            store,
            rv: 0,
            list_rv: 0,
            last_processed_rv: 0,
            compacted_rv: 0,
            compactor_rv: 0,
            slots: Vec::new(),
            free_slots: Vec::new(),
            slot_of: HashMap::default(),
            by_scope: HashMap::default(),
            by_value: HashMap::default(),
            last_range: None,
            batches: BTreeMap::new(),
            parked: BTreeMap::new(),
            fresh_waiters: BTreeSet::new(),
            progress_waiters: 0,
            timers: BTreeSet::new(),
            tick_at: now,
            progress_at: None,
            progress_active: false,
            progress_mark: if cfg_v134 { now.add_ms(progress_period) } else { now },
            next_id: 1,
            next_batch: 1,
            scratch_slots: Vec::new(),
            outputs: VecDeque::new(),
            metrics: Metrics::default(),
            relist_due: None,
            incoming: VecDeque::new(),
            reflector: Reflector::default(),
            stall: None,
            tick_pending: false,
            dispatcher_started: !cfg_v134,
            dispatcher_start_at: None,
            pumping: false,
            last_dispatched_rv: None,
            dispatched_end: 0,
        };
        c.arm_tick(now);
        if c.store.snapshots_enabled() {
            c.set_timer(now.add_ms(COMPACTOR_POLL_MS), TimerReason::CompactorPoll, 0);
        }
        Ok(c)
    }

    // ----- storage inputs -------------------------------------------------------------------

    /// A (re)list from storage completed at `rv` (`Replace`): every open watch ends
    /// (`terminateAllWatchers`), the ring empties, the store becomes `objects`, and the gate
    /// opens. Objects with RV 0 take the list RV.
    pub fn handle_replace(
        &mut self,
        now: Timestamp,
        rv: u64,
        objects: Vec<Object>,
    ) -> Result<(), StorageError> {
        self.advance(now);
        if self.ready.state() == ReadyState::Stopped {
            return Err(StorageError::Stopped);
        }
        let mut objs: Vec<Object> = objects;
        objs.sort_by(|a, b| a.key().cmp(b.key()));
        for w in objs.windows(2) {
            if w[0].key() == w[1].key() {
                return Err(StorageError::DuplicateKey(display_key(w[0].key())));
            }
        }
        for o in &objs {
            if o.rv() > rv {
                return Err(StorageError::ObjectNewerThanList {
                    key: display_key(o.key()),
                    rv: o.rv(),
                    list_rv: rv,
                });
            }
        }
        let objs: Vec<Arc<Object>> = objs
            .into_iter()
            .map(|o| {
                let mut o = if o.rv() == 0 { o.with_rv(rv) } else { o };
                o.set_etcd_meta_if_unknown(None);
                Arc::new(o)
            })
            .collect();
        // The host may relist without waiting for [`Output::Relist`]: nothing more to ask.
        if let Some((at, _)) = self.relist_due.take() {
            self.clear_timer(at, TimerReason::Relist, 0);
        }
        self.terminate_all(CloseCause::Reinitializing, None);
        // Storage input held behind a full `incoming` channel belonged to the watch this list
        // replaces.
        self.reflector.clear();
        self.ring.reset();
        self.store.replace(objs, rv);
        self.list_rv = rv;
        self.rv = rv;
        if !self.dispatcher_started && self.dispatcher_start_at.is_none() && rv != 0 {
            // 1.31+: the dispatch loop polls every 10 ms for a list RV other than 0 before it
            // starts (a list at RV 0 never starts it).
            let at = self.next_grid_point(now, DISPATCHER_START_POLL_MS);
            self.dispatcher_start_at = Some(at);
            self.set_timer(at, TimerReason::DispatcherStart, 0);
        }
        self.metrics.initializations += 1;
        let opened = self.ready.set_ready(now);
        self.wake_fresh_waiters();
        if opened {
            self.resume_parked_for_ready();
        }
        Ok(())
    }

    /// A storage event: create or update of `object` at its RV (ADDED vs MODIFIED follows the
    /// store). `create_revision`/`version` are filled in as etcd would when unset.
    pub fn handle_put(&mut self, now: Timestamp, object: Object) -> Result<(), StorageError> {
        let rv = object.rv();
        self.handle_revision(now, rv, alloc::vec![Change::Put(object)])
    }

    /// A storage event: delete of `key` at `rv`. The key must be in the store.
    pub fn handle_delete(
        &mut self,
        now: Timestamp,
        key: &[u8],
        rv: u64,
    ) -> Result<(), StorageError> {
        self.handle_revision(now, rv, alloc::vec![Change::Delete(Key::new(key))])
    }

    /// Every change of one storage revision at once (an etcd watch response carries whole
    /// revisions; a multi-key transaction is one revision). Readers and new watches never see
    /// part of a revision. Objects with RV 0 take `rv`.
    ///
    /// The watch cache takes it at once and hands its events to the dispatcher's `incoming`
    /// channel (100 events, `cacher.go`); while dispatch is held up (a blocked watcher, see
    /// [`Config::non_blocking_dispatch`], or the 1.31+ dispatcher not started yet) they wait
    /// there, and once it is full the reflector stops too: later storage input is held, in
    /// order, and the cache takes it as the channel drains.
    pub fn handle_revision(
        &mut self,
        now: Timestamp,
        rv: u64,
        changes: Vec<Change>,
    ) -> Result<(), StorageError> {
        self.advance(now);
        self.check_storage_input()?;
        let current = self.reflector.rv().unwrap_or(self.rv);
        if rv <= current {
            return Err(StorageError::RvWentBack { rv, current });
        }
        if changes.is_empty() {
            return Err(StorageError::EmptyRevision(rv));
        }
        // Check everything before changing anything.
        let mut seen: BTreeSet<&[u8]> = BTreeSet::new();
        for change in &changes {
            let key = change.key();
            if !seen.insert(key) {
                return Err(StorageError::DuplicateKey(display_key(key)));
            }
            match change {
                Change::Put(o) if o.rv() != rv && o.rv() != 0 => {
                    return Err(StorageError::RvMismatch { event_rv: rv, object_rv: o.rv() });
                }
                Change::Delete(k) if !self.reflector.exists(k.as_bytes(), &self.store) => {
                    return Err(StorageError::UnknownKey(display_key(k.as_bytes())));
                }
                _ => {}
            }
        }
        if self.reflector_blocked() {
            self.reflector.hold(Held::Revision { rv, changes, at: now });
            return Ok(());
        }
        self.apply_revision(rv, changes, now);
        self.pump();
        self.wake_fresh_waiters();
        Ok(())
    }

    /// A storage progress notify at `rv` (`UpdateResourceVersion`): the cache RV advances;
    /// nothing is fanned out, but the next periodic bookmark carries it.
    pub fn handle_progress(&mut self, now: Timestamp, rv: u64) -> Result<(), StorageError> {
        self.advance(now);
        self.check_storage_input()?;
        let current = self.reflector.rv().unwrap_or(self.rv);
        if rv < current {
            return Err(StorageError::RvWentBack { rv, current });
        }
        if self.reflector_blocked() {
            self.reflector.hold(Held::Progress(rv));
            return Ok(());
        }
        self.apply_progress(rv);
        self.pump();
        self.wake_fresh_waiters();
        Ok(())
    }

    /// The upstream watch broke: the gate closes at once; after `relist_delay_ms` (1 s:
    /// `startCaching` runs under `wait.Until(…, 1s)`, which waits its period after
    /// `ListAndWatch` returned) every watch ends (`terminateAllWatchers`) and the host is asked
    /// to relist ([`Output::Relist`]). Until then the open watches stay, and get their periodic
    /// bookmarks. A second error before the relist changes nothing.
    pub fn handle_storage_error(&mut self, now: Timestamp, reason: &str) {
        self.advance(now);
        if self.ready.state() == ReadyState::Stopped || self.relist_due.is_some() {
            return;
        }
        if self.reflector.is_holding() {
            // The reflector reaches the end of its watch after what it still holds.
            if !self.reflector.broken {
                self.reflector.hold(Held::Error(String::from(reason)));
            }
            return;
        }
        self.apply_storage_error(now, reason);
    }

    fn apply_storage_error(&mut self, now: Timestamp, reason: &str) {
        self.ready.set_pending(now, Some(String::from(reason)));
        if self.cfg.relist_delay_ms == 0 {
            self.relist(String::from(reason));
            return;
        }
        let at = now.add_ms(self.cfg.relist_delay_ms);
        self.relist_due = Some((at, String::from(reason)));
        self.set_timer(at, TimerReason::Relist, 0);
    }

    /// The cache is reinitialised at once, without [`Cacher::handle_storage_error`]'s pause (an
    /// API server restart drops every watch at once): the gate closes, every watch ends, and
    /// the host is asked to relist.
    pub fn reinitialize(&mut self, now: Timestamp, reason: &str) {
        self.advance(now);
        if self.ready.state() == ReadyState::Stopped {
            return;
        }
        if let Some((at, _)) = self.relist_due.take() {
            self.clear_timer(at, TimerReason::Relist, 0);
        }
        self.ready.set_pending(now, Some(String::from(reason)));
        self.relist(String::from(reason));
    }

    /// Storage's current revision, asked for by [`Output::NeedCurrentRevision`].
    pub fn handle_current_revision(&mut self, now: Timestamp, request: RequestId, rv: u64) {
        self.advance(now);
        let Some(parked) = self.parked.get(&request) else { return };
        if !matches!(parked.phase(), Phase::CurrentRv) {
            return;
        }
        self.continue_with_current_rv(request, rv);
    }

    /// Storage compacted its history at `rv` (what `storage.CompactRevision()` now says). An
    /// etcd [`Cacher::range`] below it goes to storage at once; the snapshots that serve
    /// Exact and continue lists are pruned by the cacher's compactor (`compactor.go`), which
    /// reads the revision every 15 s, so until its next read they still serve.
    pub fn handle_compaction(&mut self, now: Timestamp, rv: u64) {
        self.advance(now);
        self.compacted_rv = self.compacted_rv.max(rv);
    }

    /// Stops the cacher for good (`Cacher.Stop`): watches end, parked requests fail.
    pub fn stop(&mut self, now: Timestamp) {
        self.advance(now);
        if self.ready.state() == ReadyState::Stopped {
            return;
        }
        self.ready.stop(now);
        self.terminate_all(CloseCause::Stopped, Some(String::from("apiserver cacher is stopped")));
        let parked: Vec<RequestId> = self.parked.keys().copied().collect();
        for id in parked {
            self.unpark(id);
            self.outputs.push_back(Output::Rejected { request: id, status: Status::stopped() });
        }
        self.timers.clear();
        self.progress_at = None;
        self.progress_active = false;
        self.relist_due = None;
        self.incoming.clear();
        self.reflector.clear();
        self.stall = None;
        self.tick_pending = false;
        self.dispatcher_start_at = None;
    }

    // ----- polls ----------------------------------------------------------------------------

    /// The next output, in the order produced. Drain after every mutating call.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The next deadline and why it is due.
    pub fn poll_timeout(&self) -> Option<(Timestamp, TimerReason)> {
        self.timers.first().map(|&(t, r, _)| (t, r))
    }

    /// Fires every timer due at or before `now`, in deadline order. Calling it early does
    /// nothing.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.advance(now);
        while let Some(&(t, reason, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            match reason {
                TimerReason::DispatchTick => self.on_tick(now),
                TimerReason::ProgressRequest => self.on_progress_timer(now),
                TimerReason::FreshnessWait => self.on_fresh_timeout(RequestId(id)),
                TimerReason::WatchDeadline => self.on_watch_deadline(RequestId(id)),
                TimerReason::SlowWatcherBudget => self.on_batch_deadline(id),
                TimerReason::RequestTimeout => self.on_request_timeout(RequestId(id)),
                TimerReason::CompactorPoll => self.on_compactor_poll(now),
                TimerReason::DispatcherStart => self.on_dispatcher_start(),
                TimerReason::Relist => {
                    if let Some((_, reason)) = self.relist_due.take() {
                        self.relist(reason);
                    }
                }
            }
        }
    }

    // ----- getters ----------------------------------------------------------------------------

    /// When the cacher was created (bookmark buckets count whole seconds from it).
    pub fn created_at(&self) -> Timestamp {
        self.created
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The cache's resourceVersion (`watchCache.resourceVersion`).
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The RV of the last successful list (`listResourceVersion`).
    pub fn list_resource_version(&self) -> u64 {
        self.list_rv
    }

    /// The ready gate's state.
    pub fn ready_state(&self) -> ReadyState {
        self.ready.state()
    }

    /// How often the gate has opened (`ready.generation`).
    pub fn ready_generation(&self) -> u64 {
        self.ready.generation()
    }

    /// The last storage error while not ready.
    pub fn last_error(&self) -> Option<&str> {
        self.ready.last_error()
    }

    /// The ring buffer's window.
    pub fn window(&self) -> Window {
        Window {
            oldest_rv: self.ring.oldest().map(|e| e.rv()),
            newest_rv: self.ring.newest().map(|e| e.rv()),
            oldest_servable: self.oldest_servable().ok(),
            len: self.ring.len(),
            capacity: self.ring.capacity(),
            start_index: self.ring.start_index(),
            end_index: self.ring.end_index(),
            evicted_since_relist: self.ring.removed_since_relist(),
        }
    }

    /// Buffered events, oldest first: (RV, key, is delete).
    pub fn window_events(&self) -> impl Iterator<Item = (u64, &[u8], bool)> + '_ {
        self.ring.iter().map(|e| (e.rv(), e.key(), e.is_delete()))
    }

    /// The bytes of the events in the ring (see [`Config::max_cache_bytes`]).
    pub fn ring_bytes(&self) -> u64 {
        self.ring.bytes()
    }

    /// Objects in the store.
    pub fn store_len(&self) -> usize {
        self.store.len()
    }

    /// The stored object under `key` (no read decision, no metrics).
    pub fn peek(&self, key: &[u8]) -> Option<&Arc<Object>> {
        self.store.get(key)
    }

    /// All stored objects in key order (an O(1) snapshot, then a walk).
    pub fn objects(&self) -> Vec<Arc<Object>> {
        self.store.tree().to_vec()
    }

    /// Snapshots held for Exact reads (v1.34), and the oldest one's RV.
    pub fn snapshots(&self) -> (usize, Option<u64>) {
        (self.store.snapshot_count(), self.store.oldest_snapshot_rv())
    }

    /// The dispatch time budget available now, in ms.
    pub fn budget_available_ms(&self) -> u64 {
        self.budget.available_ms()
    }

    /// The dispatcher's bookmark RV (`lastProcessedResourceVersion`).
    pub fn last_processed_rv(&self) -> u64 {
        self.last_processed_rv
    }

    /// Storage's compaction revision as last reported.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Open watches.
    pub fn watcher_count(&self) -> usize {
        self.slot_of.len()
    }

    /// Requests parked (waiting for the gate, storage's revision, or freshness).
    pub fn parked_count(&self) -> usize {
        self.parked.len()
    }

    /// Requests waiting for freshness.
    pub fn fresh_waiter_count(&self) -> usize {
        self.fresh_waiters.len()
    }

    /// Entries in the bookmark time buckets (stale ones included, as in Kubernetes).
    pub fn bookmark_bucket_entries(&self) -> usize {
        self.buckets.len()
    }

    /// Open watches, by id.
    pub fn watchers(&self) -> Vec<WatcherInfo> {
        self.first_watchers(usize::MAX)
    }

    /// The `limit` open watches with the lowest ids, by id: the first page of [`Self::watchers`],
    /// without describing (or sorting) the others, so that a debug page at 100 000 watchers
    /// costs what its page shows.
    pub fn first_watchers(&self, limit: usize) -> Vec<WatcherInfo> {
        let mut ids: Vec<u64> = self.slot_of.keys().copied().collect();
        if limit < ids.len() {
            if limit > 0 {
                ids.select_nth_unstable(limit - 1);
            }
            ids.truncate(limit);
        }
        ids.sort_unstable();
        ids.into_iter().filter_map(|id| self.watcher(RequestId(id))).collect()
    }

    /// How many watches are open, how many lag behind the ring, and the largest lag: what a
    /// metrics scrape needs, without describing every watch (no allocation, whatever the
    /// number of watchers).
    pub fn watcher_summary(&self) -> WatcherSummary {
        let mut s = WatcherSummary { open: self.slot_of.len(), ..WatcherSummary::default() };
        for w in self.slots.iter().flatten() {
            let (state, lag) = self.state_of(w);
            if state == WatcherState::Lagging {
                s.lagging += 1;
            }
            s.max_lag = s.max_lag.max(lag);
        }
        s
    }

    fn state_of(&self, w: &Watcher) -> (WatcherState, u64) {
        match &w.flow {
            Flow::Active if w.initial.is_some() => (WatcherState::Replaying, 0),
            Flow::Active => (WatcherState::Active, 0),
            Flow::Blocked { overflow, .. } => (WatcherState::Blocked, overflow.len() as u64),
            Flow::Lagging { next_index } => {
                (WatcherState::Lagging, self.ring.end_index().saturating_sub(*next_index))
            }
            Flow::Draining { .. } => (WatcherState::Draining, 0),
        }
    }

    /// One open watch.
    pub fn watcher(&self, id: RequestId) -> Option<WatcherInfo> {
        let w = self.watcher_ref(id)?;
        let (state, lag) = self.state_of(w);
        Some(WatcherInfo {
            id: w.id,
            key: describe_range(&w.range),
            rv: w.rv,
            last_sent_rv: w.last_sent_rv,
            queued: w.queue.len(),
            queue_capacity: w.queue_cap,
            initial_pending: w.initial.as_ref().map_or(0, |i| i.buffer.len()),
            state,
            lag,
            auto: w.credit == u64::MAX,
            policy: w.policy,
            allow_bookmarks: w.allow_bookmarks,
        })
    }

    /// Checks internal invariants; panics on a violation. For tests and fuzzing.
    pub fn check_invariants(&self) {
        let win = self.window();
        assert!(win.len <= win.capacity, "ring over capacity");
        let mut prev = 0;
        for e in self.ring.iter() {
            assert!(e.rv() >= prev, "ring out of order");
            prev = e.rv();
        }
        assert!(self.rv >= prev, "cache RV behind the ring");
        let all = self.watchers();
        let counted = WatcherSummary {
            open: all.len(),
            lagging: all.iter().filter(|w| w.state == WatcherState::Lagging).count(),
            max_lag: all.iter().map(|w| w.lag).max().unwrap_or(0),
        };
        assert_eq!(self.watcher_summary(), counted, "watcher summary differs from the watchers");
        let page = self.first_watchers(3);
        assert_eq!(
            page[..],
            all[..all.len().min(3)],
            "first watchers are not the first of the watchers"
        );
        for (id, slot) in self.slot_of.iter() {
            let w = self.slots[*slot as usize].as_ref().expect("slot of a live watcher is empty");
            assert_eq!(w.id.0, *id);
            assert!(w.queue.len() <= w.queue_cap + 1024, "queue far over capacity");
            let placed = match &w.placement {
                Placement::Scope { namespace, name } => self
                    .by_scope
                    .get(namespace)
                    .and_then(|m| m.get(name))
                    .is_some_and(|v| v.contains(slot)),
                Placement::Trigger(v) => {
                    self.by_value.get(v).is_some_and(|s| s.as_slice().contains(slot))
                }
            };
            assert!(placed || !w.is_open_for_input(), "open watcher not indexed");
        }
        let indexed: usize =
            self.by_scope.values().flat_map(|m| m.values()).map(Vec::len).sum::<usize>()
                + self.by_value.values().map(|s| s.as_slice().len()).sum::<usize>();
        assert!(indexed <= self.slot_of.len(), "index holds closed watchers");
        if self.dispatcher_free() {
            assert!(self.incoming.is_empty(), "a free dispatcher left events in incoming");
            assert!(!self.tick_pending, "a free dispatcher left its tick");
            assert!(!self.reflector.is_holding(), "the reflector holds input with room");
        }
        if let Some(stall) = &self.stall {
            for (i, &(slot, id)) in stall.members.iter().enumerate() {
                if i == 0 && stall.front_gone {
                    continue;
                }
                let w = self.slots[slot as usize].as_ref().filter(|w| w.id == id);
                assert!(
                    w.is_some_and(
                        |w| matches!(w.flow, Flow::Blocked { batch, .. } if batch == stall.id)
                    ),
                    "a stall member is not blocked in it"
                );
            }
        }
        assert_eq!(
            self.progress_waiters,
            self.parked
                .values()
                .filter(|p| matches!(p.phase(), Phase::Fresh { progress: true, .. }))
                .count(),
            "progress waiter count"
        );
    }

    // ----- internals shared by the other modules ---------------------------------------------

    pub(crate) fn advance(&mut self, now: Timestamp) {
        if now > self.now {
            self.now = now;
        }
    }

    pub(crate) fn alloc_id(&mut self) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        id
    }

    pub(crate) fn watcher_ref(&self, id: RequestId) -> Option<&Watcher> {
        let slot = *self.slot_of.get(&id.0)?;
        self.slots.get(slot as usize)?.as_ref()
    }

    pub(crate) fn slot(&self, id: RequestId) -> Option<Slot> {
        self.slot_of.get(&id.0).copied()
    }

    pub(crate) fn set_timer(&mut self, at: Timestamp, reason: TimerReason, id: u64) {
        self.timers.insert((at, reason, id));
    }

    pub(crate) fn clear_timer(&mut self, at: Timestamp, reason: TimerReason, id: u64) {
        self.timers.remove(&(at, reason, id));
    }

    /// The oldest RV a watch can be served from (§1.4).
    pub(crate) fn oldest_servable(&self) -> Result<u64, Status> {
        if self.list_rv > 0 && !self.ring.removed_since_relist() {
            return Ok(self.list_rv + 1);
        }
        match self.ring.oldest() {
            // Part of the oldest revision was evicted: the first whole revision is the next one.
            Some(e) if self.ring.last_evicted_rv() == Some(e.rv()) => {
                let next = self.ring.first_index_after(e.rv());
                Ok(self.ring.get(next).map_or(self.rv + 1, |n| n.rv()))
            }
            Some(e) => Ok(e.rv()),
            None => Err(Status::new(
                crate::status::Reason::InternalError,
                "watch cache isn't correctly initialized",
            )),
        }
    }

    /// `processEvent` after the store mutation: ring (resizing, eviction), then the
    /// dispatcher's `incoming` channel.
    fn record_event(&mut self, event: Arc<Event>, now: Timestamp) {
        self.metrics.events_received += 1;
        let effects = self.ring.push(event.clone(), now);
        if let Some((old, new)) = effects.resized {
            if new > old {
                self.metrics.capacity_increases += 1;
            } else {
                self.metrics.capacity_decreases += 1;
            }
        }
        self.metrics.byte_evictions += effects.evicted_for_bytes;
        // While the buffer is full, snapshots older than its oldest event go (RemoveLess); so
        // they do when the window shrank for its bytes.
        if (self.ring.is_full() || effects.evicted_for_bytes > 0) && self.store.snapshots_enabled()
        {
            if let Some(oldest) = self.ring.oldest() {
                self.store.prune_snapshots_below(oldest.rv());
            }
        }
        let _ = effects.evicted;
        let index = self.ring.end_index().saturating_sub(1);
        self.incoming.push_back(Incoming::Event(event, index));
    }

    /// The watch cache takes one revision (`processEvent` for each of its events): store, ring,
    /// resourceVersion, and its events into `incoming`. `record_time` dates the events for the
    /// ring's resizing: when storage decoded them in v1.37 (`WatchEventWithRecordTime`), when
    /// the cache took them before.
    fn apply_revision(&mut self, rv: u64, changes: Vec<Change>, record_time: Timestamp) {
        for change in changes {
            let event = match change {
                Change::Put(o) => {
                    let prev = self.store.get(o.key()).cloned();
                    let mut o = if o.rv() == 0 { o.with_rv(rv) } else { o };
                    o.set_etcd_meta_if_unknown(prev.as_deref());
                    let o = Arc::new(o);
                    self.store.put(o.clone());
                    Event::put(o, prev, record_time)
                }
                Change::Delete(k) => {
                    // Checked when it arrived: the key is present.
                    let Some(prev) = self.store.delete(k.as_bytes()) else { continue };
                    Event::delete(rv, prev, record_time)
                }
            };
            self.record_event(Arc::new(event), record_time);
        }
        self.rv = rv;
        self.store.snapshot(rv);
    }

    /// `UpdateResourceVersion`: the cache RV, and a bookmark into `incoming`.
    fn apply_progress(&mut self, rv: u64) {
        self.rv = rv;
        self.incoming.push_back(Incoming::Progress(rv));
    }

    fn check_storage_input(&self) -> Result<(), StorageError> {
        match self.ready.state() {
            ReadyState::Stopped => Err(StorageError::Stopped),
            ReadyState::Pending => Err(StorageError::NotInitialized),
            ReadyState::Ready if self.reflector.broken => Err(StorageError::NotInitialized),
            ReadyState::Ready => Ok(()),
        }
    }

    /// The reflector is stuck in the event handler: `incoming` is full (one event in its hand
    /// beyond the channel's 100), or it still holds older input.
    fn reflector_blocked(&self) -> bool {
        self.reflector.is_holding() || self.incoming.len() > INCOMING_CAPACITY
    }

    /// The dispatch loop, as far as it can go: it takes the pending tick and the events of
    /// `incoming` until a blocked watcher holds it up; as `incoming` drains, the reflector
    /// hands the cache what it held.
    pub(crate) fn pump(&mut self) {
        if self.pumping {
            return;
        }
        self.pumping = true;
        let mut woke = false;
        loop {
            while self.incoming.len() <= INCOMING_CAPACITY {
                let Some(held) = self.reflector.next() else { break };
                woke = true;
                match held {
                    Held::Revision { rv, changes, at } => {
                        let time = if self.cfg.profile.is_v1_37() { at } else { self.now };
                        self.apply_revision(rv, changes, time);
                    }
                    Held::Progress(rv) => self.apply_progress(rv),
                    Held::Error(reason) => {
                        let now = self.now;
                        self.apply_storage_error(now, &reason);
                    }
                }
            }
            if !self.dispatcher_free() {
                break;
            }
            // Between revisions only: a bookmark never comes between the events of one (Go's
            // select could take the tick there; taking the events first is one of its orders).
            let mid_revision = matches!((self.incoming.front(), self.last_dispatched_rv),
                (Some(Incoming::Event(next, _)), Some(rv)) if next.rv() == rv);
            if self.tick_pending && !mid_revision {
                self.tick_pending = false;
                let now = self.now;
                self.run_tick(now);
                continue;
            }
            match self.incoming.pop_front() {
                Some(Incoming::Event(ev, index)) => {
                    self.dispatch(&ev, index);
                    self.dispatched_end = self.dispatched_end.max(index + 1);
                    self.last_dispatched_rv = Some(ev.rv());
                    self.metrics.events_dispatched += 1;
                    let rest_of_revision = matches!(self.incoming.front(),
                        Some(Incoming::Event(next, _)) if next.rv() == ev.rv());
                    if !rest_of_revision {
                        // The bookmark RV moves once the whole revision is dispatched.
                        self.last_processed_rv = ev.rv();
                    }
                }
                Some(Incoming::Progress(rv)) => {
                    self.last_processed_rv = rv;
                    self.metrics.events_dispatched += 1;
                }
                None => break,
            }
        }
        self.pumping = false;
        if woke {
            self.wake_fresh_waiters();
        }
    }

    /// Neither waiting in a blocked watcher's `add` nor before its start.
    pub(crate) fn dispatcher_free(&self) -> bool {
        self.dispatcher_started && self.stall.is_none()
    }

    fn on_dispatcher_start(&mut self) {
        self.dispatcher_start_at = None;
        if self.ready.state() == ReadyState::Stopped || self.list_rv == 0 {
            return;
        }
        self.dispatcher_started = true;
        if self.last_processed_rv == 0 {
            // 1.31+: the bookmark RV is seeded from the list the poll found.
            self.last_processed_rv = self.list_rv;
        }
        self.pump();
    }

    /// The first point of the grid `created + k·period` (k ≥ 1) after `t`.
    pub(crate) fn next_grid_point(&self, t: Timestamp, period: u64) -> Timestamp {
        let k = t.ms_since(self.created) / period + 1;
        self.created.add_ms(k.saturating_mul(period))
    }

    fn arm_tick(&mut self, now: Timestamp) {
        let base = self.cfg.dispatch_tick_ms;
        let max_extra = (base as f64 * self.cfg.dispatch_tick_jitter) as u64;
        let extra = if max_extra == 0 { 0 } else { self.rng.up_to(max_extra) };
        self.tick_at = now.add_ms(base + extra);
        self.set_timer(self.tick_at, TimerReason::DispatchTick, 0);
    }

    pub(crate) fn on_tick(&mut self, now: Timestamp) {
        if self.ready.state() == ReadyState::Stopped {
            return;
        }
        if !self.dispatcher_free() {
            // The timer's channel keeps the tick until the loop reads it again.
            self.tick_pending = true;
            return;
        }
        self.run_tick(now);
    }

    /// The loop reads the tick: bookmarks, and the timer re-armed from now.
    pub(crate) fn run_tick(&mut self, now: Timestamp) {
        self.bookmark_tick(now);
        self.arm_tick(now);
    }

    /// `compactor.compactIfNeeded`: a newer compaction revision prunes the snapshots below it.
    fn on_compactor_poll(&mut self, now: Timestamp) {
        if self.ready.state() == ReadyState::Stopped {
            return;
        }
        if self.compacted_rv > self.compactor_rv {
            self.compactor_rv = self.compacted_rv;
            self.store.prune_snapshots_below(self.compacted_rv);
        }
        self.set_timer(now.add_ms(COMPACTOR_POLL_MS), TimerReason::CompactorPoll, 0);
    }

    /// `startCaching` again: every watch ends, then the list.
    fn relist(&mut self, reason: String) {
        self.terminate_all(CloseCause::Reinitializing, None);
        self.outputs.push_back(Output::Relist { reason });
    }

    /// Ends every open watch (`terminateAllWatchers`): without draining, so each client gets
    /// what its result channel already holds, then the end of its stream.
    pub(crate) fn terminate_all(&mut self, cause: CloseCause, message: Option<String>) {
        let mut ids: Vec<u64> = self.slot_of.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(slot) = self.slot(RequestId(id)) {
                self.stop_input(slot, cause, message.clone(), true);
            }
        }
    }
}

pub(crate) fn describe_range(r: &crate::key::KeyRange) -> String {
    use crate::key::KeyRange;
    match r {
        KeyRange::Prefix(k) => format!("{}*", display_key(k.as_bytes())),
        KeyRange::Exact(k) => display_key(k.as_bytes()),
        KeyRange::Range { start, end: Some(e) } => {
            format!("[{}, {})", display_key(start.as_bytes()), display_key(e.as_bytes()))
        }
        KeyRange::Range { start, end: None } => format!("[{}, ∞)", display_key(start.as_bytes())),
    }
}
