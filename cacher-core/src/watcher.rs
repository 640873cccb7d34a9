//! One client watch: its filter, its queue, its bookmark state and its slow-consumer state.
//!
//! Kubernetes counterpart: `cache_watcher.go` (`cacheWatcher`: `nonblockingAdd`, `add`,
//! `convertToWatchEvent`, the bookmark-after-RV state machine, `processInterval`/`process`'s
//! resourceVersion filter, `forget`/`stopLocked` and draining). The queue stands for the
//! watcher's `input` channel, its `result` channel and the one event its goroutine holds
//! (2 × channel size + 1), so a watcher that stops reading blocks on the same event as in
//! Kubernetes.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;

use crate::event::Event;
use crate::interval::Initial;
use crate::key::KeyRange;
use crate::object::Object;
use crate::output::{ChangeKind, CloseCause, RequestId, WatchEvent};
use crate::request::SlowPolicy;
use crate::selector::Selector;
use crate::status::Status;
use crate::time::Timestamp;

/// Where a watcher is indexed for dispatch (`allWatchers[scope]` or `valueWatchers[value]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    Scope { namespace: Box<str>, name: Box<str> },
    Trigger(Box<str>),
}

/// The initial-events-end bookmark state (`bookmarkAfterResourceVersion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BookmarkState {
    /// Nothing pending (bookmark-after RV 0, or the annotated bookmark was sent).
    Sent,
    /// Waiting for a bookmark at or after the bookmark-after RV.
    Waiting,
    /// Such a bookmark is in the input channel, not yet in the result channel.
    Received,
}

/// How events get to the watcher.
#[derive(Debug)]
pub(crate) enum Flow {
    /// Events are queued (or delivered straight away while the client has credit).
    Active,
    /// The queue is full and dispatch is waiting for room within the time budget.
    Blocked { batch: u64, overflow: VecDeque<WatchEvent> },
    /// The queue was full (lag policy): replay from this ring index when there is room.
    Lagging { next_index: u64 },
    /// Closed for input: the client reads what is still on its way, then the watch ends.
    Draining { cause: CloseCause, error: Option<Status>, message: Option<String> },
}

pub(crate) struct Watcher {
    pub id: RequestId,
    pub range: KeyRange,
    pub selector: Option<Box<Selector>>,
    /// The resourceVersion after the initial events (`process`'s filter).
    pub rv: u64,
    pub last_sent_rv: u64,
    /// The RV of the last event queued (keeps revisions whole in the queue).
    pub last_queued_rv: u64,
    pub allow_bookmarks: bool,
    pub bookmark_after_rv: u64,
    pub bookmark_state: BookmarkState,
    /// v1.32+: the annotated bookmark to send right after the initial events.
    pub end_bookmark: Option<u64>,
    pub deadline: Option<Timestamp>,
    /// Events the client will take without being asked (`u64::MAX` = reads everything).
    pub credit: u64,
    pub policy: SlowPolicy,
    pub chan_size: usize,
    pub queue_cap: usize,
    pub queue: VecDeque<WatchEvent>,
    /// How many of the queue's first items have reached the result channel (bookmarks among
    /// them already filtered and annotated): see [`Watcher::settle_result_channel`].
    pub settled: usize,
    /// Being read by its client right now: events wait in the queue, behind what it is given.
    pub in_release: bool,
    pub initial: Option<Box<Initial>>,
    pub flow: Flow,
    pub placement: Placement,
}

impl Watcher {
    /// `convertToWatchEvent`'s filter: how this watcher sees a storage event, if at all.
    #[inline]
    pub(crate) fn classify(&self, ev: &Event) -> Option<ChangeKind> {
        if !self.range.contains(ev.key()) {
            return None;
        }
        self.classify_in_range(ev)
    }

    /// `classify` for an event already known to be in the watcher's range.
    #[inline]
    pub(crate) fn classify_in_range(&self, ev: &Event) -> Option<ChangeKind> {
        let cur = ev.object().is_some_and(|o| self.selects(o));
        let old = ev.prev().is_some_and(|o| self.selects(o));
        match (cur, old) {
            (true, false) => Some(ChangeKind::Added),
            (true, true) => Some(ChangeKind::Modified),
            (false, true) => Some(ChangeKind::Deleted),
            (false, false) => None,
        }
    }

    #[inline]
    pub(crate) fn selects(&self, o: &Object) -> bool {
        self.selector.as_ref().is_none_or(|s| s.matches(o))
    }

    /// `process`'s resourceVersion filter for storage events.
    #[inline]
    pub(crate) fn wants_rv(&self, rv: u64) -> bool {
        rv > self.rv
    }

    /// True while the watcher takes new events at all.
    #[inline]
    pub(crate) fn is_open_for_input(&self) -> bool {
        !matches!(self.flow, Flow::Draining { .. })
    }

    /// True if a dispatched event can go straight to the client.
    #[inline]
    pub(crate) fn can_take_directly(&self) -> bool {
        self.can_take_directly_at(0)
    }

    /// As `can_take_directly`, for a storage event at `rv`: a revision the client has started
    /// receiving is completed even without credit, so no response splits a revision.
    #[inline]
    pub(crate) fn can_take_directly_at(&self, rv: u64) -> bool {
        (self.credit > 0 || (rv != 0 && rv == self.last_sent_rv))
            && !self.in_release
            && self.queue.is_empty()
            && self.initial.is_none()
            && self.end_bookmark.is_none()
            && matches!(self.flow, Flow::Active)
    }

    #[inline]
    pub(crate) fn spend_credit(&mut self, n: u64) {
        if self.credit != u64::MAX {
            self.credit = self.credit.saturating_sub(n);
        }
    }

    /// Room for live events. While initial events are still being sent they hold the result
    /// channel and the watcher's goroutine, so live events only have the input channel.
    pub(crate) fn live_capacity(&self) -> usize {
        let pending = self.initial.as_ref().map_or(0, |i| i.pending_at_least(self.chan_size + 1))
            + usize::from(self.end_bookmark.is_some());
        self.queue_cap.saturating_sub(pending.min(self.chan_size + 1))
    }

    /// True if the queue can take `rv` now (a revision already started in the queue is always
    /// completed, so revisions stay whole).
    pub(crate) fn queue_has_room_for(&self, rv: u64) -> bool {
        self.queue.len() < self.live_capacity()
            || (rv == self.last_queued_rv
                && self.queue.back().and_then(WatchEvent::storage_rv) == Some(rv))
    }

    pub(crate) fn queue_has_room(&self) -> bool {
        self.queue.len() < self.live_capacity()
    }

    /// Records what the client has now been given.
    pub(crate) fn note_sent(&mut self, ev: &WatchEvent) {
        match ev {
            WatchEvent::Bookmark { rv, .. } => {
                if self.bookmark_state != BookmarkState::Sent {
                    self.bookmark_state = BookmarkState::Sent;
                }
                self.last_sent_rv = self.last_sent_rv.max(*rv);
            }
            WatchEvent::Change(_, e) => self.last_sent_rv = self.last_sent_rv.max(e.rv()),
            WatchEvent::Initial(_) => {}
        }
    }

    /// Moves what the watcher's goroutine has moved: the queue stands for the result channel
    /// (`chan_size` items, after any initial events still to send and the 1.32+ end bookmark),
    /// then the input channel. A bookmark reaching the result channel is decided there: `process`
    /// drops it or `convertToWatchEvent` annotates it, and the initial-events end counts as sent
    /// from then on (`markBookmarkAfterRvSent`, cache_watcher.go) — not when the client reads
    /// it, so a slow client's watcher is no longer closed gracefully once it is there.
    pub(crate) fn settle_result_channel(&mut self) {
        let mut ahead = self
            .initial
            .as_ref()
            .map_or(0, |i| i.pending_at_least(self.chan_size).max(i.buffer.len()));
        if self.end_bookmark.is_some() {
            if ahead < self.chan_size {
                // The end bookmark itself went into the result channel after the initial events.
                self.bookmark_state = BookmarkState::Sent;
            }
            ahead += 1;
        }
        let limit = self.chan_size.saturating_sub(ahead);
        while self.settled < self.queue.len() && self.settled < limit {
            if let WatchEvent::Bookmark { rv, .. } = self.queue[self.settled] {
                match self.bookmark_for_client(rv) {
                    Some(item) => {
                        if self.bookmark_state != BookmarkState::Sent {
                            self.bookmark_state = BookmarkState::Sent;
                        }
                        self.queue[self.settled] = item;
                    }
                    None => {
                        self.queue.remove(self.settled);
                        continue;
                    }
                }
            }
            self.settled += 1;
        }
    }

    /// The queue's first item, as it leaves the result channel for the client.
    pub(crate) fn pop_settled(&mut self) -> Option<WatchEvent> {
        if self.settled == 0 {
            self.settle_result_channel();
        }
        let item = self.queue.pop_front()?;
        self.settled = self.settled.saturating_sub(1);
        Some(item)
    }

    /// A periodic bookmark as the client gets it, or `None` if `process`'s filter drops it
    /// (not newer than the watch's RV, unless the end marker is still owed).
    pub(crate) fn bookmark_for_client(&self, rv: u64) -> Option<WatchEvent> {
        let passes = rv > self.rv || (rv == self.rv && self.bookmark_state != BookmarkState::Sent);
        passes.then(|| self.bookmark(rv))
    }

    /// The bookmark item for this watcher (annotated while the end marker is owed).
    pub(crate) fn bookmark(&self, rv: u64) -> WatchEvent {
        WatchEvent::Bookmark {
            rv,
            initial_events_end: self.bookmark_after_rv != 0
                && self.bookmark_state != BookmarkState::Sent,
        }
    }
}

/// A shared event wrapped for one watcher.
pub(crate) fn change(kind: ChangeKind, ev: &Arc<Event>) -> WatchEvent {
    WatchEvent::Change(kind, ev.clone())
}

#[cfg(test)]
impl Watcher {
    /// A watcher on `range` that takes every event, for unit tests.
    pub(crate) fn for_tests(range: KeyRange) -> Watcher {
        Watcher {
            id: RequestId(1),
            range,
            selector: None,
            rv: 0,
            last_sent_rv: 0,
            last_queued_rv: 0,
            allow_bookmarks: false,
            bookmark_after_rv: 0,
            bookmark_state: BookmarkState::Sent,
            end_bookmark: None,
            deadline: None,
            credit: u64::MAX,
            policy: crate::request::SlowPolicy::Terminate,
            chan_size: 10,
            queue_cap: 10,
            queue: VecDeque::new(),
            settled: 0,
            in_release: false,
            initial: None,
            flow: Flow::Active,
            placement: Placement::Scope { namespace: "".into(), name: "".into() },
        }
    }
}

#[cfg(test)]
mod tests {
    //! `cacher.go`'s `convertToWatchEvent` and `process` filters, one watcher at a time (the
    //! scenarios test them through dispatch).
    use alloc::sync::Arc;

    use super::*;
    use crate::object::{Attrs, Object};
    use crate::selector::Selector;
    use crate::time::Timestamp;

    fn pod(key: &str, app: &str, rv: u64) -> Arc<Object> {
        let attrs = Attrs::new([("app", app)], core::iter::empty::<(&str, &str)>());
        Arc::new(Object::new(key.as_bytes(), Some(b"v"), rv).with_attrs(attrs))
    }

    fn web_watcher() -> Watcher {
        let mut w = Watcher::for_tests(KeyRange::kubernetes("/pods/", true).expect("range"));
        w.selector = Some(Box::new(Selector::parse("app=web", "").expect("selector")));
        w
    }

    fn update(prev: &str, cur: &str) -> Event {
        Event::put(pod("/pods/a", cur, 2), Some(pod("/pods/a", prev, 1)), Timestamp::ZERO)
    }

    #[test]
    fn selector_transitions_are_added_and_deleted() {
        let w = web_watcher();
        assert_eq!(w.classify(&update("db", "web")), Some(ChangeKind::Added));
        assert_eq!(w.classify(&update("web", "web")), Some(ChangeKind::Modified));
        assert_eq!(w.classify(&update("web", "db")), Some(ChangeKind::Deleted));
        assert_eq!(w.classify(&update("db", "db")), None);
    }

    #[test]
    fn creations_and_deletions_follow_the_selector() {
        let w = web_watcher();
        let created = Event::put(pod("/pods/a", "web", 1), None, Timestamp::ZERO);
        assert_eq!(w.classify(&created), Some(ChangeKind::Added));
        let deleted = Event::delete(3, pod("/pods/a", "web", 2), Timestamp::ZERO);
        assert_eq!(w.classify(&deleted), Some(ChangeKind::Deleted));
        let other = Event::delete(3, pod("/pods/a", "db", 2), Timestamp::ZERO);
        assert_eq!(w.classify(&other), None);
    }

    #[test]
    fn keys_outside_the_range_are_never_seen() {
        let w = web_watcher();
        let outside = Event::put(pod("/podsx/a", "web", 1), None, Timestamp::ZERO);
        assert_eq!(w.classify(&outside), None);
        let nested = Event::put(pod("/pods/ns/a", "web", 1), None, Timestamp::ZERO);
        assert_eq!(w.classify(&nested), Some(ChangeKind::Added));
    }

    #[test]
    fn never_an_event_at_or_below_the_watchers_resource_version() {
        let mut w = web_watcher();
        w.rv = 10;
        assert!(!w.wants_rv(9) && !w.wants_rv(10) && w.wants_rv(11));
    }
}
