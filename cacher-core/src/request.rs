//! Client requests, parsed at the edge into types.
//!
//! Kubernetes counterparts: `storage.ListOptions` / `SelectionPredicate` as the cacher receives
//! them, with the list-option validation of `apimachinery/pkg/apis/meta/internalversion/
//! validation` that apiserver applies before storage.

use alloc::string::String;

use crate::key::{Key, KeyRange};
use crate::rv::RvParam;
use crate::selector::Selector;
use crate::status::Status;

/// How a watcher's client reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumeMode {
    /// The client reads everything at once: events are delivered as they are dispatched.
    Auto,
    /// The client reads only when told ([`crate::Cacher::consume`], or credit granted by
    /// [`crate::Cacher::grant_credit`]); until then events wait in the watcher's queue.
    Manual,
}

/// What happens to a watcher whose queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlowPolicy {
    /// Kubernetes: dispatch waits for it within the time budget, then closes it
    /// ("unresponsive").
    Terminate,
    /// etcd: it falls behind and is replayed from the ring buffer when it reads again; if it
    /// falls out of the window it gets 410.
    Lag,
}

/// A watch.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchRequest {
    /// The keys to watch.
    pub range: KeyRange,
    /// `resourceVersion`.
    pub rv: RvParam,
    /// `sendInitialEvents` (honoured only with the `WatchList` gate).
    pub send_initial_events: Option<bool>,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// Label and field selectors.
    pub selector: Selector,
    /// `timeoutSeconds`, in milliseconds: the watch ends then.
    pub timeout_ms: Option<u64>,
    /// How the client reads.
    pub consume: ConsumeMode,
    /// What happens when it reads too slowly.
    pub slow_policy: SlowPolicy,
    /// Queue capacity override; `None` = the Kubernetes channel sizing rule.
    pub queue_capacity: Option<usize>,
}

impl WatchRequest {
    /// A watch of `range` from `rv` with Kubernetes' defaults for everything else.
    pub fn new(range: KeyRange, rv: RvParam) -> WatchRequest {
        WatchRequest {
            range,
            rv,
            send_initial_events: None,
            allow_bookmarks: false,
            selector: Selector::default(),
            timeout_ms: None,
            consume: ConsumeMode::Auto,
            slow_policy: SlowPolicy::Terminate,
            queue_capacity: None,
        }
    }
}

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RvMatch {
    /// At least the given RV.
    NotOlderThan,
    /// Exactly the given RV.
    Exact,
}

impl RvMatch {
    /// Parses `NotOlderThan` or `Exact` (`""` is `None`).
    pub fn parse(s: &str) -> Result<Option<RvMatch>, Status> {
        match s {
            "" => Ok(None),
            "NotOlderThan" => Ok(Some(RvMatch::NotOlderThan)),
            "Exact" => Ok(Some(RvMatch::Exact)),
            other => Err(Status::bad_request(alloc::format!(
                "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
            ))),
        }
    }
}

/// A list.
#[derive(Clone, Debug, PartialEq)]
pub struct ListRequest {
    /// The keys to list (`Exact` for a non-recursive list).
    pub range: KeyRange,
    /// `resourceVersion`.
    pub rv: RvParam,
    /// `resourceVersionMatch`.
    pub rv_match: Option<RvMatch>,
    /// `limit` (0 = no limit).
    pub limit: u64,
    /// `continue`.
    pub continue_token: Option<String>,
    /// Label and field selectors.
    pub selector: Selector,
}

impl ListRequest {
    /// A list of `range` at `rv` with nothing else set.
    pub fn new(range: KeyRange, rv: RvParam) -> ListRequest {
        ListRequest {
            range,
            rv,
            rv_match: None,
            limit: 0,
            continue_token: None,
            selector: Selector::default(),
        }
    }

    /// The option checks apiserver makes before storage sees a list.
    pub(crate) fn validate(&self) -> Result<(), Status> {
        if let Some(m) = self.rv_match {
            if self.rv.is_unset() {
                return Err(Status::bad_request(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if self.continue_token.is_some() {
                return Err(Status::bad_request(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if m == RvMatch::Exact && self.rv == RvParam::Zero {
                return Err(Status::bad_request(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        // etcd3's store: a continue token carries its own RV; "0" is tolerated.
        if self.continue_token.is_some() && matches!(self.rv, RvParam::At(_)) {
            return Err(Status::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        if self.continue_token.as_deref() == Some("") {
            return Err(Status::bad_request("continue key is not valid: empty"));
        }
        Ok(())
    }
}

/// A get of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetRequest {
    /// The key.
    pub key: Key,
    /// `resourceVersion`.
    pub rv: RvParam,
}

/// An etcd `Range` over the cache (see [`crate::Cacher::range`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRequest {
    /// The keys.
    pub range: KeyRange,
    /// The revision to read at (0 = the latest).
    pub revision: u64,
    /// Read the latest state as of now (etcd's default), not whatever the cache has.
    pub linearizable: bool,
    /// At most this many objects (0 = all).
    pub limit: u64,
}
