//! Storage events as the cache records them.
//!
//! Kubernetes counterpart: `watchCacheEvent` in `watch_cache.go`. One event per storage change,
//! shared by `Arc` between the ring buffer and every watcher that receives it.

use alloc::sync::Arc;

use crate::object::Object;
use crate::time::Timestamp;

/// One change from storage: a put (create or update) or a delete.
#[derive(Clone, Debug)]
pub struct Event {
    rv: u64,
    object: Option<Arc<Object>>,
    prev: Option<Arc<Object>>,
    record_time: Timestamp,
}

impl Event {
    /// A create or update of `object` (at its RV), replacing `prev`, recorded at `now`.
    pub fn put(object: Arc<Object>, prev: Option<Arc<Object>>, now: Timestamp) -> Event {
        Event { rv: object.rv(), object: Some(object), prev, record_time: now }
    }

    /// A delete at `rv` of the stored `prev`, recorded at `now`.
    pub fn delete(rv: u64, prev: Arc<Object>, now: Timestamp) -> Event {
        Event { rv, object: None, prev: Some(prev), record_time: now }
    }

    /// The revision of the change.
    #[inline]
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The object after the change; `None` for a delete.
    #[inline]
    pub fn object(&self) -> Option<&Arc<Object>> {
        self.object.as_ref()
    }

    /// The object before the change; `None` for a create.
    #[inline]
    pub fn prev(&self) -> Option<&Arc<Object>> {
        self.prev.as_ref()
    }

    /// True for a delete.
    pub fn is_delete(&self) -> bool {
        self.object.is_none()
    }

    /// The key that changed.
    #[inline]
    pub fn key(&self) -> &[u8] {
        match (&self.object, &self.prev) {
            (Some(o), _) | (None, Some(o)) => o.key(),
            // Invariant: a delete always carries the deleted object.
            (None, None) => &[],
        }
    }

    /// The object whose attributes place the event (scope and trigger): the new object, or the
    /// deleted one.
    #[inline]
    pub(crate) fn placing_object(&self) -> Option<&Arc<Object>> {
        self.object.as_ref().or(self.prev.as_ref())
    }

    /// When the cache processed the event (used only to decide resizing).
    pub fn record_time(&self) -> Timestamp {
        self.record_time
    }
}
