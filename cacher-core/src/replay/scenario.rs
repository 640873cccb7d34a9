//! The scenario format: a config and timed steps (each [`Op`] variant's doc gives its op
//! name and fields; `README.md` lists the format's additions). Parsing checks every field, names the path of a bad one, and
//! leaves the requests' own strings (keys, resource versions, selectors) to
//! [`super::spec`], so that a bad one is a `REJECTED` record, as a client would see it.

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde_json::Value;

use crate::config::Config;
use crate::key::Key;
use crate::object::{Attrs, Object};
use crate::request::{ConsumeMode, SlowPolicy};
use crate::Change;

use super::json::{kind_of, Fields};
use super::spec::{
    parse_consume, parse_slow_policy, GetSpec, KeySpec, ListSpec, RangeSpec, WatchSpec,
};
use super::surface::parse_config;
use super::ScenarioError;

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

/// A step's operation (the `op` of a scenario step; each variant's doc names its fields).
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
        /// The request as written.
        spec: GetSpec,
    },
    /// `range`: an etcd-style Range.
    Range {
        /// The scenario's name for it.
        id: String,
        /// The request as written.
        spec: RangeSpec,
    },
    /// `stop_cacher`: the cacher stops.
    StopCacher,
    /// `advance`: time passes to the step's `at`, nothing else.
    Advance,
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
            let consume = match f.opt_string("consume")? {
                None => ConsumeMode::Auto,
                Some(s) => parse_consume(&s).map_err(|m| ScenarioError::new(f.at("consume"), m))?,
            };
            let slow_policy = match f.opt_string("slow_policy")? {
                None => SlowPolicy::Terminate,
                Some(s) => parse_slow_policy(&s)
                    .map_err(|m| ScenarioError::new(f.at("slow_policy"), m))?,
            };
            // Read in this order, so that the first bad field is the one reported.
            let key = f.string("key")?;
            let recursive = f.opt_bool("recursive")?.unwrap_or(true);
            let keys = match f.opt_string("range_end")? {
                Some(end) => KeySpec::Etcd { key: key.into_bytes(), range_end: end.into_bytes() },
                None => KeySpec::Kubernetes { key, recursive },
            };
            let spec = WatchSpec {
                keys,
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
        "get" => Op::Get {
            id: f.string("id")?,
            spec: GetSpec {
                key: f.string("key")?.into_bytes(),
                rv: f.opt_string("rv")?.unwrap_or_default(),
            },
        },
        "range" => Op::Range {
            id: f.string("id")?,
            spec: RangeSpec {
                key: f.string("key")?.into_bytes(),
                range_end: f.opt_string("range_end")?.unwrap_or_default().into_bytes(),
                revision: f.opt_u64("revision")?.unwrap_or(0),
                linearizable: f.opt_bool("linearizable")?.unwrap_or(false),
                limit: f.opt_u64("limit")?.unwrap_or(0),
            },
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
