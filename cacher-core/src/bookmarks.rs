//! Bookmark scheduling: watchers grouped in 1-second time buckets.
//!
//! Kubernetes counterpart: `watcherBookmarkTimeBuckets` in `cacher.go` (`addWatcherThreadUnsafe`,
//! `popExpiredWatchersThreadUnsafe`) and `cacheWatcher.nextBookmarkTime` in `cache_watcher.go`.
//! A bucket id is whole seconds since the cacher was created; a watcher waiting for its
//! initial-events-end bookmark goes in the current bucket, so it is retried on every tick.
//! Stopped watchers are not removed eagerly; the dispatcher skips them when they pop.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::time::Timestamp;

/// Identifies a watcher inside the core.
pub(crate) type Slot = u32;

#[derive(Clone, Debug)]
pub(crate) struct TimeBuckets {
    create_time: Timestamp,
    bucket_ms: u64,
    start_bucket: i64,
    buckets: BTreeMap<i64, Vec<(Slot, u64)>>,
}

impl TimeBuckets {
    pub(crate) fn new(create_time: Timestamp) -> TimeBuckets {
        TimeBuckets { create_time, bucket_ms: 1000, start_bucket: 0, buckets: BTreeMap::new() }
    }

    /// Adds a watcher due at `next` (`None` = "immediately", the zero time in Kubernetes).
    /// `generation` tells a popped entry from a stale one for a reused slot.
    pub(crate) fn add(&mut self, slot: Slot, generation: u64, next: Option<Timestamp>) {
        let id = match next {
            None => i64::MIN,
            Some(t) => {
                let delta = t.as_millis() as i128 - self.create_time.as_millis() as i128;
                (delta.div_euclid(self.bucket_ms as i128)).clamp(i64::MIN as i128, i64::MAX as i128)
                    as i64
            }
        };
        let id = id.max(self.start_bucket);
        self.buckets.entry(id).or_default().push((slot, generation));
    }

    /// Every watcher of every bucket up to the current second, in bucket order.
    pub(crate) fn pop_expired(&mut self, now: Timestamp) -> Vec<(Slot, u64)> {
        let current = (now.ms_since(self.create_time) / self.bucket_ms) as i64;
        let mut out = Vec::new();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() > current {
                break;
            }
            out.extend(entry.remove());
        }
        if current >= self.start_bucket {
            self.start_bucket = current + 1;
        }
        out
    }

    /// Watchers held, stale entries included.
    pub(crate) fn len(&self) -> usize {
        self.buckets.values().map(Vec::len).sum()
    }

    #[cfg(test)]
    pub(crate) fn bucket_count(&self) -> usize {
        self.buckets.len()
    }
}

/// `nextBookmarkTime`: when a watcher should get its next bookmark, or `Some(None)` for
/// "immediately", or `None` for "not any more".
pub(crate) fn next_bookmark_time(
    now: Timestamp,
    frequency_ms: u64,
    deadline: Option<Timestamp>,
    waiting_for_end_bookmark: bool,
) -> Option<Option<Timestamp>> {
    if waiting_for_end_bookmark {
        return Some(None);
    }
    let mut t = now.add_ms(frequency_ms);
    if let Some(d) = deadline {
        // Two seconds before the deadline, so the client gets a bookmark before it times out.
        let before = Timestamp::from_millis(d.as_millis().saturating_sub(2000));
        if before < t {
            t = before;
        }
        if d.as_millis() < 2000 || t < now {
            return None;
        }
    }
    Some(Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bucket_watchers_basic() {
        // TestTimeBucketWatchersBasic: deadlines +10 s, +20 s, +20 s (bookmark 2 s before each).
        let t0 = Timestamp::from_millis(100_000);
        let mut b = TimeBuckets::new(t0);
        for (slot, secs) in [(1, 10), (2, 20), (3, 20)] {
            let next = next_bookmark_time(t0, 60_000, Some(t0.add_ms(secs * 1000)), false).unwrap();
            b.add(slot, 0, next);
        }
        assert_eq!(b.bucket_count(), 2);
        assert!(b.pop_expired(t0).is_empty());
        assert_eq!(b.pop_expired(t0.add_ms(10_000)), [(1, 0)]);
        assert_eq!(b.pop_expired(t0.add_ms(22_000)), [(2, 0), (3, 0)]);
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn waiting_watchers_pop_every_tick() {
        // TestBookmarkAfterResourceVersionWatchers.
        let t0 = Timestamp::from_millis(5_000);
        let mut b = TimeBuckets::new(t0);
        for secs in [0, 1, 30] {
            let now = t0.add_ms(secs * 1000);
            b.add(7, 0, next_bookmark_time(now, 60_000, None, true).unwrap());
            assert_eq!(b.pop_expired(now), [(7, 0)], "at {secs}s");
        }
        let now = t0.add_ms(30_000);
        b.add(7, 0, next_bookmark_time(now, 60_000, None, false).unwrap());
        assert!(b.pop_expired(now.add_ms(30_000)).is_empty());
        assert_eq!(b.pop_expired(now.add_ms(60_000)), [(7, 0)]);
    }

    #[test]
    fn no_bookmark_past_deadline() {
        let now = Timestamp::from_millis(10_000);
        assert_eq!(next_bookmark_time(now, 60_000, Some(now.add_ms(1_000)), false), None);
        assert_eq!(
            next_bookmark_time(now, 60_000, Some(now.add_ms(5_000)), false),
            Some(Some(now.add_ms(3_000)))
        );
    }
}
