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
                let stop = (*end).min(next.saturating_add(size as u64));
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
