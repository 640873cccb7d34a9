//! The dispatch hot path: one storage event to every interested watcher, the time budget for
//! blocked watchers, and the periodic bookmarks.
//!
//! Kubernetes counterparts: `cacher.go`'s `dispatchEvents`, `startDispatching` (selecting
//! watchers by scope and trigger value), `dispatchEvent` (non-blocking adds, then blocking adds
//! against the shared budget timer, then `returnUnused`), `finishDispatching`, and the bookmark
//! tick. Unlike Kubernetes, a blocked watcher does not hold up the others: the event waits for
//! it alone, within the same budget, while dispatch moves on.

use alloc::collections::VecDeque;
use alloc::sync::Arc;
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
    pub(crate) fn dispatch(&mut self, ev: &Arc<Event>) {
        let mut candidates = core::mem::take(&mut self.scratch_slots);
        candidates.clear();
        self.collect_candidates(ev, &mut candidates);
        if candidates.is_empty() {
            self.scratch_slots = candidates;
            return;
        }
        let rv = ev.rv();
        let ring_index = self.ring.end_index().saturating_sub(1);
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
                targets.push((w.id, kind));
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
                let mut overflow = VecDeque::new();
                overflow.push_back(item);
                w.flow = Flow::Blocked { batch: batch_id, overflow };
            }
        }
        self.batches.insert(batch_id, Batch { deadline, members });
        self.set_timer(deadline, TimerReason::SlowWatcherBudget, batch_id);
    }

    /// A blocked watcher made room (or went away): when the whole batch is done, the unused
    /// time goes back to the budget (`returnUnused`).
    pub(crate) fn leave_batch(&mut self, batch: u64, slot: Slot, id: RequestId) {
        let Some(b) = self.batches.get_mut(&batch) else { return };
        b.members.retain(|&(s, i)| !(s == slot && i == id));
        if b.members.is_empty() {
            let deadline = b.deadline;
            self.batches.remove(&batch);
            self.clear_timer(deadline, TimerReason::SlowWatcherBudget, batch);
            self.budget.return_unused(deadline.ms_since(self.now));
        }
    }

    /// The budget is spent: watchers of the batch still blocked are closed.
    pub(crate) fn on_batch_deadline(&mut self, batch: u64) {
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
