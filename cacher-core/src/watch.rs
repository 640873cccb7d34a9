//! Watch requests: the decision rules, registration, delivery to the client, and the end of a
//! watch.
//!
//! Kubernetes counterparts: `Cacher.Watch` in `cacher.go` (§3 of the spec: the WatchList gate,
//! the storage bypass, readiness, scope and trigger, `getWatchCacheResourceVersion`,
//! `getBookmarkAfterResourceVersionLockedFunc`, the freshness wait, `getAllEventsSinceLocked`,
//! the generation re-check) and the client side of `cache_watcher.go` (`processInterval`,
//! `process`, forced close and draining).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;

use crate::bookmarks::{next_bookmark_time, Slot};
use crate::cacher::{Cacher, Parked, Phase, Slots, TimerReason};
use crate::interval::{Initial, Refill};
use crate::output::{CloseCause, InitialSource, Output, RequestId, WatchEvent};
use crate::ready::ReadyState;
use crate::request::{ConsumeMode, WatchRequest};
use crate::rv::RvParam;
use crate::status::{Reason, Status};
use crate::time::Timestamp;
use crate::watcher::{BookmarkState, Flow, Placement, Watcher};

impl Cacher {
    /// Starts a watch. Returns its id at once, or a 400 for a malformed request; everything
    /// else (events, a 410 or 504 ERROR item, a 429 while initialising, the end of the watch)
    /// comes as outputs.
    pub fn start_watch(&mut self, now: Timestamp, req: WatchRequest) -> Result<RequestId, Status> {
        self.advance(now);
        if req.queue_capacity == Some(0) {
            return Err(Status::bad_request("queue capacity must be at least 1"));
        }
        let id = self.alloc_id();
        // Step 1: without the WatchList gate, sendInitialEvents is dropped.
        let sie = if self.cfg.watch_list { req.send_initial_events } else { None };
        // Step 2: bypass to storage.
        if self.cfg.watch_from_storage_without_rv && sie.is_none() && req.rv.is_unset() {
            self.metrics.watches_delegated += 1;
            self.outputs.push_back(Output::WatchDelegated {
                watch: id,
                reason: "resourceVersion \"\" watches go to storage (WatchFromStorageWithoutResourceVersion)",
            });
            return Ok(id);
        }
        // v1.37: the cacher checks the key first (`Cacher.Watch` → `prepareKey`).
        if self.cfg.profile.is_v1_37() {
            if let Err(status) = self.check_key(&req.range) {
                self.outputs.push_back(Output::Rejected { request: id, status });
                return Ok(id);
            }
        }
        let deadline = req.timeout_ms.map(|t| now.add_ms(t));
        match self.ready.state() {
            ReadyState::Ready => {
                let generation = self.ready.generation();
                self.watch_after_ready(id, Box::new(req), sie, generation, deadline);
            }
            _ if self.cfg.resilient_initialization => {
                let status = self.not_ready_429(now);
                self.outputs.push_back(Output::Rejected { request: id, status });
            }
            ReadyState::Stopped => {
                self.outputs.push_back(Output::Rejected { request: id, status: Status::stopped() });
            }
            ReadyState::Pending => {
                self.park(
                    id,
                    Parked::Watch {
                        req: Box::new(req),
                        sie,
                        phase: Phase::Ready,
                        generation: 0,
                        required_rv: 0,
                        deadline,
                    },
                );
            }
        }
        Ok(id)
    }

    /// The client went away. Returns false if the id is not an open or pending watch.
    pub fn stop_watch(&mut self, now: Timestamp, id: RequestId) -> bool {
        self.advance(now);
        if let Some(p) = self.parked.get(&id) {
            if !matches!(p, Parked::Watch { .. }) {
                return false;
            }
            let waiting_for_ready = matches!(p.phase(), Phase::Ready);
            self.unpark(id);
            if waiting_for_ready {
                self.outputs.push_back(Output::Rejected {
                    request: id,
                    status: Status::new(Reason::ServiceUnavailable, "context canceled"),
                });
            } else {
                self.outputs.push_back(Output::WatchClosed {
                    watch: id,
                    cause: CloseCause::Stopped,
                    last_rv: 0,
                    message: None,
                });
            }
            return true;
        }
        if self.slot(id).is_none() {
            return false;
        }
        self.close_watcher(id, CloseCause::Stopped, None, None);
        true
    }

    /// A manual watcher's client reads up to `max` queued events (`None` = all). Whole
    /// revisions are kept together, so slightly more than `max` can come. Returns how many
    /// were delivered (0 for an unknown or closed watch).
    pub fn consume(&mut self, now: Timestamp, id: RequestId, max: Option<u64>) -> usize {
        self.advance(now);
        let Some(slot) = self.slot(id) else { return 0 };
        self.release(slot, max.unwrap_or(u64::MAX))
    }

    /// Gives a manual watcher credit for `n` more events: queued events are delivered at once,
    /// and the rest of the credit lets later events through without queueing (how a host says
    /// "the client's stream has room for n more"). Returns how many were delivered now.
    pub fn grant_credit(&mut self, now: Timestamp, id: RequestId, n: u64) -> usize {
        self.advance(now);
        let Some(slot) = self.slot(id) else { return 0 };
        if let Some(w) = self.slots[slot as usize].as_mut() {
            if w.credit != u64::MAX {
                w.credit = w.credit.saturating_add(n);
            }
        }
        let credit = self.slots[slot as usize].as_ref().map_or(0, |w| w.credit);
        let delivered = self.release(slot, credit);
        if let Some(w) = self.slots[slot as usize].as_mut() {
            w.spend_credit(delivered as u64);
        }
        delivered
    }

    // ----- the decision path ----------------------------------------------------------------

    pub(crate) fn watch_after_ready(
        &mut self,
        id: RequestId,
        req: Box<WatchRequest>,
        sie: Option<bool>,
        generation: u64,
        deadline: Option<Timestamp>,
    ) {
        // 1.31+: a watch-list stream needs storage progress requests (checked once ready).
        if self.cfg.profile.is_v1_34()
            && sie == Some(true)
            && req.allow_bookmarks
            && !self.cfg.storage_supports_progress
        {
            self.error_watcher(
                id,
                Status::new(
                    Reason::InternalError,
                    "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled",
                ),
            );
            return;
        }
        // Step 8: requiredResourceVersion.
        let required = match req.rv {
            RvParam::At(n) => n,
            RvParam::Zero => 0,
            RvParam::Unset if sie.is_none() => 0,
            RvParam::Unset => {
                self.park(
                    id,
                    Parked::Watch {
                        req,
                        sie,
                        phase: Phase::CurrentRv,
                        generation,
                        required_rv: 0,
                        deadline,
                    },
                );
                self.outputs.push_back(Output::NeedCurrentRevision { request: id });
                return;
            }
        };
        self.watch_after_required(id, req, sie, generation, required, deadline);
    }

    pub(crate) fn watch_after_required(
        &mut self,
        id: RequestId,
        req: Box<WatchRequest>,
        sie: Option<bool>,
        generation: u64,
        required: u64,
        deadline: Option<Timestamp>,
    ) {
        // Step 11: only watch-list requests wait for freshness.
        if sie == Some(true) && required > self.rv {
            let progress = self.progress_while_waiting(true);
            let fresh_deadline = self.now.add_ms(self.cfg.freshness_timeout_ms);
            self.park(
                id,
                Parked::Watch {
                    req,
                    sie,
                    phase: Phase::Fresh {
                        rv: required,
                        deadline: fresh_deadline,
                        progress,
                        started: self.now,
                    },
                    generation,
                    required_rv: required,
                    deadline,
                },
            );
            return;
        }
        self.register_watch(id, *req, sie, generation, required, deadline);
    }

    /// Steps 12–14: the initial events, the generation re-check, and registration.
    pub(crate) fn register_watch(
        &mut self,
        id: RequestId,
        req: WatchRequest,
        sie: Option<bool>,
        generation: u64,
        required: u64,
        deadline: Option<Timestamp>,
    ) {
        let now = self.now;
        if !self.ready.is_ready() || self.ready.generation() != generation {
            // The cache was reinitialised in between: an immediately-closed watcher.
            self.outputs.push_back(Output::WatchClosed {
                watch: id,
                cause: CloseCause::Reinitializing,
                last_rv: 0,
                message: None,
            });
            return;
        }
        let bookmark_after = if sie == Some(true) && req.allow_bookmarks {
            match req.rv {
                RvParam::Unset => required,
                RvParam::Zero => self.rv,
                RvParam::At(n) => n,
            }
        } else {
            0
        };
        let from_store = |c: &Cacher| Initial::from_store(c.store.tree().clone());
        let (initial, start_rv, from_rv) = if sie == Some(true) {
            (Some(from_store(self)), self.rv, self.rv)
        } else {
            let oldest = match self.oldest_servable() {
                Ok(o) => o,
                Err(status) => return self.error_watcher(id, status),
            };
            if required == 0 && sie.is_none() {
                (Some(from_store(self)), self.rv, self.rv)
            } else {
                let required = if required == 0 { self.rv } else { required };
                if required.saturating_add(1) < oldest {
                    self.metrics.watch_expired += 1;
                    return self.error_watcher(id, Status::too_old(required, oldest - 1));
                }
                if required >= self.rv {
                    (None, required, required)
                } else {
                    let first = self.ring.first_index_after(required);
                    let end = self.ring.end_index();
                    let last_rv = self.ring.newest().map_or(required, |e| e.rv()).max(required);
                    (Some(Initial::from_ring(first, end)), last_rv, required)
                }
            }
        };
        // In 1.30 `process` filters by the required RV, raised only by the initial events it
        // actually sent (each at the cache RV for a store interval); 1.34 also raises it to the
        // interval's RV. Only bookmarks can tell the difference.
        let start_rv = if self.cfg.profile.is_v1_34() {
            start_rv
        } else if sie == Some(false) && req.rv == RvParam::Zero {
            0
        } else if initial.as_ref().is_some_and(|i| i.is_store()) && self.store.len() == 0 {
            required
        } else {
            start_rv
        };
        // Steps 5–7: scope, trigger, channel size.
        let trigger = self
            .cfg
            .index_field
            .as_deref()
            .and_then(|f| req.selector.fields.requires_exact_match(f))
            .map(Box::<str>::from);
        let placement = match trigger {
            Some(v) => Placement::Trigger(v),
            None => Placement::Scope {
                namespace: req
                    .selector
                    .fields
                    .requires_exact_match("metadata.namespace")
                    .unwrap_or("")
                    .into(),
                name: req
                    .selector
                    .fields
                    .requires_exact_match("metadata.name")
                    .unwrap_or("")
                    .into(),
            },
        };
        let chan_size = self
            .cfg
            .watch_chan_size_for(self.ring.capacity(), matches!(placement, Placement::Trigger(_)));
        let queue_cap = req.queue_capacity.unwrap_or(2 * chan_size + 1);
        let source = match &initial {
            Some(i) if matches!(i.source, crate::interval::Source::Store { .. }) => {
                InitialSource::Store
            }
            Some(_) => InitialSource::Ring,
            None => InitialSource::Nothing,
        };
        let end_bookmark = (self.cfg.profile.is_v1_34() && bookmark_after != 0)
            .then_some(self.rv.max(bookmark_after));
        // Watchers of the same range share its key (dispatch reads it for every candidate).
        let range = match &self.last_range {
            Some(r) if *r == req.range => r.clone(),
            _ => {
                self.last_range = Some(req.range.clone());
                req.range
            }
        };
        let mut w = Watcher {
            id,
            range,
            selector: (!req.selector.is_empty()).then(|| Box::new(req.selector)),
            rv: start_rv,
            last_sent_rv: 0,
            last_queued_rv: 0,
            allow_bookmarks: req.allow_bookmarks,
            bookmark_after_rv: bookmark_after,
            bookmark_state: if bookmark_after == 0 {
                BookmarkState::Sent
            } else {
                BookmarkState::Waiting
            },
            end_bookmark,
            deadline,
            credit: match req.consume {
                ConsumeMode::Auto => u64::MAX,
                ConsumeMode::Manual => 0,
            },
            policy: req.slow_policy,
            chan_size,
            queue_cap,
            queue: VecDeque::new(),
            settled: 0,
            in_release: false,
            initial: None,
            flow: Flow::Active,
            placement,
        };
        // The first interval fill happens at once, as processInterval's first Next() does.
        if let Some(mut init) = initial {
            match init.refill(&w, &self.ring, self.cfg.interval_buffer_size) {
                Refill::Invalidated(_) | Refill::Exhausted => {}
                Refill::More => {}
            }
            if !init.is_exhausted() {
                w.initial = Some(Box::new(init));
            }
        }
        let slot = self.insert_watcher(w);
        self.outputs.push_back(Output::WatchStarted { watch: id, rv: from_rv, initial: source });
        if bookmark_after != 0 || req.allow_bookmarks {
            self.schedule_bookmark(slot, now);
        }
        if let Some(d) = deadline {
            self.set_timer(d, TimerReason::WatchDeadline, id.0);
        }
        self.metrics.watches_started += 1;
        if req.consume == ConsumeMode::Auto {
            self.release(slot, u64::MAX);
        }
    }

    /// A watch that gets exactly one ERROR item and ends (Kubernetes' error watcher).
    pub(crate) fn error_watcher(&mut self, id: RequestId, status: Status) {
        self.outputs.push_back(Output::WatchError { watch: id, status });
        self.outputs.push_back(Output::WatchClosed {
            watch: id,
            cause: CloseCause::Error,
            last_rv: 0,
            message: None,
        });
    }

    /// v1.37's key check ([`crate::request::prepare_key`]) with this cacher's resource prefix.
    pub(crate) fn check_key(&self, range: &crate::key::KeyRange) -> Result<(), Status> {
        crate::request::prepare_key(range, self.cfg.resource_prefix.as_deref())
    }

    /// The 429 of an unready cache. Since 1.33 the message carries the error ListAndWatch
    /// returned (`ready.go` `setError`), but a broken storage watch is not one: the reflector
    /// returns nil when its watch ends with an error event (client-go `reflector.go`, "watch
    /// closed"), so after [`Cacher::handle_storage_error`] the message is the plain one.
    pub(crate) fn not_ready_429(&self, now: Timestamp) -> Status {
        let message = if self.ready.state() == ReadyState::Stopped {
            String::from("apiserver cacher is stopped")
        } else {
            String::from("storage is (re)initializing")
        };
        let retry = if self.cfg.profile.is_v1_34() { self.ready.retry_after_s(now) } else { 1 };
        Status { reason: Reason::TooManyRequests, message, retry_after_s: Some(retry) }
    }

    /// Whether a request waiting for freshness asks storage for progress: in 1.30 under the
    /// ConsistentListFromCache gate; in 1.34 when storage supports progress requests (watches)
    /// and, for reads, also under the gate (`ConsistentReadSupported`).
    pub(crate) fn progress_while_waiting(&self, watch: bool) -> bool {
        if !self.cfg.profile.is_v1_34() {
            self.cfg.consistent_list_from_cache
        } else if watch {
            self.cfg.storage_supports_progress
        } else {
            self.cfg.consistent_list_from_cache && self.cfg.storage_supports_progress
        }
    }

    // ----- watcher table --------------------------------------------------------------------

    fn insert_watcher(&mut self, w: Watcher) -> Slot {
        let id = w.id.0;
        let placement = w.placement.clone();
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(w);
                s
            }
            None => {
                self.slots.push(Some(w));
                (self.slots.len() - 1) as Slot
            }
        };
        self.slot_of.insert(id, slot);
        match placement {
            Placement::Scope { namespace, name } => {
                self.by_scope.entry(namespace).or_default().entry(name).or_default().push(slot)
            }
            Placement::Trigger(v) => match self.by_value.get_mut(&v) {
                Some(slots) => slots.push(slot),
                None => {
                    self.by_value.insert(v, Slots::One(slot));
                }
            },
        }
        slot
    }

    /// Takes a watcher out of the dispatch index (it stays in the table while draining).
    pub(crate) fn unindex(&mut self, slot: Slot) {
        let Some(w) = self.slots[slot as usize].as_ref() else { return };
        match &w.placement {
            Placement::Scope { namespace, name } => {
                if let Some(names) = self.by_scope.get_mut(namespace) {
                    if let Some(v) = names.get_mut(name) {
                        if let Some(pos) = v.iter().position(|s| *s == slot) {
                            v.remove(pos);
                        }
                        if v.is_empty() {
                            names.remove(name);
                        }
                    }
                    if names.is_empty() {
                        self.by_scope.remove(namespace);
                    }
                }
            }
            Placement::Trigger(val) => {
                if self.by_value.get_mut(val).is_some_and(|v| v.remove(slot)) {
                    self.by_value.remove(val);
                }
            }
        }
    }

    fn remove_watcher(&mut self, slot: Slot) -> Option<Watcher> {
        if self.slots[slot as usize].as_ref().is_some_and(|w| w.is_open_for_input()) {
            self.unindex(slot);
        }
        let w = self.slots[slot as usize].take()?;
        self.slot_of.remove(&w.id.0);
        self.free_slots.push(slot);
        if let Some(d) = w.deadline {
            self.clear_timer(d, TimerReason::WatchDeadline, w.id.0);
        }
        if let Flow::Blocked { batch, .. } = w.flow {
            self.leave_batch(batch, slot, w.id);
        }
        Some(w)
    }

    /// Ends a watch now: queued events are dropped (`forget` without draining).
    pub(crate) fn close_watcher(
        &mut self,
        id: RequestId,
        cause: CloseCause,
        error: Option<Status>,
        message: Option<String>,
    ) {
        let Some(slot) = self.slot(id) else { return };
        let Some(w) = self.remove_watcher(slot) else { return };
        if let Some(status) = error {
            self.outputs.push_back(Output::WatchError { watch: id, status });
        }
        self.outputs.push_back(Output::WatchClosed {
            watch: id,
            cause,
            last_rv: w.last_sent_rv,
            message,
        });
    }

    /// "Forcing watcher close due to unresponsiveness": the watcher stops taking events; the
    /// client still gets what its result channel holds (everything queued if the close is
    /// graceful, i.e. the initial-events-end bookmark is queued but unread).
    pub(crate) fn terminate_unresponsive(&mut self, slot: Slot) {
        self.metrics.terminated_watchers += 1;
        let graceful = self.slots[slot as usize].as_mut().is_some_and(|w| {
            w.settle_result_channel();
            w.bookmark_state == BookmarkState::Received
        });
        self.stop_input(slot, CloseCause::Unresponsive, None, !graceful);
    }

    /// `stopLocked`: the watcher takes no more events and its queue closes. Without draining,
    /// only what its result channel holds (`chan_size` items: initial events while it is still
    /// replaying, else the first queued ones) reaches the client; the watch then ends.
    pub(crate) fn stop_input(
        &mut self,
        slot: Slot,
        cause: CloseCause,
        message: Option<String>,
        trim: bool,
    ) {
        let (id, batch) = {
            let Some(w) = self.slots[slot as usize].as_ref() else { return };
            (w.id, if let Flow::Blocked { batch, .. } = w.flow { Some(batch) } else { None })
        };
        if self.slots[slot as usize].as_ref().is_some_and(|w| w.is_open_for_input()) {
            self.unindex(slot);
        }
        if let Some(b) = batch {
            self.leave_batch(b, slot, id);
        }
        let buffer_size = self.cfg.interval_buffer_size;
        let Cacher { slots, ring, .. } = self;
        let Some(w) = slots[slot as usize].as_mut() else { return };
        w.flow = Flow::Draining { cause, error: None, message };
        if trim {
            let keep = w.chan_size;
            let mut replaying = false;
            if let Some(mut init) = w.initial.take() {
                // The result channel holds the next initial events: load them first.
                while init.buffer.len() < keep {
                    match init.refill(w, ring, buffer_size) {
                        Refill::More => continue,
                        Refill::Exhausted | Refill::Invalidated(_) => break,
                    }
                }
                replaying = !init.is_source_exhausted() || init.buffer.len() >= keep;
                init.buffer.truncate(keep);
                init.finish_source();
                w.initial = Some(init);
            }
            let used = w.initial.as_ref().map_or(0, |i| i.buffer.len());
            if replaying {
                // Live events were still in the input channel: they are lost.
                w.end_bookmark = None;
                w.queue.clear();
                w.settled = 0;
            } else {
                let mut room = keep - used;
                if w.end_bookmark.is_some() {
                    if room == 0 {
                        w.end_bookmark = None;
                    } else {
                        room -= 1;
                    }
                }
                w.queue.truncate(room);
                w.settled = w.settled.min(w.queue.len());
            }
        }
        self.finish_if_drained(slot);
    }

    /// Emits the end of a draining watcher once the client has read everything.
    pub(crate) fn finish_if_drained(&mut self, slot: Slot) {
        let done = match self.slots[slot as usize].as_ref() {
            Some(w) => {
                matches!(w.flow, Flow::Draining { .. })
                    && w.queue.is_empty()
                    && w.end_bookmark.is_none()
                    && w.initial.as_ref().is_none_or(|i| i.is_exhausted())
            }
            None => false,
        };
        if !done {
            return;
        }
        let Some(w) = self.remove_watcher(slot) else { return };
        if let Flow::Draining { cause, error, message } = w.flow {
            if let Some(status) = error {
                self.outputs.push_back(Output::WatchError { watch: w.id, status });
            }
            self.outputs.push_back(Output::WatchClosed {
                watch: w.id,
                cause,
                last_rv: w.last_sent_rv,
                message,
            });
        }
    }

    pub(crate) fn schedule_bookmark(&mut self, slot: Slot, now: Timestamp) {
        let Some(w) = self.slots[slot as usize].as_ref() else { return };
        if !w.allow_bookmarks {
            return;
        }
        if let Some(next) = next_bookmark_time(
            now,
            self.cfg.bookmark_frequency_ms,
            w.deadline,
            w.bookmark_state == BookmarkState::Waiting,
        ) {
            self.buckets.add(slot, w.id.0, next);
        }
    }

    // ----- delivery --------------------------------------------------------------------------

    /// Delivers up to `max` items (initial events, the end bookmark, then the queue), refills
    /// the queue from a blocked watcher's overflow or a lagging watcher's ring position, and
    /// ends a drained watcher. If reading frees the dispatcher (it was waiting on this
    /// watcher), the events it then dispatches are read too, as a client that keeps reading
    /// gets them. Returns how many items were delivered.
    pub(crate) fn release(&mut self, slot: Slot, max: u64) -> usize {
        let Some(id) = self.slots[slot as usize].as_ref().map(|w| w.id) else { return 0 };
        let mut total = 0usize;
        loop {
            total += self.release_once(slot, max.saturating_sub(total as u64));
            if !self.dispatch_waiting() {
                return total;
            }
            // The dispatcher is free again: it runs now. This watcher's events wait in its queue
            // meanwhile, so none overtakes what it was just given (nor spends its credit).
            if let Some(w) = self.slots[slot as usize].as_mut().filter(|w| w.id == id) {
                w.in_release = true;
            }
            self.pump();
            let Some(w) = self.slots[slot as usize].as_mut().filter(|w| w.id == id) else {
                return total;
            };
            w.in_release = false;
            if total as u64 >= max
                || (w.queue.is_empty() && !matches!(w.flow, Flow::Draining { .. }))
            {
                return total;
            }
        }
    }

    /// True if the dispatcher is free and has work (events in `incoming`, a tick, held input).
    pub(crate) fn dispatch_waiting(&self) -> bool {
        self.dispatcher_free() && (!self.incoming.is_empty() || self.tick_pending)
    }

    fn release_once(&mut self, slot: Slot, max: u64) -> usize {
        let id = match self.slots[slot as usize].as_ref() {
            Some(w) => w.id,
            None => return 0,
        };
        let mut out: Vec<WatchEvent> = Vec::new();
        let mut invalidated: Option<String> = None;
        loop {
            let before = out.len();
            invalidated = invalidated.or_else(|| self.take_items(slot, max, &mut out));
            let moved = if invalidated.is_none() { self.refill_queue(slot) } else { false };
            if invalidated.is_some() || out.len() as u64 >= max || (out.len() == before && !moved) {
                break;
            }
        }
        let n = out.len();
        if n > 0 {
            let mut init_events = 0u64;
            let mut bookmarks = 0u64;
            for e in &out {
                match e {
                    WatchEvent::Initial(_) => init_events += 1,
                    WatchEvent::Bookmark { .. } => bookmarks += 1,
                    WatchEvent::Change(..) => {}
                }
            }
            self.metrics.init_events += init_events;
            self.metrics.bookmarks_sent += bookmarks;
            self.metrics.deliveries += n as u64;
            self.outputs.push_back(Output::Deliver { watch: id, events: out });
        }
        if let Some(message) = invalidated {
            self.close_watcher(id, CloseCause::Error, None, Some(message));
            return n;
        }
        self.finish_if_drained(slot);
        n
    }

    /// Moves items to `out` until `max` (completing a started revision); returns the message
    /// of an invalidated interval.
    fn take_items(&mut self, slot: Slot, max: u64, out: &mut Vec<WatchEvent>) -> Option<String> {
        let buffer_size = self.cfg.interval_buffer_size;
        let Cacher { slots, ring, .. } = self;
        let w = slots[slot as usize].as_mut()?;
        loop {
            let full = out.len() as u64 >= max;
            if let Some(mut init) = w.initial.take() {
                if let Some(ev) = init.buffer.pop_front() {
                    // Keep a revision whole here too: a replay from the ring that reaches the
                    // limit inside a revision (a transaction, a lease expiry) completes it.
                    let continues = ev.storage_rv().is_some()
                        && ev.storage_rv() == out.last().and_then(WatchEvent::storage_rv);
                    if full && !continues {
                        init.buffer.push_front(ev);
                        w.initial = Some(init);
                        return None;
                    }
                    w.note_sent(&ev);
                    out.push(ev);
                    w.initial = Some(init);
                    continue;
                }
                match init.refill(w, ring, buffer_size) {
                    Refill::More => {
                        w.initial = Some(init);
                        continue;
                    }
                    Refill::Exhausted => continue,
                    Refill::Invalidated(msg) => return Some(msg),
                }
            }
            if full {
                // Keep a revision whole: take the rest of the last one delivered.
                let last = out.last().and_then(WatchEvent::storage_rv);
                let next = w.queue.front().and_then(WatchEvent::storage_rv);
                if last.is_none() || last != next {
                    return None;
                }
            }
            if let Some(rv) = w.end_bookmark.take() {
                // Converted right after the initial events, before anything else was sent.
                let ev = WatchEvent::Bookmark { rv, initial_events_end: true };
                w.note_sent(&ev);
                out.push(ev);
                continue;
            }
            match w.pop_settled() {
                Some(ev) => {
                    w.note_sent(&ev);
                    out.push(ev);
                }
                None => return None,
            }
        }
    }

    /// Refills the queue from a blocked watcher's overflow or a lagging watcher's position.
    /// Returns true if anything moved.
    fn refill_queue(&mut self, slot: Slot) -> bool {
        let blocked = self.slots[slot as usize].as_ref().and_then(|w| match w.flow {
            Flow::Blocked { batch, .. } => Some((batch, w.id)),
            _ => None,
        });
        if let Some((batch, id)) = blocked {
            if self.stall.as_ref().is_some_and(|s| s.id == batch) {
                // The stalled dispatcher gives the event to this watcher only when it is the one
                // it waits on.
                if !self.is_stall_front(batch, slot, id) || !self.offer_blocked_item(slot, id) {
                    return false;
                }
                self.advance_stall();
                return true;
            }
        }
        let now = self.now;
        let dispatched_end = self.dispatched_end;
        let Cacher { slots, ring, .. } = self;
        let Some(w) = slots[slot as usize].as_mut() else { return false };
        let mut moved = false;
        let mut unblocked_batch = None;
        let mut fell_out = None;
        let cap = w.live_capacity();
        match &mut w.flow {
            Flow::Blocked { batch, overflow } => {
                while let Some(ev) = overflow.front() {
                    let rv = ev.storage_rv().unwrap_or(0);
                    if !(w.queue.len() < cap
                        || (rv == w.last_queued_rv
                            && w.queue.back().and_then(WatchEvent::storage_rv) == Some(rv)))
                    {
                        break;
                    }
                    let ev = overflow.pop_front().expect("front exists");
                    w.last_queued_rv = rv;
                    w.queue.push_back(ev);
                    moved = true;
                }
                if overflow.is_empty() {
                    unblocked_batch = Some(*batch);
                }
            }
            Flow::Lagging { next_index } => {
                let mut idx = *next_index;
                // Only as far as dispatch has gone: later events reach it by dispatch.
                while idx < dispatched_end {
                    let Some(ev) = ring.get(idx) else {
                        fell_out = Some(w.last_queued_rv.max(w.rv));
                        break;
                    };
                    let rv = ev.rv();
                    let wanted = if w.wants_rv(rv) { w.classify(ev) } else { None };
                    if let Some(kind) = wanted {
                        if !w.queue_has_room_for(rv) {
                            break;
                        }
                        w.queue.push_back(WatchEvent::Change(kind, ev.clone()));
                        w.last_queued_rv = rv;
                        moved = true;
                    }
                    idx += 1;
                }
                w.flow = if fell_out.is_none() && idx >= dispatched_end {
                    Flow::Active
                } else {
                    Flow::Lagging { next_index: idx }
                };
            }
            Flow::Active | Flow::Draining { .. } => {}
        }
        if let Some(rv) = fell_out {
            let oldest = ring.oldest().map_or(rv + 1, |e| e.rv());
            w.flow = Flow::Draining {
                cause: CloseCause::Error,
                error: Some(Status::too_old(rv, oldest.saturating_sub(1))),
                message: None,
            };
            self.metrics.watch_expired += 1;
            self.unindex(slot);
            return moved;
        }
        if let Some(batch) = unblocked_batch {
            if let Some(w) = self.slots[slot as usize].as_mut() {
                w.flow = Flow::Active;
                let id = w.id;
                self.leave_batch(batch, slot, id);
                let _ = now;
            }
        }
        moved
    }
}
