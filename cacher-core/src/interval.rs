//! The initial events of a new watch, read lazily.
//!
//! Kubernetes counterpart: `watch_cache_interval.go` (`watchCacheInterval`: a 100-event buffer
//! refilled from the ring buffer under the lock, invalidated when the ring's start index moves
//! past it; or the current state copied out of the store as ADDED events). The store variant
//! here holds an O(1) snapshot of the persistent tree instead of a copy, so it can never be
//! invalidated either.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::btree::Tree;
use crate::output::WatchEvent;
use crate::ring::Ring;
use crate::store::{list_tree, Query};
use crate::watcher::{change, Watcher};

pub(crate) enum Source {
    /// Ring indices `[next, end)`.
    Ring { next: u64, end: u64 },
    /// The state at registration; `next_key` = where to continue (`None` before the first
    /// fill), `done` once the range is exhausted.
    Store { tree: Tree, next_key: Option<Vec<u8>>, done: bool },
}

pub(crate) struct Initial {
    pub source: Source,
    pub buffer: VecDeque<WatchEvent>,
}

/// What a refill found.
pub(crate) enum Refill {
    /// Events were added (possibly none, if none matched; call again).
    More,
    /// Nothing is left.
    Exhausted,
    /// The ring moved past the interval (eviction or relist): the watch must close.
    Invalidated(String),
}

impl Initial {
    pub(crate) fn from_ring(next: u64, end: u64) -> Initial {
        Initial { source: Source::Ring { next, end }, buffer: VecDeque::new() }
    }

    pub(crate) fn from_store(tree: Tree) -> Initial {
        Initial {
            source: Source::Store { tree, next_key: None, done: false },
            buffer: VecDeque::new(),
        }
    }

    pub(crate) fn is_store(&self) -> bool {
        matches!(self.source, Source::Store { .. })
    }

    /// True when nothing is left to load (the buffer may still hold events).
    pub(crate) fn is_source_exhausted(&self) -> bool {
        match &self.source {
            Source::Ring { next, end } => next >= end,
            Source::Store { done, .. } => *done,
        }
    }

    /// Loads nothing more (what is buffered is all the client gets).
    pub(crate) fn finish_source(&mut self) {
        self.source = Source::Ring { next: 0, end: 0 };
    }

    /// An upper bound of the initial events still to deliver, `cap` if unknown.
    pub(crate) fn pending_at_least(&self, cap: usize) -> usize {
        if self.is_source_exhausted() {
            self.buffer.len()
        } else {
            cap
        }
    }

    pub(crate) fn is_exhausted(&self) -> bool {
        self.buffer.is_empty()
            && match &self.source {
                Source::Ring { next, end } => next >= end,
                Source::Store { done, .. } => *done,
            }
    }

    /// Loads up to `size` entries into the buffer, filtered for `w`.
    pub(crate) fn refill(&mut self, w: &Watcher, ring: &Ring, size: usize) -> Refill {
        match &mut self.source {
            Source::Ring { next, end } => {
                if *next >= *end {
                    return Refill::Exhausted;
                }
                if *next < ring.start_index() {
                    return Refill::Invalidated(format!(
                        "cache interval invalidated, interval startIndex: {next}"
                    ));
                }
                let mut stop = (*end).min(next.saturating_add(size as u64));
                // Whole revisions only (a host's etcd transactions put several events in one):
                // were the ring to evict the rest of one before the next fill, the replay would
                // have sent part of it before it is invalidated. Kubernetes' revisions hold one
                // event each, so for them this changes nothing.
                let last_rv = stop.checked_sub(1).and_then(|i| ring.get(i)).map(|e| e.rv());
                while stop < *end && ring.get(stop).map(|e| e.rv()) == last_rv && last_rv.is_some()
                {
                    stop += 1;
                }
                for i in *next..stop {
                    if let Some(ev) = ring.get(i) {
                        if let Some(kind) = w.classify(ev) {
                            self.buffer.push_back(change(kind, ev));
                        }
                    }
                }
                *next = stop;
                Refill::More
            }
            Source::Store { tree, next_key, done } => {
                if *done {
                    return Refill::Exhausted;
                }
                let all = crate::selector::Selector::default();
                let page = list_tree(
                    tree,
                    &Query {
                        range: &w.range,
                        start: next_key.as_deref(),
                        selector: w.selector.as_deref().unwrap_or(&all),
                        limit: size,
                        count_remaining: false,
                    },
                );
                self.buffer.extend(page.items.into_iter().map(WatchEvent::Initial));
                match page.continue_key {
                    Some(k) => *next_key = Some(k),
                    None => *done = true,
                }
                Refill::More
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! After `watch_cache_interval_test.go`: the buffer is filled `size` entries of the ring at a
    //! time, filtered for the watcher, until the interval is exhausted; an interval whose next
    //! index the ring has evicted is invalidated instead of skipping events.
    use alloc::sync::Arc;

    use super::*;
    use crate::event::Event;
    use crate::key::KeyRange;
    use crate::object::Object;
    use crate::ring::RingConfig;
    use crate::time::Timestamp;

    fn ring(capacity: usize) -> Ring {
        Ring::new(RingConfig {
            capacity,
            lower_bound: capacity,
            upper_bound: capacity,
            dynamic: false,
            event_fresh_ms: 75_000,
            max_bytes: None,
        })
    }

    /// Events at revisions 1..=n, alternating between `/a/` and `/b/`.
    fn fill(r: &mut Ring, from: u64, n: u64) {
        for rv in from..from + n {
            let key = if rv % 2 == 1 { format!("/a/{rv}") } else { format!("/b/{rv}") };
            let ev = Event::put(
                Arc::new(Object::new(key.as_bytes(), Some(b"v"), rv)),
                None,
                Timestamp::from_millis(rv),
            );
            r.push(Arc::new(ev), Timestamp::from_millis(rv));
        }
    }

    fn watcher(prefix: &str) -> Watcher {
        Watcher::for_tests(KeyRange::kubernetes(prefix, true).expect("a range"))
    }

    /// How many events each fill of `size` added, until the interval is exhausted.
    fn fill_sizes(it: &mut Initial, w: &Watcher, r: &Ring, size: usize) -> Vec<usize> {
        let mut sizes = Vec::new();
        loop {
            let before = it.buffer.len();
            match it.refill(w, r, size) {
                Refill::More => sizes.push(it.buffer.len() - before),
                Refill::Exhausted => return sizes,
                Refill::Invalidated(m) => panic!("invalidated: {m}"),
            }
        }
    }

    #[test]
    fn fills_size_ring_entries_at_a_time_filtered_for_the_watcher() {
        let mut r = ring(100);
        fill(&mut r, 1, 10);
        let w = watcher("/a/");
        let mut it = Initial::from_ring(r.start_index(), r.end_index());
        let sizes = fill_sizes(&mut it, &w, &r, 4);
        // Ring entries 0..4, 4..8, 8..10: two, two and one of them under /a/.
        assert_eq!(sizes, [2, 2, 1]);
        let rvs: Vec<u64> = it.buffer.iter().map(WatchEvent::rv).collect();
        assert_eq!(rvs, [1, 3, 5, 7, 9]);
        assert!(it.is_source_exhausted());
    }

    #[test]
    fn a_fill_ends_with_a_whole_revision() {
        // Three revisions of three events each (a transaction each: etcd, not Kubernetes).
        let mut r = ring(100);
        for rv in 1..=3u64 {
            for k in 0..3 {
                let key = format!("/a/{rv}-{k}");
                let ev = Event::put(
                    Arc::new(Object::new(key.as_bytes(), Some(b"v"), rv)),
                    None,
                    Timestamp::from_millis(rv),
                );
                r.push(Arc::new(ev), Timestamp::from_millis(rv));
            }
        }
        let w = watcher("/a/");
        let mut it = Initial::from_ring(r.start_index(), r.end_index());
        let fills = fill_sizes(&mut it, &w, &r, 4);
        // Four entries reach into revision 2: the fill takes the rest of it. Were the ring to
        // evict revision 2's last events before the next fill, the replay would have sent part
        // of a revision before it is invalidated (robustness seed 10: two events lost).
        assert_eq!(fills, [6, 3]);
    }

    #[test]
    fn an_empty_interval_is_exhausted_at_once() {
        let r = ring(10);
        let mut it = Initial::from_ring(r.start_index(), r.end_index());
        assert!(matches!(it.refill(&watcher("/a/"), &r, 4), Refill::Exhausted));
        assert!(it.buffer.is_empty());
    }

    #[test]
    fn an_interval_the_ring_evicted_is_invalidated_not_skipped() {
        let mut r = ring(4);
        fill(&mut r, 1, 4);
        let w = watcher("/a/");
        let mut it = Initial::from_ring(r.start_index(), r.end_index());
        assert!(matches!(it.refill(&w, &r, 2), Refill::More));
        // Two more events evict ring entries 0 and 1; the interval's next index (2) is still
        // in the ring, so the replay goes on.
        fill(&mut r, 5, 2);
        assert!(matches!(it.refill(&w, &r, 2), Refill::More));
        // An interval that has not started yet, then four events evict its first entries.
        let mut late = Initial::from_ring(r.start_index(), r.end_index());
        fill(&mut r, 7, 4);
        match late.refill(&w, &r, 2) {
            Refill::Invalidated(m) => {
                assert!(m.starts_with("cache interval invalidated, interval startIndex:"), "{m}")
            }
            _ => panic!("an evicted interval must be invalidated"),
        }
    }
}
