//! The run loop around a [`Cacher`] that the replayer and both bindings share: a clock that
//! only moves forward and fires every timer at its own deadline on the way, an output queue
//! stamped with the time each output was produced, storage's current revision answered
//! automatically (as the replayer does), and outputs handed out one [`OutputItem`] at a time (a
//! fan-out to three watchers is three items).
//!
//! A binding's `Cacher` is this driver plus argument conversion and its own errors; the
//! replayer is this driver plus the scenario's request names.
//!
//! Kubernetes counterpart: the fake clock and the event loop of the cacher's tests
//! (`cacher_testing_utils_test.go`), here as the one loop every host uses.

use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;

use crate::cacher::{Cacher, Change, StorageError};
use crate::config::{Config, ConfigError};
use crate::object::Object;
use crate::output::{
    CloseCause, InitialSource, Output, RangeOutcome, ReadOutcome, RequestId, WatchEvent,
};
use crate::request::{GetRequest, ListRequest, RangeRequest, WatchRequest};
use crate::status::Status;
use crate::time::Timestamp;

/// A [`Cacher`] with a clock, an output queue and the host's answers to its questions.
///
/// Inputs act at the driver's time ([`Driver::now_ms`]); move it with [`Driver::advance`]
/// first. Read outputs with [`Driver::poll_item`] (one item per watcher and event) or
/// [`Driver::poll_output`] (whole outputs), not both.
pub struct Driver {
    cacher: Cacher,
    now_ms: u64,
    etcd_rv: u64,
    max_stored_rv: u64,
    auto_current_revision: bool,
    /// Outputs produced and not yet read, with the time they were produced at.
    outputs: VecDeque<(u64, Output)>,
    /// The items of an output that [`Driver::poll_item`] has started on.
    items: VecDeque<OutputItem>,
}

/// Why [`Driver::advance`] did not reach its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdvanceError<E> {
    /// The target is before the driver's time: the core's clock is monotonic.
    TimeGoesBack {
        /// The target.
        to_ms: u64,
        /// The driver's time.
        now_ms: u64,
    },
    /// The caller's check refused the next timer expiration; time stopped just before it.
    Stopped(E),
}

impl<E> core::fmt::Display for AdvanceError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AdvanceError::TimeGoesBack { to_ms, now_ms } => {
                write!(f, "time goes back ({to_ms} after {now_ms}); the core's clock is monotonic")
            }
            AdvanceError::Stopped(_) => f.write_str("stopped before the target time"),
        }
    }
}

impl Driver {
    /// A new cacher at time 0.
    pub fn new(config: Config) -> Result<Driver, ConfigError> {
        Ok(Driver {
            cacher: Cacher::new(config, Timestamp::ZERO)?,
            now_ms: 0,
            etcd_rv: 0,
            max_stored_rv: 0,
            auto_current_revision: true,
            outputs: VecDeque::new(),
            items: VecDeque::new(),
        })
    }

    // --- time

    /// Moves time to `to_ms`, firing every timer due by then at its own deadline, in order.
    ///
    /// `check(n, deadline)` runs before the `n`-th expiration of this call; an error stops
    /// there, with the driver's time just before that deadline (every earlier timer fired), so
    /// a caller can bound the work (a far target can mean millions of dispatch ticks) or let
    /// the user interrupt it.
    pub fn advance<E>(
        &mut self,
        to_ms: u64,
        mut check: impl FnMut(u64, u64) -> Result<(), E>,
    ) -> Result<(), AdvanceError<E>> {
        if to_ms < self.now_ms {
            return Err(AdvanceError::TimeGoesBack { to_ms, now_ms: self.now_ms });
        }
        let mut n: u64 = 0;
        while let Some((t, _)) = self.cacher.poll_timeout() {
            let t = t.as_millis();
            if t > to_ms {
                break;
            }
            n += 1;
            if let Err(e) = check(n, t) {
                self.now_ms = self.now_ms.max(t.saturating_sub(1));
                return Err(AdvanceError::Stopped(e));
            }
            self.cacher.handle_timeout(Timestamp::from_millis(t));
            self.collect(t);
        }
        self.now_ms = to_ms;
        Ok(())
    }

    // --- storage inputs, at the driver's time

    /// A (re)list from storage completed at `rv`.
    pub fn handle_replace(&mut self, rv: u64, objects: Vec<Object>) -> Result<(), StorageError> {
        let r = self.cacher.handle_replace(self.now(), rv, objects);
        self.stored(rv, r)
    }

    /// A storage put; the object's RV is the event's.
    pub fn handle_put(&mut self, object: Object) -> Result<(), StorageError> {
        let rv = object.rv();
        let r = self.cacher.handle_put(self.now(), object);
        self.stored(rv, r)
    }

    /// A storage delete of `key` at `rv`.
    pub fn handle_delete(&mut self, key: &[u8], rv: u64) -> Result<(), StorageError> {
        let r = self.cacher.handle_delete(self.now(), key, rv);
        self.stored(rv, r)
    }

    /// Every change of one revision.
    pub fn handle_revision(&mut self, rv: u64, changes: Vec<Change>) -> Result<(), StorageError> {
        let r = self.cacher.handle_revision(self.now(), rv, changes);
        self.stored(rv, r)
    }

    /// A storage progress notify at `rv`.
    pub fn handle_progress(&mut self, rv: u64) -> Result<(), StorageError> {
        let r = self.cacher.handle_progress(self.now(), rv);
        self.stored(rv, r)
    }

    /// The storage watch broke.
    pub fn handle_storage_error(&mut self, reason: &str) {
        self.cacher.handle_storage_error(self.now(), reason);
        self.collect(self.now_ms);
    }

    /// Storage compacted its history at `rv`.
    pub fn handle_compaction(&mut self, rv: u64) {
        self.cacher.handle_compaction(self.now(), rv);
        self.collect(self.now_ms);
    }

    /// Storage's current revision for a `NeedCurrentRevision` (when not answered
    /// automatically).
    pub fn handle_current_revision(&mut self, request: RequestId, rv: u64) {
        self.cacher.handle_current_revision(self.now(), request, rv);
        self.collect(self.now_ms);
    }

    /// Stops the cacher for good.
    pub fn stop(&mut self) {
        self.cacher.stop(self.now());
        self.collect(self.now_ms);
    }

    /// Storage's current revision as a quorum read would answer it now: automatic answers give
    /// the highest of this and every RV stored so far.
    pub fn set_etcd_rv(&mut self, rv: u64) {
        self.etcd_rv = rv;
    }

    /// Whether `NeedCurrentRevision` is answered at once (default true); the output is queued
    /// either way.
    pub fn set_auto_current_revision(&mut self, on: bool) {
        self.auto_current_revision = on;
    }

    // --- client commands, at the driver's time

    /// The watch as the API server's request layer hands it to the cacher (see
    /// [`WatchRequest::through_request_layer`]), with this cacher's WatchList gate: what the
    /// replayer does to every scenario watch, and the bindings' `request_layer` option.
    pub fn through_request_layer(&self, req: WatchRequest) -> Result<WatchRequest, Status> {
        req.through_request_layer(self.cacher.config().watch_list)
    }

    /// Starts a watch ([`WatchSpec::to_request`](super::WatchSpec::to_request) parses one).
    pub fn start_watch(&mut self, req: WatchRequest) -> Result<RequestId, Status> {
        let r = self.cacher.start_watch(self.now(), req);
        self.collect(self.now_ms);
        r
    }

    /// The client of a watch goes away; false if it was not open.
    pub fn stop_watch(&mut self, id: RequestId) -> bool {
        let r = self.cacher.stop_watch(self.now(), id);
        self.collect(self.now_ms);
        r
    }

    /// A manual watcher's client reads up to `max` queued events; how many it read.
    pub fn consume(&mut self, id: RequestId, max: Option<u64>) -> usize {
        let n = self.cacher.consume(self.now(), id, max);
        self.collect(self.now_ms);
        n
    }

    /// Credit for `n` more events; how many were delivered.
    pub fn grant_credit(&mut self, id: RequestId, n: u64) -> usize {
        let d = self.cacher.grant_credit(self.now(), id, n);
        self.collect(self.now_ms);
        d
    }

    /// Starts a list (its result is an output).
    pub fn list(&mut self, req: ListRequest) -> Result<RequestId, Status> {
        let r = self.cacher.list(self.now(), req);
        self.collect(self.now_ms);
        r
    }

    /// Starts a get.
    pub fn get(&mut self, req: GetRequest) -> Result<RequestId, Status> {
        let r = self.cacher.get(self.now(), req);
        self.collect(self.now_ms);
        r
    }

    /// Starts an etcd-style range.
    pub fn range(&mut self, req: RangeRequest) -> Result<RequestId, Status> {
        let r = self.cacher.range(self.now(), req);
        self.collect(self.now_ms);
        r
    }

    // --- outputs

    /// The next output item (a fan-out or a delivery of several events comes out one item per
    /// watcher and event), or `None`.
    pub fn poll_item(&mut self) -> Option<OutputItem> {
        while self.items.is_empty() {
            let (at, out) = self.outputs.pop_front()?;
            OutputItem::expand(at, out, &mut |item| self.items.push_back(item));
        }
        self.items.pop_front()
    }

    /// The next whole output and the time it was produced at, or `None`.
    pub fn poll_output(&mut self) -> Option<(u64, Output)> {
        self.outputs.pop_front()
    }

    // --- getters

    /// The cacher, for its getters.
    pub fn cacher(&self) -> &Cacher {
        &self.cacher
    }

    /// The driver's time, in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Storage's current revision as last set.
    pub fn etcd_rv(&self) -> u64 {
        self.etcd_rv
    }

    /// Whether `NeedCurrentRevision` is answered automatically.
    pub fn auto_current_revision(&self) -> bool {
        self.auto_current_revision
    }

    // --- private

    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.now_ms)
    }

    fn stored(&mut self, rv: u64, r: Result<(), StorageError>) -> Result<(), StorageError> {
        if r.is_ok() {
            self.max_stored_rv = self.max_stored_rv.max(rv);
        }
        self.collect(self.now_ms);
        r
    }

    fn collect(&mut self, at: u64) {
        while let Some(out) = self.cacher.poll_output() {
            let ask = match &out {
                Output::NeedCurrentRevision { request } if self.auto_current_revision => {
                    Some(*request)
                }
                _ => None,
            };
            self.outputs.push_back((at, out));
            if let Some(request) = ask {
                let answer = self.etcd_rv.max(self.max_stored_rv);
                self.cacher.handle_current_revision(Timestamp::from_millis(at), request, answer);
            }
        }
    }
}

/// Whether a read result answers a list or a get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// A list.
    List,
    /// A get.
    Get,
}

impl ReadKind {
    /// `LIST` or `GET`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReadKind::List => "LIST",
            ReadKind::Get => "GET",
        }
    }
}

/// One item of the core's output as the bindings hand it out and the trace records it: an
/// [`Output`] with a fan-out or a delivery split into one item per watcher and event (events
/// stay shared), stamped with the time it was produced at. `type_str` names each kind as the
/// trace, Python's `type` and JS's `type` do.
#[derive(Clone, Debug)]
pub enum OutputItem {
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK` for one watcher.
    Event {
        /// Milliseconds.
        at: u64,
        /// The watch.
        watch: RequestId,
        /// What it sees.
        event: WatchEvent,
    },
    /// `STARTED`: a watch is registered (host information; not in traces).
    Started {
        /// Milliseconds.
        at: u64,
        /// The watch.
        watch: RequestId,
        /// Changes after this RV follow.
        rv: u64,
        /// Where its initial events come from.
        initial: InitialSource,
    },
    /// `ERROR` on an open watch; a `CLOSED` follows.
    Error {
        /// Milliseconds.
        at: u64,
        /// The watch.
        watch: RequestId,
        /// The error.
        status: Status,
    },
    /// `CLOSED`: the watch ended.
    Closed {
        /// Milliseconds.
        at: u64,
        /// The watch.
        watch: RequestId,
        /// Why.
        cause: CloseCause,
        /// The last RV its client was given.
        last_rv: u64,
        /// Detail, if any.
        message: Option<String>,
    },
    /// `WATCH`: a watch the host must serve from storage.
    Delegated {
        /// Milliseconds.
        at: u64,
        /// The watch.
        watch: RequestId,
        /// Why.
        reason: &'static str,
    },
    /// `LIST` or `GET`: where a read is answered, and the cache's answer.
    Read {
        /// Milliseconds.
        at: u64,
        /// The request.
        request: RequestId,
        /// List or get.
        kind: ReadKind,
        /// The outcome.
        outcome: ReadOutcome,
    },
    /// `RANGE`: where an etcd range is answered, and the cache's answer.
    Range {
        /// Milliseconds.
        at: u64,
        /// The request.
        request: RequestId,
        /// The outcome.
        outcome: RangeOutcome,
    },
    /// `REJECTED`: a request that failed.
    Rejected {
        /// Milliseconds.
        at: u64,
        /// The request.
        request: RequestId,
        /// Why.
        status: Status,
    },
    /// `REQUEST_PROGRESS`: ask storage for a progress notify.
    RequestProgress {
        /// Milliseconds.
        at: u64,
    },
    /// `NEED_CURRENT_RV`: ask storage for its current revision.
    NeedCurrentRevision {
        /// Milliseconds.
        at: u64,
        /// The waiting request.
        request: RequestId,
    },
    /// `RELIST`: the cache must relist.
    Relist {
        /// Milliseconds.
        at: u64,
        /// Why.
        reason: String,
    },
}

impl OutputItem {
    /// The items of one output, in order.
    pub fn expand(at: u64, out: Output, sink: &mut impl FnMut(OutputItem)) {
        match out {
            Output::Fanout { event, targets } => {
                for &crate::output::Target { watch, kind } in targets.iter() {
                    let event = WatchEvent::Change(kind, event.clone());
                    sink(OutputItem::Event { at, watch, event });
                }
            }
            Output::Deliver { watch, events } => {
                for event in events {
                    sink(OutputItem::Event { at, watch, event });
                }
            }
            Output::WatchStarted { watch, rv, initial } => {
                sink(OutputItem::Started { at, watch, rv, initial })
            }
            Output::WatchError { watch, status } => sink(OutputItem::Error { at, watch, status }),
            Output::WatchClosed { watch, cause, last_rv, message } => {
                sink(OutputItem::Closed { at, watch, cause, last_rv, message })
            }
            Output::WatchDelegated { watch, reason } => {
                sink(OutputItem::Delegated { at, watch, reason })
            }
            Output::List { request, outcome } => {
                sink(OutputItem::Read { at, request, kind: ReadKind::List, outcome })
            }
            Output::Get { request, outcome } => {
                sink(OutputItem::Read { at, request, kind: ReadKind::Get, outcome })
            }
            Output::Range { request, outcome } => sink(OutputItem::Range { at, request, outcome }),
            Output::Rejected { request, status } => {
                sink(OutputItem::Rejected { at, request, status })
            }
            Output::RequestProgress => sink(OutputItem::RequestProgress { at }),
            Output::NeedCurrentRevision { request } => {
                sink(OutputItem::NeedCurrentRevision { at, request })
            }
            Output::Relist { reason } => sink(OutputItem::Relist { at, reason }),
        }
    }

    /// Milliseconds at which the core produced it.
    pub fn at(&self) -> u64 {
        match self {
            OutputItem::Event { at, .. }
            | OutputItem::Started { at, .. }
            | OutputItem::Error { at, .. }
            | OutputItem::Closed { at, .. }
            | OutputItem::Delegated { at, .. }
            | OutputItem::Read { at, .. }
            | OutputItem::Range { at, .. }
            | OutputItem::Rejected { at, .. }
            | OutputItem::RequestProgress { at }
            | OutputItem::NeedCurrentRevision { at, .. }
            | OutputItem::Relist { at, .. } => *at,
        }
    }

    /// The request it concerns, if any.
    pub fn id(&self) -> Option<RequestId> {
        match self {
            OutputItem::Event { watch, .. }
            | OutputItem::Started { watch, .. }
            | OutputItem::Error { watch, .. }
            | OutputItem::Closed { watch, .. }
            | OutputItem::Delegated { watch, .. } => Some(*watch),
            OutputItem::Read { request, .. }
            | OutputItem::Range { request, .. }
            | OutputItem::Rejected { request, .. }
            | OutputItem::NeedCurrentRevision { request, .. } => Some(*request),
            OutputItem::RequestProgress { .. } | OutputItem::Relist { .. } => None,
        }
    }

    /// Its `type`: `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `STARTED`, `ERROR`, `CLOSED`,
    /// `WATCH`, `LIST`, `GET`, `RANGE`, `REJECTED`, `REQUEST_PROGRESS`, `NEED_CURRENT_RV` or
    /// `RELIST`.
    pub fn type_str(&self) -> &'static str {
        match self {
            OutputItem::Event { event, .. } => event.type_str(),
            OutputItem::Started { .. } => "STARTED",
            OutputItem::Error { .. } => "ERROR",
            OutputItem::Closed { .. } => "CLOSED",
            OutputItem::Delegated { .. } => "WATCH",
            OutputItem::Read { kind, .. } => kind.as_str(),
            OutputItem::Range { .. } => "RANGE",
            OutputItem::Rejected { .. } => "REJECTED",
            OutputItem::RequestProgress { .. } => "REQUEST_PROGRESS",
            OutputItem::NeedCurrentRevision { .. } => "NEED_CURRENT_RV",
            OutputItem::Relist { .. } => "RELIST",
        }
    }
}
