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

impl SlowPolicy {
    /// `terminate` or `lag`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SlowPolicy::Terminate => "terminate",
            SlowPolicy::Lag => "lag",
        }
    }
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

impl WatchRequest {
    /// What the API server's request layer does to a watch before the cacher sees it
    /// (`endpoints/handlers/get.go` `ListResource`, which the cacher never does itself):
    /// `SetListOptionsDefaults` — with the `WatchList` gate on, a watch from resourceVersion
    /// `""` or `"0"` without `sendInitialEvents` becomes one with `sendInitialEvents=true`
    /// (apimachinery `internalversion/defaults.go`) — then `ValidateListOptions` for watches:
    /// `sendInitialEvents` without the gate is a 422. (Clients send `sendInitialEvents` with
    /// `resourceVersionMatch=NotOlderThan`, which the validation requires; the request types
    /// have no match for watches, so that is taken as given.)
    ///
    /// The scenario replayer applies it to every `watch` step, since scenario steps are client
    /// requests at the API server; [`crate::Cacher::start_watch`] is the cacher alone.
    pub fn through_request_layer(mut self, watch_list: bool) -> Result<WatchRequest, Status> {
        if watch_list
            && self.send_initial_events.is_none()
            && matches!(self.rv, RvParam::Unset | RvParam::Zero)
        {
            self.send_initial_events = Some(true);
        }
        if self.send_initial_events.is_some() && !watch_list {
            return Err(Status::invalid_list_options(&[
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            ]));
        }
        Ok(self)
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
    /// Parses `NotOlderThan` or `Exact` (`""` is `None`); anything else is the 422 that
    /// `ValidateListOptions` gives it.
    pub fn parse(s: &str) -> Result<Option<RvMatch>, Status> {
        match s {
            "" => Ok(None),
            "NotOlderThan" => Ok(Some(RvMatch::NotOlderThan)),
            "Exact" => Ok(Some(RvMatch::Exact)),
            other => Err(Status::invalid_list_options(&[alloc::format!(
                "resourceVersionMatch: Unsupported value: {}: supported values: \"Exact\", \"NotOlderThan\", \"\"",
                crate::status::go_quote(other)
            )])),
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

    /// The option checks made before the cache sees a list: the API server's
    /// `ValidateListOptions` (`endpoints/handlers/get.go`: 422 Invalid, every error at once),
    /// then storage's (`storage.ValidateListOptions`, which the 1.34 `CacheDelegator` and etcd's
    /// store apply first: a recursive list's continue token must decode, and must not come with
    /// a resourceVersion; 400).
    pub(crate) fn validate(&self) -> Result<(), Status> {
        let mut errs: alloc::vec::Vec<&str> = alloc::vec::Vec::new();
        if let Some(m) = self.rv_match {
            if self.rv.is_unset() {
                errs.push("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided");
            }
            if self.continue_token.is_some() {
                errs.push("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided");
            }
            if m == RvMatch::Exact && self.rv == RvParam::Zero {
                errs.push("resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"");
            }
        }
        if !errs.is_empty() {
            return Err(Status::invalid_list_options(&errs));
        }
        if let (Some(tok), false) = (&self.continue_token, self.range.is_single_key()) {
            if tok.is_empty() {
                return Err(Status::bad_request("continue key is not valid: empty"));
            }
            crate::continue_token::decode(tok, b"").map_err(|e| {
                Status::bad_request(alloc::format!("invalid continue token: {}", e.message))
            })?;
            if matches!(self.rv, RvParam::At(_)) {
                return Err(Status::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
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

/// v1.37's `storage.PrepareKey` (`pkg/storage/interfaces.go`), which the cacher applies to the
/// key of every watch, list and get it serves: no `.` or `..` segment, not empty, and (recursive
/// keys with a trailing `/`) under the resource prefix. The error is a plain one: the API server
/// answers it 500 with no reason.
pub(crate) fn prepare_key(
    range: &crate::key::KeyRange,
    resource_prefix: Option<&str>,
) -> Result<(), Status> {
    use crate::key::KeyRange;
    use crate::status::{go_quote, Reason};
    let (key, recursive) = match range {
        KeyRange::Prefix(k) => (k, true),
        KeyRange::Exact(k) => (k, false),
        // etcd byte ranges have no Kubernetes counterpart.
        KeyRange::Range { .. } => return Ok(()),
    };
    let key = crate::key::display_key(key.as_bytes());
    let err = |m: String| Err(Status::new(Reason::Unknown, m));
    let dotted = |d: &str| {
        key == d
            || key.starts_with(&alloc::format!("{d}/"))
            || key.ends_with(&alloc::format!("/{d}"))
            || key.contains(&alloc::format!("/{d}/"))
    };
    if dotted("..") || dotted(".") {
        return err(alloc::format!("invalid key: {}", go_quote(&key)));
    }
    if key.is_empty() || key == "/" {
        return err(alloc::format!("empty key: {}", go_quote(&key)));
    }
    let mut prepared = key;
    if recursive && !prepared.ends_with('/') {
        prepared.push('/');
    }
    if let Some(prefix) = resource_prefix {
        if !prepared.starts_with(prefix) {
            return err(alloc::format!(
                "invalid key: {} lacks resource prefix: {}",
                go_quote(&prepared),
                go_quote(prefix)
            ));
        }
    }
    Ok(())
}
