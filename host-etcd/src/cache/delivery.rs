//! What the cache task hands to the etcd watch sessions: typed batches of whole revisions, one
//! message per session per wake-up, in the order the core produced them.
//!
//! The events of one wake-up form one [`EventRun`], shared (never copied) by every session that
//! gets some of them; each watch gets the indices of its events ([`Picks`]). An event's wire
//! encoding is cached inside the run, per option set, so it is done once however many watchers
//! get it — and it lives exactly as long as the run, so no identity by address is needed.
//!
//! Kubernetes counterpart: what `cacheWatcher.input` carries (`cache_watcher.go`), batched;
//! the shared encoding follows `cachingObject` (`caching_object.go`).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use cacher_core::{CloseCause, Event, RequestId};

/// A watch session, numbered from a counter (never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl SessionId {
    /// The next session id of this process.
    pub fn next() -> SessionId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SessionId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// One attempt of a session to serve one of its watches from a cache, numbered by the session
/// (never reused within it): messages about an older attempt are recognised and dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchTag(pub u64);

/// The events one cache gave out in one wake-up, in order (whole revisions), with the cache's
/// revision then.
pub struct EventRun {
    header_rev: u64,
    /// etcd's compaction revision as the cache knew it when the run was given out: an event at
    /// or below it is sent without `prev_kv` (see [`EventRun::prev_kv`]).
    compacted: u64,
    events: Vec<Arc<Event>>,
    /// Wire encodings, filled on first use: `[without prev_kv, with prev_kv]` per event.
    encodings: Box<[[OnceLock<Bytes>; 2]]>,
    /// The encoded response header every watcher of the run gets, filled on first use.
    header: OnceLock<Bytes>,
}

impl std::fmt::Debug for EventRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRun")
            .field("header_rev", &self.header_rev)
            .field("revisions", &self.events.iter().map(|e| e.rv()).collect::<Vec<_>>())
            .finish()
    }
}

impl EventRun {
    /// A run of `events` given out when the cache was at `header_rev`.
    pub fn new(header_rev: u64, events: Vec<Arc<Event>>) -> EventRun {
        let encodings = events.iter().map(|_| [OnceLock::new(), OnceLock::new()]).collect();
        EventRun { header_rev, events, encodings, header: OnceLock::new(), compacted: 0 }
    }

    /// The same run, given out when etcd had been compacted at `rev`.
    pub fn with_compacted(mut self, rev: u64) -> EventRun {
        self.compacted = rev;
        self
    }

    /// Whether the `i`-th event goes out with its previous value to a watch that asked for
    /// `prev_kv`. etcd reads the previous value when it sends an event, at the revision just
    /// before the event's, and sends none when that read fails because the revision is
    /// compacted (`v3rpc/watch.go`, `sendLoop`): an event at the compaction revision itself
    /// (a watch that starts exactly there, or catches up to it) has no `prev_kv` from etcd.
    pub fn prev_kv(&self, i: u32, asked: bool) -> bool {
        asked && self.events.get(i as usize).is_some_and(|ev| self.has_prev(ev))
    }

    /// etcd's read at `ev`'s revision − 1 succeeds: it is above the compaction.
    fn has_prev(&self, ev: &Event) -> bool {
        ev.rv() > self.compacted
    }

    /// The cache's revision when the run was given out (etcd's `header.revision`: at least
    /// the last event's).
    pub fn header_rev(&self) -> u64 {
        self.header_rev
    }

    /// The encoded response header, computed by `encode` the first time (borrowed: the
    /// sessions of both worker threads read it, and a count on it would bounce between them).
    pub fn header_encoding(&self, encode: impl FnOnce() -> Bytes) -> &[u8] {
        self.header.get_or_init(encode)
    }

    /// Events in the run.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True if the run has no events.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The `i`-th event.
    pub fn event(&self, i: u32) -> Option<&Arc<Event>> {
        self.events.get(i as usize)
    }

    /// The `i`-th event's encoding for a watch that asked for `prev_kv` or not (with the
    /// previous value only where [`EventRun::prev_kv`] says), computed by `encode` the first
    /// time (borrowed, as the header).
    pub fn encoding(
        &self,
        i: u32,
        prev_kv: bool,
        encode: impl FnOnce(&Event, bool) -> Bytes,
    ) -> &[u8] {
        let i = i as usize;
        match (self.encodings.get(i), self.events.get(i)) {
            (Some(slots), Some(ev)) => {
                let prev_kv = prev_kv && self.has_prev(ev);
                slots[usize::from(prev_kv)].get_or_init(|| encode(ev, prev_kv))
            }
            _ => &[],
        }
    }
}

/// Which events of a run are one watch's, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Picks {
    /// The run's events `start..end` (the common case: every watcher of a prefix).
    Range(u32, u32),
    /// These indices.
    List(Vec<u32>),
}

impl Picks {
    /// Just event `i`.
    pub fn one(i: u32) -> Picks {
        Picks::Range(i, i + 1)
    }

    /// Adds event `i` (after every index already there).
    pub fn push(&mut self, i: u32) {
        match self {
            Picks::Range(_, end) if *end == i => *end += 1,
            Picks::Range(start, end) => {
                let mut v: Vec<u32> = (*start..*end).collect();
                v.push(i);
                *self = Picks::List(v);
            }
            Picks::List(v) => v.push(i),
        }
    }

    /// How many events.
    pub fn len(&self) -> usize {
        match self {
            Picks::Range(s, e) => (e - s) as usize,
            Picks::List(v) => v.len(),
        }
    }

    /// True if none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (range, list) = match self {
            Picks::Range(s, e) => (*s..*e, &[][..]),
            Picks::List(v) => (0..0, v.as_slice()),
        };
        range.chain(list.iter().copied())
    }
}

/// One watch's share of a run.
#[derive(Clone, Debug)]
pub struct WatchItems {
    /// The watch (its session's tag).
    pub tag: WatchTag,
    /// Its events.
    pub picks: Picks,
}

/// What a cache tells a session, in order: a watch's start is told before its events, its
/// events before its end, and a frontier after every event it vouches for.
#[derive(Debug)]
pub enum CacheMsg {
    /// The watch is served from the cache: changes after `after_rev` follow.
    Started {
        /// The watch.
        tag: WatchTag,
        /// The core's watch (for credit and cancel).
        watch: RequestId,
        /// Changes after this revision are delivered.
        after_rev: u64,
        /// The cache's revision now.
        cache_rv: u64,
    },
    /// The cache cannot serve the watch (not ready in time, outside its window, compacted):
    /// the session goes to etcd.
    Refused {
        /// The watch.
        tag: WatchTag,
        /// Why, in words.
        reason: String,
    },
    /// Events of one wake-up for some of the session's watches.
    Events {
        /// The run, shared with other sessions.
        run: Arc<EventRun>,
        /// Each watch's events, whole revisions.
        items: Vec<WatchItems>,
    },
    /// The cached watch ended (fell out of the window, the cache relists or stops); nothing
    /// more comes for it.
    Closed {
        /// The watch.
        tag: WatchTag,
        /// Why.
        cause: CloseCause,
        /// Detail.
        message: Option<String>,
    },
    /// Answer to a frontier query: which of the asked watches have been given every event up
    /// to `cache_rv`.
    Frontier {
        /// The query's token.
        token: u64,
        /// The cache's revision.
        cache_rv: u64,
        /// Per watch asked: caught up (nothing queued, nothing to replay).
        caught_up: Vec<(WatchTag, bool)>,
    },
}

/// Where a cache sends a session's messages (bounded by credit, not by the channel).
pub type SessionSink = crate::queue::Sender<CacheMsg>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_prev_kv_at_or_below_the_compaction() {
        let t = cacher_core::Timestamp::ZERO;
        let o = |rv: u64| Arc::new(cacher_core::Object::new(b"/k", Some(b"v"), rv));
        let ev = |rv: u64| Arc::new(Event::put(o(rv), Some(o(rv - 1)), t));
        let run = EventRun::new(12, vec![ev(10), ev(11), ev(12)]).with_compacted(11);
        assert_eq!(
            [0, 1, 2].map(|i| run.prev_kv(i, true)),
            [false, false, true],
            "etcd reads the previous value at rv - 1, refused at or below the compaction"
        );
        assert!(!run.prev_kv(2, false));
        assert!(!run.prev_kv(7, true));
        let encode = |_: &Event, prev: bool| Bytes::from(if prev { "with" } else { "without" });
        assert_eq!(run.encoding(1, true, encode), b"without");
        assert_eq!(run.encoding(2, true, encode), b"with");
    }

    #[test]
    fn picks_stay_a_range_while_contiguous() {
        let mut p = Picks::one(3);
        p.push(4);
        p.push(5);
        assert_eq!(p, Picks::Range(3, 6));
        p.push(8);
        assert_eq!(p, Picks::List(vec![3, 4, 5, 8]));
        assert_eq!(p.iter().collect::<Vec<_>>(), vec![3, 4, 5, 8]);
        assert_eq!(p.len(), 4);
    }

    #[test]
    fn an_encoding_is_computed_once_per_option() {
        use cacher_core::{Object, Timestamp};
        let o = Arc::new(Object::new(b"/a", Some(b"v"), 5));
        let run = EventRun::new(5, vec![Arc::new(Event::put(o, None, Timestamp::ZERO))]);
        let mut calls = 0;
        let a = run.encoding(0, false, |_, _| {
            calls += 1;
            Bytes::from_static(b"x")
        });
        let b = run.encoding(0, false, |_, _| {
            calls += 1;
            Bytes::from_static(b"y")
        });
        assert_eq!((a, b, calls), (&b"x"[..], &b"x"[..], 1));
        assert_eq!(run.encoding(0, true, |_, _| Bytes::from_static(b"z")), b"z");
        assert_eq!(run.encoding(9, true, |_, _| Bytes::from_static(b"z")), b"");
    }
}
