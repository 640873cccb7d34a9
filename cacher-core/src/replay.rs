//! The scenario replayer, and the driver the bindings share with it.
//!
//! A scenario (JSON: a config and a list of timed steps, each an [`Op`]; README.md lists the
//! format's additions) runs against a fresh [`Cacher`](crate::Cacher) in [`replay`], which
//! returns the trace: every output the core produced, in order, as flat records. It is a pure
//! function: the same scenario gives the same trace, byte for byte, on every host. Malformed
//! scenarios are a [`ScenarioError`] naming the step and field; a malformed *request* inside a
//! well-formed step is not an error but a `REJECTED` record, as a client would see it.
//!
//! The parts, each used by the replayer and by both bindings (Python, JS), so that a scenario,
//! a notebook and the browser demo drive the core the same way:
//!
//! | module | owns |
//! |---|---|
//! | [`driver`] | the run loop: time that fires every timer on the way, the output queue, automatic answers to `NEED_CURRENT_RV`, outputs as [`OutputItem`]s (one per watcher and event) |
//! | [`spec`] | client requests with their strings (keys, resource versions, selectors) parsed into the core's request types |
//! | [`surface`] | the configuration fields and the metrics as one list of names and values |
//! | [`trace`] | the trace records of the output items, and the golden-file text |
//! | [`scenario`] | the scenario format: config, steps, objects |
//! | [`json`] | reading JSON objects field by field (also the workload format of [`crate::simulate`]) |
//!
//! A binding is the driver plus its language's argument conversion and errors; it decides
//! nothing.
//!
//! Kubernetes counterpart: the table-driven tests of `pkg/storage/cacher/` (`cacher_test.go`,
//! `watch_cache_test.go`) and their fake clock, written down as data.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::Value;

use crate::output::RequestId;
use crate::status::Status;

pub mod driver;
pub mod json;
pub mod scenario;
pub mod spec;
pub mod surface;
pub mod trace;

pub use driver::{AdvanceError, Driver, OutputItem, ReadKind};
pub use scenario::{parse_object, Op, Scenario, Step};
pub use spec::{GetSpec, KeySpec, ListSpec, RangeSpec, WatchSpec};
pub use surface::{config_fields, metrics_fields, parse_config, FieldValue, CONFIG_FIELDS};
pub use trace::{record_of, records_of, trace_to_json, Item, Record};

/// A malformed scenario: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioError {
    /// A JSON path, e.g. `steps[3].rv` or `config.capacity`.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl ScenarioError {
    /// An error at `path` (`""`: the whole input).
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> ScenarioError {
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

// ----- running ------------------------------------------------------------------------------------

/// The most timer expirations one scenario may go through (about 11 days of 1-second ticks).
const MAX_TIMER_STEPS: u64 = 1_000_000;

/// The driver, with the scenario's names for its requests.
struct Replayer {
    driver: Driver,
    names: BTreeMap<RequestId, String>,
    ids: BTreeMap<String, RequestId>,
    trace: Vec<Record>,
}

impl Replayer {
    fn new(sc: &Scenario) -> Result<Replayer, ScenarioError> {
        let driver = Driver::new(sc.config.clone())
            .map_err(|e| ScenarioError::new(format!("config.{}", e.field), e.message))?;
        Ok(Replayer { driver, names: BTreeMap::new(), ids: BTreeMap::new(), trace: Vec::new() })
    }

    fn run(mut self, sc: &Scenario) -> Result<Vec<Record>, ScenarioError> {
        // Time is stepped through every deadline (ticks, progress requests, bookmarks): a step
        // far in the future would take as long as it says. The bound is for the whole scenario.
        let mut timer_steps: u64 = 0;
        for (i, step) in sc.steps.iter().enumerate() {
            let advanced = self.driver.advance(step.at, |_, _| {
                timer_steps += 1;
                if timer_steps > MAX_TIMER_STEPS {
                    Err(())
                } else {
                    Ok(())
                }
            });
            if advanced.is_err() {
                // Steps are in time order (checked by the parser): only the bound stops it.
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
            self.record();
            self.apply(i, step)?;
            self.record();
        }
        Ok(self.trace)
    }

    fn record(&mut self) {
        let (names, trace) = (&self.names, &mut self.trace);
        while let Some((at, out)) = self.driver.poll_output() {
            OutputItem::expand(at, out, &mut |item| trace.extend(record_of(&item, names)));
        }
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

    /// Names a request by its scenario id; a request rejected before it got an id is
    /// recorded as REJECTED and its name stays taken.
    fn bind(&mut self, id: &str, started: Result<RequestId, Status>) {
        match started {
            Ok(rid) => {
                self.ids.insert(id.to_owned(), rid);
                self.names.insert(rid, id.to_owned());
            }
            Err(status) => {
                self.ids.insert(id.to_owned(), RequestId(0));
                let at = self.driver.now_ms();
                self.trace.push(trace::rejected(at, Some(id.to_owned()), &status));
            }
        }
    }

    fn storage(i: usize, r: Result<(), crate::StorageError>) -> Result<(), ScenarioError> {
        r.map_err(|e| ScenarioError::new(format!("steps[{i}]"), e.to_string()))
    }

    fn apply(&mut self, i: usize, step: &Step) -> Result<(), ScenarioError> {
        let d = &mut self.driver;
        match &step.op {
            Op::Replace { rv, objects } => {
                Self::storage(i, d.handle_replace(*rv, objects.clone()))?
            }
            Op::Put { object, .. } => Self::storage(i, d.handle_put(object.clone()))?,
            Op::Delete { rv, key } => Self::storage(i, d.handle_delete(key.as_bytes(), *rv))?,
            Op::Txn { rv, changes } => Self::storage(i, d.handle_revision(*rv, changes.clone()))?,
            Op::Progress { rv } => Self::storage(i, d.handle_progress(*rv))?,
            Op::StorageError { reason } => d.handle_storage_error(reason),
            Op::EtcdRv { rv } => d.set_etcd_rv(*rv),
            Op::Compact { rv } => d.handle_compaction(*rv),
            Op::Watch { id, spec } => {
                self.claim(i, id)?;
                // A scenario's watch is a request at the API server: its request layer first.
                let started = spec
                    .to_request()
                    .and_then(|req| self.driver.through_request_layer(req))
                    .and_then(|req| self.driver.start_watch(req));
                self.bind(id, started);
            }
            Op::Consume { id, max } => {
                let rid = self.request_id(i, id)?;
                self.driver.consume(rid, *max);
            }
            Op::Credit { id, n } => {
                let rid = self.request_id(i, id)?;
                self.driver.grant_credit(rid, *n);
            }
            Op::StopWatch { id } => {
                let rid = self.request_id(i, id)?;
                self.driver.stop_watch(rid);
            }
            Op::List { id, spec } => {
                self.claim(i, id)?;
                let started = spec.to_request().and_then(|req| self.driver.list(req));
                self.bind(id, started);
            }
            Op::Get { id, spec } => {
                self.claim(i, id)?;
                let started = spec.to_request().and_then(|req| self.driver.get(req));
                self.bind(id, started);
            }
            Op::Range { id, spec } => {
                self.claim(i, id)?;
                let started = spec.to_request().and_then(|req| self.driver.range(req));
                self.bind(id, started);
            }
            Op::StopCacher => d.stop(),
            Op::Advance => {}
        }
        Ok(())
    }
}
