//! What the core asks of its host: deliveries to watchers, read results, decisions to go to
//! storage, and requests to storage.
//!
//! Kubernetes counterparts: what `cacheWatcher.ResultChan()` yields (`cache_watcher.go`), the
//! return values of `Cacher.Watch/Get/GetList` (`cacher.go`), and the calls the cacher makes on
//! storage (`RequestWatchProgress` from `watch_progress.go`, `GetCurrentResourceVersion`, the
//! reflector's relist).

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::event::Event;
use crate::object::Object;
use crate::status::Status;

/// A client request (watch, list or get), numbered by the core from a counter, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl core::fmt::Display for RequestId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How a watcher sees a storage event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// The object is new to this watcher (created, or now matches its selector).
    Added,
    /// The object changed and still matches.
    Modified,
    /// The object is gone for this watcher (deleted, or no longer matches its selector).
    Deleted,
}

impl ChangeKind {
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One item of a watch stream.
#[derive(Clone, Debug)]
pub enum WatchEvent {
    /// An object of the initial state, sent as ADDED with its own resourceVersion.
    Initial(Arc<Object>),
    /// A storage event as this watcher sees it.
    Change(ChangeKind, Arc<Event>),
    /// A bookmark: every event up to `rv` has been sent.
    Bookmark {
        /// The bookmark's resourceVersion.
        rv: u64,
        /// Carries the `k8s.io/initial-events-end: "true"` annotation.
        initial_events_end: bool,
    },
}

impl WatchEvent {
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`.
    pub fn type_str(&self) -> &'static str {
        match self {
            WatchEvent::Initial(_) => "ADDED",
            WatchEvent::Change(k, _) => k.as_str(),
            WatchEvent::Bookmark { .. } => "BOOKMARK",
        }
    }

    /// The resourceVersion the client sees on the object: its own for ADDED/MODIFIED, the
    /// deletion's for DELETED, the bookmark's for BOOKMARK.
    pub fn rv(&self) -> u64 {
        match self {
            WatchEvent::Initial(o) => o.rv(),
            WatchEvent::Change(ChangeKind::Deleted, e) => e.rv(),
            WatchEvent::Change(_, e) => e.object().map_or(e.rv(), |o| o.rv()),
            WatchEvent::Bookmark { rv, .. } => *rv,
        }
    }

    /// The object the client sees: for DELETED the last stored state (shown at the deletion's
    /// resourceVersion by [`WatchEvent::rv`]); none for bookmarks.
    pub fn object(&self) -> Option<&Arc<Object>> {
        match self {
            WatchEvent::Initial(o) => Some(o),
            WatchEvent::Change(ChangeKind::Deleted, e) => e.prev(),
            WatchEvent::Change(_, e) => e.object(),
            WatchEvent::Bookmark { .. } => None,
        }
    }

    /// The underlying storage event, if any.
    pub fn event(&self) -> Option<&Arc<Event>> {
        match self {
            WatchEvent::Change(_, e) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn storage_rv(&self) -> Option<u64> {
        match self {
            WatchEvent::Change(_, e) => Some(e.rv()),
            _ => None,
        }
    }
}

/// Where a new watch's initial events come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InitialSource {
    /// The current state, as ADDED events (RV 0, or sendInitialEvents=true).
    Store,
    /// The ring buffer: the buffered events after its RV.
    Ring,
    /// None: it starts at or after the cache's RV.
    Nothing,
}

impl InitialSource {
    /// `store`, `ring` or `none`.
    pub const fn as_str(self) -> &'static str {
        match self {
            InitialSource::Store => "store",
            InitialSource::Ring => "ring",
            InitialSource::Nothing => "none",
        }
    }
}

/// Why a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseCause {
    /// It did not read fast enough (Kubernetes' "Forcing watcher close due to
    /// unresponsiveness").
    Unresponsive,
    /// The client stopped it, or the cacher was stopped.
    Stopped,
    /// The cache is relisting (`terminateAllWatchers`), or was relisted while the watch was
    /// being set up.
    Reinitializing,
    /// Its `timeout` passed.
    Timeout,
    /// An error ended it (after an ERROR item, or an invalidated replay).
    Error,
}

impl CloseCause {
    /// Lower-case name, as the trace spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            CloseCause::Unresponsive => "unresponsive",
            CloseCause::Stopped => "stopped",
            CloseCause::Reinitializing => "reinitializing",
            CloseCause::Timeout => "timeout",
            CloseCause::Error => "error",
        }
    }
}

/// A list or get served from the cache.
#[derive(Clone, Debug)]
pub struct CachedRead {
    /// The resourceVersion of the result.
    pub rv: u64,
    /// The objects, in key order.
    pub items: Vec<Arc<Object>>,
    /// The continue token for the next page.
    pub continue_token: Option<String>,
    /// `remainingItemCount`, when known.
    pub remaining: Option<u64>,
    /// Why the cache could serve it.
    pub reason: &'static str,
}

/// Where a read is answered.
#[derive(Clone, Debug)]
pub enum ReadOutcome {
    /// From the cache.
    Cache(CachedRead),
    /// The host must ask storage (etcd); the cache cannot or should not answer.
    Storage {
        /// Why.
        reason: &'static str,
    },
}

/// An etcd `Range` served from the cache.
#[derive(Clone, Debug)]
pub struct RangeRead {
    /// The cache's revision (etcd's `header.revision`).
    pub header_rv: u64,
    /// The objects, in key order (at most the limit).
    pub items: Vec<Arc<Object>>,
    /// Keys in the range (etcd's `count`).
    pub count: u64,
    /// More keys than `items` (etcd's `more`).
    pub more: bool,
    /// Why the cache could serve it.
    pub reason: &'static str,
}

/// Where an etcd `Range` is answered.
#[derive(Clone, Debug)]
pub enum RangeOutcome {
    /// From the cache.
    Cache(RangeRead),
    /// The host must ask etcd.
    Storage {
        /// Why.
        reason: &'static str,
    },
}

/// One element of a fan-out: a watcher and how it sees the event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The watcher.
    pub watch: RequestId,
    /// How it sees the event.
    pub kind: ChangeKind,
}

/// Everything the core asks of its host, in order. Drain with [`crate::Cacher::poll_output`]
/// after every call that changes the core.
#[derive(Clone, Debug)]
pub enum Output {
    /// One storage event for many watchers at once (shared, never copied per watcher).
    Fanout {
        /// The event.
        event: Arc<Event>,
        /// The watchers and how each sees it, in dispatch order.
        targets: Box<[Target]>,
    },
    /// A watch is registered: change events with RV above `rv` follow (after any initial
    /// events). Host information (e.g. the header of etcd's `created` response); not part of a
    /// scenario trace.
    WatchStarted {
        /// The watch.
        watch: RequestId,
        /// Changes after this RV are delivered.
        rv: u64,
        /// Where its initial events come from.
        initial: InitialSource,
    },
    /// Events for one watcher (initial events, or what it read from its queue).
    Deliver {
        /// The watch.
        watch: RequestId,
        /// The events, in order.
        events: Vec<WatchEvent>,
    },
    /// An ERROR item on an open watch; a [`Output::WatchClosed`] follows.
    WatchError {
        /// The watch.
        watch: RequestId,
        /// The error.
        status: Status,
    },
    /// The watch ended; nothing more comes for it.
    WatchClosed {
        /// The watch.
        watch: RequestId,
        /// Why.
        cause: CloseCause,
        /// The last resourceVersion delivered to the client (where it would resume).
        last_rv: u64,
        /// Detail, where there is more to say.
        message: Option<String>,
    },
    /// The host must serve this watch from storage (the cache does not).
    WatchDelegated {
        /// The watch.
        watch: RequestId,
        /// Why.
        reason: &'static str,
    },
    /// A list's outcome.
    List {
        /// The list.
        request: RequestId,
        /// Where it is answered.
        outcome: ReadOutcome,
    },
    /// A get's outcome.
    Get {
        /// The get.
        request: RequestId,
        /// Where it is answered.
        outcome: ReadOutcome,
    },
    /// An etcd range's outcome.
    Range {
        /// The request.
        request: RequestId,
        /// Where it is answered.
        outcome: RangeOutcome,
    },
    /// A request that failed without starting (or a list or get that failed).
    Rejected {
        /// The request.
        request: RequestId,
        /// Why.
        status: Status,
    },
    /// Ask storage for a watch progress notification (etcd `RequestWatchProgress`); the answer
    /// comes back as [`crate::Cacher::handle_progress`].
    RequestProgress,
    /// Ask storage for its current revision (a quorum read); answer with
    /// [`crate::Cacher::handle_current_revision`].
    NeedCurrentRevision {
        /// The request waiting for it.
        request: RequestId,
    },
    /// The cache must relist: list, then [`crate::Cacher::handle_replace`].
    Relist {
        /// Why.
        reason: String,
    },
}
