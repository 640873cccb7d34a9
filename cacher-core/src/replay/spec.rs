//! Client requests as hosts receive them: keys, resource versions and selectors still as text,
//! parsed into the core's request types in one place. The replayer fills these from a
//! scenario's steps, the Python binding from keyword arguments, the JS binding from an options
//! object; a malformed field is the [`Status`] a Kubernetes client would get (400), whoever
//! asked.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::key::{Key, KeyRange};
use crate::request::{
    ConsumeMode, GetRequest, ListRequest, RangeRequest, RvMatch, SlowPolicy, WatchRequest,
};
use crate::rv::RvParam;
use crate::selector::Selector;
use crate::status::Status;

/// The keys a watch names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySpec {
    /// A Kubernetes key: every key under it when `recursive`, else that one key.
    Kubernetes {
        /// The key (a path).
        key: String,
        /// A prefix (path segments) rather than one key.
        recursive: bool,
    },
    /// An etcd byte range `[key, range_end)` with etcd's conventions (see [`KeyRange::etcd`]).
    Etcd {
        /// The start key.
        key: Vec<u8>,
        /// The range end.
        range_end: Vec<u8>,
    },
}

impl KeySpec {
    /// The range it selects.
    pub fn to_range(&self) -> Result<KeyRange, Status> {
        match self {
            KeySpec::Kubernetes { key, recursive } => KeyRange::kubernetes(key, *recursive),
            KeySpec::Etcd { key, range_end } => KeyRange::etcd(key, range_end),
        }
    }
}

/// A watch as a client writes it (the scenario's `watch` step, `Cacher.start_watch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSpec {
    /// What it watches.
    pub keys: KeySpec,
    /// `resourceVersion` (`""`: unset).
    pub rv: String,
    /// `sendInitialEvents`.
    pub send_initial_events: Option<bool>,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// `labelSelector`.
    pub label_selector: String,
    /// `fieldSelector`.
    pub field_selector: String,
    /// `timeoutSeconds`, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Whether its client reads everything at once or only when told to.
    pub consume: ConsumeMode,
    /// What happens when it falls behind.
    pub slow_policy: SlowPolicy,
    /// Its queue's capacity (`None`: the Kubernetes sizing rule).
    pub queue_capacity: Option<usize>,
}

impl WatchSpec {
    /// A watch of `keys` with every option at its default.
    pub fn new(keys: KeySpec) -> WatchSpec {
        WatchSpec {
            keys,
            rv: String::new(),
            send_initial_events: None,
            allow_bookmarks: false,
            label_selector: String::new(),
            field_selector: String::new(),
            timeout_ms: None,
            consume: ConsumeMode::Auto,
            slow_policy: SlowPolicy::Terminate,
            queue_capacity: None,
        }
    }

    /// The request, or the status a client gets for it (range, then resourceVersion, then
    /// selectors: the first bad one).
    pub fn to_request(&self) -> Result<WatchRequest, Status> {
        let mut req = WatchRequest::new(self.keys.to_range()?, RvParam::parse(&self.rv)?);
        req.send_initial_events = self.send_initial_events;
        req.allow_bookmarks = self.allow_bookmarks;
        req.selector = Selector::parse(&self.label_selector, &self.field_selector)?;
        req.timeout_ms = self.timeout_ms;
        req.consume = self.consume;
        req.slow_policy = self.slow_policy;
        req.queue_capacity = self.queue_capacity;
        Ok(req)
    }
}

/// A list as a client writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListSpec {
    /// The key.
    pub key: String,
    /// Every key under it, rather than that one key.
    pub recursive: bool,
    /// `resourceVersion` (`""`: unset).
    pub rv: String,
    /// `resourceVersionMatch` (`""`: none).
    pub rv_match: String,
    /// `limit` (0: none).
    pub limit: u64,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `labelSelector`.
    pub label_selector: String,
    /// `fieldSelector`.
    pub field_selector: String,
}

impl ListSpec {
    /// A recursive list of `key` with every option at its default.
    pub fn new(key: impl Into<String>) -> ListSpec {
        ListSpec {
            key: key.into(),
            recursive: true,
            rv: String::new(),
            rv_match: String::new(),
            limit: 0,
            continue_token: None,
            label_selector: String::new(),
            field_selector: String::new(),
        }
    }

    /// The request, or the status a client gets for it.
    pub fn to_request(&self) -> Result<ListRequest, Status> {
        let mut req = ListRequest::new(
            KeyRange::kubernetes(&self.key, self.recursive)?,
            RvParam::parse(&self.rv)?,
        );
        req.rv_match = RvMatch::parse(&self.rv_match)?;
        req.limit = self.limit;
        req.continue_token = self.continue_token.clone();
        req.selector = Selector::parse(&self.label_selector, &self.field_selector)?;
        Ok(req)
    }
}

/// A get of one key as a client writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetSpec {
    /// The key.
    pub key: Vec<u8>,
    /// `resourceVersion` (`""`: unset).
    pub rv: String,
}

impl GetSpec {
    /// The request, or the status a client gets for it.
    pub fn to_request(&self) -> Result<GetRequest, Status> {
        Ok(GetRequest { key: Key::new(&self.key), rv: RvParam::parse(&self.rv)? })
    }
}

/// An etcd `Range` as a client writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSpec {
    /// The key (or the range's start).
    pub key: Vec<u8>,
    /// The range end (empty: one key).
    pub range_end: Vec<u8>,
    /// The revision to read at (0: latest).
    pub revision: u64,
    /// Catch up with storage first.
    pub linearizable: bool,
    /// At most this many keys (0: no limit).
    pub limit: u64,
}

impl RangeSpec {
    /// The request, or the status a client gets for it.
    pub fn to_request(&self) -> Result<RangeRequest, Status> {
        Ok(RangeRequest {
            range: KeyRange::etcd(&self.key, &self.range_end)?,
            revision: self.revision,
            linearizable: self.linearizable,
            limit: self.limit,
        })
    }
}

/// `"auto"` or `"manual"`; the error says what was expected (the caller names the field).
pub fn parse_consume(s: &str) -> Result<ConsumeMode, String> {
    match s {
        "auto" => Ok(ConsumeMode::Auto),
        "manual" => Ok(ConsumeMode::Manual),
        other => Err(format!("expected \"auto\" or \"manual\", got {other:?}")),
    }
}

/// `"terminate"` or `"lag"`; the error says what was expected.
pub fn parse_slow_policy(s: &str) -> Result<SlowPolicy, String> {
    match s {
        "terminate" => Ok(SlowPolicy::Terminate),
        "lag" => Ok(SlowPolicy::Lag),
        other => Err(format!("expected \"terminate\" or \"lag\", got {other:?}")),
    }
}
