//! The dispatch hot path: one storage event to every interested watcher, the time budget for
//! blocked watchers, and the periodic bookmarks.
//!
//! Kubernetes counterparts: `cacher.go`'s `dispatchEvents`, `startDispatching` (selecting
//! watchers by scope and trigger value), `dispatchEvent` (non-blocking adds, then blocking adds
//! against the shared budget timer, then `returnUnused`), `finishDispatching`, and the bookmark
//! tick.
//!
//! As in Kubernetes, a blocked watcher holds up the whole dispatch: the one dispatcher waits in
//! `cacheWatcher.add` for each blocked watcher in turn, until it takes the event or the shared
//! budget timer fires, and every later event (and the bookmark tick) waits in `incoming`
//! meanwhile (kubernetes#141450). With [`crate::Config::non_blocking_dispatch`] (watchcache's
//! improvement, off in every profile) the event waits for the blocked watcher alone, within the
//! same budget, while dispatch moves on.

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use crate::bookmarks::Slot;
use crate::cacher::{Batch, Cacher, TimerReason};
use crate::event::Event;
use crate::output::{Output, RequestId, Target, WatchEvent};
use crate::request::SlowPolicy;
use crate::time::Timestamp;
use crate::watcher::{BookmarkState, Flow};

impl Cacher {
    /// Fans `ev` out. Watchers that can take it now are listed in one [`Output::Fanout`];
    /// others get it queued; watchers with a full queue block (terminate policy) or fall
    /// behind (lag policy).
    pub(crate) fn dispatch(&mut self, ev: &Arc<Event>, ring_index: u64) {
        let mut candidates = core::mem::take(&mut self.scratch_slots);
        candidates.clear();
        self.collect_candidates(ev, &mut candidates);
        if candidates.is_empty() {
            self.scratch_slots = candidates;
            return;
        }
        let rv = ev.rv();
        let mut targets: Vec<Target> = Vec::with_capacity(candidates.len());
        let mut blocked: Vec<(Slot, WatchEvent)> = Vec::new();
        // Watchers of the same range share its keys' allocation: check each range once.
        let mut memo: Option<((u8, usize, usize), bool)> = None;
        for &slot in &candidates {
            let Some(w) = self.slots[slot as usize].as_mut() else { continue };
            let id = w.range.identity();
            let in_range = match memo {
                Some((m, r)) if m == id => r,
                _ => {
                    let r = w.range.contains(ev.key());
                    memo = Some((id, r));
                    r
                }
            };
            if !in_range {
                continue;
            }
            let Some(kind) = w.classify_in_range(ev) else { continue };
            if !w.wants_rv(rv) {
                continue;
            }
            if w.can_take_directly_at(rv) {
                w.spend_credit(1);
                if rv > w.last_sent_rv {
                    w.last_sent_rv = rv;
                }
                targets.push(Target { watch: w.id, kind });
                continue;
            }
            let item = WatchEvent::Change(kind, ev.clone());
            match &mut w.flow {
                Flow::Active => {
                    if w.queue_has_room_for(rv) {
                        w.queue.push_back(item);
                        w.last_queued_rv = rv;
                    } else {
                        match w.policy {
                            SlowPolicy::Terminate => blocked.push((slot, item)),
                            SlowPolicy::Lag => w.flow = Flow::Lagging { next_index: ring_index },
                        }
                    }
                }
                Flow::Blocked { overflow, .. } => overflow.push_back(item),
                Flow::Lagging { .. } | Flow::Draining { .. } => {}
            }
        }
        self.scratch_slots = candidates;
        if !targets.is_empty() {
            self.metrics.deliveries += targets.len() as u64;
            self.outputs.push_back(Output::Fanout {
                event: ev.clone(),
                targets: targets.into_boxed_slice(),
            });
        }
        if !blocked.is_empty() {
            self.block(blocked);
        }
    }

    /// `startDispatching`: the watchers of the event's scopes and trigger values, in order.
    fn collect_candidates(&self, ev: &Event, out: &mut Vec<Slot>) {
        let Some(obj) = ev.placing_object() else { return };
        let ns = obj.field("metadata.namespace").unwrap_or("");
        let name = obj.field("metadata.name").unwrap_or("");
        let mut scope = |ns: &str, name: &str| {
            if let Some(v) = self.by_scope.get(ns).and_then(|m| m.get(name)) {
                out.extend_from_slice(v);
            }
        };
        if !ns.is_empty() && !name.is_empty() {
            scope(ns, name);
        }
        if !ns.is_empty() {
            scope(ns, "");
        }
        if !name.is_empty() {
            scope("", name);
        }
        scope("", "");
        if let Some(field) = self.cfg.index_field.as_deref() {
            let cur = ev.object().map(|o| o.field(field).unwrap_or(""));
            let prev = ev.prev().map(|o| o.field(field).unwrap_or(""));
            if let Some(v) = cur.and_then(|c| self.by_value.get(c)) {
                out.extend_from_slice(v.as_slice());
            }
            if prev != cur {
                if let Some(v) = prev.and_then(|p| self.by_value.get(p)) {
                    out.extend_from_slice(v.as_slice());
                }
            }
        }
    }

    /// `dispatchEvent`'s blocking part: one budget take for the event; every blocked watcher
    /// gets until the same deadline to make room, else it is closed.
    fn block(&mut self, blocked: Vec<(Slot, WatchEvent)>) {
        let now = self.now;
        let taken = self.budget.take_available(now);
        if taken == 0 {
            for (slot, _) in blocked {
                self.terminate_unresponsive(slot);
            }
            return;
        }
        let batch_id = self.next_batch;
        self.next_batch += 1;
        let deadline = now.add_ms(taken);
        let mut members = Vec::with_capacity(blocked.len());
        for (slot, item) in blocked {
            if let Some(w) = self.slots[slot as usize].as_mut() {
                members.push((slot, w.id));
                w.flow = Flow::Blocked { batch: batch_id, overflow: VecDeque::from(vec![item]) };
            }
        }
        self.set_timer(deadline, TimerReason::SlowWatcherBudget, batch_id);
        if self.cfg.non_blocking_dispatch {
            self.batches.insert(batch_id, Batch { deadline, members });
            return;
        }
        // The dispatcher itself now waits, on the first of them.
        self.stall = Some(Stall {
            id: batch_id,
            deadline,
            started: now,
            taken_ms: taken,
            members: members.into(),
            front_gone: false,
        });
    }

    /// A blocked watcher made room (or went away). Without a stall, when the whole batch is
    /// done, the unused time goes back to the budget (`returnUnused`). In a stall, a watcher
    /// that goes away does not release the dispatcher: `add` goes on waiting on its input
    /// until the timer fires (its stop is deferred while dispatching).
    pub(crate) fn leave_batch(&mut self, batch: u64, slot: Slot, id: RequestId) {
        if let Some(stall) = self.stall.as_mut().filter(|s| s.id == batch) {
            if stall.members.front() == Some(&(slot, id)) {
                stall.front_gone = true;
            } else {
                stall.members.retain(|&(s, i)| !(s == slot && i == id));
            }
            return;
        }
        let Some(b) = self.batches.get_mut(&batch) else { return };
        b.members.retain(|&(s, i)| !(s == slot && i == id));
        if b.members.is_empty() {
            let deadline = b.deadline;
            self.batches.remove(&batch);
            self.clear_timer(deadline, TimerReason::SlowWatcherBudget, batch);
            self.budget.return_unused(deadline.ms_since(self.now));
        }
    }

    /// True if `slot` is the watcher the stalled dispatcher is waiting on.
    pub(crate) fn is_stall_front(&self, batch: u64, slot: Slot, id: RequestId) -> bool {
        self.stall.as_ref().is_some_and(|s| {
            s.id == batch && !s.front_gone && s.members.front() == Some(&(slot, id))
        })
    }

    /// The watcher the dispatcher waited on took the event: `add` returns, and the next blocked
    /// watchers are tried in turn (each takes it if it has room, else the dispatcher waits on
    /// it); when none is left, dispatch goes on and the unused budget is returned.
    pub(crate) fn advance_stall(&mut self) {
        let Some(stall) = self.stall.as_mut() else { return };
        stall.members.pop_front();
        while let Some(&(slot, id)) = self.stall.as_ref().and_then(|s| s.members.front()) {
            if !self.offer_blocked_item(slot, id) {
                return;
            }
            if let Some(s) = self.stall.as_mut() {
                s.members.pop_front();
            }
        }
        if let Some(s) = self.stall.take() {
            self.clear_timer(s.deadline, TimerReason::SlowWatcherBudget, s.id);
            let used = self.now.ms_since(s.started);
            self.budget.return_unused(s.taken_ms.saturating_sub(used));
        }
    }

    /// A blocked watcher's pending item goes into its queue if there is room.
    pub(crate) fn offer_blocked_item(&mut self, slot: Slot, id: RequestId) -> bool {
        let Some(w) = self.slots[slot as usize].as_mut().filter(|w| w.id == id) else {
            return true;
        };
        let cap = w.live_capacity();
        let Flow::Blocked { overflow, .. } = &mut w.flow else { return true };
        let Some(ev) = overflow.front() else { return true };
        let rv = ev.storage_rv().unwrap_or(0);
        let room = w.queue.len() < cap
            || (rv == w.last_queued_rv
                && w.queue.back().and_then(WatchEvent::storage_rv) == Some(rv));
        if !room {
            return false;
        }
        let items = core::mem::take(overflow);
        for ev in items {
            w.last_queued_rv = ev.storage_rv().unwrap_or(w.last_queued_rv);
            w.queue.push_back(ev);
        }
        w.flow = Flow::Active;
        true
    }

    /// The budget is spent: watchers of the batch still blocked are closed. In a stall, the
    /// one the dispatcher waited on is closed, and each later one takes the event if it has
    /// room by now, else is closed at once (`add` with a nil timer); then dispatch goes on.
    pub(crate) fn on_batch_deadline(&mut self, batch: u64) {
        if self.stall.as_ref().is_some_and(|s| s.id == batch) {
            let Some(stall) = self.stall.take() else { return };
            let mut first = true;
            for (slot, id) in stall.members {
                let waited_on = core::mem::take(&mut first);
                let live = self.slots[slot as usize].as_ref().is_some_and(|w| {
                    w.id == id && matches!(w.flow, Flow::Blocked { batch: bb, .. } if bb == batch)
                });
                if !live || (waited_on && stall.front_gone) {
                    continue;
                }
                if waited_on || !self.offer_blocked_item(slot, id) {
                    self.terminate_unresponsive(slot);
                }
            }
            self.pump();
            return;
        }
        let Some(b) = self.batches.remove(&batch) else { return };
        for (slot, id) in b.members {
            let still_blocked = self.slots[slot as usize].as_ref().is_some_and(|w| {
                w.id == id && matches!(w.flow, Flow::Blocked { batch: bb, .. } if bb == batch)
            });
            if still_blocked {
                self.terminate_unresponsive(slot);
            }
        }
    }

    /// The dispatch tick: a bookmark at `lastProcessedResourceVersion` for every watcher whose
    /// bucket is due, then each is rescheduled.
    pub(crate) fn bookmark_tick(&mut self, now: Timestamp) {
        let popped = self.buckets.pop_expired(now);
        if popped.is_empty() {
            return;
        }
        let rv = self.last_processed_rv;
        for (slot, gen) in popped {
            let live = self.slots[slot as usize]
                .as_ref()
                .is_some_and(|w| w.id.0 == gen && w.is_open_for_input() && w.allow_bookmarks);
            if !live {
                continue;
            }
            // 1.30: before the dispatcher has seen any event, expired watchers are only requeued.
            if rv != 0 {
                self.offer_bookmark(slot, rv);
            }
            self.schedule_bookmark(slot, now);
        }
    }

    /// `nonblockingAdd` of a bookmark. `process`'s filter and the initial-events-end
    /// annotation are decided when the client reads it (see `Watcher::bookmark_for_client`).
    fn offer_bookmark(&mut self, slot: Slot, rv: u64) {
        let Some(w) = self.slots[slot as usize].as_mut() else { return };
        if rv < w.bookmark_after_rv {
            return;
        }
        let direct = w.can_take_directly();
        let room = direct || (matches!(w.flow, Flow::Active) && w.queue_has_room());
        if !room {
            return;
        }
        if w.bookmark_state == BookmarkState::Waiting {
            w.bookmark_state = BookmarkState::Received;
        }
        if !direct {
            w.queue.push_back(WatchEvent::Bookmark { rv, initial_events_end: false });
            return;
        }
        let Some(item) = w.bookmark_for_client(rv) else { return };
        w.spend_credit(1);
        w.note_sent(&item);
        let id = w.id;
        self.metrics.deliveries += 1;
        self.metrics.bookmarks_sent += 1;
        self.outputs.push_back(Output::Deliver { watch: id, events: alloc::vec![item] });
    }
}

/// The dispatcher inside `dispatchEvent`'s blocking phase: it waits on the first blocked
/// watcher until it takes the event or the budget timer fires; the others follow in turn.
pub(crate) struct Stall {
    /// The batch id in the members' [`Flow::Blocked`].
    pub id: u64,
    pub deadline: Timestamp,
    pub started: Timestamp,
    pub taken_ms: u64,
    /// The blocked watchers still to be given the event, the one waited on first.
    pub members: VecDeque<(Slot, RequestId)>,
    /// The one waited on went away: `add` waits on until the timer fires.
    pub front_gone: bool,
}
