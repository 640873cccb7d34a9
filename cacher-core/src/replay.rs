//! The scenario replayer: the conformance language shared by Rust, Python and JS.
//!
//! A scenario (JSON, see `DESIGN.md`) is a config and a list of timed steps; [`replay`] runs it
//! against a fresh [`Cacher`] and returns the trace: every output the core produced, in order,
//! as flat records. It is a pure function: the same scenario gives the same trace, byte for
//! byte, on every host. Malformed scenarios are a [`ScenarioError`] naming the step and field;
//! a malformed *request* inside a well-formed step is not an error but a `REJECTED` record, as
//! a client would see it.
//!
//! Kubernetes counterpart: the table-driven tests of `pkg/storage/cacher/` (`cacher_test.go`,
//! `watch_cache_test.go`) and their fake clock, written down as data.

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::{Config, Profile};
use crate::key::{display_key, Key, KeyRange};
use crate::object::{Attrs, Object};
use crate::output::{Output, ReadOutcome, RequestId, WatchEvent};
use crate::request::{ConsumeMode, GetRequest, ListRequest, RvMatch, SlowPolicy, WatchRequest};
use crate::rv::RvParam;
use crate::selector::Selector;
use crate::status::Status;
use crate::time::Timestamp;
use crate::{Cacher, Change};

/// A malformed scenario: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioError {
    /// A JSON path, e.g. `steps[3].rv` or `config.capacity`.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl ScenarioError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> ScenarioError {
        ScenarioError { path: path.into(), message: message.into() }
    }
}

impl core::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl core::error::Error for ScenarioError {}

/// One line of a trace. Fields that do not apply are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Record {
    /// Milliseconds.
    pub at: u64,
    /// The client request's id (from the scenario), where it concerns one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`, `CLOSED`, `REJECTED`, `LIST`, `GET`,
    /// `WATCH`, `REQUEST_PROGRESS`, `NEED_CURRENT_RV`, `RELIST`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `cache` or `storage`, for LIST, GET and WATCH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    /// The object's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The resourceVersion the client sees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rv: Option<u64>,
    /// The object's value (for DELETED, the last stored value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Bookmark annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Why a watch CLOSED.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// HTTP-style code of an ERROR or REJECTED.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// Status reason of an ERROR or REJECTED; why a read went where it went; why a relist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Status message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Retry-After of a REJECTED.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u32>,
    /// Objects of a LIST or GET served from the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<Item>>,
    /// The continue token of a LIST page.
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
    /// `remainingItemCount` of a LIST page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// Keys in the range of a RANGE (etcd's `count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// More keys than returned, for a RANGE (etcd's `more`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more: Option<bool>,
}

/// An object in a LIST or GET record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Item {
    /// Key.
    pub key: String,
    /// Its own resourceVersion.
    pub rv: u64,
    /// Value.
    pub value: Option<String>,
}

/// Replays a scenario given as JSON text.
pub fn replay_str(json: &str) -> Result<Vec<Record>, ScenarioError> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| ScenarioError::new("", format!("invalid JSON: {e}")))?;
    replay(&v)
}

/// Replays a scenario given as a JSON value.
pub fn replay(scenario: &Value) -> Result<Vec<Record>, ScenarioError> {
    let sc = Scenario::parse(scenario)?;
    Replayer::new(&sc)?.run(&sc)
}

/// The trace as JSON text: an array with one record per line (the golden-file format).
pub fn trace_to_json(trace: &[Record]) -> String {
    let mut out = String::from("[\n");
    for (i, r) in trace.iter().enumerate() {
        // Serialising these plain records cannot fail.
        out.push_str(&serde_json::to_string(r).unwrap_or_default());
        out.push_str(if i + 1 < trace.len() { ",\n" } else { "\n" });
    }
    out.push_str("]\n");
    out
}

// ----- the scenario model ------------------------------------------------------------------------

/// A parsed scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// The core's configuration.
    pub config: Config,
    /// The steps, in time order.
    pub steps: Vec<Step>,
}

/// One timed step.
#[derive(Clone, Debug)]
pub struct Step {
    /// Milliseconds.
    pub at: u64,
    /// What happens.
    pub op: Op,
}

/// A watch as written in a scenario (strings are parsed when it runs, so a bad one is a
/// `REJECTED` record, not a scenario error).
#[derive(Clone, Debug)]
pub struct WatchSpec {
    key: String,
    recursive: bool,
    range_end: Option<String>,
    rv: String,
    send_initial_events: Option<bool>,
    allow_bookmarks: bool,
    label_selector: String,
    field_selector: String,
    timeout_ms: Option<u64>,
    consume: ConsumeMode,
    slow_policy: SlowPolicy,
    queue_capacity: Option<usize>,
}

/// A list as written in a scenario.
#[derive(Clone, Debug)]
pub struct ListSpec {
    key: String,
    recursive: bool,
    rv: String,
    rv_match: String,
    limit: u64,
    continue_token: Option<String>,
    label_selector: String,
    field_selector: String,
}

/// A step's operation (the `op` of a scenario step; DESIGN.md spells each one).
#[derive(Clone, Debug)]
pub enum Op {
    /// `replace`: the storage's list at `rv` replaces everything the cache holds.
    Replace {
        /// The list's revision.
        rv: u64,
        /// Every object at that revision.
        objects: Vec<Object>,
    },
    /// `put`: an object created or updated at `rv`.
    Put {
        /// The revision.
        rv: u64,
        /// The object as stored.
        object: Object,
    },
    /// `delete`: a key deleted at `rv`.
    Delete {
        /// The revision.
        rv: u64,
        /// The deleted key.
        key: String,
    },
    /// `txn`: several changes in one revision.
    Txn {
        /// The revision.
        rv: u64,
        /// The changes, in order.
        changes: Vec<Change>,
    },
    /// `progress`: a storage progress notify at `rv`.
    Progress {
        /// The revision storage has reached.
        rv: u64,
    },
    /// `storage_error`: the storage watch failed.
    StorageError {
        /// Why.
        reason: String,
    },
    /// `etcd_rv`: the storage's current revision, as a quorum read answers it.
    EtcdRv {
        /// The revision.
        rv: u64,
    },
    /// `compact`: storage compacted up to `rv`.
    Compact {
        /// The compaction revision.
        rv: u64,
    },
    /// `watch`: a client watch request.
    Watch {
        /// The scenario's name for it.
        id: String,
        /// The request as written.
        spec: Box<WatchSpec>,
    },
    /// `consume`: the client of watch `id` reads up to `max` events (all if `None`).
    Consume {
        /// The watch.
        id: String,
        /// How many at most.
        max: Option<u64>,
    },
    /// `credit`: the host grants watch `id` credit for `n` more events.
    Credit {
        /// The watch.
        id: String,
        /// How many.
        n: u64,
    },
    /// `stop_watch`: the client of watch `id` goes away.
    StopWatch {
        /// The watch.
        id: String,
    },
    /// `list`: a client list request.
    List {
        /// The scenario's name for it.
        id: String,
        /// The request as written.
        spec: Box<ListSpec>,
    },
    /// `get`: a client get of one key.
    Get {
        /// The scenario's name for it.
        id: String,
        /// The key.
        key: String,
        /// Its resourceVersion parameter.
        rv: String,
    },
    /// `range`: an etcd-style Range.
    Range {
        /// The scenario's name for it.
        id: String,
        /// The key (or the range's start).
        key: String,
        /// The range's end, if any.
        range_end: Option<String>,
        /// At this revision (0: latest).
        revision: u64,
        /// A linearizable read.
        linearizable: bool,
        /// At most this many keys (0: no limit).
        limit: u64,
    },
    /// `stop_cacher`: the cacher stops.
    StopCacher,
    /// `advance`: time passes to the step's `at`, nothing else.
    Advance,
}

/// Reads fields of a JSON object, remembering which were used to report unknown ones (shared
/// with the workload parser of `simulate`).
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
    used: BTreeSet<&'static str>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(v: &'a Value, path: &str) -> Result<Fields<'a>, ScenarioError> {
        match v {
            Value::Object(map) => Ok(Fields { map, path: path.to_owned(), used: BTreeSet::new() }),
            other => {
                Err(ScenarioError::new(path, format!("expected an object, got {}", kind_of(other))))
            }
        }
    }

    pub(crate) fn at(&self, field: &str) -> String {
        if self.path.is_empty() {
            field.to_owned()
        } else {
            format!("{}.{}", self.path, field)
        }
    }

    pub(crate) fn raw(&mut self, field: &'static str) -> Option<&'a Value> {
        self.used.insert(field);
        match self.map.get(field) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    fn require(&mut self, field: &'static str) -> Result<&'a Value, ScenarioError> {
        self.raw(field)
            .ok_or_else(|| ScenarioError::new(self.at(field), "required field is missing"))
    }

    fn u64_of(&self, field: &str, v: &Value) -> Result<u64, ScenarioError> {
        match v {
            Value::Number(n) => n.as_u64().ok_or_else(|| {
                ScenarioError::new(
                    self.at(field),
                    format!("expected a non-negative integer, got {n}"),
                )
            }),
            // Large resource versions may be written as strings (JavaScript cannot hold them).
            Value::String(s) => crate::rv::parse_u64(s).ok_or_else(|| {
                ScenarioError::new(
                    self.at(field),
                    format!("expected a non-negative integer, got {s:?}"),
                )
            }),
            other => Err(ScenarioError::new(
                self.at(field),
                format!("expected a non-negative integer, got {}", kind_of(other)),
            )),
        }
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, ScenarioError> {
        let v = self.require(field)?;
        self.u64_of(field, v)
    }

    pub(crate) fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(v) => self.u64_of(field, v).map(Some),
        }
    }

    fn string(&mut self, field: &'static str) -> Result<String, ScenarioError> {
        let v = self.require(field)?;
        self.string_of(field, v)
    }

    fn string_of(&self, field: &str, v: &Value) -> Result<String, ScenarioError> {
        match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(ScenarioError::new(
                self.at(field),
                format!("expected a string, got {}", kind_of(other)),
            )),
        }
    }

    pub(crate) fn opt_string(
        &mut self,
        field: &'static str,
    ) -> Result<Option<String>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(v) => self.string_of(field, v).map(Some),
        }
    }

    pub(crate) fn opt_bool(&mut self, field: &'static str) -> Result<Option<bool>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ScenarioError::new(
                self.at(field),
                format!("expected true or false, got {}", kind_of(other)),
            )),
        }
    }

    fn opt_f64(&mut self, field: &'static str) -> Result<Option<f64>, ScenarioError> {
        match self.raw(field) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(ScenarioError::new(
                self.at(field),
                format!("expected a number, got {}", kind_of(other)),
            )),
        }
    }

    fn string_map(&mut self, field: &'static str) -> Result<Vec<(String, String)>, ScenarioError> {
        match self.raw(field) {
            None => Ok(Vec::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(ScenarioError::new(
                        format!("{}.{}", self.at(field), k),
                        format!("expected a string, got {}", kind_of(other)),
                    )),
                })
                .collect(),
            Some(other) => Err(ScenarioError::new(
                self.at(field),
                format!("expected an object of strings, got {}", kind_of(other)),
            )),
        }
    }

    /// Fails on any field that was not read.
    pub(crate) fn finish(self) -> Result<(), ScenarioError> {
        for k in self.map.keys() {
            if !self.used.contains(k.as_str()) {
                let known: Vec<&str> = self.used.iter().copied().collect();
                return Err(ScenarioError::new(
                    self.at(k),
                    format!("unknown field; expected one of: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Scenario {
    /// Parses and checks a scenario.
    pub fn parse(v: &Value) -> Result<Scenario, ScenarioError> {
        let mut f = Fields::new(v, "")?;
        let name = f.opt_string("name")?.unwrap_or_default();
        let _description = f.opt_string("description")?;
        let config = match f.raw("config") {
            None => Config::default(),
            Some(c) => parse_config(c, "config")?,
        };
        let steps_v = f.require("steps")?;
        let Value::Array(items) = steps_v else {
            return Err(ScenarioError::new(
                "steps",
                format!("expected an array, got {}", kind_of(steps_v)),
            ));
        };
        f.finish()?;
        let mut steps = Vec::with_capacity(items.len());
        let mut last_at = 0;
        for (i, s) in items.iter().enumerate() {
            let path = format!("steps[{i}]");
            let step = parse_step(s, &path)?;
            if step.at < last_at {
                return Err(ScenarioError::new(
                    format!("{path}.at"),
                    format!("time goes back: {} after {}", step.at, last_at),
                ));
            }
            last_at = step.at;
            steps.push(step);
        }
        Ok(Scenario { name, config, steps })
    }
}

/// Parses a config object (every field optional; the profile presets the gates).
pub fn parse_config(v: &Value, path: &str) -> Result<Config, ScenarioError> {
    let mut f = Fields::new(v, path)?;
    let profile = match f.opt_string("profile")? {
        None => Profile::V1_30,
        Some(p) => {
            Profile::parse(&p).map_err(|e| ScenarioError::new(f.at("profile"), e.message))?
        }
    };
    let mut c = Config::for_profile(profile);
    macro_rules! num {
        ($field:ident, $name:literal) => {
            if let Some(x) = f.opt_u64($name)? {
                c.$field =
                    x.try_into().map_err(|_| ScenarioError::new(f.at($name), "value too large"))?;
            }
        };
    }
    macro_rules! flag {
        ($field:ident, $name:literal) => {
            if let Some(x) = f.opt_bool($name)? {
                c.$field = x;
            }
        };
    }
    num!(capacity, "capacity");
    num!(lower_bound_capacity, "lower_bound_capacity");
    num!(upper_bound_capacity, "upper_bound_capacity");
    flag!(dynamic_capacity, "dynamic_capacity");
    num!(event_fresh_ms, "event_fresh_ms");
    num!(bookmark_frequency_ms, "bookmark_frequency_ms");
    num!(dispatch_tick_ms, "dispatch_tick_ms");
    if let Some(j) = f.opt_f64("dispatch_tick_jitter")? {
        c.dispatch_tick_jitter = j;
    }
    num!(freshness_timeout_ms, "freshness_timeout_ms");
    num!(progress_request_interval_ms, "progress_request_interval_ms");
    num!(budget_refill_ms_per_s, "budget_refill_ms_per_s");
    num!(budget_max_ms, "budget_max_ms");
    if let Some(n) = f.opt_u64("watch_chan_size")? {
        c.watch_chan_size = Some(
            n.try_into()
                .map_err(|_| ScenarioError::new(f.at("watch_chan_size"), "value too large"))?,
        );
    }
    if let Some(s) = f.opt_string("index_field")? {
        c.index_field = Some(s.into_boxed_str());
    }
    num!(interval_buffer_size, "interval_buffer_size");
    num!(request_timeout_ms, "request_timeout_ms");
    num!(seed, "seed");
    flag!(watch_list, "watch_list");
    flag!(consistent_list_from_cache, "consistent_list_from_cache");
    flag!(resilient_initialization, "resilient_initialization");
    flag!(list_from_cache_snapshot, "list_from_cache_snapshot");
    flag!(watch_from_storage_without_rv, "watch_from_storage_without_rv");
    flag!(storage_supports_progress, "storage_supports_progress");
    f.finish()?;
    c.validate().map_err(|e| ScenarioError::new(f_at(path, &e.field), e.message))?;
    Ok(c)
}

fn f_at(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// Parses an object in the scenario format (`key`, `value`, `rv`, `labels`, `fields`); `rv`
/// defaults to `default_rv`.
pub fn parse_object(
    v: &Value,
    path: &str,
    default_rv: Option<u64>,
) -> Result<Object, ScenarioError> {
    let mut f = Fields::new(v, path)?;
    let key = f.string("key")?;
    let value = f.opt_string("value")?;
    let rv = match (f.opt_u64("rv")?, default_rv) {
        (Some(rv), _) => rv,
        (None, Some(d)) => d,
        (None, None) => 0,
    };
    let labels = f.string_map("labels")?;
    let fields = f.string_map("fields")?;
    f.finish()?;
    if key.is_empty() {
        return Err(ScenarioError::new(format!("{path}.key"), "must not be empty"));
    }
    Ok(Object::new(key.as_bytes(), value.as_deref().map(str::as_bytes), rv)
        .with_attrs(Attrs::new(labels, fields)))
}

fn parse_step(v: &Value, path: &str) -> Result<Step, ScenarioError> {
    let mut f = Fields::new(v, path)?;
    let at = f.u64("at")?;
    let op_name = f.string("op")?;
    let op = match op_name.as_str() {
        "replace" => {
            let rv = f.u64("rv")?;
            let objects = match f.raw("objects") {
                None => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(i, o)| parse_object(o, &format!("{path}.objects[{i}]"), Some(rv)))
                    .collect::<Result<_, _>>()?,
                Some(other) => {
                    return Err(ScenarioError::new(f.at("objects"), format!("expected an array, got {}", kind_of(other))))
                }
            };
            Op::Replace { rv, objects }
        }
        "put" => {
            let rv = f.u64("rv")?;
            let o = f.require("object")?;
            let object = parse_object(o, &format!("{path}.object"), Some(rv))?;
            if object.rv() != rv {
                return Err(ScenarioError::new(
                    format!("{path}.object.rv"),
                    format!("must equal the event's rv {rv} (or be left out), got {}", object.rv()),
                ));
            }
            Op::Put { rv, object }
        }
        "delete" => Op::Delete { rv: f.u64("rv")?, key: f.string("key")? },
        "txn" => {
            let rv = f.u64("rv")?;
            let ops = match f.require("ops")? {
                Value::Array(a) if !a.is_empty() => a,
                other => {
                    return Err(ScenarioError::new(
                        f.at("ops"),
                        format!("expected a non-empty array of puts and deletes, got {}", kind_of(other)),
                    ))
                }
            };
            let mut changes = Vec::with_capacity(ops.len());
            for (j, o) in ops.iter().enumerate() {
                let p = format!("{path}.ops[{j}]");
                let mut g = Fields::new(o, &p)?;
                match g.string("op")?.as_str() {
                    "put" => {
                        let obj = parse_object(g.require("object")?, &format!("{p}.object"), Some(rv))?;
                        if obj.rv() != rv {
                            return Err(ScenarioError::new(
                                format!("{p}.object.rv"),
                                format!("must equal the txn's rv {rv} (or be left out), got {}", obj.rv()),
                            ));
                        }
                        changes.push(Change::Put(obj));
                    }
                    "delete" => changes.push(Change::Delete(Key::from(g.string("key")?.as_str()))),
                    other => {
                        return Err(ScenarioError::new(
                            format!("{p}.op"),
                            format!("expected \"put\" or \"delete\" inside a txn, got {other:?}"),
                        ))
                    }
                }
                g.finish()?;
            }
            Op::Txn { rv, changes }
        }
        "progress" => Op::Progress { rv: f.u64("rv")? },
        "storage_error" => Op::StorageError { reason: f.opt_string("reason")?.unwrap_or_else(|| "watch failed".to_owned()) },
        "etcd_rv" => Op::EtcdRv { rv: f.u64("rv")? },
        "compact" => Op::Compact { rv: f.u64("rv")? },
        "watch" => {
            let id = f.string("id")?;
            let consume = match f.opt_string("consume")?.as_deref() {
                None | Some("auto") => ConsumeMode::Auto,
                Some("manual") => ConsumeMode::Manual,
                Some(other) => {
                    return Err(ScenarioError::new(f.at("consume"), format!("expected \"auto\" or \"manual\", got {other:?}")))
                }
            };
            let slow_policy = match f.opt_string("slow_policy")?.as_deref() {
                None | Some("terminate") => SlowPolicy::Terminate,
                Some("lag") => SlowPolicy::Lag,
                Some(other) => {
                    return Err(ScenarioError::new(f.at("slow_policy"), format!("expected \"terminate\" or \"lag\", got {other:?}")))
                }
            };
            let spec = WatchSpec {
                key: f.string("key")?,
                recursive: f.opt_bool("recursive")?.unwrap_or(true),
                range_end: f.opt_string("range_end")?,
                rv: f.opt_string("rv")?.unwrap_or_default(),
                send_initial_events: f.opt_bool("send_initial_events")?,
                allow_bookmarks: f.opt_bool("allow_bookmarks")?.unwrap_or(false),
                label_selector: f.opt_string("label_selector")?.unwrap_or_default(),
                field_selector: f.opt_string("field_selector")?.unwrap_or_default(),
                timeout_ms: f.opt_u64("timeout_ms")?,
                consume,
                slow_policy,
                queue_capacity: f
                    .opt_u64("queue_capacity")?
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            };
            Op::Watch { id, spec: Box::new(spec) }
        }
        "consume" => Op::Consume { id: f.string("id")?, max: f.opt_u64("max")? },
        "credit" => Op::Credit { id: f.string("id")?, n: f.u64("n")? },
        "stop_watch" => Op::StopWatch { id: f.string("id")? },
        "list" => {
            let id = f.string("id")?;
            let spec = ListSpec {
                key: f.string("key")?,
                recursive: f.opt_bool("recursive")?.unwrap_or(true),
                rv: f.opt_string("rv")?.unwrap_or_default(),
                rv_match: f.opt_string("rv_match")?.unwrap_or_default(),
                limit: f.opt_u64("limit")?.unwrap_or(0),
                continue_token: f.opt_string("continue")?,
                label_selector: f.opt_string("label_selector")?.unwrap_or_default(),
                field_selector: f.opt_string("field_selector")?.unwrap_or_default(),
            };
            Op::List { id, spec: Box::new(spec) }
        }
        "get" => Op::Get { id: f.string("id")?, key: f.string("key")?, rv: f.opt_string("rv")?.unwrap_or_default() },
        "range" => Op::Range {
            id: f.string("id")?,
            key: f.string("key")?,
            range_end: f.opt_string("range_end")?,
            revision: f.opt_u64("revision")?.unwrap_or(0),
            linearizable: f.opt_bool("linearizable")?.unwrap_or(false),
            limit: f.opt_u64("limit")?.unwrap_or(0),
        },
        "stop_cacher" => Op::StopCacher,
        "advance" => Op::Advance,
        other => {
            return Err(ScenarioError::new(
                f.at("op"),
                format!(
                    "unknown op {other:?}; expected one of replace, put, delete, txn, progress, \
                     storage_error, etcd_rv, compact, watch, consume, credit, stop_watch, list, get, range, stop_cacher, advance"
                ),
            ))
        }
    };
    f.finish()?;
    Ok(Step { at, op })
}

impl WatchSpec {
    fn to_request(&self) -> Result<WatchRequest, Status> {
        let range = match &self.range_end {
            Some(end) => KeyRange::etcd(self.key.as_bytes(), end.as_bytes())?,
            None => KeyRange::kubernetes(&self.key, self.recursive)?,
        };
        let mut req = WatchRequest::new(range, RvParam::parse(&self.rv)?);
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

impl ListSpec {
    fn to_request(&self) -> Result<ListRequest, Status> {
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

// ----- running ------------------------------------------------------------------------------------

/// The most timer expirations one scenario may go through (about 11 days of 1-second ticks).
const MAX_TIMER_STEPS: u64 = 1_000_000;

struct Replayer {
    cacher: Cacher,
    names: BTreeMap<RequestId, String>,
    ids: BTreeMap<String, RequestId>,
    etcd_rv: u64,
    max_stored_rv: u64,
    trace: Vec<Record>,
}

impl Replayer {
    fn new(sc: &Scenario) -> Result<Replayer, ScenarioError> {
        let cacher = Cacher::new(sc.config.clone(), Timestamp::ZERO)
            .map_err(|e| ScenarioError::new(format!("config.{}", e.field), e.message))?;
        Ok(Replayer {
            cacher,
            names: BTreeMap::new(),
            ids: BTreeMap::new(),
            etcd_rv: 0,
            max_stored_rv: 0,
            trace: Vec::new(),
        })
    }

    fn run(mut self, sc: &Scenario) -> Result<Vec<Record>, ScenarioError> {
        let mut timer_steps: u64 = 0;
        for (i, step) in sc.steps.iter().enumerate() {
            while let Some((t, _)) = self.cacher.poll_timeout() {
                if t.as_millis() > step.at {
                    break;
                }
                // Time is stepped through every deadline (ticks, progress requests, bookmarks):
                // a step far in the future would take as long as it says.
                timer_steps += 1;
                if timer_steps > MAX_TIMER_STEPS {
                    return Err(ScenarioError::new(
                        format!("steps[{i}].at"),
                        format!(
                            "reaching {} ms takes more than {MAX_TIMER_STEPS} timer expirations \
                             (dispatch ticks, progress requests, bookmarks): the scenario spans \
                             too much time; simulate() is the tool for long runs",
                            step.at
                        ),
                    ));
                }
                self.cacher.handle_timeout(t);
                self.drain(t.as_millis());
            }
            self.apply(i, step)?;
            self.drain(step.at);
        }
        Ok(self.trace)
    }

    fn request_id(&self, i: usize, id: &str) -> Result<RequestId, ScenarioError> {
        self.ids.get(id).copied().ok_or_else(|| {
            ScenarioError::new(format!("steps[{i}].id"), format!("no request with id {id:?}"))
        })
    }

    fn claim(&mut self, i: usize, id: &str) -> Result<(), ScenarioError> {
        if self.ids.contains_key(id) {
            return Err(ScenarioError::new(
                format!("steps[{i}].id"),
                format!("id {id:?} is already used"),
            ));
        }
        Ok(())
    }

    fn bind(&mut self, id: &str, rid: RequestId) {
        self.ids.insert(id.to_owned(), rid);
        self.names.insert(rid, id.to_owned());
    }

    fn storage(i: usize, r: Result<(), crate::StorageError>) -> Result<(), ScenarioError> {
        r.map_err(|e| ScenarioError::new(format!("steps[{i}]"), e.to_string()))
    }

    /// A request rejected before it got an id: its name stays taken.
    fn reject_unbound(&mut self, at: u64, id: &str, status: &Status) {
        self.ids.insert(id.to_owned(), RequestId(0));
        self.trace.push(rejected(at, Some(id.to_owned()), status));
    }

    fn apply(&mut self, i: usize, step: &Step) -> Result<(), ScenarioError> {
        let now = Timestamp::from_millis(step.at);
        let at = step.at;
        match &step.op {
            Op::Replace { rv, objects } => {
                Self::storage(i, self.cacher.handle_replace(now, *rv, objects.clone()))?;
                self.max_stored_rv = self.max_stored_rv.max(*rv);
            }
            Op::Put { object, rv } => {
                Self::storage(i, self.cacher.handle_put(now, object.clone()))?;
                self.max_stored_rv = self.max_stored_rv.max(*rv);
            }
            Op::Delete { rv, key } => {
                Self::storage(i, self.cacher.handle_delete(now, key.as_bytes(), *rv))?;
                self.max_stored_rv = self.max_stored_rv.max(*rv);
            }
            Op::Txn { rv, changes } => {
                Self::storage(i, self.cacher.handle_revision(now, *rv, changes.clone()))?;
                self.max_stored_rv = self.max_stored_rv.max(*rv);
            }
            Op::Progress { rv } => {
                Self::storage(i, self.cacher.handle_progress(now, *rv))?;
                self.max_stored_rv = self.max_stored_rv.max(*rv);
            }
            Op::StorageError { reason } => self.cacher.handle_storage_error(now, reason),
            Op::EtcdRv { rv } => self.etcd_rv = *rv,
            Op::Compact { rv } => self.cacher.handle_compaction(now, *rv),
            Op::Watch { id, spec } => {
                self.claim(i, id)?;
                match spec.to_request() {
                    Err(status) => self.reject_unbound(at, id, &status),
                    // Outputs are drained after the step, so binding the returned id is in time.
                    Ok(req) => match self.cacher.start_watch(now, req) {
                        Ok(rid) => self.bind(id, rid),
                        Err(status) => self.reject_unbound(at, id, &status),
                    },
                }
            }
            Op::Consume { id, max } => {
                let rid = self.request_id(i, id)?;
                self.cacher.consume(now, rid, *max);
            }
            Op::Credit { id, n } => {
                let rid = self.request_id(i, id)?;
                self.cacher.grant_credit(now, rid, *n);
            }
            Op::StopWatch { id } => {
                let rid = self.request_id(i, id)?;
                self.cacher.stop_watch(now, rid);
            }
            Op::List { id, spec } => {
                self.claim(i, id)?;
                match spec.to_request() {
                    Err(status) => self.reject_unbound(at, id, &status),
                    Ok(req) => match self.cacher.list(now, req) {
                        Ok(rid) => self.bind(id, rid),
                        Err(status) => self.reject_unbound(at, id, &status),
                    },
                }
            }
            Op::Get { id, key, rv } => {
                self.claim(i, id)?;
                let req =
                    RvParam::parse(rv).map(|rv| GetRequest { key: Key::from(key.as_str()), rv });
                match req {
                    Err(status) => self.reject_unbound(at, id, &status),
                    Ok(req) => match self.cacher.get(now, req) {
                        Ok(rid) => self.bind(id, rid),
                        Err(status) => self.reject_unbound(at, id, &status),
                    },
                }
            }
            Op::Range { id, key, range_end, revision, linearizable, limit } => {
                self.claim(i, id)?;
                let range =
                    KeyRange::etcd(key.as_bytes(), range_end.as_deref().unwrap_or("").as_bytes());
                let req = range.map(|range| crate::RangeRequest {
                    range,
                    revision: *revision,
                    linearizable: *linearizable,
                    limit: *limit,
                });
                match req {
                    Err(status) => self.reject_unbound(at, id, &status),
                    Ok(req) => match self.cacher.range(now, req) {
                        Ok(rid) => self.bind(id, rid),
                        Err(status) => self.reject_unbound(at, id, &status),
                    },
                }
            }
            Op::StopCacher => self.cacher.stop(now),
            Op::Advance => {}
        }
        Ok(())
    }

    fn drain(&mut self, at: u64) {
        while let Some(out) = self.cacher.poll_output() {
            if let Output::NeedCurrentRevision { request } = &out {
                let request = *request;
                self.trace.push(Record {
                    at,
                    id: self.names.get(&request).cloned(),
                    kind: "NEED_CURRENT_RV",
                    ..Record::default()
                });
                let answer = self.etcd_rv.max(self.max_stored_rv);
                self.cacher.handle_current_revision(Timestamp::from_millis(at), request, answer);
                continue;
            }
            records_of(&out, at, &self.names, &mut self.trace);
        }
    }
}

fn rejected(at: u64, id: Option<String>, status: &Status) -> Record {
    Record {
        at,
        id,
        kind: "REJECTED",
        code: Some(status.code()),
        reason: Some(status.reason.as_str().to_owned()),
        message: Some(status.message.clone()),
        retry_after_s: status.retry_after_s,
        ..Record::default()
    }
}

fn text(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(display_key)
}

/// The trace records of one output (also used by hosts that print traces).
pub fn records_of(
    out: &Output,
    at: u64,
    names: &BTreeMap<RequestId, String>,
    trace: &mut Vec<Record>,
) {
    let name =
        |id: &RequestId| Some(names.get(id).cloned().unwrap_or_else(|| format!("#{}", id.0)));
    match out {
        Output::Fanout { event, targets } => {
            for (id, kind) in targets.iter() {
                trace.push(event_record(at, name(id), &WatchEvent::Change(*kind, event.clone())));
            }
        }
        Output::Deliver { watch, events } => {
            for e in events {
                trace.push(event_record(at, name(watch), e));
            }
        }
        // Host information; the trace shows what clients see.
        Output::WatchStarted { .. } => {}
        Output::WatchError { watch, status } => trace.push(Record {
            at,
            id: name(watch),
            kind: "ERROR",
            code: Some(status.code()),
            reason: Some(status.reason.as_str().to_owned()),
            message: Some(status.message.clone()),
            ..Record::default()
        }),
        Output::WatchClosed { watch, cause, message, .. } => trace.push(Record {
            at,
            id: name(watch),
            kind: "CLOSED",
            cause: Some(cause.as_str()),
            message: message.clone(),
            ..Record::default()
        }),
        Output::WatchDelegated { watch, reason } => trace.push(Record {
            at,
            id: name(watch),
            kind: "WATCH",
            source: Some("storage"),
            reason: Some((*reason).to_owned()),
            ..Record::default()
        }),
        Output::List { request, outcome } => {
            trace.push(read_record(at, name(request), "LIST", outcome))
        }
        Output::Get { request, outcome } => {
            trace.push(read_record(at, name(request), "GET", outcome))
        }
        Output::Range { request, outcome } => trace.push(match outcome {
            crate::RangeOutcome::Storage { reason } => Record {
                at,
                id: name(request),
                kind: "RANGE",
                source: Some("storage"),
                reason: Some((*reason).to_owned()),
                ..Record::default()
            },
            crate::RangeOutcome::Cache(r) => Record {
                at,
                id: name(request),
                kind: "RANGE",
                source: Some("cache"),
                rv: Some(r.header_rv),
                reason: Some(r.reason.to_owned()),
                items: Some(
                    r.items
                        .iter()
                        .map(|o| Item {
                            key: display_key(o.key()),
                            rv: o.rv(),
                            value: text(o.value()),
                        })
                        .collect(),
                ),
                count: Some(r.count),
                more: Some(r.more),
                ..Record::default()
            },
        }),
        Output::Rejected { request, status } => trace.push(rejected(at, name(request), status)),
        Output::RequestProgress => {
            trace.push(Record { at, kind: "REQUEST_PROGRESS", ..Record::default() })
        }
        Output::NeedCurrentRevision { request } => trace.push(Record {
            at,
            id: name(request),
            kind: "NEED_CURRENT_RV",
            ..Record::default()
        }),
        Output::Relist { reason } => trace.push(Record {
            at,
            kind: "RELIST",
            reason: Some(reason.clone()),
            ..Record::default()
        }),
    }
}

fn event_record(at: u64, id: Option<String>, e: &WatchEvent) -> Record {
    match e {
        WatchEvent::Bookmark { rv, initial_events_end } => Record {
            at,
            id,
            kind: "BOOKMARK",
            rv: Some(*rv),
            annotations: initial_events_end.then(|| {
                let mut m = BTreeMap::new();
                m.insert("k8s.io/initial-events-end".to_owned(), "true".to_owned());
                m
            }),
            ..Record::default()
        },
        _ => {
            let obj = e.object();
            Record {
                at,
                id,
                kind: e.type_str(),
                key: obj.map(|o| display_key(o.key())),
                rv: Some(e.rv()),
                value: obj.and_then(|o| text(o.value())),
                ..Record::default()
            }
        }
    }
}

fn read_record(at: u64, id: Option<String>, kind: &'static str, outcome: &ReadOutcome) -> Record {
    match outcome {
        ReadOutcome::Storage { reason } => Record {
            at,
            id,
            kind,
            source: Some("storage"),
            reason: Some((*reason).to_owned()),
            ..Record::default()
        },
        ReadOutcome::Cache(r) => Record {
            at,
            id,
            kind,
            source: Some("cache"),
            rv: Some(r.rv),
            reason: Some(r.reason.to_owned()),
            items: Some(
                r.items
                    .iter()
                    .map(|o| Item { key: display_key(o.key()), rv: o.rv(), value: text(o.value()) })
                    .collect(),
            ),
            continue_token: r.continue_token.clone(),
            remaining: r.remaining,
            ..Record::default()
        },
    }
}
