//! The ring buffer of recent events and its window.
//!
//! Kubernetes counterpart: the cyclic buffer of `watch_cache.go` (`cache`, `startIndex`,
//! `endIndex`, `removedEventSinceRelist`, `updateCache`, `resizeCacheLocked`,
//! `doCacheResizeLocked`, `getAllEventsSinceLocked`'s binary search). Indices only ever grow, so
//! a reader holding an index can tell that the events it wanted were evicted or reset
//! (`watch_cache_interval.go`'s validator).
//!
//! It owns no objects: events are shared with the watchers that received them.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::event::Event;
use crate::time::Timestamp;

/// How the ring sizes itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// The initial capacity.
    pub capacity: usize,
    /// Never shrink below this.
    pub lower_bound: usize,
    /// Never grow above this.
    pub upper_bound: usize,
    /// Grow and shrink at all (Kubernetes: always).
    pub dynamic: bool,
    /// The fresh-event window (`eventFreshDuration`, 75 s).
    pub event_fresh_ms: u64,
    /// Most bytes of events the ring holds (not Kubernetes: `Config::max_cache_bytes`).
    pub max_bytes: Option<u64>,
}

/// What a push did besides storing the event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PushEffects {
    /// The capacity changed from the first to the second value.
    pub resized: Option<(usize, usize)>,
    /// Events dropped from the front (by a shrink or by the push itself).
    pub evicted: u64,
    /// Of those, dropped because the ring held more than its bytes allow.
    pub evicted_for_bytes: u64,
}

pub(crate) struct Ring {
    slots: Vec<Option<Arc<Event>>>,
    start: u64,
    end: u64,
    removed_since_relist: bool,
    last_evicted_rv: Option<u64>,
    /// The events' bytes, as [`event_bytes`] counts them.
    bytes: u64,
    cfg: RingConfig,
}

/// What an event costs the cache, roughly: its key, the new value and the one it replaced (the
/// ring holds both; the store's snapshots share them), and a fixed overhead.
pub(crate) fn event_bytes(e: &Event) -> u64 {
    let value =
        |o: Option<&Arc<crate::object::Object>>| o.and_then(|o| o.value()).map_or(0, <[u8]>::len);
    (e.key().len() + value(e.object()) + value(e.prev()) + 160) as u64
}

impl Ring {
    pub(crate) fn new(cfg: RingConfig) -> Ring {
        let cap = cfg.capacity.max(1);
        Ring {
            slots: alloc::vec![None; cap],
            start: 0,
            end: 0,
            removed_since_relist: false,
            last_evicted_rv: None,
            bytes: 0,
            cfg,
        }
    }

    /// The bytes of the events held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Drops the oldest event.
    fn evict_front(&mut self) {
        let slot = self.slot(self.start);
        let evicted = self.slots[slot].take();
        self.bytes = self.bytes.saturating_sub(evicted.as_deref().map_or(0, event_bytes));
        self.last_evicted_rv = evicted.map(|e| e.rv());
        self.start += 1;
        self.removed_since_relist = true;
    }

    /// Appends an event (`updateCache`): resize if full, evict the oldest if still full, store.
    pub(crate) fn push(&mut self, event: Arc<Event>, now: Timestamp) -> PushEffects {
        let mut effects = PushEffects::default();
        if self.cfg.dynamic {
            if let Some((old, new, dropped)) = self.resize_if_needed(now) {
                effects.resized = Some((old, new));
                effects.evicted += dropped;
            }
        }
        if self.is_full() {
            self.evict_front();
            effects.evicted += 1;
        }
        self.bytes += event_bytes(&event);
        let slot = self.slot(self.end);
        self.slots[slot] = Some(event);
        self.end += 1;
        // Beyond its bytes, the window shrinks from the front (the newest event always stays).
        if let Some(max) = self.cfg.max_bytes {
            while self.bytes > max && self.len() > 1 {
                self.evict_front();
                effects.evicted += 1;
                effects.evicted_for_bytes += 1;
            }
        }
        effects
    }

    /// A relist (`Replace`): the buffer empties, indices move on, the eviction flag resets.
    pub(crate) fn reset(&mut self) {
        for i in self.start..self.end {
            let slot = self.slot(i);
            self.slots[slot] = None;
        }
        self.start = self.end;
        self.removed_since_relist = false;
        self.last_evicted_rv = None;
        self.bytes = 0;
    }

    /// RV of the last event dropped from the front (to tell a partly evicted revision).
    pub(crate) fn last_evicted_rv(&self) -> Option<u64> {
        self.last_evicted_rv
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    pub(crate) fn start_index(&self) -> u64 {
        self.start
    }

    pub(crate) fn end_index(&self) -> u64 {
        self.end
    }

    pub(crate) fn removed_since_relist(&self) -> bool {
        self.removed_since_relist
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() == self.capacity()
    }

    /// The event at a ring index, if it is still in the window.
    #[inline]
    pub(crate) fn get(&self, index: u64) -> Option<&Arc<Event>> {
        if index < self.start || index >= self.end {
            return None;
        }
        self.slots[self.slot(index)].as_ref()
    }

    pub(crate) fn oldest(&self) -> Option<&Arc<Event>> {
        self.get(self.start)
    }

    pub(crate) fn newest(&self) -> Option<&Arc<Event>> {
        self.end.checked_sub(1).and_then(|i| self.get(i))
    }

    /// The index of the first event with RV strictly greater than `rv` (`end` if none).
    pub(crate) fn first_index_after(&self, rv: u64) -> u64 {
        let (mut lo, mut hi) = (self.start, self.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid) {
                Some(e) if e.rv() <= rv => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// The events of the window, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Event>> + '_ {
        (self.start..self.end).filter_map(move |i| self.get(i))
    }

    #[inline]
    fn slot(&self, index: u64) -> usize {
        (index % self.slots.len() as u64) as usize
    }

    /// `resizeCacheLocked`: grow while the oldest event is fresh, shrink when the newest quarter
    /// is stale. Returns (old, new, events dropped by a shrink).
    fn resize_if_needed(&mut self, now: Timestamp) -> Option<(usize, usize, u64)> {
        if !self.is_full() {
            return None;
        }
        let cap = self.capacity();
        let oldest = self.oldest()?.record_time();
        if now.ms_since(oldest) < self.cfg.event_fresh_ms {
            let new_cap = cap.saturating_mul(2).min(self.cfg.upper_bound);
            if new_cap > cap {
                let dropped = self.resize(new_cap);
                return Some((cap, new_cap, dropped));
            }
            return None;
        }
        // The oldest event of the newest quarter; with cap < 4 this is, as in Kubernetes, the
        // slot of `end`, which holds the oldest event of a full buffer.
        let probe = self.slots[self.slot(self.end - (cap / 4) as u64)].as_ref()?.record_time();
        if now.ms_since(probe) > self.cfg.event_fresh_ms {
            let new_cap = (cap / 2).max(self.cfg.lower_bound);
            if new_cap < cap {
                let dropped = self.resize(new_cap);
                return Some((cap, new_cap, dropped));
            }
        }
        None
    }

    fn resize(&mut self, new_cap: usize) -> u64 {
        let new_cap = new_cap.max(1);
        let mut dropped = 0;
        if new_cap < self.len() {
            let new_start = self.end - new_cap as u64;
            dropped = new_start - self.start;
            self.last_evicted_rv = self.get(new_start - 1).map(|e| e.rv());
            let gone: u64 =
                (self.start..new_start).filter_map(|i| self.get(i)).map(|e| event_bytes(e)).sum();
            self.bytes = self.bytes.saturating_sub(gone);
            self.start = new_start;
        }
        let mut slots: Vec<Option<Arc<Event>>> = alloc::vec![None; new_cap];
        for i in self.start..self.end {
            let old = self.slot(i);
            slots[(i % new_cap as u64) as usize] = self.slots[old].take();
        }
        self.slots = slots;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Object;

    fn ev(rv: u64, at_ms: u64) -> Arc<Event> {
        Arc::new(Event::put(
            Arc::new(Object::new(b"/k", Some(b"v"), rv)),
            None,
            Timestamp::from_millis(at_ms),
        ))
    }

    fn ring(capacity: usize, lower: usize, upper: usize) -> Ring {
        Ring::new(RingConfig {
            capacity,
            lower_bound: lower,
            upper_bound: upper,
            dynamic: true,
            event_fresh_ms: 75_000,
            max_bytes: None,
        })
    }

    #[test]
    fn beyond_its_bytes_the_window_shrinks_from_the_front() {
        let one = event_bytes(&ev(1, 0));
        let mut r = Ring::new(RingConfig {
            capacity: 100,
            lower_bound: 100,
            upper_bound: 100,
            dynamic: false,
            event_fresh_ms: 75_000,
            max_bytes: Some(one * 3),
        });
        let mut evicted = 0;
        for rv in 1..=5 {
            evicted += r.push(ev(rv, rv), Timestamp::from_millis(rv)).evicted_for_bytes;
        }
        assert_eq!((r.len(), evicted, r.bytes()), (3, 2, one * 3));
        assert_eq!(r.oldest().map(|e| e.rv()), Some(3));
        assert!(r.removed_since_relist());
        r.reset();
        assert_eq!(r.bytes(), 0);
    }

    const EFD: u64 = 75_000;

    /// TestDynamicCache (watch_cache_test.go): fill `cap` events spaced `interval` apart, then
    /// one more push triggers the resize decision.
    fn dynamic_case(
        cap: usize,
        lower: usize,
        upper: usize,
        interval: u64,
        start: u64,
    ) -> (usize, u64) {
        let mut r = ring(cap, lower, upper);
        r.start = start;
        r.end = start;
        for i in 0..cap as u64 {
            r.push(ev(i + 1, i * interval), Timestamp::from_millis(i * interval));
        }
        assert!(r.is_full());
        let now = Timestamp::from_millis(cap as u64 * interval);
        r.resize_if_needed(now);
        (r.capacity(), r.start_index() - start)
    }

    #[test]
    fn dynamic_cache_table() {
        // (capacity, lower, upper, interval between events, want capacity, want start offset)
        let cases: &[(usize, usize, usize, u64, usize, u64)] = &[
            (5, 1, 10, EFD / 6, 10, 0),
            (5, 1, 10, EFD / 4, 5, 0),
            (5, 1, 10, EFD / 4 + 1, 5, 0),
            (5, 1, 8, EFD / 6, 8, 0),
            (5, 2, 10, EFD + 1000, 2, 3),
            (5, 3, 10, EFD + 1000, 3, 2),
            (8, 1, 16, EFD / 9, 16, 0),
            (8, 1, 16, EFD / 8 + 1, 8, 0),
            (8, 1, 16, EFD / 2 + 1000, 4, 4),
            (8, 7, 16, EFD / 2 + 1000, 7, 1),
        ];
        for &(cap, lower, upper, interval, want_cap, want_start) in cases {
            for start in [0, 3] {
                let got = dynamic_case(cap, lower, upper, interval, start);
                assert_eq!(
                    got,
                    (want_cap, want_start),
                    "cap {cap} lower {lower} interval {interval}"
                );
            }
        }
    }

    #[test]
    fn element_positions_survive_resize() {
        let mut r = ring(4, 1, 64);
        for i in 1..=20 {
            r.push(ev(i, 0), Timestamp::ZERO);
        }
        assert_eq!(r.capacity(), 32);
        let rvs: Vec<u64> = r.iter().map(|e| e.rv()).collect();
        assert_eq!(rvs, (1..=20).collect::<Vec<_>>());
        for i in r.start_index()..r.end_index() {
            assert_eq!(r.get(i).unwrap().rv(), i + 1);
        }
    }

    #[test]
    fn eviction_sets_flag_and_reset_clears_it() {
        let mut r = Ring::new(RingConfig {
            capacity: 3,
            lower_bound: 3,
            upper_bound: 3,
            dynamic: false,
            event_fresh_ms: EFD,
            max_bytes: None,
        });
        for i in 1..=3 {
            r.push(ev(i, 0), Timestamp::ZERO);
        }
        assert!(!r.removed_since_relist());
        let eff = r.push(ev(4, 0), Timestamp::ZERO);
        assert_eq!(eff.evicted, 1);
        assert!(r.removed_since_relist());
        assert_eq!(r.oldest().unwrap().rv(), 2);
        let end = r.end_index();
        r.reset();
        assert_eq!((r.start_index(), r.end_index(), r.len()), (end, end, 0));
        assert!(!r.removed_since_relist());
    }

    #[test]
    fn binary_search_from_rv() {
        let mut r = ring(10, 10, 10);
        for rv in [3, 5, 5, 9] {
            r.push(ev(rv, 0), Timestamp::ZERO);
        }
        assert_eq!(r.first_index_after(0), 0);
        assert_eq!(r.first_index_after(3), 1);
        assert_eq!(r.first_index_after(4), 1);
        assert_eq!(r.first_index_after(5), 3);
        assert_eq!(r.first_index_after(9), 4);
    }

    #[test]
    fn growth_keeps_eviction_flag() {
        // TestCacheIncreaseDoesNotBreakWatch: an eviction followed by growth must not reset the flag.
        let mut r = Ring::new(RingConfig {
            capacity: 2,
            lower_bound: 1,
            upper_bound: 8,
            dynamic: true,
            event_fresh_ms: EFD,
            max_bytes: None,
        });
        r.push(ev(1, 0), Timestamp::ZERO);
        r.push(ev(2, 1), Timestamp::from_millis(1));
        // Stale: shrink is impossible below... force an eviction with a stale oldest event.
        r.push(ev(3, 200_000), Timestamp::from_millis(200_000));
        assert!(r.removed_since_relist());
        for i in 4..10 {
            r.push(ev(i, 200_000), Timestamp::from_millis(200_000));
        }
        assert!(r.capacity() > 2);
        assert!(r.removed_since_relist());
    }
}
