//! `watchcache._core`: the watch cache core for Python.
//!
//! A thin layer over `cacher-core`'s driver (`cacher_core::replay`): argument conversion (with
//! `TypeError`s that name the argument), the error mapping to the exception classes of
//! `watchcache._errors`, and the output items as Python objects. The run loop, the request
//! parsing, the output items and the config and metric names are the core's, shared with the
//! JS binding; nothing here decides anything.

use cacher_core::replay::{
    self as core_replay, config_fields, metrics_fields, AdvanceError, Driver, FieldValue, GetSpec,
    KeySpec, ListSpec, OutputItem, RangeSpec, Record, ScenarioError, WatchSpec,
};
use cacher_core::simulate as core_simulate;
use cacher_core::{
    Attrs, Change, Config, Key, Object, RangeOutcome, ReadOutcome, RequestId, Status, StorageError,
    WatchEvent,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::{intern, IntoPyObjectExt};

// ----- errors ------------------------------------------------------------------------------------

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let m = ERRORS.get_or_try_init(py, || py.import("watchcache._errors").map(Bound::unbind))?;
    m.bind(py).getattr(name)
}

/// The exception class of a client-facing status code (400 and 422 → InvalidRequest, 410 →
/// ResourceExpired, ...).
fn status_class(code: u16) -> &'static str {
    match code {
        400 | 422 => "InvalidRequest",
        404 => "NotFound",
        410 => "ResourceExpired",
        504 => "TooLargeResourceVersion",
        429 | 503 => "NotReady",
        _ => "WatchCacheError",
    }
}

/// The exception for a client-facing status.
fn status_error(py: Python<'_>, status: &Status) -> PyErr {
    let code = status.code();
    let reason = status.reason.as_str();
    make_error(py, status_class(code), code, reason, &status.message, status.retry_after_s)
}

fn make_error(
    py: Python<'_>,
    class: &str,
    code: u16,
    reason: &str,
    message: &str,
    retry_after_s: Option<u32>,
) -> PyErr {
    match error_class(py, class).and_then(|c| c.call1((code, reason, message, retry_after_s))) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

fn scenario_error(py: Python<'_>, e: &ScenarioError) -> PyErr {
    make_error(py, "ScenarioError", 400, "BadRequest", &e.to_string(), None)
}

fn storage_error(py: Python<'_>, e: &StorageError) -> PyErr {
    make_error(py, "StorageInputError", 400, "BadRequest", &e.to_string(), None)
}

fn config_error(py: Python<'_>, e: &ScenarioError) -> PyErr {
    let msg = e.to_string();
    let msg = msg.strip_prefix("config.").unwrap_or(&msg);
    make_error(py, "ConfigError", 400, "BadRequest", msg, None)
}

// ----- conversions in ------------------------------------------------------------------------------

fn type_error(arg: &str, want: &str, got: &Bound<'_, PyAny>) -> PyErr {
    let ty = got.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("{arg}: expected {want}, got {ty}"))
}

fn bytes_of(arg: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    Err(type_error(arg, "str or bytes", v))
}

fn string_map(arg: &str, v: Option<Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    let Some(v) = v.filter(|v| !v.is_none()) else { return Ok(Vec::new()) };
    let d = v.cast::<PyDict>().map_err(|_| type_error(arg, "a dict of str to str", &v))?;
    let mut out = Vec::with_capacity(d.len());
    for (k, val) in d.iter() {
        let k: String = k.extract().map_err(|_| type_error(arg, "str keys", &k))?;
        let val: String =
            val.extract().map_err(|_| type_error(&format!("{arg}[{k:?}]"), "str", &val))?;
        out.push((k, val));
    }
    Ok(out)
}

/// An object from a dict `{"key", "value", "rv", "labels", "fields"}`.
fn object_of(arg: &str, v: &Bound<'_, PyAny>, default_rv: u64) -> PyResult<Object> {
    let d = v
        .cast::<PyDict>()
        .map_err(|_| type_error(arg, "a dict with key, value, rv, labels, fields", v))?;
    for k in d.keys() {
        let name: String = k.extract().unwrap_or_default();
        if !matches!(name.as_str(), "key" | "value" | "rv" | "labels" | "fields") {
            return Err(PyValueError::new_err(format!(
                "{arg}: unknown field {name:?}; expected key, value, rv, labels, fields"
            )));
        }
    }
    let key = match d.get_item("key")? {
        Some(k) => bytes_of(&format!("{arg}['key']"), &k)?,
        None => return Err(PyValueError::new_err(format!("{arg}: 'key' is required"))),
    };
    if key.is_empty() {
        return Err(PyValueError::new_err(format!("{arg}: 'key' must not be empty")));
    }
    let value = match d.get_item("value")? {
        Some(v) if !v.is_none() => Some(bytes_of(&format!("{arg}['value']"), &v)?),
        _ => None,
    };
    let rv = match d.get_item("rv")? {
        Some(r) if !r.is_none() => r
            .extract::<u64>()
            .map_err(|_| type_error(&format!("{arg}['rv']"), "a non-negative int", &r))?,
        _ => default_rv,
    };
    let labels = string_map(&format!("{arg}['labels']"), d.get_item("labels")?)?;
    let fields = string_map(&format!("{arg}['fields']"), d.get_item("fields")?)?;
    Ok(Object::new(&key, value.as_deref(), rv).with_attrs(Attrs::new(labels, fields)))
}

/// A resourceVersion argument as the text a client sends (None: unset); parsed by the core.
fn rv_text(rv: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    match rv {
        None => Ok(String::new()),
        Some(rv) if rv.is_none() => Ok(String::new()),
        Some(rv) => {
            if let Ok(s) = rv.cast::<PyString>() {
                Ok(s.to_cow()?.into_owned())
            } else if let Ok(n) = rv.extract::<u64>() {
                Ok(n.to_string())
            } else {
                Err(type_error("rv", "str or non-negative int", rv))
            }
        }
    }
}

fn py_opt(v: Option<u64>) -> String {
    v.map_or_else(|| String::from("None"), |v| v.to_string())
}

// ----- conversions out ---------------------------------------------------------------------------

fn text<'py>(py: Python<'py>, b: Option<&[u8]>) -> PyResult<Bound<'py, PyAny>> {
    match b {
        None => Ok(py.None().into_bound(py)),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Ok(PyString::new(py, s).into_any()),
            Err(_) => Ok(PyBytes::new(py, b).into_any()),
        },
    }
}

/// A trace record as a dict, fields in trace order; absent fields are left out.
fn record_dict<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(intern!(py, "at"), r.at)?;
    if let Some(id) = &r.id {
        d.set_item(intern!(py, "id"), id)?;
    }
    d.set_item(intern!(py, "type"), r.kind)?;
    if let Some(v) = r.source {
        d.set_item(intern!(py, "source"), v)?;
    }
    if let Some(v) = &r.key {
        d.set_item(intern!(py, "key"), v)?;
    }
    if let Some(v) = r.rv {
        d.set_item(intern!(py, "rv"), v)?;
    }
    if let Some(v) = &r.value {
        d.set_item(intern!(py, "value"), v)?;
    }
    if let Some(a) = &r.annotations {
        d.set_item(intern!(py, "annotations"), a)?;
    }
    if let Some(v) = r.cause {
        d.set_item(intern!(py, "cause"), v)?;
    }
    if let Some(v) = r.code {
        d.set_item(intern!(py, "code"), v)?;
    }
    if let Some(v) = &r.reason {
        d.set_item(intern!(py, "reason"), v)?;
    }
    if let Some(v) = &r.message {
        d.set_item(intern!(py, "message"), v)?;
    }
    if let Some(v) = r.retry_after_s {
        d.set_item(intern!(py, "retry_after_s"), v)?;
    }
    if let Some(items) = &r.items {
        let list = PyList::empty(py);
        for it in items {
            let i = PyDict::new(py);
            i.set_item(intern!(py, "key"), &it.key)?;
            i.set_item(intern!(py, "rv"), it.rv)?;
            i.set_item(intern!(py, "value"), &it.value)?;
            list.append(i)?;
        }
        d.set_item(intern!(py, "items"), list)?;
    }
    if let Some(v) = &r.continue_token {
        d.set_item(intern!(py, "continue"), v)?;
    }
    if let Some(v) = r.remaining {
        d.set_item(intern!(py, "remaining"), v)?;
    }
    if let Some(v) = r.count {
        d.set_item(intern!(py, "count"), v)?;
    }
    if let Some(v) = r.more {
        d.set_item(intern!(py, "more"), v)?;
    }
    Ok(d)
}

fn trace_list<'py>(py: Python<'py>, trace: &[Record]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for r in trace {
        list.append(record_dict(py, r)?)?;
    }
    Ok(list)
}

/// A Python value (dicts, lists, str, int, float, bool, None) as JSON, without an
/// intermediate representation. Nesting is bounded so no input can exhaust the stack.
fn json_of(v: &Bound<'_, PyAny>, depth: usize) -> PyResult<serde_json::Value> {
    use pyo3::types::{PyBool, PyFloat, PyInt};
    use serde_json::Value;
    if depth > 128 {
        return Err(PyValueError::new_err("scenario nests deeper than 128 levels"));
    }
    if v.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut map = serde_json::Map::with_capacity(d.len());
        for (k, val) in d.iter() {
            let key = k
                .cast::<PyString>()
                .map_err(|_| type_error("scenario", "dicts with str keys", &k))?
                .to_cow()?
                .into_owned();
            map.insert(key, json_of(&val, depth + 1)?);
        }
        return Ok(Value::Object(map));
    }
    if v.cast::<PyBool>().is_ok() {
        return Ok(Value::Bool(v.extract()?));
    }
    if v.cast::<PyInt>().is_ok() {
        if let Ok(n) = v.extract::<u64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = v.extract::<i64>() {
            return Ok(Value::from(n));
        }
        return Err(PyValueError::new_err(format!("integer {v} is out of range")));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return serde_json::Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err("NaN and infinity are not JSON"));
    }
    if let Ok(l) = v.cast::<PyList>() {
        return l
            .iter()
            .map(|x| json_of(&x, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    if let Ok(t) = v.cast::<PyTuple>() {
        return t
            .iter()
            .map(|x| json_of(&x, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    Err(type_error("scenario", "JSON-like values (dict, list, str, int, float, bool, None)", v))
}

fn scenario_value(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    json_of(v, 0).map_err(|e| {
        if e.is_instance_of::<PyTypeError>(py) {
            e
        } else {
            make_error(py, "ScenarioError", 400, "BadRequest", &e.value(py).to_string(), None)
        }
    })
}

// ----- replay --------------------------------------------------------------------------------------

/// A scenario or workload argument: JSON text, or a dict converted straight to JSON.
enum JsonInput {
    Text(String),
    Value(serde_json::Value),
}

fn json_input(py: Python<'_>, arg: &str, v: &Bound<'_, PyAny>) -> PyResult<JsonInput> {
    if let Ok(s) = v.cast::<PyString>() {
        Ok(JsonInput::Text(s.to_cow()?.into_owned()))
    } else if v.cast::<PyDict>().is_ok() {
        scenario_value(py, v).map(JsonInput::Value)
    } else {
        Err(type_error(arg, "a dict or a JSON string", v))
    }
}

fn scenario_trace(py: Python<'_>, scenario: &Bound<'_, PyAny>) -> PyResult<Vec<Record>> {
    let trace = match json_input(py, "scenario", scenario)? {
        JsonInput::Text(text) => py.detach(|| core_replay::replay_str(&text)),
        JsonInput::Value(value) => py.detach(|| core_replay::replay(&value)),
    };
    trace.map_err(|e| scenario_error(py, &e))
}

/// Replays a scenario (a dict, or its JSON text) and returns its trace as a list of dicts,
/// the same records as the Rust replayer's, in the same order.
#[pyfunction]
fn replay<'py>(py: Python<'py>, scenario: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    trace_list(py, &scenario_trace(py, scenario)?)
}

/// Replays a scenario and returns the trace as JSON text, byte for byte what
/// `watchcache replay FILE` prints (the golden-file format).
#[pyfunction]
fn replay_json(py: Python<'_>, scenario: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(core_replay::trace_to_json(&scenario_trace(py, scenario)?))
}

// ----- simulate ------------------------------------------------------------------------------------

/// Runs a workload simulation (a dict, or its JSON text) and returns its report as a dict:
/// ``summary`` (totals: events written, deliveries, bookmarks, 410s, relists, etcd range
/// requests and objects, terminations, delivery-lag percentiles, peak ring capacity, ...) and
/// ``series`` (one dict per simulated second: window span in RVs and seconds, capacity, 410s,
/// relists, etcd reads, connected watchers). Deterministic for a seed: it drives the real core
/// with simulated time, so an hour of load runs in seconds. A malformed workload raises
/// ``ScenarioError`` naming the field.
///
/// >>> import watchcache
/// >>> r = watchcache.simulate({"duration_s": 60, "seed": 1, "writes": {"rate_per_s": 20},
/// ...                          "watchers": {"count": 50, "selector_fraction": 0.1}})
/// >>> s = r["summary"]
/// >>> s["deliveries"] == 5 * s["events_written"], s["watch_410"], len(r["series"])
/// (True, 0, 60)
/// >>> r = watchcache.simulate('{"duration_s": 30, "watchers": {"count": 10},'
/// ...                         ' "restarts": [{"at_s": 10, "outage_s": 5}]}')
/// >>> r["summary"]["relists"], [x["t_s"] for x in r["series"] if not x["ready"]]
/// (10, [11, 12, 13, 14, 15])
/// >>> watchcache.simulate({"writes": {"rate_per_s": -1}})
/// Traceback (most recent call last):
/// ...
/// watchcache._errors.ScenarioError: writes.rate_per_s: must be a non-negative number, got -1
#[pyfunction]
fn simulate<'py>(py: Python<'py>, workload: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let result = match json_input(py, "workload", workload)? {
        JsonInput::Text(text) => py.detach(|| core_simulate::simulate_str(&text)),
        JsonInput::Value(value) => py.detach(|| core_simulate::simulate(&value)),
    };
    let report = result
        .map_err(|e| make_error(py, "ScenarioError", 400, "BadRequest", &e.to_string(), None))?;
    let text = core_simulate::report_to_json(&report);
    py.import(intern!(py, "json"))?.call_method1(intern!(py, "loads"), (text,))
}

// ----- output objects ----------------------------------------------------------------------------

/// A watch item as the client sees it: ADDED, MODIFIED, DELETED or BOOKMARK.
#[pyclass(frozen, get_all, module = "watchcache")]
struct WatchItem {
    /// Milliseconds at which the core produced it.
    at: u64,
    /// The watch's id.
    id: u64,
    /// ADDED, MODIFIED, DELETED or BOOKMARK.
    r#type: &'static str,
    /// The object's key (None for BOOKMARK).
    key: Option<Py<PyAny>>,
    /// The resourceVersion the client sees.
    rv: u64,
    /// The object's value (for DELETED, the last stored value).
    value: Option<Py<PyAny>>,
    /// True on the initial-events-end bookmark.
    initial_events_end: bool,
}

#[pymethods]
impl WatchItem {
    #[classattr]
    fn __match_args__(
    ) -> (&'static str, &'static str, &'static str, &'static str, &'static str, &'static str) {
        ("at", "id", "type", "key", "rv", "value")
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("at", self.at)?;
        d.set_item("id", self.id)?;
        d.set_item("type", self.r#type)?;
        if let Some(k) = &self.key {
            d.set_item("key", k)?;
        }
        d.set_item("rv", self.rv)?;
        if self.r#type != "BOOKMARK" {
            d.set_item("value", &self.value)?;
        }
        if self.initial_events_end {
            let a = PyDict::new(py);
            a.set_item("k8s.io/initial-events-end", "true")?;
            d.set_item("annotations", a)?;
        }
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let key = match &self.key {
            Some(k) => k.bind(py).repr().map(|r| r.to_string()).unwrap_or_default(),
            None => String::from("None"),
        };
        format!(
            "WatchItem(at={}, id={}, type='{}', key={key}, rv={})",
            self.at, self.id, self.r#type, self.rv
        )
    }
}

/// Generates a simple frozen output class with `to_dict`, `__match_args__` and `__repr__`.
macro_rules! output_class {
    ($(#[$doc:meta])* $name:ident, $ty:literal, { $($(#[$fdoc:meta])* $field:ident : $fty:ty),* }) => {
        $(#[$doc])*
        #[pyclass(frozen, get_all, module = "watchcache")]
        struct $name {
            /// Milliseconds at which the core produced it.
            at: u64,
            $($(#[$fdoc])* $field: $fty),*
        }

        #[pymethods]
        impl $name {
            #[classattr]
            fn __match_args__(py: Python<'_>) -> PyResult<Py<PyTuple>> {
                PyTuple::new(py, ["at" $(, stringify!($field))*]).map(Bound::unbind)
            }

            /// The output's type, as in the trace and in JS.
            #[getter]
            #[pyo3(name = "type")]
            fn type_str(&self) -> &'static str {
                $ty
            }

            /// The record as a dict (the trace's field names).
            fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                d.set_item("at", self.at)?;
                d.set_item("type", $ty)?;
                $(d.set_item(stringify!($field), &self.$field)?;)*
                Ok(d)
            }

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let _ = py;
                let parts: Vec<String> = vec![format!("at={}", self.at) $(, format!("{}={}", stringify!($field), (&self.$field).into_bound_py_any(py)?.repr()?))*];
                Ok(format!("{}({})", stringify!($name), parts.join(", ")))
            }
        }
    };
}

output_class!(
    /// A watch is registered; change events after `rv` follow.
    WatchStarted, "STARTED", {
    /// The watch's id.
    id: u64,
    /// Changes after this resourceVersion are delivered.
    rv: u64,
    /// Where its initial events come from: "store", "ring" or "none".
    initial: &'static str
});
output_class!(
    /// An ERROR item on an open watch; a WatchClosed follows.
    WatchError, "ERROR", {
    /// The watch's id.
    id: u64,
    /// HTTP-style code (410, 504, 500).
    code: u16,
    /// Status reason (Expired, Timeout, InternalError).
    reason: &'static str,
    /// Status message.
    message: String,
    /// Retry-After, in seconds.
    retry_after_s: Option<u32>
});
output_class!(
    /// The end of a watch.
    WatchClosed, "CLOSED", {
    /// The watch's id.
    id: u64,
    /// unresponsive, stopped, reinitializing, timeout or error.
    cause: &'static str,
    /// The last resourceVersion the client was given.
    last_rv: u64,
    /// Detail, if any.
    message: Option<String>
});
output_class!(
    /// A watch the host must serve from storage.
    WatchDelegated, "WATCH", {
    /// The watch's id.
    id: u64,
    /// Why.
    reason: &'static str,
    /// "storage".
    source: &'static str
});
output_class!(
    /// A request that failed (not started, or a list/get that failed).
    Rejected, "REJECTED", {
    /// The request's id.
    id: u64,
    /// HTTP-style code (400, 404, 410, 429, 503, 504).
    code: u16,
    /// Status reason.
    reason: &'static str,
    /// Status message.
    message: String,
    /// Retry-After, in seconds.
    retry_after_s: Option<u32>
});
output_class!(
    /// The core asks storage for a progress notification.
    RequestProgress, "REQUEST_PROGRESS", {});
output_class!(
    /// The core asks storage for its current revision (answered automatically unless
    /// `Cacher.auto_current_revision` is False).
    NeedCurrentRevision, "NEED_CURRENT_RV", {
    /// The waiting request's id.
    id: u64
});
output_class!(
    /// The core asks for a relist.
    Relist, "RELIST", {
    /// Why.
    reason: String
});

#[pymethods]
impl Rejected {
    /// The typed exception for this rejection (InvalidRequest, NotFound, ResourceExpired,
    /// TooLargeResourceVersion, NotReady, or WatchCacheError).
    #[getter]
    fn error(&self, py: Python<'_>) -> Py<PyAny> {
        let (code, reason, retry) = (self.code, self.reason, self.retry_after_s);
        make_error(py, status_class(code), code, reason, &self.message, retry)
            .into_value(py)
            .into_any()
    }
}

#[pymethods]
impl WatchError {
    /// The typed exception for this error (ResourceExpired for 410, ...).
    #[getter]
    fn error(&self, py: Python<'_>) -> Py<PyAny> {
        let (code, reason, retry) = (self.code, self.reason, self.retry_after_s);
        make_error(py, status_class(code), code, reason, &self.message, retry)
            .into_value(py)
            .into_any()
    }
}

/// An object in a read result.
#[pyclass(frozen, get_all, module = "watchcache")]
struct Item {
    /// Key.
    key: Py<PyAny>,
    /// Its own resourceVersion.
    rv: u64,
    /// Value.
    value: Option<Py<PyAny>>,
    /// Labels.
    labels: Py<PyDict>,
    /// Fields.
    fields: Py<PyDict>,
}

#[pymethods]
impl Item {
    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str) {
        ("key", "rv", "value")
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("key", &self.key)?;
        d.set_item("rv", self.rv)?;
        d.set_item("value", &self.value)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("Item(key={}, rv={})", self.key.bind(py), self.rv)
    }
}

/// A list or get result: served from the cache (with items) or sent to storage.
#[pyclass(frozen, get_all, module = "watchcache")]
struct ReadResult {
    /// Milliseconds at which the core produced it.
    at: u64,
    /// The request's id.
    id: u64,
    /// "LIST" or "GET".
    r#type: &'static str,
    /// "cache" or "storage".
    source: &'static str,
    /// Why it is answered there.
    reason: &'static str,
    /// The resourceVersion of a cache result.
    rv: Option<u64>,
    /// The objects of a cache result.
    items: Py<PyTuple>,
    /// The continue token of a page.
    continue_token: Option<String>,
    /// remainingItemCount of a page.
    remaining: Option<u64>,
}

#[pymethods]
impl ReadResult {
    #[classattr]
    fn __match_args__(
    ) -> (&'static str, &'static str, &'static str, &'static str, &'static str, &'static str) {
        ("at", "id", "type", "source", "rv", "items")
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("at", self.at)?;
        d.set_item("id", self.id)?;
        d.set_item("type", self.r#type)?;
        d.set_item("source", self.source)?;
        d.set_item("reason", self.reason)?;
        if self.source == "cache" {
            d.set_item("rv", self.rv)?;
            let items = PyList::empty(py);
            for it in self.items.bind(py).iter() {
                items.append(it.cast::<Item>()?.get().to_dict(py)?)?;
            }
            d.set_item("items", items)?;
            if let Some(c) = &self.continue_token {
                d.set_item("continue", c)?;
            }
            if let Some(r) = self.remaining {
                d.set_item("remaining", r)?;
            }
        }
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ReadResult(at={}, id={}, type={}, source={}, rv={:?}, items={})",
            self.at,
            self.id,
            self.r#type,
            self.source,
            self.rv,
            self.items.bind(py).len()
        )
    }
}

/// An etcd-style range result: served from the cache (with count and more) or sent to storage.
#[pyclass(frozen, get_all, module = "watchcache")]
struct RangeResult {
    /// Milliseconds at which the core produced it.
    at: u64,
    /// The request's id.
    id: u64,
    /// "cache" or "storage".
    source: &'static str,
    /// Why it is answered there.
    reason: &'static str,
    /// The cache's revision (etcd's header.revision), for a cache result.
    rv: Option<u64>,
    /// The objects (at most the limit).
    items: Py<PyTuple>,
    /// Keys in the range (etcd's count).
    count: Option<u64>,
    /// More keys than returned (etcd's more).
    more: Option<bool>,
}

#[pymethods]
impl RangeResult {
    /// "RANGE".
    #[getter]
    #[pyo3(name = "type")]
    fn type_str(&self) -> &'static str {
        "RANGE"
    }

    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str, &'static str, &'static str) {
        ("at", "id", "source", "rv", "items")
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("at", self.at)?;
        d.set_item("id", self.id)?;
        d.set_item("type", "RANGE")?;
        d.set_item("source", self.source)?;
        d.set_item("reason", self.reason)?;
        if self.source == "cache" {
            d.set_item("rv", self.rv)?;
            let items = PyList::empty(py);
            for it in self.items.bind(py).iter() {
                items.append(it.cast::<Item>()?.get().to_dict(py)?)?;
            }
            d.set_item("items", items)?;
            d.set_item("count", self.count)?;
            d.set_item("more", self.more)?;
        }
        Ok(d)
    }
}

// ----- output items as Python objects -------------------------------------------------------------

fn item_of(py: Python<'_>, o: &Object) -> PyResult<Item> {
    let labels = PyDict::new(py);
    let fields = PyDict::new(py);
    if let Some(a) = o.attrs() {
        for (k, v) in a.labels() {
            labels.set_item(k, v)?;
        }
        for (k, v) in a.fields() {
            fields.set_item(k, v)?;
        }
    }
    Ok(Item {
        key: text(py, Some(o.key()))?.unbind(),
        rv: o.rv(),
        value: o.value().map(|v| text(py, Some(v))).transpose()?.map(Bound::unbind),
        labels: labels.unbind(),
        fields: fields.unbind(),
    })
}

fn items_of<'a>(
    py: Python<'_>,
    objects: impl Iterator<Item = &'a std::sync::Arc<Object>>,
) -> PyResult<Py<PyTuple>> {
    let items: Vec<Py<Item>> =
        objects.map(|o| Py::new(py, item_of(py, o)?)).collect::<PyResult<_>>()?;
    Ok(PyTuple::new(py, items)?.unbind())
}

fn watch_item(py: Python<'_>, at: u64, id: RequestId, e: &WatchEvent) -> PyResult<WatchItem> {
    let o = e.object();
    Ok(WatchItem {
        at,
        id: id.0,
        r#type: e.type_str(),
        key: o.map(|o| text(py, Some(o.key()))).transpose()?.map(Bound::unbind),
        rv: e.rv(),
        value: o.and_then(|o| o.value()).map(|v| text(py, Some(v))).transpose()?.map(Bound::unbind),
        initial_events_end: matches!(e, WatchEvent::Bookmark { initial_events_end: true, .. }),
    })
}

/// The Python object of one output item (the core's model; JS maps the same one).
fn output_object(py: Python<'_>, item: OutputItem) -> PyResult<Py<PyAny>> {
    let obj = match item {
        OutputItem::Event { at, watch, event } => {
            watch_item(py, at, watch, &event)?.into_py_any(py)?
        }
        OutputItem::Started { at, watch, rv, initial } => {
            WatchStarted { at, id: watch.0, rv, initial: initial.as_str() }.into_py_any(py)?
        }
        OutputItem::Error { at, watch, status } => WatchError {
            at,
            id: watch.0,
            code: status.code(),
            reason: status.reason.as_str(),
            message: status.message,
            retry_after_s: status.retry_after_s,
        }
        .into_py_any(py)?,
        OutputItem::Closed { at, watch, cause, last_rv, message } => {
            WatchClosed { at, id: watch.0, cause: cause.as_str(), last_rv, message }
                .into_py_any(py)?
        }
        OutputItem::Delegated { at, watch, reason } => {
            WatchDelegated { at, id: watch.0, reason, source: "storage" }.into_py_any(py)?
        }
        OutputItem::Read { at, request, kind, outcome } => {
            let base = |source, reason, items| ReadResult {
                at,
                id: request.0,
                r#type: kind.as_str(),
                source,
                reason,
                rv: None,
                items,
                continue_token: None,
                remaining: None,
            };
            match outcome {
                ReadOutcome::Storage { reason } => {
                    base("storage", reason, PyTuple::empty(py).unbind())
                }
                ReadOutcome::Cache(r) => ReadResult {
                    rv: Some(r.rv),
                    continue_token: r.continue_token,
                    remaining: r.remaining,
                    ..base("cache", r.reason, items_of(py, r.items.iter())?)
                },
            }
            .into_py_any(py)?
        }
        OutputItem::Range { at, request, outcome } => match outcome {
            RangeOutcome::Storage { reason } => RangeResult {
                at,
                id: request.0,
                source: "storage",
                reason,
                rv: None,
                items: PyTuple::empty(py).unbind(),
                count: None,
                more: None,
            },
            RangeOutcome::Cache(r) => RangeResult {
                at,
                id: request.0,
                source: "cache",
                reason: r.reason,
                rv: Some(r.header_rv),
                items: items_of(py, r.items.iter())?,
                count: Some(r.count),
                more: Some(r.more),
            },
        }
        .into_py_any(py)?,
        OutputItem::Rejected { at, request, status } => Rejected {
            at,
            id: request.0,
            code: status.code(),
            reason: status.reason.as_str(),
            message: status.message,
            retry_after_s: status.retry_after_s,
        }
        .into_py_any(py)?,
        OutputItem::RequestProgress { at } => RequestProgress { at }.into_py_any(py)?,
        OutputItem::NeedCurrentRevision { at, request } => {
            NeedCurrentRevision { at, id: request.0 }.into_py_any(py)?
        }
        OutputItem::Relist { at, reason } => Relist { at, reason }.into_py_any(py)?,
    };
    Ok(obj)
}

/// A config or metric value as a Python object.
fn field_object(py: Python<'_>, v: FieldValue<'_>) -> PyResult<Py<PyAny>> {
    match v {
        FieldValue::Null => Ok(py.None()),
        FieldValue::Bool(b) => b.into_py_any(py),
        FieldValue::Size(n) | FieldValue::Count(n) => n.into_py_any(py),
        FieldValue::Float(x) => x.into_py_any(py),
        FieldValue::Str(s) => s.into_py_any(py),
        FieldValue::CountsBy(m) => m.clone().into_py_any(py),
        FieldValue::Counts(c) => c.to_vec().into_py_any(py),
    }
}

fn fields_dict<'py, 'a>(
    py: Python<'py>,
    fields: impl IntoIterator<Item = (&'static str, FieldValue<'a>)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, v) in fields {
        d.set_item(name, field_object(py, v)?)?;
    }
    Ok(d)
}

// ----- the Cacher ----------------------------------------------------------------------------------

/// The watch cache core, driven with explicit time (`now_ms`, milliseconds).
///
/// Keyword arguments are the core's config, as in a scenario's "config"
/// (e.g. `profile="v1.34"`, `capacity=100`, `index_field="spec.nodeName"`).
///
/// >>> import watchcache
/// >>> c = watchcache.Cacher(capacity=3, dynamic_capacity=False)
/// >>> c.handle_replace(0, 9, [])
/// >>> c.handle_put(10, {"key": "/pods/ns/a", "value": "v1", "rv": 10})
/// >>> w = c.start_watch(20, "/pods/", rv="9")
/// >>> [o.type for o in c.drain()]
/// ['STARTED', 'ADDED']
/// >>> c.window.oldest_rv, c.window.newest_rv, c.resource_version
/// (10, 10, 10)
#[pyclass(module = "watchcache", unsendable)]
struct Cacher {
    driver: Driver,
}

impl Cacher {
    /// Moves time to `now_ms`, firing every timer due by then. A far `now_ms` can mean
    /// millions of deadlines (a dispatch tick per second): Ctrl-C interrupts it
    /// (KeyboardInterrupt), leaving the cacher at the last deadline it reached.
    fn step(&mut self, py: Python<'_>, now_ms: u64) -> PyResult<()> {
        let check = |n: u64, _| if n % 8192 == 0 { py.check_signals() } else { Ok(()) };
        self.driver.advance(now_ms, check).map_err(|e| match e {
            AdvanceError::Stopped(interrupt) => interrupt,
            e @ AdvanceError::TimeGoesBack { .. } => PyValueError::new_err(format!("now_ms: {e}")),
        })
    }
}

#[pymethods]
impl Cacher {
    #[new]
    #[pyo3(signature = (**config))]
    fn new(py: Python<'_>, config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let cfg = match config {
            None => Config::default(),
            Some(d) => {
                let value = json_of(d.as_any(), 0)?;
                core_replay::parse_config(&value, "config").map_err(|e| config_error(py, &e))?
            }
        };
        let driver = Driver::new(cfg).map_err(|e| {
            let msg = format!("{}: {}", e.field, e.message);
            make_error(py, "ConfigError", 400, "BadRequest", &msg, None)
        })?;
        Ok(Cacher { driver })
    }

    /// Answer NEED_CURRENT_RV with max(etcd_rv, every RV stored), as the replayer does.
    #[getter]
    fn auto_current_revision(&self) -> bool {
        self.driver.auto_current_revision()
    }

    #[setter]
    fn set_auto_current_revision(&mut self, on: bool) {
        self.driver.set_auto_current_revision(on);
    }

    // --- storage inputs

    /// A (re)list completed at `rv` with `objects` (dicts: key, value, rv, labels, fields).
    fn handle_replace(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        rv: u64,
        objects: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let list = objects
            .cast::<PyList>()
            .map_err(|_| type_error("objects", "a list of dicts", objects))?;
        let objs = list
            .iter()
            .enumerate()
            .map(|(i, o)| object_of(&format!("objects[{i}]"), &o, rv))
            .collect::<PyResult<Vec<_>>>()?;
        self.step(py, now_ms)?;
        self.driver.handle_replace(rv, objs).map_err(|e| storage_error(py, &e))
    }

    /// A storage put (create or update). `object["rv"]` is the event's resourceVersion.
    fn handle_put(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        object: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let o = object_of("object", object, 0)?;
        if o.rv() == 0 {
            return Err(PyValueError::new_err(
                "object: 'rv' (the event's resourceVersion) is required",
            ));
        }
        self.step(py, now_ms)?;
        self.driver.handle_put(o).map_err(|e| storage_error(py, &e))
    }

    /// A storage delete of `key` at `rv`.
    fn handle_delete(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        key: &Bound<'_, PyAny>,
        rv: u64,
    ) -> PyResult<()> {
        let key = bytes_of("key", key)?;
        self.step(py, now_ms)?;
        self.driver.handle_delete(&key, rv).map_err(|e| storage_error(py, &e))
    }

    /// Every change of one revision at once: `changes` is a list of `("put", object)` and
    /// `("delete", key)`.
    fn handle_txn(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        rv: u64,
        changes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let list = changes
            .cast::<PyList>()
            .map_err(|_| type_error("changes", "a list of (op, arg) tuples", changes))?;
        let mut out = Vec::with_capacity(list.len());
        for (i, c) in list.iter().enumerate() {
            let (op, arg): (String, Bound<'_, PyAny>) = c.extract().map_err(|_| {
                type_error(&format!("changes[{i}]"), "a (\"put\" | \"delete\", value) tuple", &c)
            })?;
            out.push(match op.as_str() {
                "put" => Change::Put(object_of(&format!("changes[{i}][1]"), &arg, rv)?),
                "delete" => Change::Delete(Key::new(&bytes_of(&format!("changes[{i}][1]"), &arg)?)),
                other => {
                    return Err(PyValueError::new_err(format!(
                        "changes[{i}]: unknown op {other:?}; expected \"put\" or \"delete\""
                    )))
                }
            });
        }
        self.step(py, now_ms)?;
        self.driver.handle_revision(rv, out).map_err(|e| storage_error(py, &e))
    }

    /// A storage progress notify at `rv`.
    fn handle_progress(&mut self, py: Python<'_>, now_ms: u64, rv: u64) -> PyResult<()> {
        self.step(py, now_ms)?;
        self.driver.handle_progress(rv).map_err(|e| storage_error(py, &e))
    }

    /// The upstream watch broke: the cache must relist.
    #[pyo3(signature = (now_ms, reason = "watch failed"))]
    fn handle_storage_error(&mut self, py: Python<'_>, now_ms: u64, reason: &str) -> PyResult<()> {
        self.step(py, now_ms)?;
        self.driver.handle_storage_error(reason);
        Ok(())
    }

    /// Storage's current revision for a NEED_CURRENT_RV (when auto_current_revision is off).
    fn handle_current_revision(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        request_id: u64,
        rv: u64,
    ) -> PyResult<()> {
        self.step(py, now_ms)?;
        self.driver.handle_current_revision(RequestId(request_id), rv);
        Ok(())
    }

    /// Storage compacted its history at `rv`.
    fn handle_compaction(&mut self, py: Python<'_>, now_ms: u64, rv: u64) -> PyResult<()> {
        self.step(py, now_ms)?;
        self.driver.handle_compaction(rv);
        Ok(())
    }

    /// Sets storage's current revision, used to answer NEED_CURRENT_RV automatically.
    fn set_etcd_rv(&mut self, rv: u64) {
        self.driver.set_etcd_rv(rv);
    }

    /// Stops the cacher for good.
    fn stop(&mut self, py: Python<'_>, now_ms: u64) -> PyResult<()> {
        self.step(py, now_ms)?;
        self.driver.stop();
        Ok(())
    }

    // --- client commands

    /// Starts a watch; returns its id. Bad options raise InvalidRequest. `request_layer=True`
    /// applies the API server's request layer first, as scenario watches get it (with WatchList
    /// on, an RV "" or "0" watch becomes a watch-list); the default is the cacher alone.
    #[pyo3(signature = (now_ms, key, *, recursive = true, range_end = None, rv = None,
        send_initial_events = None, allow_bookmarks = false, label_selector = "",
        field_selector = "", timeout_ms = None, consume = "auto", slow_policy = "terminate",
        queue_capacity = None, request_layer = false))]
    #[allow(clippy::too_many_arguments)]
    fn start_watch(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        key: &Bound<'_, PyAny>,
        recursive: bool,
        range_end: Option<&Bound<'_, PyAny>>,
        rv: Option<&Bound<'_, PyAny>>,
        send_initial_events: Option<bool>,
        allow_bookmarks: bool,
        label_selector: &str,
        field_selector: &str,
        timeout_ms: Option<u64>,
        consume: &str,
        slow_policy: &str,
        queue_capacity: Option<usize>,
        request_layer: bool,
    ) -> PyResult<u64> {
        let key = bytes_of("key", key)?;
        let keys = match range_end {
            Some(end) if !end.is_none() => {
                KeySpec::Etcd { key, range_end: bytes_of("range_end", end)? }
            }
            _ => KeySpec::Kubernetes {
                key: String::from_utf8(key).map_err(|_| {
                    PyValueError::new_err(
                        "key: a Kubernetes key must be UTF-8 (use range_end for byte ranges)",
                    )
                })?,
                recursive,
            },
        };
        let spec = WatchSpec {
            keys,
            rv: rv_text(rv)?,
            send_initial_events,
            allow_bookmarks,
            label_selector: label_selector.to_owned(),
            field_selector: field_selector.to_owned(),
            timeout_ms,
            consume: core_replay::spec::parse_consume(consume)
                .map_err(|m| PyValueError::new_err(format!("consume: {m}")))?,
            slow_policy: core_replay::spec::parse_slow_policy(slow_policy)
                .map_err(|m| PyValueError::new_err(format!("slow_policy: {m}")))?,
            queue_capacity,
        };
        let mut req = spec.to_request().map_err(|st| status_error(py, &st))?;
        if request_layer {
            req = self.driver.through_request_layer(req).map_err(|st| status_error(py, &st))?;
        }
        self.step(py, now_ms)?;
        let id = self.driver.start_watch(req).map_err(|st| status_error(py, &st))?;
        Ok(id.0)
    }

    /// The client of a watch goes away. Returns False if it was not open.
    fn stop_watch(&mut self, py: Python<'_>, now_ms: u64, id: u64) -> PyResult<bool> {
        self.step(py, now_ms)?;
        Ok(self.driver.stop_watch(RequestId(id)))
    }

    /// A manual watcher's client reads up to `max` queued events (None = all).
    #[pyo3(signature = (now_ms, id, max = None))]
    fn consume(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        id: u64,
        max: Option<u64>,
    ) -> PyResult<usize> {
        self.step(py, now_ms)?;
        Ok(self.driver.consume(RequestId(id), max))
    }

    /// Gives a manual watcher credit for `n` more events.
    fn grant_credit(&mut self, py: Python<'_>, now_ms: u64, id: u64, n: u64) -> PyResult<usize> {
        self.step(py, now_ms)?;
        Ok(self.driver.grant_credit(RequestId(id), n))
    }

    /// Starts a list; returns its id (the result is an output).
    #[pyo3(signature = (now_ms, key, *, recursive = true, rv = None, rv_match = None, limit = 0,
        continue_token = None, label_selector = "", field_selector = ""))]
    #[allow(clippy::too_many_arguments)]
    fn list(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        key: &str,
        recursive: bool,
        rv: Option<&Bound<'_, PyAny>>,
        rv_match: Option<&str>,
        limit: u64,
        continue_token: Option<String>,
        label_selector: &str,
        field_selector: &str,
    ) -> PyResult<u64> {
        let spec = ListSpec {
            key: key.to_owned(),
            recursive,
            rv: rv_text(rv)?,
            rv_match: rv_match.unwrap_or("").to_owned(),
            limit,
            continue_token,
            label_selector: label_selector.to_owned(),
            field_selector: field_selector.to_owned(),
        };
        let req = spec.to_request().map_err(|st| status_error(py, &st))?;
        self.step(py, now_ms)?;
        let id = self.driver.list(req).map_err(|st| status_error(py, &st))?;
        Ok(id.0)
    }

    /// Starts a get of one key; returns its id.
    #[pyo3(signature = (now_ms, key, *, rv = None))]
    fn get(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        key: &Bound<'_, PyAny>,
        rv: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let spec = GetSpec { key: bytes_of("key", key)?, rv: rv_text(rv)? };
        let req = spec.to_request().map_err(|st| status_error(py, &st))?;
        self.step(py, now_ms)?;
        let id = self.driver.get(req).map_err(|st| status_error(py, &st))?;
        Ok(id.0)
    }

    /// Starts an etcd-style range read (`revision` 0 = latest; `linearizable` catches up with
    /// storage first); returns its id (the result is a RangeResult output).
    #[pyo3(signature = (now_ms, key, *, range_end = None, revision = 0, linearizable = false, limit = 0))]
    #[allow(clippy::too_many_arguments)]
    fn range(
        &mut self,
        py: Python<'_>,
        now_ms: u64,
        key: &Bound<'_, PyAny>,
        range_end: Option<&Bound<'_, PyAny>>,
        revision: u64,
        linearizable: bool,
        limit: u64,
    ) -> PyResult<u64> {
        let spec = RangeSpec {
            key: bytes_of("key", key)?,
            range_end: match range_end {
                Some(e) if !e.is_none() => bytes_of("range_end", e)?,
                _ => Vec::new(),
            },
            revision,
            linearizable,
            limit,
        };
        let req = spec.to_request().map_err(|st| status_error(py, &st))?;
        self.step(py, now_ms)?;
        let id = self.driver.range(req).map_err(|st| status_error(py, &st))?;
        Ok(id.0)
    }

    // --- polls

    /// Moves time to `now_ms`, firing every timer due by then at its own deadline.
    fn advance(&mut self, py: Python<'_>, now_ms: u64) -> PyResult<()> {
        self.step(py, now_ms)
    }

    /// The next output, or None (a fan-out, or several events for one watcher, comes out one
    /// item per call, in the order drain gives).
    fn poll_output(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.driver.poll_item().map(|item| output_object(py, item)).transpose()
    }

    /// Every output produced so far, in order (fan-outs as one item per watcher).
    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        while let Some(item) = self.driver.poll_item() {
            list.append(output_object(py, item)?)?;
        }
        Ok(list)
    }

    /// The next deadline as (ms, reason), or None.
    fn poll_timeout(&self) -> Option<(u64, &'static str)> {
        self.driver.cacher().poll_timeout().map(|(t, r)| (t.as_millis(), r.as_str()))
    }

    // --- getters

    /// Current time (the last now_ms given).
    #[getter]
    fn now_ms(&self) -> u64 {
        self.driver.now_ms()
    }

    /// The cache's resourceVersion.
    #[getter]
    fn resource_version(&self) -> u64 {
        self.driver.cacher().resource_version()
    }

    /// The RV of the last list.
    #[getter]
    fn list_resource_version(&self) -> u64 {
        self.driver.cacher().list_resource_version()
    }

    /// "pending", "ready" or "stopped".
    #[getter]
    fn ready_state(&self) -> &'static str {
        self.driver.cacher().ready_state().as_str()
    }

    /// Objects in the store.
    #[getter]
    fn store_len(&self) -> usize {
        self.driver.cacher().store_len()
    }

    /// The ring buffer's window.
    #[getter]
    fn window(&self) -> Window {
        let w = self.driver.cacher().window();
        Window {
            oldest_rv: w.oldest_rv,
            newest_rv: w.newest_rv,
            oldest_servable: w.oldest_servable,
            len: w.len,
            capacity: w.capacity,
            start_index: w.start_index,
            end_index: w.end_index,
            evicted_since_relist: w.evicted_since_relist,
        }
    }

    /// The buffered events, oldest first, as (rv, key, is_delete).
    fn window_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for (rv, key, del) in self.driver.cacher().window_events() {
            list.append((rv, text(py, Some(key))?, del))?;
        }
        Ok(list)
    }

    /// The stored objects, in key order.
    fn objects<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for o in self.driver.cacher().objects() {
            list.append(item_of(py, &o)?)?;
        }
        Ok(list)
    }

    /// Open watches.
    fn watchers(&self) -> Vec<WatcherInfo> {
        self.driver.cacher().watchers().into_iter().map(WatcherInfo::from).collect()
    }

    /// One open watch, or None.
    fn watcher(&self, id: u64) -> Option<WatcherInfo> {
        self.driver.cacher().watcher(RequestId(id)).map(WatcherInfo::from)
    }

    /// The metrics, as a dict named after Kubernetes' watch-cache metrics.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(py, metrics_fields(self.driver.cacher().metrics()))
    }

    /// The configuration, as a dict of scenario config fields.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(py, config_fields(self.driver.cacher().config()))
    }

    /// Dispatch time budget available now, in ms.
    #[getter]
    fn budget_ms(&self) -> u64 {
        self.driver.cacher().budget_available_ms()
    }

    /// Requests parked (waiting for the gate, storage's revision, or freshness).
    #[getter]
    fn parked(&self) -> usize {
        self.driver.cacher().parked_count()
    }

    fn __repr__(&self) -> String {
        let c = self.driver.cacher();
        let w = c.window();
        format!(
            "Cacher(profile={}, state={}, rv={}, store={}, window={}..{} ({}/{}), watchers={})",
            c.config().profile.as_str(),
            c.ready_state().as_str(),
            c.resource_version(),
            c.store_len(),
            py_opt(w.oldest_rv),
            py_opt(w.newest_rv),
            w.len,
            w.capacity,
            c.watcher_count()
        )
    }
}

/// The ring buffer's window.
#[pyclass(frozen, get_all, module = "watchcache")]
struct Window {
    /// RV of the oldest buffered event.
    oldest_rv: Option<u64>,
    /// RV of the newest buffered event.
    newest_rv: Option<u64>,
    /// The oldest RV a watch can start after (a watch from X needs X >= oldest_servable - 1).
    oldest_servable: Option<u64>,
    /// Buffered events.
    len: usize,
    /// Capacity.
    capacity: usize,
    /// Monotonic index of the oldest event.
    start_index: u64,
    /// Monotonic index after the newest event.
    end_index: u64,
    /// An event was evicted since the last relist.
    evicted_since_relist: bool,
}

#[pymethods]
impl Window {
    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str, &'static str) {
        ("oldest_rv", "newest_rv", "len", "capacity")
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("oldest_rv", self.oldest_rv)?;
        d.set_item("newest_rv", self.newest_rv)?;
        d.set_item("oldest_servable", self.oldest_servable)?;
        d.set_item("len", self.len)?;
        d.set_item("capacity", self.capacity)?;
        d.set_item("start_index", self.start_index)?;
        d.set_item("end_index", self.end_index)?;
        d.set_item("evicted_since_relist", self.evicted_since_relist)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Window(oldest_rv={}, newest_rv={}, len={}, capacity={})",
            py_opt(self.oldest_rv),
            py_opt(self.newest_rv),
            self.len,
            self.capacity
        )
    }
}

/// An open watch as the cache sees it.
#[pyclass(frozen, get_all, module = "watchcache")]
struct WatcherInfo {
    /// Its id.
    id: u64,
    /// The key or range it watches.
    key: String,
    /// Its resourceVersion after the initial events.
    rv: u64,
    /// The last RV its client was given.
    last_sent_rv: u64,
    /// Events waiting in its queue.
    queued: usize,
    /// Queue capacity.
    queue_capacity: usize,
    /// Initial events not yet read.
    initial_pending: usize,
    /// active, replaying, blocked, lagging or draining.
    state: &'static str,
    /// Events behind the newest buffered event (lagging watchers).
    lag: u64,
    /// Reads everything at once.
    auto: bool,
    /// terminate or lag.
    policy: &'static str,
    /// Bookmarks allowed.
    allow_bookmarks: bool,
}

#[pymethods]
impl WatcherInfo {
    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str, &'static str) {
        ("id", "key", "state", "queued")
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("id", self.id)?;
        d.set_item("key", &self.key)?;
        d.set_item("rv", self.rv)?;
        d.set_item("last_sent_rv", self.last_sent_rv)?;
        d.set_item("queued", self.queued)?;
        d.set_item("queue_capacity", self.queue_capacity)?;
        d.set_item("initial_pending", self.initial_pending)?;
        d.set_item("state", self.state)?;
        d.set_item("lag", self.lag)?;
        d.set_item("auto", self.auto)?;
        d.set_item("policy", self.policy)?;
        d.set_item("allow_bookmarks", self.allow_bookmarks)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "WatcherInfo(id={}, key={:?}, state={}, queued={}/{})",
            self.id, self.key, self.state, self.queued, self.queue_capacity
        )
    }
}

impl From<cacher_core::WatcherInfo> for WatcherInfo {
    fn from(w: cacher_core::WatcherInfo) -> Self {
        WatcherInfo {
            id: w.id.0,
            key: w.key,
            rv: w.rv,
            last_sent_rv: w.last_sent_rv,
            queued: w.queued,
            queue_capacity: w.queue_capacity,
            initial_pending: w.initial_pending,
            state: w.state.as_str(),
            lag: w.lag,
            auto: w.auto,
            policy: w.policy.as_str(),
            allow_bookmarks: w.allow_bookmarks,
        }
    }
}

// ----- module --------------------------------------------------------------------------------------

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(replay_json, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_class::<Cacher>()?;
    m.add_class::<Window>()?;
    m.add_class::<WatcherInfo>()?;
    m.add_class::<WatchItem>()?;
    m.add_class::<WatchStarted>()?;
    m.add_class::<WatchError>()?;
    m.add_class::<WatchClosed>()?;
    m.add_class::<WatchDelegated>()?;
    m.add_class::<ReadResult>()?;
    m.add_class::<RangeResult>()?;
    m.add_class::<Item>()?;
    m.add_class::<Rejected>()?;
    m.add_class::<RequestProgress>()?;
    m.add_class::<NeedCurrentRevision>()?;
    m.add_class::<Relist>()?;
    Ok(())
}
