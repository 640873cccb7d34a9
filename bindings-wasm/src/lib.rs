//! The watchcache core for JavaScript (browser and Node), via wasm-bindgen.
//!
//! A thin layer over `cacher-core`'s driver (`cacher_core::replay`): argument conversion,
//! errors as JS `Error`s with a `name` and a `code`, and the output items as plain objects. The
//! run loop, the request parsing, the output items and the config and metric names are the
//! core's, shared with the Python binding. Resource versions (and every other 64-bit count)
//! cross as `BigInt`, never as lossy numbers; times (`at`, milliseconds) and request ids are
//! numbers. `replayJson` returns the trace as the exact JSON text the Rust replayer prints.

use std::collections::BTreeMap;

use cacher_core::replay::{
    self as core_replay, config_fields, metrics_fields, AdvanceError, Driver, FieldValue, GetSpec,
    KeySpec, ListSpec, OutputItem, RangeSpec, Record, ScenarioError, WatchSpec,
};
use cacher_core::simulate as core_simulate;
use cacher_core::{
    Change, Config, Key, Object, RangeOutcome, ReadOutcome, RequestId, Status, WatchEvent,
};
use js_sys::{Array, Object as JsObject, Reflect};
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

// ----- errors ------------------------------------------------------------------------------------

fn js_error(
    name: &str,
    code: u16,
    reason: &str,
    message: &str,
    retry_after_s: Option<u32>,
) -> JsValue {
    let e = js_sys::Error::new(message);
    e.set_name(name);
    let v: &JsValue = e.as_ref();
    let _ = Reflect::set(v, &"code".into(), &JsValue::from(code));
    let _ = Reflect::set(v, &"reason".into(), &JsValue::from_str(reason));
    if let Some(r) = retry_after_s {
        let _ = Reflect::set(v, &"retryAfterS".into(), &JsValue::from(r));
    }
    e.into()
}

fn status_name(code: u16) -> &'static str {
    match code {
        400 | 422 => "InvalidRequest",
        404 => "NotFound",
        410 => "ResourceExpired",
        504 => "TooLargeResourceVersion",
        429 | 503 => "NotReady",
        _ => "WatchCacheError",
    }
}

fn status_error(st: &Status) -> JsValue {
    js_error(status_name(st.code()), st.code(), st.reason.as_str(), &st.message, st.retry_after_s)
}

fn scenario_error(e: &ScenarioError) -> JsValue {
    js_error("ScenarioError", 400, "BadRequest", &e.to_string(), None)
}

fn type_error(msg: String) -> JsValue {
    js_sys::TypeError::new(&msg).into()
}

fn describe(v: &JsValue) -> String {
    if v.is_null() {
        "null".into()
    } else if v.is_undefined() {
        "undefined".into()
    } else {
        v.js_typeof().as_string().unwrap_or_else(|| "?".into())
    }
}

// ----- conversions in ------------------------------------------------------------------------------

const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

/// A non-negative integer from a number (a safe integer), a BigInt, or a decimal string.
fn u64_arg(name: &str, v: &JsValue) -> Result<u64, JsValue> {
    if let Some(f) = v.as_f64() {
        if (0.0..=MAX_SAFE).contains(&f) && f.fract() == 0.0 {
            return Ok(f as u64);
        }
        return Err(type_error(format!(
            "{name}: expected a non-negative safe integer (use a BigInt or a string above 2^53), got {f}"
        )));
    }
    if v.is_bigint() {
        return u64::try_from(js_sys::BigInt::unchecked_from_js_ref(v).clone())
            .map_err(|_| type_error(format!("{name}: BigInt out of the u64 range")));
    }
    if let Some(s) = v.as_string() {
        return s
            .parse::<u64>()
            .map_err(|_| type_error(format!("{name}: expected a decimal integer, got {s:?}")));
    }
    Err(type_error(format!(
        "{name}: expected a number, BigInt or decimal string, got {}",
        describe(v)
    )))
}

fn opt_u64(name: &str, v: &JsValue) -> Result<Option<u64>, JsValue> {
    if v.is_null() || v.is_undefined() {
        Ok(None)
    } else {
        u64_arg(name, v).map(Some)
    }
}

fn string_arg(name: &str, v: &JsValue) -> Result<String, JsValue> {
    v.as_string()
        .ok_or_else(|| type_error(format!("{name}: expected a string, got {}", describe(v))))
}

fn opt_string(name: &str, v: &JsValue) -> Result<Option<String>, JsValue> {
    if v.is_null() || v.is_undefined() {
        Ok(None)
    } else {
        string_arg(name, v).map(Some)
    }
}

fn opt_bool(name: &str, v: &JsValue) -> Result<Option<bool>, JsValue> {
    if v.is_null() || v.is_undefined() {
        return Ok(None);
    }
    v.as_bool()
        .map(Some)
        .ok_or_else(|| type_error(format!("{name}: expected a boolean, got {}", describe(v))))
}

/// Key or value bytes from a string or a Uint8Array.
fn bytes_arg(name: &str, v: &JsValue) -> Result<Vec<u8>, JsValue> {
    if let Some(s) = v.as_string() {
        return Ok(s.into_bytes());
    }
    if let Some(a) = v.dyn_ref::<js_sys::Uint8Array>() {
        return Ok(a.to_vec());
    }
    Err(type_error(format!("{name}: expected a string or a Uint8Array, got {}", describe(v))))
}

/// Reads an options object, rejecting unknown keys.
struct Opts {
    obj: Option<JsValue>,
    name: &'static str,
    known: &'static [&'static str],
}

impl Opts {
    fn new(
        name: &'static str,
        v: &JsValue,
        known: &'static [&'static str],
    ) -> Result<Opts, JsValue> {
        if v.is_null() || v.is_undefined() {
            return Ok(Opts { obj: None, name, known });
        }
        if !v.is_object() || Array::is_array(v) {
            return Err(type_error(format!(
                "{name}: expected an options object, got {}",
                describe(v)
            )));
        }
        for k in JsObject::keys(v.unchecked_ref::<JsObject>()).iter() {
            let k = k.as_string().unwrap_or_default();
            if !known.contains(&k.as_str()) {
                return Err(type_error(format!(
                    "{name}: unknown option {k:?}; expected one of {}",
                    known.join(", ")
                )));
            }
        }
        Ok(Opts { obj: Some(v.clone()), name, known })
    }

    fn get(&self, key: &str) -> JsValue {
        debug_assert!(self.known.contains(&key));
        match &self.obj {
            Some(o) => Reflect::get(o, &key.into()).unwrap_or(JsValue::UNDEFINED),
            None => JsValue::UNDEFINED,
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, JsValue> {
        opt_bool(&self.path(key), &self.get(key))
    }

    fn string(&self, key: &str) -> Result<Option<String>, JsValue> {
        opt_string(&self.path(key), &self.get(key))
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, JsValue> {
        opt_u64(&self.path(key), &self.get(key))
    }
}

/// A JS value as JSON: objects, arrays, strings, numbers (integers exact), BigInts, booleans,
/// null. Nesting is bounded so no input can exhaust the stack.
fn json_of(v: &JsValue, depth: usize) -> Result<serde_json::Value, JsValue> {
    use serde_json::Value;
    if depth > 128 {
        return Err(type_error("scenario nests deeper than 128 levels".into()));
    }
    if v.is_null() || v.is_undefined() {
        return Ok(Value::Null);
    }
    if let Some(s) = v.as_string() {
        return Ok(Value::String(s));
    }
    if let Some(b) = v.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Some(f) = v.as_f64() {
        if f.fract() == 0.0 && f.abs() <= MAX_SAFE {
            return Ok(if f >= 0.0 { Value::from(f as u64) } else { Value::from(f as i64) });
        }
        return serde_json::Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| type_error("NaN and Infinity are not JSON".into()));
    }
    if v.is_bigint() {
        let b = js_sys::BigInt::unchecked_from_js_ref(v).clone();
        if let Ok(n) = u64::try_from(b.clone()) {
            return Ok(Value::from(n));
        }
        return i64::try_from(b)
            .map(Value::from)
            .map_err(|_| type_error("BigInt out of the 64-bit range".into()));
    }
    if Array::is_array(v) {
        let a: &Array = v.unchecked_ref();
        return a
            .iter()
            .map(|x| json_of(&x, depth + 1))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if v.is_object() {
        let mut map = serde_json::Map::new();
        for entry in JsObject::entries(v.unchecked_ref::<JsObject>()).iter() {
            let pair: &Array = entry.unchecked_ref();
            let k = pair.get(0).as_string().unwrap_or_default();
            map.insert(k, json_of(&pair.get(1), depth + 1)?);
        }
        return Ok(Value::Object(map));
    }
    Err(type_error(format!("scenario: {} is not JSON", describe(v))))
}

/// An object from `{key, value, rv, labels, fields}` (the scenario format).
fn object_arg(name: &str, v: &JsValue, default_rv: u64) -> Result<Object, JsValue> {
    if !v.is_object() || Array::is_array(v) {
        return Err(type_error(format!(
            "{name}: expected an object {{key, value, rv, labels, fields}}, got {}",
            describe(v)
        )));
    }
    let json = json_of(v, 0)?;
    core_replay::parse_object(&json, name, Some(default_rv)).map_err(|e| type_error(e.to_string()))
}

/// A put's object: its `rv` (the event's resourceVersion) is required.
fn put_object(name: &str, o: Object) -> Result<Object, JsValue> {
    if o.rv() == 0 {
        return Err(type_error(format!("{name}: rv (the event's resourceVersion) is required")));
    }
    Ok(o)
}

/// A resourceVersion option as the text a client sends (absent: unset); parsed by the core.
fn rv_text(v: &JsValue) -> Result<String, JsValue> {
    if v.is_null() || v.is_undefined() {
        Ok(String::new())
    } else if let Some(s) = v.as_string() {
        Ok(s)
    } else {
        Ok(u64_arg("rv", v)?.to_string())
    }
}

// ----- conversions out -----------------------------------------------------------------------------

fn serializer() -> serde_wasm_bindgen::Serializer {
    serde_wasm_bindgen::Serializer::new()
        .serialize_large_number_types_as_bigints(true)
        .serialize_maps_as_objects(true)
}

fn to_js<T: Serialize>(v: &T) -> Result<JsValue, JsValue> {
    v.serialize(&serializer())
        .map_err(|e| js_error("WatchCacheError", 500, "InternalError", &e.to_string(), None))
}

fn text(b: &[u8]) -> String {
    cacher_core::display_key(b)
}

/// A trace record for JS: `at` a number, resource versions BigInt.
#[derive(Serialize)]
struct JsRecord<'a> {
    at: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rv: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_s: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    items: Option<&'a [core_replay::Item]>,
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    more: Option<bool>,
}

impl<'a> From<&'a Record> for JsRecord<'a> {
    fn from(r: &'a Record) -> Self {
        JsRecord {
            at: r.at as f64,
            id: r.id.as_deref(),
            kind: r.kind,
            source: r.source,
            key: r.key.as_deref(),
            rv: r.rv,
            value: r.value.as_deref(),
            annotations: r.annotations.as_ref(),
            cause: r.cause,
            code: r.code,
            reason: r.reason.as_deref(),
            message: r.message.as_deref(),
            retry_after_s: r.retry_after_s,
            items: r.items.as_deref(),
            continue_token: r.continue_token.as_deref(),
            remaining: r.remaining,
            count: r.count,
            more: r.more,
        }
    }
}

/// A scenario or workload argument: JSON text, or an object converted straight to JSON.
enum JsonInput {
    Text(String),
    Value(serde_json::Value),
}

fn json_input(arg: &str, v: &JsValue) -> Result<JsonInput, JsValue> {
    if let Some(text) = v.as_string() {
        Ok(JsonInput::Text(text))
    } else if v.is_object() && !Array::is_array(v) {
        json_of(v, 0).map(JsonInput::Value).map_err(|e| {
            let msg =
                e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message())).unwrap_or_default();
            js_error("ScenarioError", 400, "BadRequest", &msg, None)
        })
    } else {
        Err(type_error(format!("{arg}: expected an object or a JSON string, got {}", describe(v))))
    }
}

fn scenario_trace(scenario: &JsValue) -> Result<Vec<Record>, JsValue> {
    match json_input("scenario", scenario)? {
        JsonInput::Text(text) => core_replay::replay_str(&text),
        JsonInput::Value(value) => core_replay::replay(&value),
    }
    .map_err(|e| scenario_error(&e))
}

/// Replays a scenario (an object, or its JSON text) and returns its trace: an array of
/// records with `at` in milliseconds (a number) and resource versions as BigInt.
#[wasm_bindgen(unchecked_return_type = "TraceRecord[]")]
pub fn replay(
    #[wasm_bindgen(unchecked_param_type = "ScenarioInput")] scenario: JsValue,
) -> Result<JsValue, JsValue> {
    let trace = scenario_trace(&scenario)?;
    let out = Array::new_with_length(trace.len() as u32);
    for (i, r) in trace.iter().enumerate() {
        out.set(i as u32, to_js(&JsRecord::from(r))?);
    }
    Ok(out.into())
}

/// Replays a scenario and returns the trace as JSON text, byte for byte what the Rust replayer
/// prints (the golden-file format; resource versions are exact JSON integers).
#[wasm_bindgen(js_name = replayJson)]
pub fn replay_json(
    #[wasm_bindgen(unchecked_param_type = "ScenarioInput")] scenario: JsValue,
) -> Result<String, JsValue> {
    Ok(core_replay::trace_to_json(&scenario_trace(&scenario)?))
}

/// Runs a workload simulation (an object, or its JSON text) and returns its report as a plain
/// object: `summary` (totals) and `series` (one record per simulated second), with the same
/// field names as the JSON report and Python's `simulate`. Counts and resource versions are
/// BigInt; seconds, shares, percentiles, capacities and watcher counts are numbers; a
/// percentile without deliveries is null. A malformed workload throws a `ScenarioError` whose
/// message names the field.
#[wasm_bindgen(unchecked_return_type = "SimulationReport")]
pub fn simulate(
    #[wasm_bindgen(unchecked_param_type = "ScenarioInput")] workload: JsValue,
) -> Result<JsValue, JsValue> {
    let report = match json_input("workload", &workload)? {
        JsonInput::Text(text) => core_simulate::simulate_str(&text),
        JsonInput::Value(value) => core_simulate::simulate(&value),
    };
    let report =
        report.map_err(|e| js_error("ScenarioError", 400, "BadRequest", &e.to_string(), None))?;
    report
        .serialize(&serializer().serialize_missing_as_null(true))
        .map_err(|e| js_error("WatchCacheError", 500, "InternalError", &e.to_string(), None))
}

/// The package version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").into()
}

// ----- TypeScript declarations ---------------------------------------------------------------------

// The shapes the functions below take and return, for `watchcache.d.ts`. The signatures refer
// to them through `unchecked_param_type`/`unchecked_return_type`; tests/types.test.mjs checks
// that no `any` is left.
#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** A JSON value as the scenario and workload formats take it (BigInts are exact integers). */
export type JsonValue = null | undefined | boolean | number | bigint | string | JsonValue[] | JsonObject;
/** A JSON object. */
export interface JsonObject { [field: string]: JsonValue; }
/**
 * A scenario (the `scenarios/` format: `config`, `steps`, ...) or a workload (the
 * `scenarios/simulate/` format), as an object or as JSON text. The core validates it and
 * throws a `ScenarioError` naming the bad field.
 */
export type ScenarioInput = string | JsonObject;

/**
 * A resource version (or another unsigned 64-bit integer) on the way in: a safe-integer
 * number, a BigInt or a decimal string. A number above 2^53 is refused with a TypeError.
 * On the way out resource versions are always `bigint`.
 */
export type ResourceVersion = number | bigint | string;
/** A key (or range end): a string (UTF-8) or raw bytes. */
export type KeyInput = string | Uint8Array;

/** An object from storage, in the scenario format. `null` fields count as absent. */
export interface StorageObject {
    key: string;
    value?: string | null;
    /** Its resourceVersion (defaults to the event's, where there is one). */
    rv?: ResourceVersion | null;
    labels?: Record<string, string> | null;
    fields?: Record<string, string> | null;
}
/** An object of a put: `rv` is the event's resourceVersion and is required. */
export type PutObject = StorageObject & { rv: ResourceVersion };
/** One change of a transaction. */
export type TxnChange = ["put", StorageObject] | ["delete", KeyInput];

/** A config field that is an unsigned integer. */
export type ConfigInteger = number | bigint | string;
/** The cacher's configuration: the scenario's config fields (`null` counts as absent). */
export interface CacherConfig {
    profile?: "v1.30" | "v1.34" | "v1.37" | "1.30" | "1.34" | "1.37" | null;
    capacity?: ConfigInteger | null;
    lower_bound_capacity?: ConfigInteger | null;
    upper_bound_capacity?: ConfigInteger | null;
    dynamic_capacity?: boolean | null;
    event_fresh_ms?: ConfigInteger | null;
    bookmark_frequency_ms?: ConfigInteger | null;
    dispatch_tick_ms?: ConfigInteger | null;
    dispatch_tick_jitter?: number | null;
    freshness_timeout_ms?: ConfigInteger | null;
    progress_request_interval_ms?: ConfigInteger | null;
    budget_refill_ms_per_s?: ConfigInteger | null;
    budget_max_ms?: ConfigInteger | null;
    watch_chan_size?: ConfigInteger | null;
    index_field?: string | null;
    interval_buffer_size?: ConfigInteger | null;
    request_timeout_ms?: ConfigInteger | null;
    seed?: ConfigInteger | null;
    watch_list?: boolean | null;
    consistent_list_from_cache?: boolean | null;
    resilient_initialization?: boolean | null;
    list_from_cache_snapshot?: boolean | null;
    watch_from_storage_without_rv?: boolean | null;
    storage_supports_progress?: boolean | null;
    consistent_list_skip_timeout_fallback?: boolean | null;
    non_blocking_dispatch?: boolean | null;
    relist_delay_ms?: ConfigInteger | null;
    max_cache_bytes?: ConfigInteger | null;
    resource_prefix?: string | null;
}
/**
 * The configuration in effect, as `Cacher.config()` returns it: every field of `CacherConfig`,
 * in the same order as Python's `Cacher.config()`. Sizes and durations are numbers (a BigInt
 * only beyond 2^53); the seed is a BigInt.
 */
export interface CacherConfigInfo {
    profile: "v1.30" | "v1.34" | "v1.37";
    capacity: number;
    lower_bound_capacity: number;
    upper_bound_capacity: number;
    dynamic_capacity: boolean;
    event_fresh_ms: number;
    bookmark_frequency_ms: number;
    dispatch_tick_ms: number;
    dispatch_tick_jitter: number;
    freshness_timeout_ms: number;
    progress_request_interval_ms: number;
    budget_refill_ms_per_s: number;
    budget_max_ms: number;
    watch_chan_size: number | null;
    index_field: string | null;
    interval_buffer_size: number;
    request_timeout_ms: number;
    seed: bigint;
    watch_list: boolean;
    consistent_list_from_cache: boolean;
    resilient_initialization: boolean;
    list_from_cache_snapshot: boolean;
    watch_from_storage_without_rv: boolean;
    storage_supports_progress: boolean;
    consistent_list_skip_timeout_fallback: boolean;
    non_blocking_dispatch: boolean;
    relist_delay_ms: number;
    max_cache_bytes: number | null;
    resource_prefix: string | null;
}

/** Options of `Cacher.startWatch` (`null` counts as absent). */
export interface WatchOptions {
    /** Watch the key as a prefix (default true); ignored with `rangeEnd`. */
    recursive?: boolean | null;
    /** An etcd-style range end instead of a Kubernetes key. */
    rangeEnd?: KeyInput | null;
    /** The resourceVersion to watch from (absent: unset, as in Kubernetes). */
    rv?: ResourceVersion | null;
    sendInitialEvents?: boolean | null;
    allowBookmarks?: boolean | null;
    labelSelector?: string | null;
    fieldSelector?: string | null;
    timeoutMs?: number | bigint | string | null;
    /** `"auto"` (default): the client keeps up; `"manual"`: it reads with `consume`/`grantCredit`. */
    consume?: "auto" | "manual" | null;
    /** What happens to a watcher whose queue is full (default `"terminate"`). */
    slowPolicy?: "terminate" | "lag" | null;
    queueCapacity?: number | bigint | string | null;
    /**
     * Apply the API server's request layer first, as scenario watches get it (with WatchList
     * on, an RV "" or "0" watch becomes a watch-list); default false: the cacher alone.
     */
    requestLayer?: boolean | null;
}
/** Options of `Cacher.list` (`null` counts as absent). */
export interface ListOptions {
    /** List the key as a prefix (default true). */
    recursive?: boolean | null;
    rv?: ResourceVersion | null;
    rvMatch?: "Exact" | "NotOlderThan" | "" | null;
    /** Page size (0: no limit). */
    limit?: number | bigint | string | null;
    /** The continue token of the previous page. */
    continue?: string | null;
    labelSelector?: string | null;
    fieldSelector?: string | null;
}
/** Options of `Cacher.get`. */
export interface GetOptions {
    rv?: ResourceVersion | null;
}
/** Options of `Cacher.range` (etcd's Range). */
export interface RangeOptions {
    rangeEnd?: KeyInput | null;
    /** The revision to read at (0: latest). */
    revision?: ResourceVersion | null;
    linearizable?: boolean | null;
    limit?: number | bigint | string | null;
}

/** An object of a read result or of `Cacher.objects()`. */
export interface Item {
    key: string;
    rv: bigint;
    value: string | undefined;
    labels: Record<string, string>;
    fields: Record<string, string>;
}

/** An event delivered to a watcher. */
export interface WatchEventOutput {
    at: number;
    type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK";
    id: number;
    /** Absent on bookmarks. */
    key?: string;
    rv: bigint;
    value?: string;
    /** True on the bookmark that ends the initial events. */
    initialEventsEnd: boolean;
}
/** A watch started: where its initial events come from. */
export interface WatchStartedOutput {
    at: number;
    type: "STARTED";
    id: number;
    rv: bigint;
    initial: "store" | "ring" | "none";
}
/** An ERROR on an open watch (a CLOSED follows). */
export interface WatchErrorOutput {
    at: number;
    type: "ERROR";
    id: number;
    code: number;
    reason: string;
    message: string;
    retryAfterS?: number;
}
/** A request refused (the status of the error a server would return). */
export interface RejectedOutput {
    at: number;
    type: "REJECTED";
    id: number;
    code: number;
    reason: string;
    message: string;
    retryAfterS?: number;
}
/** A watch ended. */
export interface WatchClosedOutput {
    at: number;
    type: "CLOSED";
    id: number;
    cause: "unresponsive" | "stopped" | "reinitializing" | "timeout" | "error";
    lastRv: bigint;
    message?: string;
}
/** A watch the cache sends to storage. */
export interface WatchDelegatedOutput {
    at: number;
    type: "WATCH";
    id: number;
    source: "storage";
    reason: string;
}
/** A list or get the cache sends to storage. */
export interface ReadDelegatedOutput {
    at: number;
    type: "LIST" | "GET";
    id: number;
    source: "storage";
    reason: string;
}
/** A list or get served from the cache. */
export interface ReadResultOutput {
    at: number;
    type: "LIST" | "GET";
    id: number;
    source: "cache";
    reason: string;
    rv: bigint;
    items: Item[];
    continue?: string;
    remaining?: bigint;
}
/** A range the cache sends to storage. */
export interface RangeDelegatedOutput {
    at: number;
    type: "RANGE";
    id: number;
    source: "storage";
    reason: string;
}
/** A range served from the cache. */
export interface RangeResultOutput {
    at: number;
    type: "RANGE";
    id: number;
    source: "cache";
    reason: string;
    rv: bigint;
    items: Item[];
    count: bigint;
    more: boolean;
}
/** Storage should send a progress notify. */
export interface RequestProgressOutput {
    at: number;
    type: "REQUEST_PROGRESS";
}
/** The cache needs storage's current revision for request `id` (see `handleCurrentRevision`). */
export interface NeedCurrentRevisionOutput {
    at: number;
    type: "NEED_CURRENT_RV";
    id: number;
}
/** The cache must relist from storage. */
export interface RelistOutput {
    at: number;
    type: "RELIST";
    reason: string;
}
/** One output of the Cacher, told apart by `type` (and `source` for reads). */
export type CacherOutput =
    | WatchEventOutput
    | WatchStartedOutput
    | WatchErrorOutput
    | WatchClosedOutput
    | WatchDelegatedOutput
    | ReadDelegatedOutput
    | ReadResultOutput
    | RangeDelegatedOutput
    | RangeResultOutput
    | RejectedOutput
    | RequestProgressOutput
    | NeedCurrentRevisionOutput
    | RelistOutput;

/** The next deadline of the Cacher. */
export interface Deadline {
    atMs: number;
    reason:
        | "dispatch_tick"
        | "progress_request"
        | "freshness_wait"
        | "watch_deadline"
        | "slow_watcher_budget"
        | "request_timeout"
        | "dispatcher_start"
        | "relist"
        | "compactor_poll";
}
/** The ring buffer's window (RVs undefined while it is empty or uninitialised). */
export interface Window {
    oldestRv: bigint | undefined;
    newestRv: bigint | undefined;
    oldestServable: bigint | undefined;
    len: number;
    capacity: number;
    startIndex: bigint;
    endIndex: bigint;
    evictedSinceRelist: boolean;
}
/** An event in the ring buffer. */
export interface WindowEvent {
    rv: bigint;
    key: string;
    isDelete: boolean;
}
/** An open watch. */
export interface WatcherInfo {
    id: number;
    key: string;
    rv: bigint;
    lastSentRv: bigint;
    queued: number;
    queueCapacity: number;
    initialPending: number;
    state: "replaying" | "active" | "blocked" | "lagging" | "draining";
    lag: bigint;
    auto: boolean;
    policy: "terminate" | "lag";
    allowBookmarks: boolean;
}
/** The Cacher's metrics (Kubernetes' watch-cache metric names). */
export interface Metrics {
    events_received: bigint;
    events_dispatched: bigint;
    init_events: bigint;
    terminated_watchers: bigint;
    capacity_increases: bigint;
    capacity_decreases: bigint;
    initializations: bigint;
    cache_lists: Record<string, bigint>;
    cache_list_fetched: Record<string, bigint>;
    cache_list_returned: bigint;
    read_wait_buckets_ms: bigint[];
    read_wait_counts: bigint[];
    read_wait_sum_ms: bigint;
    consistent_reads_ok: bigint;
    consistent_reads_fallback: bigint;
    lists_delegated: bigint;
    gets_delegated: bigint;
    watches_delegated: bigint;
    watches_started: bigint;
    progress_requests: bigint;
    deliveries: bigint;
    bookmarks_sent: bigint;
    watch_expired: bigint;
    byte_evictions: bigint;
}

/** An object of a LIST or GET record of a trace. */
export interface TraceItem {
    key: string;
    rv: bigint;
    value: string | undefined;
}
/** One record of a trace (`replay`); fields that do not apply are absent. */
export interface TraceRecord {
    at: number;
    /** The scenario's request id. */
    id?: string;
    type:
        | "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR" | "CLOSED" | "REJECTED"
        | "LIST" | "GET" | "WATCH" | "RANGE" | "REQUEST_PROGRESS" | "NEED_CURRENT_RV" | "RELIST";
    source?: "cache" | "storage";
    key?: string;
    rv?: bigint;
    value?: string;
    annotations?: Record<string, string>;
    cause?: string;
    code?: number;
    reason?: string;
    message?: string;
    retry_after_s?: number;
    items?: TraceItem[];
    continue?: string;
    remaining?: bigint;
    count?: bigint;
    more?: boolean;
}

/** Totals of a simulation. */
export interface SimulationSummary {
    duration_s: number;
    events_written: bigint;
    events_cached: bigint;
    deliveries: bigint;
    bookmarks_sent: bigint;
    watch_410: bigint;
    watch_errors: bigint;
    relists: bigint;
    relists_pending: bigint;
    cache_lists: bigint;
    etcd_range_requests: bigint;
    etcd_range_objects: bigint;
    etcd_list_410: bigint;
    compactions: bigint;
    watcher_terminations: bigint;
    disconnects: bigint;
    restarts: bigint;
    watches_started: bigint;
    watches_rejected: bigint;
    p50_delivery_lag_ms: number | null;
    p99_delivery_lag_ms: number | null;
    mean_delivery_lag_ms: number | null;
    max_delivery_lag_ms: bigint | null;
    peak_ring_capacity: number;
    final_ring_capacity: number;
    capacity_increases: bigint;
    capacity_decreases: bigint;
    selector_fraction: number;
    final_etcd_rv: bigint;
}
/** One simulated second. */
export interface SimulationSecond {
    t_s: number;
    etcd_rv: bigint;
    cache_rv: bigint;
    ready: boolean;
    window_rv: bigint;
    window_s: number;
    window_events: number;
    capacity: number;
    writes: bigint;
    deliveries: bigint;
    watch_410: bigint;
    relists: bigint;
    etcd_range_requests: bigint;
    etcd_range_objects: bigint;
    connected_watchers: number;
}
/** The report of `simulate`. */
export interface SimulationReport {
    summary: SimulationSummary;
    series: SimulationSecond[];
}
"#;

// ----- output items as plain objects ---------------------------------------------------------------

#[derive(Serialize, Default)]
struct JsItem {
    key: String,
    rv: u64,
    value: Option<String>,
    labels: BTreeMap<String, String>,
    fields: BTreeMap<String, String>,
}

fn item_of(o: &Object) -> JsItem {
    let (labels, fields) = match o.attrs() {
        Some(a) => (
            a.labels().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
            a.fields().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
        ),
        None => Default::default(),
    };
    JsItem { key: text(o.key()), rv: o.rv(), value: o.value().map(text), labels, fields }
}

/// One output item as a plain object: `type` says which (the trace's record types, plus
/// `STARTED`); `id` is the request's id (a number). The fields are Python's, in camelCase.
#[derive(Serialize, Default)]
struct JsOutput {
    at: f64,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rv: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(rename = "initialEventsEnd", skip_serializing_if = "Option::is_none")]
    initial_events_end: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    initial: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'static str>,
    #[serde(rename = "lastRv", skip_serializing_if = "Option::is_none")]
    last_rv: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(rename = "retryAfterS", skip_serializing_if = "Option::is_none")]
    retry_after_s: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    items: Option<Vec<JsItem>>,
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    more: Option<bool>,
}

fn status_output(base: JsOutput, st: Status) -> JsOutput {
    JsOutput {
        code: Some(st.code()),
        reason: Some(st.reason.as_str().into()),
        message: Some(st.message),
        retry_after_s: st.retry_after_s,
        ..base
    }
}

/// The plain object of one output item (the core's model; Python maps the same one).
fn output_of(item: OutputItem) -> JsOutput {
    let base = JsOutput {
        at: item.at() as f64,
        kind: item.type_str(),
        id: item.id().map(|id| id.0 as f64),
        ..JsOutput::default()
    };
    match item {
        OutputItem::Event { event, .. } => {
            let obj = event.object();
            JsOutput {
                key: obj.map(|o| text(o.key())),
                rv: Some(event.rv()),
                value: obj.and_then(|o| o.value()).map(text),
                initial_events_end: Some(matches!(
                    event,
                    WatchEvent::Bookmark { initial_events_end: true, .. }
                )),
                ..base
            }
        }
        OutputItem::Started { rv, initial, .. } => {
            JsOutput { rv: Some(rv), initial: Some(initial.as_str()), ..base }
        }
        OutputItem::Error { status, .. } | OutputItem::Rejected { status, .. } => {
            status_output(base, status)
        }
        OutputItem::Closed { cause, last_rv, message, .. } => {
            JsOutput { cause: Some(cause.as_str()), last_rv: Some(last_rv), message, ..base }
        }
        OutputItem::Delegated { reason, .. } => {
            JsOutput { source: Some("storage"), reason: Some(reason.into()), ..base }
        }
        OutputItem::Read { outcome: ReadOutcome::Storage { reason }, .. }
        | OutputItem::Range { outcome: RangeOutcome::Storage { reason }, .. } => {
            JsOutput { source: Some("storage"), reason: Some(reason.into()), ..base }
        }
        OutputItem::Read { outcome: ReadOutcome::Cache(r), .. } => JsOutput {
            source: Some("cache"),
            reason: Some(r.reason.into()),
            rv: Some(r.rv),
            items: Some(r.items.iter().map(|o| item_of(o)).collect()),
            continue_token: r.continue_token,
            remaining: r.remaining,
            ..base
        },
        OutputItem::Range { outcome: RangeOutcome::Cache(r), .. } => JsOutput {
            source: Some("cache"),
            reason: Some(r.reason.into()),
            rv: Some(r.header_rv),
            items: Some(r.items.iter().map(|o| item_of(o)).collect()),
            count: Some(r.count),
            more: Some(r.more),
            ..base
        },
        OutputItem::Relist { reason, .. } => JsOutput { reason: Some(reason), ..base },
        OutputItem::RequestProgress { .. } | OutputItem::NeedCurrentRevision { .. } => base,
    }
}

/// A config or metric value: sizes and durations as numbers (a BigInt beyond 2^53), counts
/// and seeds as BigInt.
fn field_js(v: FieldValue<'_>) -> JsValue {
    let big = |n: u64| JsValue::from(js_sys::BigInt::from(n));
    match v {
        FieldValue::Null => JsValue::NULL,
        FieldValue::Bool(b) => JsValue::from(b),
        FieldValue::Size(n) if n as f64 <= MAX_SAFE => JsValue::from(n as f64),
        FieldValue::Size(n) | FieldValue::Count(n) => big(n),
        FieldValue::Float(x) => JsValue::from(x),
        FieldValue::Str(s) => JsValue::from_str(s),
        FieldValue::CountsBy(m) => {
            let o = JsObject::new();
            for (k, n) in m {
                let _ = Reflect::set(&o, &JsValue::from_str(k), &big(*n));
            }
            o.into()
        }
        FieldValue::Counts(c) => c.iter().map(|n| big(*n)).collect::<Array>().into(),
    }
}

fn fields_js<'a>(fields: impl IntoIterator<Item = (&'static str, FieldValue<'a>)>) -> JsValue {
    let o = JsObject::new();
    for (name, v) in fields {
        let _ = Reflect::set(&o, &JsValue::from_str(name), &field_js(v));
    }
    o.into()
}

// ----- the Cacher ----------------------------------------------------------------------------------

/// The watch cache core, driven with explicit time (`nowMs`, milliseconds). Method names
/// mirror the Python API in camelCase.
#[wasm_bindgen]
pub struct Cacher {
    driver: Driver,
}

/// The most timer expirations one call may step through (about 11 days of 1-second ticks).
const MAX_TIMER_STEPS: u64 = 1_000_000;

impl Cacher {
    /// Moves time to `nowMs`. Every deadline up to it fires, in order. A far target can mean
    /// millions of them (a dispatch tick per second) and a page cannot be interrupted: stop
    /// after MAX_TIMER_STEPS, at the last deadline reached, and say so.
    fn step(&mut self, now_ms: &JsValue) -> Result<(), JsValue> {
        let t = u64_arg("nowMs", now_ms)?;
        let from = self.driver.now_ms();
        let bound = |n: u64, _| if n > MAX_TIMER_STEPS { Err(()) } else { Ok(()) };
        self.driver.advance(t, bound).map_err(|e| match e {
            AdvanceError::Stopped(()) => js_error(
                "InvalidRequest",
                400,
                "BadRequest",
                &format!(
                    "nowMs: reaching {t} ms from {from} ms takes more than {MAX_TIMER_STEPS} \
                     timer expirations; advance in smaller steps (time stopped at {} ms)",
                    self.driver.now_ms()
                ),
                None,
            ),
            e @ AdvanceError::TimeGoesBack { .. } => type_error(format!("nowMs: {e}")),
        })
    }
}

fn storage_error(e: cacher_core::StorageError) -> JsValue {
    js_error("StorageInputError", 400, "BadRequest", &e.to_string(), None)
}

#[wasm_bindgen]
impl Cacher {
    /// A new cacher. `config` uses the scenario's config fields (e.g. `{profile: "v1.34",
    /// capacity: 100}`); a bad field throws a `ConfigError` naming it.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_optional_param_type = "CacherConfig | null")] config: JsValue,
    ) -> Result<Cacher, JsValue> {
        let cfg = if config.is_null() || config.is_undefined() {
            Config::default()
        } else {
            let value = json_of(&config, 0)?;
            core_replay::parse_config(&value, "config").map_err(|e| {
                let msg = e.to_string();
                let msg = msg.strip_prefix("config.").unwrap_or(&msg);
                js_error("ConfigError", 400, "BadRequest", msg, None)
            })?
        };
        let driver = Driver::new(cfg).map_err(|e| {
            js_error("ConfigError", 400, "BadRequest", &format!("{}: {}", e.field, e.message), None)
        })?;
        Ok(Cacher { driver })
    }

    /// Answer NEED_CURRENT_RV automatically with max(etcdRv, every RV stored) (default true).
    #[wasm_bindgen(getter = autoCurrentRevision)]
    pub fn auto_current_revision(&self) -> bool {
        self.driver.auto_current_revision()
    }

    /// Sets whether NEED_CURRENT_RV is answered automatically.
    #[wasm_bindgen(setter = autoCurrentRevision)]
    pub fn set_auto_current_revision(&mut self, v: bool) {
        self.driver.set_auto_current_revision(v);
    }

    /// A (re)list completed at `rv` with `objects` (`{key, value, rv, labels, fields}`).
    #[wasm_bindgen(js_name = handleReplace)]
    pub fn handle_replace(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
        #[wasm_bindgen(unchecked_param_type = "StorageObject[]")] objects: JsValue,
    ) -> Result<(), JsValue> {
        let rv = u64_arg("rv", &rv)?;
        if !Array::is_array(&objects) {
            return Err(type_error(format!(
                "objects: expected an array, got {}",
                describe(&objects)
            )));
        }
        let arr: &Array = objects.unchecked_ref();
        let objs = arr
            .iter()
            .enumerate()
            .map(|(i, o)| object_arg(&format!("objects[{i}]"), &o, rv))
            .collect::<Result<Vec<_>, _>>()?;
        self.step(&now_ms)?;
        self.driver.handle_replace(rv, objs).map_err(storage_error)
    }

    /// A storage put; `object.rv` is the event's resourceVersion.
    #[wasm_bindgen(js_name = handlePut)]
    pub fn handle_put(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "PutObject")] object: JsValue,
    ) -> Result<(), JsValue> {
        let o = put_object("object", object_arg("object", &object, 0)?)?;
        self.step(&now_ms)?;
        self.driver.handle_put(o).map_err(storage_error)
    }

    /// Several storage puts at one time, in order: `handlePut` for each, in one call. `puts`
    /// is an array of put objects or its JSON text; the text is the fast form (one
    /// `JSON.stringify` instead of reading each object's fields across the JS-wasm boundary),
    /// which the teaching page's 10 000 events/s load uses. Every object is read before any is
    /// applied, so a malformed one (a `TypeError` naming `puts[i]`) applies none; a put the
    /// store refuses (`StorageInputError`) stops the batch there, the ones before it applied,
    /// and its message says how many were. Returns the number applied.
    #[wasm_bindgen(js_name = handlePuts)]
    pub fn handle_puts(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "PutObject[] | string")] puts: JsValue,
    ) -> Result<u32, JsValue> {
        let list = if let Some(text) = puts.as_string() {
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(serde_json::Value::Array(a)) => a,
                Ok(other) => {
                    return Err(type_error(format!(
                        "puts: expected a JSON array of objects, got {}",
                        core_replay::json::kind_of(&other)
                    )))
                }
                Err(e) => return Err(type_error(format!("puts: not JSON: {e}"))),
            }
        } else if Array::is_array(&puts) {
            let arr: &Array = puts.unchecked_ref();
            arr.iter().map(|v| json_of(&v, 0)).collect::<Result<Vec<_>, _>>()?
        } else {
            return Err(type_error(format!(
                "puts: expected an array of objects or its JSON text, got {}",
                describe(&puts)
            )));
        };
        let objs = list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let name = format!("puts[{i}]");
                core_replay::parse_object(v, &name, Some(0))
                    .map_err(|e| type_error(e.to_string()))
                    .and_then(|o| put_object(&name, o))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.step(&now_ms)?;
        let n = objs.len();
        for (i, o) in objs.into_iter().enumerate() {
            self.driver.handle_put(o).map_err(|e| {
                js_error(
                    "StorageInputError",
                    400,
                    "BadRequest",
                    &format!("puts[{i}]: {e} ({i} of {n} applied)"),
                    None,
                )
            })?;
        }
        Ok(n as u32)
    }

    /// A storage delete of `key` at `rv`.
    #[wasm_bindgen(js_name = handleDelete)]
    pub fn handle_delete(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "KeyInput")] key: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
    ) -> Result<(), JsValue> {
        let key = bytes_arg("key", &key)?;
        let rv = u64_arg("rv", &rv)?;
        self.step(&now_ms)?;
        self.driver.handle_delete(&key, rv).map_err(storage_error)
    }

    /// Every change of one revision at once: `changes` is an array of `["put", object]` and
    /// `["delete", key]`.
    #[wasm_bindgen(js_name = handleTxn)]
    pub fn handle_txn(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
        #[wasm_bindgen(unchecked_param_type = "TxnChange[]")] changes: JsValue,
    ) -> Result<(), JsValue> {
        let rv = u64_arg("rv", &rv)?;
        if !Array::is_array(&changes) {
            return Err(type_error("changes: expected an array of [op, arg] pairs".into()));
        }
        let arr: &Array = changes.unchecked_ref();
        let mut out = Vec::with_capacity(arr.length() as usize);
        for (i, c) in arr.iter().enumerate() {
            let pair: Option<&Array> = Array::is_array(&c).then(|| c.unchecked_ref());
            let Some(pair) = pair.filter(|p| p.length() == 2) else {
                return Err(type_error(format!(
                    "changes[{i}]: expected [\"put\", object] or [\"delete\", key]"
                )));
            };
            let arg = format!("changes[{i}][1]");
            match pair.get(0).as_string().as_deref() {
                Some("put") => out.push(Change::Put(object_arg(&arg, &pair.get(1), rv)?)),
                Some("delete") => {
                    out.push(Change::Delete(Key::new(&bytes_arg(&arg, &pair.get(1))?)))
                }
                _ => {
                    return Err(type_error(format!(
                        "changes[{i}]: the op must be \"put\" or \"delete\""
                    )))
                }
            }
        }
        self.step(&now_ms)?;
        self.driver.handle_revision(rv, out).map_err(storage_error)
    }

    /// A storage progress notify at `rv`.
    #[wasm_bindgen(js_name = handleProgress)]
    pub fn handle_progress(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
    ) -> Result<(), JsValue> {
        let rv = u64_arg("rv", &rv)?;
        self.step(&now_ms)?;
        self.driver.handle_progress(rv).map_err(storage_error)
    }

    /// The upstream watch broke: the cache must relist.
    #[wasm_bindgen(js_name = handleStorageError)]
    pub fn handle_storage_error(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        reason: Option<String>,
    ) -> Result<(), JsValue> {
        self.step(&now_ms)?;
        self.driver.handle_storage_error(reason.as_deref().unwrap_or("watch failed"));
        Ok(())
    }

    /// Storage's current revision for a NEED_CURRENT_RV.
    #[wasm_bindgen(js_name = handleCurrentRevision)]
    pub fn handle_current_revision(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(js_name = requestId, unchecked_param_type = "number")] request_id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
    ) -> Result<(), JsValue> {
        let id = u64_arg("requestId", &request_id)?;
        let rv = u64_arg("rv", &rv)?;
        self.step(&now_ms)?;
        self.driver.handle_current_revision(RequestId(id), rv);
        Ok(())
    }

    /// Storage compacted its history at `rv`.
    #[wasm_bindgen(js_name = handleCompaction)]
    pub fn handle_compaction(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
    ) -> Result<(), JsValue> {
        let rv = u64_arg("rv", &rv)?;
        self.step(&now_ms)?;
        self.driver.handle_compaction(rv);
        Ok(())
    }

    /// Storage's current revision, used to answer NEED_CURRENT_RV automatically.
    #[wasm_bindgen(js_name = setEtcdRv)]
    pub fn set_etcd_rv(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "ResourceVersion")] rv: JsValue,
    ) -> Result<(), JsValue> {
        self.driver.set_etcd_rv(u64_arg("rv", &rv)?);
        Ok(())
    }

    /// Stops the cacher for good.
    pub fn stop(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        self.step(&now_ms)?;
        self.driver.stop();
        Ok(())
    }

    /// Starts a watch and returns its id. `options`: `{recursive, rangeEnd, rv,
    /// sendInitialEvents, allowBookmarks, labelSelector, fieldSelector, timeoutMs, consume
    /// ("auto"|"manual"), slowPolicy ("terminate"|"lag"), queueCapacity, requestLayer}`.
    #[wasm_bindgen(js_name = startWatch)]
    pub fn start_watch(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "KeyInput")] key: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "WatchOptions | null")] options: JsValue,
    ) -> Result<f64, JsValue> {
        const KNOWN: &[&str] = &[
            "recursive",
            "rangeEnd",
            "rv",
            "sendInitialEvents",
            "allowBookmarks",
            "labelSelector",
            "fieldSelector",
            "timeoutMs",
            "consume",
            "slowPolicy",
            "queueCapacity",
            "requestLayer",
        ];
        let o = Opts::new("options", &options, KNOWN)?;
        let key = bytes_arg("key", &key)?;
        let recursive = o.bool("recursive")?.unwrap_or(true);
        let range_end = o.get("rangeEnd");
        let keys = if range_end.is_null() || range_end.is_undefined() {
            let key = String::from_utf8(key)
                .map_err(|_| type_error("key: a Kubernetes key must be UTF-8".into()))?;
            KeySpec::Kubernetes { key, recursive }
        } else {
            KeySpec::Etcd { key, range_end: bytes_arg(&o.path("rangeEnd"), &range_end)? }
        };
        let spec = WatchSpec {
            keys,
            rv: rv_text(&o.get("rv"))?,
            send_initial_events: o.bool("sendInitialEvents")?,
            allow_bookmarks: o.bool("allowBookmarks")?.unwrap_or(false),
            label_selector: o.string("labelSelector")?.unwrap_or_default(),
            field_selector: o.string("fieldSelector")?.unwrap_or_default(),
            timeout_ms: o.u64("timeoutMs")?,
            consume: match o.string("consume")? {
                None => cacher_core::ConsumeMode::Auto,
                Some(s) => core_replay::spec::parse_consume(&s)
                    .map_err(|m| type_error(format!("options.consume: {m}")))?,
            },
            slow_policy: match o.string("slowPolicy")? {
                None => cacher_core::SlowPolicy::Terminate,
                Some(s) => core_replay::spec::parse_slow_policy(&s)
                    .map_err(|m| type_error(format!("options.slowPolicy: {m}")))?,
            },
            queue_capacity: o.u64("queueCapacity")?.map(|n| n as usize),
        };
        let mut req = spec.to_request().map_err(|st| status_error(&st))?;
        if o.bool("requestLayer")?.unwrap_or(false) {
            req = self.driver.through_request_layer(req).map_err(|st| status_error(&st))?;
        }
        self.step(&now_ms)?;
        let id = self.driver.start_watch(req).map_err(|st| status_error(&st))?;
        Ok(id.0 as f64)
    }

    /// The client of a watch goes away; false if it was not open.
    #[wasm_bindgen(js_name = stopWatch)]
    pub fn stop_watch(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] id: JsValue,
    ) -> Result<bool, JsValue> {
        let id = u64_arg("id", &id)?;
        self.step(&now_ms)?;
        Ok(self.driver.stop_watch(RequestId(id)))
    }

    /// A manual watcher's client reads up to `max` queued events (all if omitted).
    pub fn consume(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] id: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "number | null")] max: JsValue,
    ) -> Result<f64, JsValue> {
        let id = u64_arg("id", &id)?;
        let max = opt_u64("max", &max)?;
        self.step(&now_ms)?;
        Ok(self.driver.consume(RequestId(id), max) as f64)
    }

    /// Gives a manual watcher credit for `n` more events.
    #[wasm_bindgen(js_name = grantCredit)]
    pub fn grant_credit(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] n: JsValue,
    ) -> Result<f64, JsValue> {
        let id = u64_arg("id", &id)?;
        let n = u64_arg("n", &n)?;
        self.step(&now_ms)?;
        Ok(self.driver.grant_credit(RequestId(id), n) as f64)
    }

    /// Starts a list and returns its id. `options`: `{recursive, rv, rvMatch ("Exact" |
    /// "NotOlderThan"), limit, continue, labelSelector, fieldSelector}`.
    pub fn list(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] key: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ListOptions | null")] options: JsValue,
    ) -> Result<f64, JsValue> {
        const KNOWN: &[&str] =
            &["recursive", "rv", "rvMatch", "limit", "continue", "labelSelector", "fieldSelector"];
        let o = Opts::new("options", &options, KNOWN)?;
        let spec = ListSpec {
            key: string_arg("key", &key)?,
            recursive: o.bool("recursive")?.unwrap_or(true),
            rv: rv_text(&o.get("rv"))?,
            rv_match: o.string("rvMatch")?.unwrap_or_default(),
            limit: o.u64("limit")?.unwrap_or(0),
            continue_token: o.string("continue")?,
            label_selector: o.string("labelSelector")?.unwrap_or_default(),
            field_selector: o.string("fieldSelector")?.unwrap_or_default(),
        };
        let req = spec.to_request().map_err(|st| status_error(&st))?;
        self.step(&now_ms)?;
        let id = self.driver.list(req).map_err(|st| status_error(&st))?;
        Ok(id.0 as f64)
    }

    /// Starts a get of one key and returns its id. `options`: `{rv}`.
    pub fn get(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "KeyInput")] key: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "GetOptions | null")] options: JsValue,
    ) -> Result<f64, JsValue> {
        let o = Opts::new("options", &options, &["rv"])?;
        let spec = GetSpec { key: bytes_arg("key", &key)?, rv: rv_text(&o.get("rv"))? };
        let req = spec.to_request().map_err(|st| status_error(&st))?;
        self.step(&now_ms)?;
        let id = self.driver.get(req).map_err(|st| status_error(&st))?;
        Ok(id.0 as f64)
    }

    /// Starts an etcd-style range read and returns its id. `options`: `{rangeEnd, revision
    /// (0 = latest), linearizable, limit}`.
    pub fn range(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_param_type = "KeyInput")] key: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "RangeOptions | null")] options: JsValue,
    ) -> Result<f64, JsValue> {
        let o = Opts::new("options", &options, &["rangeEnd", "revision", "linearizable", "limit"])?;
        let key = bytes_arg("key", &key)?;
        let end = o.get("rangeEnd");
        let spec = RangeSpec {
            key,
            range_end: if end.is_null() || end.is_undefined() {
                Vec::new()
            } else {
                bytes_arg(&o.path("rangeEnd"), &end)?
            },
            revision: o.u64("revision")?.unwrap_or(0),
            linearizable: o.bool("linearizable")?.unwrap_or(false),
            limit: o.u64("limit")?.unwrap_or(0),
        };
        let req = spec.to_request().map_err(|st| status_error(&st))?;
        self.step(&now_ms)?;
        let id = self.driver.range(req).map_err(|st| status_error(&st))?;
        Ok(id.0 as f64)
    }

    /// Moves time to `nowMs`, firing every timer due by then at its own deadline.
    pub fn advance(
        &mut self,
        #[wasm_bindgen(js_name = nowMs, unchecked_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        self.step(&now_ms)
    }

    /// The next output as a plain object (the shape `drain` gives), or null when there is
    /// none. A fan-out to several watchers, or a delivery of several events, comes out one
    /// item per call.
    #[wasm_bindgen(js_name = pollOutput, unchecked_return_type = "CacherOutput | null")]
    pub fn poll_output(&mut self) -> Result<JsValue, JsValue> {
        match self.driver.poll_item() {
            Some(item) => to_js(&output_of(item)),
            None => Ok(JsValue::NULL),
        }
    }

    /// Every output produced so far, in order, as plain objects (a fan-out becomes one item
    /// per watcher).
    #[wasm_bindgen(unchecked_return_type = "CacherOutput[]")]
    pub fn drain(&mut self) -> Result<JsValue, JsValue> {
        let arr = Array::new();
        while let Some(item) = self.driver.poll_item() {
            arr.push(&to_js(&output_of(item))?);
        }
        Ok(arr.into())
    }

    /// The next deadline as `{atMs, reason}`, or null.
    #[wasm_bindgen(js_name = pollTimeout, unchecked_return_type = "Deadline | null")]
    pub fn poll_timeout(&self) -> JsValue {
        match self.driver.cacher().poll_timeout() {
            None => JsValue::NULL,
            Some((t, r)) => {
                let o = JsObject::new();
                let _ = Reflect::set(&o, &"atMs".into(), &JsValue::from(t.as_millis() as f64));
                let _ = Reflect::set(&o, &"reason".into(), &JsValue::from_str(r.as_str()));
                o.into()
            }
        }
    }

    /// The last `nowMs` given.
    #[wasm_bindgen(getter = nowMs)]
    pub fn now_ms(&self) -> f64 {
        self.driver.now_ms() as f64
    }

    /// The cache's resourceVersion.
    #[wasm_bindgen(getter = resourceVersion)]
    pub fn resource_version(&self) -> u64 {
        self.driver.cacher().resource_version()
    }

    /// The RV of the last list.
    #[wasm_bindgen(getter = listResourceVersion)]
    pub fn list_resource_version(&self) -> u64 {
        self.driver.cacher().list_resource_version()
    }

    /// "pending", "ready" or "stopped".
    #[wasm_bindgen(getter = readyState, unchecked_return_type = "\"pending\" | \"ready\" | \"stopped\"")]
    pub fn ready_state(&self) -> String {
        self.driver.cacher().ready_state().as_str().into()
    }

    /// Objects in the store.
    #[wasm_bindgen(getter = storeLen)]
    pub fn store_len(&self) -> f64 {
        self.driver.cacher().store_len() as f64
    }

    /// Dispatch time budget available now, in ms.
    #[wasm_bindgen(getter = budgetMs)]
    pub fn budget_ms(&self) -> f64 {
        self.driver.cacher().budget_available_ms() as f64
    }

    /// Requests parked (waiting for the gate, storage's revision, or freshness).
    #[wasm_bindgen(getter)]
    pub fn parked(&self) -> f64 {
        self.driver.cacher().parked_count() as f64
    }

    /// The ring buffer's window: `{oldestRv, newestRv, oldestServable, len, capacity,
    /// startIndex, endIndex, evictedSinceRelist}` (RVs and indices BigInt; the RVs undefined
    /// while there are none).
    #[wasm_bindgen(unchecked_return_type = "Window")]
    pub fn window(&self) -> Result<JsValue, JsValue> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct W {
            oldest_rv: Option<u64>,
            newest_rv: Option<u64>,
            oldest_servable: Option<u64>,
            len: u32,
            capacity: u32,
            start_index: u64,
            end_index: u64,
            evicted_since_relist: bool,
        }
        let w = self.driver.cacher().window();
        to_js(&W {
            oldest_rv: w.oldest_rv,
            newest_rv: w.newest_rv,
            oldest_servable: w.oldest_servable,
            len: w.len as u32,
            capacity: w.capacity as u32,
            start_index: w.start_index,
            end_index: w.end_index,
            evicted_since_relist: w.evicted_since_relist,
        })
    }

    /// The buffered events, oldest first: `[{rv, key, isDelete}]`.
    #[wasm_bindgen(js_name = windowEvents, unchecked_return_type = "WindowEvent[]")]
    pub fn window_events(&self) -> Result<JsValue, JsValue> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct E {
            rv: u64,
            key: String,
            is_delete: bool,
        }
        let v: Vec<E> = self
            .driver
            .cacher()
            .window_events()
            .map(|(rv, k, d)| E { rv, key: text(k), is_delete: d })
            .collect();
        to_js(&v)
    }

    /// The stored objects, in key order: `[{key, rv, value, labels, fields}]`.
    #[wasm_bindgen(unchecked_return_type = "Item[]")]
    pub fn objects(&self) -> Result<JsValue, JsValue> {
        let v: Vec<JsItem> = self.driver.cacher().objects().iter().map(|o| item_of(o)).collect();
        to_js(&v)
    }

    /// Open watches.
    #[wasm_bindgen(unchecked_return_type = "WatcherInfo[]")]
    pub fn watchers(&self) -> Result<JsValue, JsValue> {
        let v: Vec<JsWatcher> =
            self.driver.cacher().watchers().into_iter().map(JsWatcher::from).collect();
        to_js(&v)
    }

    /// One open watch, or null.
    #[wasm_bindgen(unchecked_return_type = "WatcherInfo | null")]
    pub fn watcher(
        &self,
        #[wasm_bindgen(unchecked_param_type = "number")] id: JsValue,
    ) -> Result<JsValue, JsValue> {
        let id = u64_arg("id", &id)?;
        match self.driver.cacher().watcher(RequestId(id)) {
            Some(w) => to_js(&JsWatcher::from(w)),
            None => Ok(JsValue::NULL),
        }
    }

    /// The metrics (Kubernetes' watch-cache metric names, counts as BigInt).
    #[wasm_bindgen(unchecked_return_type = "Metrics")]
    pub fn metrics(&self) -> JsValue {
        fields_js(metrics_fields(self.driver.cacher().metrics()))
    }

    /// The configuration (scenario config field names).
    #[wasm_bindgen(unchecked_return_type = "CacherConfigInfo")]
    pub fn config(&self) -> JsValue {
        fields_js(config_fields(self.driver.cacher().config()))
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsWatcher {
    id: f64,
    key: String,
    rv: u64,
    last_sent_rv: u64,
    queued: u32,
    queue_capacity: u32,
    initial_pending: u32,
    state: &'static str,
    lag: u64,
    auto: bool,
    policy: &'static str,
    allow_bookmarks: bool,
}

impl From<cacher_core::WatcherInfo> for JsWatcher {
    fn from(w: cacher_core::WatcherInfo) -> Self {
        JsWatcher {
            id: w.id.0 as f64,
            key: w.key,
            rv: w.rv,
            last_sent_rv: w.last_sent_rv,
            queued: w.queued as u32,
            queue_capacity: w.queue_capacity as u32,
            initial_pending: w.initial_pending as u32,
            state: w.state.as_str(),
            lag: w.lag,
            auto: w.auto,
            policy: w.policy.as_str(),
            allow_bookmarks: w.allow_bookmarks,
        }
    }
}
